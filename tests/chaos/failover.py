"""The Patroni failover scenario: workers and producers ride through a failed primary on libpq multi-host settings.

Runs in a process of its own, whose Django settings reach the cluster of
:mod:`tests.chaos.patroni` through ``host=127.0.0.1,127.0.0.1
port=5433,5434 target_session_attrs=read-write`` (``Cluster.env()``)::

    python -m tests.chaos.failover --base CLUSTER_DIR --out LOG_DIR --result result.json

It migrates the database, then runs ``workers`` fq_worker processes (chaos
handlers, 4 runners each, short polls) on ``chaos.work`` kept stocked with
jobs, ``producers`` sequential producer processes (one idempotency token per
job, repeated after a database error until it goes through), and one more
worker on ``chaos.wake`` that polls only every 60 s. Then, for each fault in
turn (``kill``: ``kill -9`` of the primary's postmaster; ``switchover``:
``patronictl switchover --force``), once the cluster has its sync standby:

* waits until the other node accepts writes (``t_up``);
* measures, from ``t_up``, when each worker process got its first lease from
  the new primary, when each producer's first enqueue returned, and when
  every worker's wakeup listener had its ``LISTEN`` on the new primary
  (``pg_stat_activity``);
* enqueues one job on ``chaos.wake`` and measures how soon it was claimed:
  far below the 60 s poll, so only the notification can have woken it.

At the end: the producers stop, the queue drains, the workers stop (exit 0),
and the checker of :mod:`tests.chaos.invariants` runs with every producer's
records (each enqueue that returned is one job, present). On top of it,
from the workers' logs: every ``job.acked`` line (the ack's commit returned)
is a job that ended ``succeeded`` and, when acks wait for the synchronous
standby (``FQ_SYNCHRONOUS_SETTLE``), each job was acked once, in the attempt it
ended with: an ack the failover forgot lets the job run (and be acked) again. With the default asynchronous settle
that is counted (``acks_forgotten``), as at-least-once delivery allows. The result (summary line, problems, figures) is written as
JSON to ``--result``; the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time
from pathlib import Path

WAKE = "chaos.wake"
WAKE_POLL_MS = 60_000
#: The bound the scenario holds each recovery to, in seconds after the new primary accepts writes.
RECOVERY_BOUND_S = 15.0
#: The figures held to it: each worker's first lease, each producer's first enqueue, every listener's LISTEN.
BOUNDED = ("workers_first_lease_s", "producers_first_enqueue_s", "listen_on_new_primary_s")


def _parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.chaos.failover")
    p.add_argument("--base", required=True, help="the Patroni cluster's directory (tests.chaos.patroni.Cluster)")
    p.add_argument("--out", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--faults", default="kill,switchover")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--load-s", type=float, default=4.0, help="load before each fault, seconds")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    for _ in range(30):  # the cluster may still be settling right after its start
        try:
            call_command("migrate", verbosity=0, interactive=False)
            break
        except Exception:
            from django.db import connections

            connections.close_all()
            time.sleep(1)
    result = run(Path(args.base), Path(args.out), faults=args.faults.split(","), workers=args.workers,
                 producers=args.producers, load_s=args.load_s, strict_acks=settings.FQ_SYNCHRONOUS_SETTLE)
    Path(args.result).write_text(json.dumps(result, indent=2, default=str))
    return 0


def _retry(fn, timeout: float = 60.0):
    """``fn()``, retried on database errors (this process's connection dies with the primary) for ``timeout`` seconds."""
    from django.db import Error as DbError
    from django.db import connections

    give_up = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except DbError:
            connections.close_all()
            if time.monotonic() > give_up:
                raise
            time.sleep(0.2)


def _sql(sql: str, params=()):
    from django.db import connection

    def q():
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    return _retry(q)


def run(base: Path, out: Path, *, faults: list[str], workers: int = 3, producers: int = 2, load_s: float = 4.0,
        strict_acks: bool = True) -> dict:
    from django.db import connections

    from django_fq import services as fq

    from . import invariants, procs, scenarios
    from .patroni import Cluster

    cluster = Cluster(base)
    started = time.monotonic()
    work = scenarios.WORK
    scenarios._fresh([work, WAKE])
    invariants.install()
    visibility_ms = 3000
    fq.configure(work, max_attempts=1000, backoff_ms=0, visibility_ms=visibility_ms)
    fq.configure(WAKE, max_attempts=1000, backoff_ms=0, visibility_ms=visibility_ms)
    outcome = scenarios.Outcome("patroni-failover", invariants.Report([work, WAKE]))
    logs = out / "patroni-failover"
    stop_file = logs / "producers.stop"
    figures: list[dict] = []

    def stock() -> None:
        if fq.stats(work).counts["ready"] < 400:
            fq.enqueue_many(work, [{"payload": {"sleep_ms": n % 6}} for n in range(800)])

    pool = [
        procs.worker(work, logs / f"worker-{n}.log", "--concurrency=4", f"--visibility={visibility_ms}", *scenarios.FAST,
                     env={"FQ_CHAOS_TAG": f"w{n}"})
        for n in range(workers)
    ]
    waker = procs.worker(WAKE, logs / "worker-wake.log", "--concurrency=1", f"--visibility={visibility_ms}",
                         f"--poll-interval={WAKE_POLL_MS}", f"--max-poll-interval={WAKE_POLL_MS}", "--grace=10",
                         env={"FQ_CHAOS_TAG": "wake"}, name="fq_worker wake")
    makers = [
        procs.actor("producer", logs / f"producer-{n}.log", f"--queues={work}", "--seconds=900", f"--stop-file={stop_file}",
                    "--sequential", "--retry-db-errors", f"--name=p{n}-", "--pace-ms=5",
                    f"--out={logs / f'producer-{n}.json'}")
        for n in range(producers)
    ]
    everyone = [*pool, waker]
    try:
        _retry(stock)
        for w in everyone:
            w.wait_ready(180)
        scenarios._wait(lambda: all(scenarios._read_jsonl(logs / f"producer-{n}.json.jsonl") for n in range(producers)),
                        180, "every producer to enqueue")
        _wait_listening(len(everyone), time.time(), 60)
        base_wake = _wake_pickup_ms(fq)
        figures.append({"fault": "none (before any fault)", "wake_pickup_ms": base_wake})
        for fault in faults:
            cluster.wait_healthy(120)
            until = time.monotonic() + load_s
            while time.monotonic() < until:
                _retry(stock)
                time.sleep(0.2)
            connections.close_all()
            t_fault = time.time()
            old_port = cluster.kill_primary() if fault == "kill" else cluster.switchover()
            t_returned = time.time()
            new_port, t_up = cluster.wait_new_primary(old_port, 90)
            connections.close_all()
            fig = {"fault": fault, "old_primary": old_port, "new_primary": new_port,
                   "new_primary_up_after_fault_s": round(t_up - t_fault, 2), "command_s": round(t_returned - t_fault, 2)}
            _retry(stock)
            fig.update(_recovery(logs, pool, producers, t_up))
            fig["producer_outage_s"] = _outage(logs, producers, t_fault)
            fig["listen_on_new_primary_s"] = round(_wait_listening(len(everyone), t_up, 60) - t_up, 2)
            fig["wake_pickup_ms"] = _wake_pickup_ms(fq)
            figures.append(fig)
            slow = {k: fig[k] for k in BOUNDED if not isinstance(fig[k], (int, float)) or fig[k] > RECOVERY_BOUND_S}
            if slow:
                outcome.problems.append(f"{fault}: recovered later than {RECOVERY_BOUND_S} s after the new primary: {slow}")
            if fig["wake_pickup_ms"] is None or fig["wake_pickup_ms"] > 5000:
                outcome.problems.append(f"{fault}: the job on {WAKE} was not picked up by the wakeup "
                                        f"({fig['wake_pickup_ms']} ms; the worker polls every {WAKE_POLL_MS} ms)")
        outcome.restarts = len(faults)
        stop_file.write_text("stop")
        for m in makers:
            code = m.wait(300)
            if code != 0:
                outcome.problems.append(f"producer pid {m.pid} exited {code}:\n{m.text()[-1500:]}")
        if not _retry(lambda: scenarios._wait_drained([work, WAKE], 300), 330):
            outcome.problems.append("the queues were not drained in time")
        for w in everyone:
            if not w.alive():
                outcome.problems.append(f"{w.name} pid {w.pid} died (exit {w.proc.returncode}):\n{w.text()[-1500:]}")
            elif not w.count(r"worker\.reconnected "):
                outcome.problems.append(f"{w.name} pid {w.pid} never logged that it reconnected")
    except (TimeoutError, AssertionError, RuntimeError) as exc:
        outcome.problems.append(str(exc))
    finally:
        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.write_text("stop")
        scenarios._stop_all([w for w in everyone if w.alive()], outcome.problems)
        for p in makers + everyone:
            if p.alive():
                p.kill()
    records, survived = [], 0
    for n in range(producers):
        records += scenarios._read_jsonl(logs / f"producer-{n}.json.jsonl")
        summary = scenarios._read_json(logs / f"producer-{n}.json")
        survived += summary.get("db_errors_survived", 0)
        if summary.get("unexpected_count"):
            outcome.problems += [f"producer {n}: {u}" for u in summary["unexpected"]]
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(everyone + makers)]
    connections.close_all()
    outcome.report = _retry(lambda: invariants.check([work, WAKE], visibility_ms=visibility_ms, drained=True, producers=records))
    acked = _acks_from_logs(everyone)
    ack_problems, forgotten = _check_acks(acked)
    outcome.problems += ack_problems
    if forgotten and strict_acks:
        outcome.problems.append(f"{len(forgotten)} acks that returned were forgotten by the failover (the job ran "
                                f"again), e.g. (job, acked attempts, final attempts) {forgotten[:5]}")
    outcome.notes = {"enqueues": len(records), "acks_logged": sum(len(v) for v in acked.values()),
                     "acks_forgotten": len(forgotten),
                     "producer_db_errors_survived": survived, "handler_runs_failed_by_the_outage": outcome.report.failed_runs,
                     "worker_db_errors": sum(w.count(r"worker\.db_error ") for w in everyone), "figures": figures}
    outcome.took_s = time.monotonic() - started
    report = {k: v for k, v in vars(outcome.report).items() if k != "by_kind"}
    report["by_kind"] = dict(outcome.report.by_kind)
    return {"problems": outcome.problems, "notes": outcome.notes, "restarts": outcome.restarts,
            "took_s": outcome.took_s, "report": report}


#: The database the scenario creates on the cluster.
DB_NAME = "fq_ha"


def scenario(out: Path, *, faults: str = "kill,switchover", sync_settle: bool = True, progress=None):
    """Start the cluster, run :func:`run` in a process of its own on it, tear the cluster down; an ``Outcome``.

    ``sync_settle``: the workers run with ``FQ_SYNCHRONOUS_SETTLE = True`` (claims and acks wait
    for the sync standby too). Raises RuntimeError when the cluster cannot run here
    (:func:`tests.chaos.patroni.unavailable`). The figures are in ``outcome.notes["figures"]``.
    """
    import collections
    import os
    import subprocess
    import sys

    from . import invariants, patroni, scenarios
    from .procs import ROOT

    reason = patroni.unavailable()
    if reason:
        raise RuntimeError(reason)
    cluster = patroni.Cluster()
    result = Path(out) / "patroni-failover-result.json"
    try:
        if progress:
            progress("patroni-failover: starting etcd and two Patroni nodes")
        cluster.start()
        cluster.create_database(DB_NAME)
        env = {**os.environ, **patroni.Cluster.env(), "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
               "FQ_TEST_PG_NAME": DB_NAME, "FQ_CHILD_DB_NAME": DB_NAME, "FQ_CHAOS_SYNC_SETTLE": "1" if sync_settle else "0",
               "PYTHONPATH": str(ROOT)}
        env.pop("FQ_TEST_PG_POOLER", None)
        if progress:
            progress(f"patroni-failover: faults {faults} under load")
        done = subprocess.run([sys.executable, "-m", "tests.chaos.failover", "--base", str(cluster.base), "--out", str(out),
                               "--result", str(result), "--faults", faults],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not result.exists():
            raise AssertionError(f"the failover scenario's process failed ({done.returncode}):\n{done.stderr[-4000:]}")
    finally:
        cluster.stop()
    data = json.loads(result.read_text())
    fields = data["report"]
    by_kind = collections.Counter(fields.pop("by_kind"))
    report = invariants.Report(**fields)
    report.by_kind = by_kind
    outcome = scenarios.Outcome("patroni-failover", report, took_s=data["took_s"], restarts=data["restarts"],
                                problems=data["problems"], notes=data["notes"])
    return outcome


def _recovery(logs: Path, pool, producers: int, t_up: float, timeout: float = 60.0) -> dict:
    """Seconds from ``t_up`` to each worker's first lease and each producer's first enqueue on the new primary."""
    from . import scenarios

    want = {w.pid for w in pool}
    t_up_ms = int(t_up * 1000)
    give_up = time.monotonic() + timeout
    workers_s: dict[int, float] = {}
    producers_s: dict[int, float] = {}
    while time.monotonic() < give_up and (len(workers_s) < len(want) or len(producers_s) < producers):
        for worker, first in _sql("SELECT worker, MIN(at) FROM fqchaos_lease WHERE at >= %s GROUP BY worker", [t_up_ms]):
            parts = worker.split(":")
            if len(parts) >= 3 and parts[-2].isdigit() and int(parts[-2]) in want:
                pid = int(parts[-2])
                workers_s[pid] = min(workers_s.get(pid, 1e9), (first - t_up_ms) / 1000)
        for n in range(producers):
            if n in producers_s:
                continue
            after = [r["at"] for r in scenarios._read_jsonl(logs / f"producer-{n}.json.jsonl") if r.get("at", 0) >= t_up_ms]
            if after:
                producers_s[n] = (min(after) - t_up_ms) / 1000
        time.sleep(0.2)
    return {
        "workers_first_lease_s": round(max(workers_s.values()), 2) if len(workers_s) == len(want) else f"missing {want - set(workers_s)}",
        "producers_first_enqueue_s": round(max(producers_s.values()), 2) if len(producers_s) == producers else "missing",
    }


def _outage(logs: Path, producers: int, t_fault: float) -> float:
    """The longest gap (s) between two enqueues of one producer returning, from 2 s before the fault on."""
    from . import scenarios

    worst = 0.0
    since = int((t_fault - 2) * 1000)
    for n in range(producers):
        at = sorted(r["at"] for r in scenarios._read_jsonl(logs / f"producer-{n}.json.jsonl") if r.get("at", 0) >= since)
        worst = max([worst, *((b - a) / 1000 for a, b in itertools.pairwise(at))])
    return round(worst, 2)


def _wait_listening(n: int, since: float, timeout: float) -> float:
    """Wait until ``n`` sessions on the primary sit in ``LISTEN django_fq``; returns ``time.time()`` then."""
    give_up = time.monotonic() + timeout
    while True:
        got = _sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
                   " AND pid <> pg_backend_pid()")[0][0]
        if got >= n:
            return time.time()
        if time.monotonic() > give_up:
            raise RuntimeError(f"only {got} of {n} wakeup listeners on the primary {timeout:.0f} s after {since:.1f}")
        time.sleep(0.1)


def _wake_pickup_ms(fq) -> int | None:
    """Enqueue one job on the 60-s-polling queue; ms from its enqueue to its claim (database clock), ``None`` if not in 30 s."""
    ref = _retry(lambda: fq.enqueue(WAKE, {"sleep_ms": 0}))
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        rows = _sql("SELECT l.claimed_at - j.enqueued_at FROM fqchaos_lease l JOIN fqchaos_job j ON j.seq = l.job_seq"
                    " WHERE j.uid = %s ORDER BY l.generation LIMIT 1", [ref.id])
        if rows:
            return int(rows[0][0])
        time.sleep(0.05)
    return None


_ACKED = re.compile(r"job\.acked .*?job=(\S+).*?attempt=(\d+)/")


def _acks_from_logs(workers) -> dict[str, list[int]]:
    """Job id -> the attempts whose ack a worker logged as done (the ack's commit returned)."""
    found: dict[str, list[int]] = {}
    for w in workers:
        for line in w.text().splitlines():
            m = _ACKED.search(line)
            if m:
                found.setdefault(m.group(1), []).append(int(m.group(2)))
    return found


def _check_acks(acked: dict[str, list[int]]) -> tuple[list[str], list]:
    """Problems (an acked job not succeeded at the end) and the forgotten acks.

    A forgotten ack is one whose commit returned to the worker but that the new
    primary does not have: the job's lease expired, it ran again and was acked
    again, with a later attempt, or with the same one when its claim was
    forgotten too. So a job logged acked more than once, or with another attempt
    than it ended with, is one. Returns ``(problems, forgotten)``; the caller
    decides whether forgotten acks are a problem (they are when acks wait for
    the synchronous standby, ``FQ_SYNCHRONOUS_SETTLE``).
    """
    rows = {}
    uids = list(acked)
    for i in range(0, len(uids), 1000):
        chunk = uids[i:i + 1000]
        for uid, state, attempts in _sql("SELECT uid, state, attempts FROM django_fq_job WHERE uid = ANY(%s)", [chunk]):
            rows[uid] = (state, attempts)
    problems = []
    unfinished = [(uid, rows.get(uid)) for uid in acked if rows.get(uid, ("?",))[0] != "succeeded"]
    if unfinished:
        problems.append(f"{len(unfinished)} acked jobs are not succeeded at the end, e.g. {unfinished[:5]}")
    forgotten = [(uid, a, rows[uid][1]) for uid, a in acked.items() if uid in rows and (len(a) > 1 or a[0] != rows[uid][1])]
    return problems, forgotten


if __name__ == "__main__":
    raise SystemExit(main())
