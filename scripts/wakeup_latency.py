"""Pickup latency of an idle worker with the default poll interval, from another process and from its own.

    .venv/bin/python scripts/wakeup_latency.py --db mariadb          # 200 jobs each way
    .venv/bin/python scripts/wakeup_latency.py --db sqlite --jobs 50

For each job: the worker is idle (the previous job is done), the producer
pauses a random 0.3–1.3 s (so the worker's idle pause, which doubles from
``--poll-interval`` 200 ms up to ``--max-poll-interval`` 1 s, is caught at
every stage), takes t0, enqueues one job and waits for the handler to report
the monotonic time it started (``CLOCK_MONOTONIC`` is one clock for every
process of the machine). Latency = start − t0: the enqueue's own round trips
included.

* **other process**: the worker is a child process (``multiprocessing``,
  spawned), as ``manage.py fq_worker`` is; where the database cannot notify
  (MariaDB/MySQL, SQLite) it finds the job on its next poll.
* **same process**: the worker runs on a thread of the producer's process, whose
  enqueue wakes it at commit (docs/explanation/design.md, "Wakeups").

The worker has ``fq_worker``'s defaults (one runner thread, the reaper on).
The jobs go to a database of their own, created and dropped by the script
with the test settings of ``--db`` (``tests/settings.py``: MariaDB at
127.0.0.1:3306 as root, PostgreSQL at 127.0.0.1:5432); its name is
``--name`` (a file in a temporary directory for SQLite).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE = "latency"


def _setup(db: str, name: str) -> None:
    sys.path.insert(0, ROOT)
    os.environ.update(FQ_TEST_DB=db, FQ_CHILD_DB_NAME=name, DJANGO_SETTINGS_MODULE="tests.worker_settings")
    import django

    django.setup()


def _handler(report):
    def handler(job):
        report(job.payload["n"], time.monotonic())

    return handler


def _worker_process(db: str, name: str, started, ready) -> None:
    _setup(db, name)
    from django_fq.worker import Worker

    worker = Worker([QUEUE], handlers={QUEUE: _handler(lambda n, t: started.put((n, t)))}, install_signals=True)
    ready.set()
    worker.run()  # until SIGTERM


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0–100) of ``values``, by linear interpolation between ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _measure(jobs: int, wait_started, first: int) -> tuple[list[float], int]:
    """``jobs`` latencies (ms), and how many samples were dropped because the database was away."""
    from django.db import OperationalError, connections

    from django_fq import services as fq

    out, dropped = [], 0
    for n in range(first, first + jobs):
        time.sleep(random.uniform(0.3, 1.3))
        t0 = time.monotonic()
        tries = 0
        while True:
            try:
                fq.enqueue(QUEUE, {"n": n})
                break
            except OperationalError:  # the server restarted (another user of it): reconnect, drop the sample
                tries += 1
                if tries > 60:
                    raise
                connections.close_all()
                time.sleep(1)
        got, started = wait_started()
        assert got == n, (got, n)
        if tries:
            dropped += 1
        else:
            out.append((started - t0) * 1000)
    return out, dropped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("mariadb", "sqlite", "postgres"), default="mariadb")
    parser.add_argument("--jobs", type=int, default=200, help="jobs measured each way (default 200)")
    parser.add_argument("--name", default="fq_wakeup_latency", help="database name on a server (created, dropped)")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="fq-latency-")
    name = os.path.join(tmp, "latency.sqlite3") if args.db == "sqlite" else args.name
    _setup(args.db, name)
    from django.core.management import call_command
    from django.db import connection, connections

    from django_fq import services as fq
    from django_fq import storage, wakeup
    from django_fq.worker import Worker

    store = storage.for_connection(connection)
    if store.embedded:
        call_command("migrate", verbosity=0, interactive=False)
    else:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    results = {}
    with connection.cursor() as cur:
        cur.execute("SELECT sqlite_version()" if store.embedded else "SELECT VERSION()")
        version = str(cur.fetchone()[0])
    try:
        fq.configure(QUEUE)
        # Another process: a spawned child, as fq_worker runs.
        spawn = mp.get_context("spawn")
        started, ready = spawn.Queue(), spawn.Event()
        connections.close_all()
        child = spawn.Process(target=_worker_process, args=(args.db, name, started, ready))
        child.start()
        try:
            assert ready.wait(60)
            time.sleep(2)  # the child's first claim rounds, then idle
            results["other process"] = _measure(args.jobs, lambda: started.get(timeout=120), 0)
        finally:
            child.terminate()  # SIGTERM: the worker stops gracefully
            child.join(30)
        # The same process: a worker thread, woken by the enqueue's commit.
        inbox: list = []
        cond = threading.Condition()

        def report(n, t):
            with cond:
                inbox.append((n, t))
                cond.notify_all()

        def wait_started():
            with cond:
                assert cond.wait_for(lambda: inbox, timeout=120)
                return inbox.pop(0)

        worker = Worker([QUEUE], handlers={QUEUE: _handler(report)})
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            time.sleep(2)
            results["same process"] = _measure(args.jobs, wait_started, args.jobs)
        finally:
            worker.request_stop("measured")
            thread.join(30)
        wakeup.shutdown_all()
    finally:
        connections.close_all()
        if not store.embedded:
            connection.creation.destroy_test_db(name, verbosity=0)
    print(f"{time.strftime('%Y-%m-%d', time.gmtime())}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{args.db} {version}, listen={store.supports_listen_notify}, {args.jobs} jobs each")  # fmt: skip
    print("| enqueue from | jobs | median ms | p95 ms | max ms |")
    print("|---|---|---|---|---|")
    for where, (ms, dropped) in results.items():
        note = f" ({dropped} dropped: server restarted)" if dropped else ""
        print(f"| {where} | {len(ms)}{note} | {statistics.median(ms):.1f} | {percentile(ms, 95):.1f} | {max(ms):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
