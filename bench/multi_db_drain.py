"""Drain of two queues spread over two PostgreSQL databases against the same two queues on one.

::

    PYTHONPATH=. .venv-dj52/bin/python bench/multi_db_drain.py --order one,two,two,one,one,two

Two queues, ``a:q`` and ``b:q``, get ``--n`` no-op jobs each. Mode ``one``: both on one
database (no ``FQ_QUEUE_DATABASES``). Mode ``two``: ``b:*`` on a second database
(``FQ_QUEUE_DATABASES = {"b:*": "second"}``, ``bench/settings_multi.py``). Each run empties
both databases, enqueues, then runs one ``fq_worker --queue a:q --queue b:q --burst
--concurrency C`` process and reports:

* the steady drain rate (docs/reference/semantics.md §9: jobs finished per second from the
  first job recorded done to the last, over both databases; each database's clock is the
  same server's here);
* the worker's CPU seconds per job (user + system, from ``os.wait4``, start-up included).

Modes are alternated in one sitting; the summary prints each mode's runs, their means and
the ratio two / one, with the load average. Both databases are on the one local PostgreSQL
server, so this measures what spreading costs or gains in django-fq itself (two claim
queues, two completers, two listeners), not a second server's hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--order", default="one,two,two,one", help="comma-separated runs: one / two")
    p.add_argument("--n", type=int, default=10000, help="jobs per queue per run (two queues)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--db-name", default="fq_bench_multi_a")
    p.add_argument("--db-name2", default="fq_bench_multi_b")
    p.add_argument("--logs", default="/tmp/fq-multi-db-drain")
    p.add_argument("--out", help="write the runs as JSON here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    order = [r.strip() for r in args.order.split(",") if r.strip()]
    if any(r not in ("one", "two") for r in order):
        raise SystemExit("--order takes one/two")
    os.makedirs(args.logs, exist_ok=True)
    from bench import pgdb

    for name in (args.db_name, args.db_name2):
        if not name.replace("_", "").isalnum():
            raise SystemExit(f"bad database name {name!r}")
        pgdb.drop(name)
        pgdb.psql(f'CREATE DATABASE "{name}"')
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.settings_multi", FQ_BENCH_DB="postgres", FQ_BENCH_PG_NAME=args.db_name,
        FQ_BENCH_PG_NAME2=args.db_name2,
        FQ_BENCH_SPLIT="1",  # this driver sees both aliases with the mapping; each worker gets its run's
    )  # fmt: skip
    sys.path.insert(0, REPO)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from django_fq import services
    from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter

    for alias in ("default", "second"):
        call_command("migrate", database=alias, verbosity=0, interactive=False)
    tables = ", ".join(t._meta.db_table for t in (Lease, IdempotencyToken, QueueCounter, Job, Queue))
    job = Job._meta.db_table
    runs = []
    try:
        for i, mode in enumerate(order):
            for alias in ("default", "second"):
                with connections[alias].cursor() as cur:
                    cur.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
            from django.test.utils import override_settings

            mapping = {"b:*": "second"} if mode == "two" else {}
            with override_settings(FQ_QUEUE_DATABASES=mapping):
                for queue in ("a:q", "b:q"):
                    for start in range(0, args.n, 5000):
                        services.enqueue_many(
                            queue, [{"payload": {"i": k}} for k in range(start, min(args.n, start + 5000))]
                        )
            connections.close_all()
            env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1", FQ_BENCH_SPLIT="1" if mode == "two" else "0")
            cmd = [sys.executable, "-m", "django", "fq_worker", "--queue", "a:q", "--queue", "b:q", "--burst",
                   "--concurrency", str(args.concurrency), "--no-progress"]  # fmt: skip
            log_path = os.path.join(args.logs, f"run{i}_{mode}.log")
            load = os.getloadavg()
            with open(log_path, "w") as logf:
                t0 = time.perf_counter()
                proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
                _, status, usage = os.wait4(proc.pid, 0)
                wall = time.perf_counter() - t0
            done, first, last = 0, None, None
            for alias in ("default", "second"):
                with connections[alias].cursor() as cur:
                    cur.execute(
                        f"SELECT count(*), min(finished_at), max(finished_at) FROM {job} WHERE state = 'succeeded'"
                    )
                    n, lo, hi = cur.fetchone()
                done += n
                if lo is not None:
                    first = lo if first is None else min(first, lo)
                    last = hi if last is None else max(last, hi)
            connections.close_all()
            total = 2 * args.n
            span_ms = (last - first) if first is not None else 0
            cpu = usage.ru_utime + usage.ru_stime
            run = {
                "run": i, "mode": mode, "jobs": total, "succeeded": done, "exit": os.waitstatus_to_exitcode(status),
                "steady_rate": round((total - 1) / (span_ms / 1000), 1) if span_ms > 0 else None,
                "cpu_us_per_job": round(cpu / total * 1e6, 1), "wall_s": round(wall, 2),
                "loadavg_before": [round(x, 2) for x in load],
            }  # fmt: skip
            runs.append(run)
            print(json.dumps(run), flush=True)
            if done != total or run["exit"] != 0:
                raise SystemExit(f"run {i} ({mode}): {done} of {total} succeeded, exit {run['exit']}; see {log_path}")
    finally:
        connections.close_all()
        pgdb.drop(args.db_name)
        pgdb.drop(args.db_name2)
    means = {}
    for mode in ("one", "two"):
        mine = [r for r in runs if r["mode"] == mode]
        if mine:
            rate = sum(r["steady_rate"] for r in mine) / len(mine)
            cpu = sum(r["cpu_us_per_job"] for r in mine) / len(mine)
            means[mode] = (rate, cpu)
            print(f"{mode}: steady {[r['steady_rate'] for r in mine]} mean {rate:.0f} jobs/s; "
                  f"cpu/job {[r['cpu_us_per_job'] for r in mine]} mean {cpu:.0f} us")  # fmt: skip
    if len(means) == 2:
        print(
            f"ratio two/one: steady {means['two'][0] / means['one'][0]:.2f}, cpu/job {means['two'][1] / means['one'][1]:.2f}"
        )
    print(f"load average at the end: {os.getloadavg()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
