"""Per-key concurrency on PostgreSQL: claim latency with many keys, and the drain under ``key_concurrency=1``.

::

    PYTHONPATH=. .venv-dj6/bin/python bench/keys.py --out /tmp/fq-keys.json

Everything runs in one sitting on a fresh database (``--db-name``, dropped at the end), in
alternating order where two cases are compared, so both meet the same machine load:

* **claim latency** (this process, one ``services.claim(count=1)`` per sample, the lease kept):
  ``none``, ``--ready`` ready jobs without a key; ``keys``, the same number spread over
  ``--keys`` keys (two jobs each) in a queue with ``key_concurrency=1``, so half of them are
  held; ``busy``, the worst case: one key with ``--busy`` held jobs enqueued before ``--keys``
  other keys' jobs, so in claim order the busy key's jobs all come first. Target: ``keys`` ≤ 1.5 ×
  ``none`` (median). The claims of a keyed queue are the same statement as an unkeyed one's;
  ``busy`` shows that the held jobs are never read.
* **drain** (one ``fq_worker --burst --concurrency C`` process, no-op handler, queue ``bench``):
  ``plain``, ``--n`` jobs without a key; ``keyed``, ``--n`` jobs over ``--drain-keys`` keys with
  ``key_concurrency=1``. Steady rate as the suite measures it: jobs finished per second from
  the first ``finished_at`` to the last (database clock). Target: ``keyed`` ≥ 50 % of ``plain``.
* **per-key rate** (``key_rate_limit``): claim case ``keyrate``, the ``keys`` jobs in a queue with
  ``key_rate_limit=1000`` per second instead (never binding: the cost of the claim path that logs
  keyed claims); drain case ``keyrate``, the ``keyed`` jobs with ``key_rate_limit=1000000``
  (never binding); and ``bound``, ``--bound-keys`` keys at ``--bound-limit`` claims per 1000 ms
  with four windows of work each: the share of the claims the limit allows over the claim span
  (first to last ``claimed_at``: ideal three windows), and the busiest window of any key.

Results: docs/performance.md#per-key-concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from bench import pgdb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE = "bench"  # served by bench/benchapp/fq_handlers.py
CLAIM_QUEUE = "claimbench"  # never served by a worker
ENQUEUE_BATCH = 5000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db-name", default="fq_bench_keys")
    p.add_argument("--ready", type=int, default=20_000, help="ready jobs of the claim-latency queue")
    p.add_argument("--keys", type=int, default=10_000, help="keys holding ready jobs (claim latency)")
    p.add_argument("--busy", type=int, default=100_000, help="held jobs of the one busy key (worst case)")
    p.add_argument("--samples", type=int, default=300, help="claims timed per claim case and round")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the claim cases, alternated")
    p.add_argument("--n", type=int, default=10_000, help="jobs per drain")
    p.add_argument("--drain-keys", type=int, default=1_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--bound-keys", type=int, default=50, help="keys of the binding per-key rate case")
    p.add_argument("--bound-limit", type=int, default=10, help="key_rate_limit per 1000 ms of that case")
    p.add_argument("--logs", default="/tmp/fq-bench-keys")
    p.add_argument("--out", help="write the results as JSON here")
    return p.parse_args(argv)


def _reset() -> None:
    from django.db import connection

    from django_fq.models import ConcurrencyKey, IdempotencyToken, Job, KeyClaim, Lease, Queue, QueueCounter

    models = (Lease, IdempotencyToken, QueueCounter, ConcurrencyKey, KeyClaim, Job, Queue)
    tables = ", ".join(m._meta.db_table for m in models)
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
        cur.execute("TRUNCATE django_fq_claim_floor")


def _fill(queue: str, items: list[dict]) -> None:
    from django_fq import services

    for start in range(0, len(items), ENQUEUE_BATCH):
        services.enqueue_many(queue, items[start : start + ENQUEUE_BATCH])


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ANALYZE django_fq_job")
        cur.execute("ANALYZE django_fq_key")


def claim_case(case: str, args) -> dict:
    """Fill ``CLAIM_QUEUE`` for ``case``, then time ``args.samples`` one-job claims (ms)."""
    from django_fq import services

    _reset()
    services.configure(
        CLAIM_QUEUE,
        visibility_ms=600_000,
        key_concurrency=0 if case in ("none", "keyrate") else 1,
        key_rate_limit=1000 if case == "keyrate" else 0,
    )
    if case == "none":
        _fill(CLAIM_QUEUE, [{"payload": i} for i in range(args.ready)])
    elif case in ("keys", "keyrate"):
        per = max(1, args.ready // args.keys)
        _fill(CLAIM_QUEUE, [{"payload": i, "concurrency_key": f"k{i % args.keys}"} for i in range(args.keys * per)])
    else:  # busy: one key's held jobs first in claim order, then one job of each other key
        _fill(CLAIM_QUEUE, [{"payload": i, "concurrency_key": "busy"} for i in range(args.busy)])
        _fill(CLAIM_QUEUE, [{"payload": i, "concurrency_key": f"k{i}"} for i in range(args.keys)])
    _analyze()
    times = []
    for _ in range(args.samples):
        t0 = time.perf_counter()
        got = services.claim(CLAIM_QUEUE, count=1)
        times.append((time.perf_counter() - t0) * 1000)
        if not got:
            raise SystemExit(f"claim case {case}: nothing to claim after {len(times)} claims")
    times.sort()
    return {
        "case": case,
        "median_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 3),
        "samples": len(times),
    }


def drain_case(case: str, args, i: int) -> dict:
    """Enqueue ``args.n`` no-op jobs (keyed or not), drain them with one burst worker; the steady rate."""
    from django.db import connection

    from django_fq import services

    _reset()
    n = args.n
    services.configure(
        QUEUE,
        key_concurrency=1 if case == "keyed" else 0,
        key_rate_limit={"keyrate": 1_000_000, "bound": args.bound_limit}.get(case, 0),
        rate_window_ms=1000,
    )
    if case in ("keyed", "keyrate"):
        _fill(QUEUE, [{"payload": j, "concurrency_key": f"c{j % args.drain_keys}"} for j in range(n)])
    elif case == "bound":
        n = args.bound_keys * args.bound_limit * 4
        _fill(QUEUE, [{"payload": j, "concurrency_key": f"c{j % args.bound_keys}"} for j in range(n)])
    else:
        _fill(QUEUE, [{"payload": j} for j in range(n)])
    _analyze()
    connection.close()
    log = os.path.join(args.logs, f"drain{i}_{case}.log")
    cmd = [sys.executable, "-m", "django", "fq_worker", "--queue", QUEUE, "--burst", "--no-progress",
           "--concurrency", str(args.concurrency)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    if case == "bound":
        # Not --burst: a burst worker ends once no job is ready, and a key out of tokens has none
        # ready until its next token frees. Stopped (SIGTERM) once every job has succeeded.
        cmd.remove("--burst")
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        if case == "bound":
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
            give_up = time.monotonic() + 300
            while _succeeded() < n and time.monotonic() < give_up and proc.poll() is None:
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        else:
            code = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
        wall = time.perf_counter() - t0
    with connection.cursor() as cur:
        cur.execute("SELECT COUNT(*), MIN(finished_at), MAX(finished_at) FROM django_fq_job WHERE state = 'succeeded'")
        done, first, last = cur.fetchone()
        cur.execute("SELECT concurrency_key, claimed_at FROM django_fq_job WHERE state = 'succeeded'")
        claimed = cur.fetchall()
    connection.close()
    if code != 0 or done != n:
        raise SystemExit(f"drain {case}: {done} of {n} succeeded, exit {code}; see {log}")
    steady = (done - 1) / ((last - first) / 1000) if last > first else float("nan")
    row = {"case": case, "n": done, "steady": round(steady, 1), "wall_s": round(wall, 2)}
    if case == "bound":
        instants = sorted(at for _, at in claimed)
        span = instants[-1] - instants[0]
        by_key: dict = {}
        for key, at in claimed:
            by_key.setdefault(key, []).append(at)
        row["claim_span_ms"] = span
        row["share_of_allowed"] = round(3000 / span, 3) if span else float("nan")
        row["busiest_window"] = max(_most_in_window(v, 1000) for v in by_key.values())
    return row


def _succeeded() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM django_fq_job WHERE state = 'succeeded'")
        done = cur.fetchone()[0]
    connection.close()
    return done


def _most_in_window(instants: list[int], window_ms: int) -> int:
    instants = sorted(instants)
    most, lo = 0, 0
    for hi, t in enumerate(instants):
        while instants[lo] <= t - window_ms:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.logs, exist_ok=True)
    pgdb.fresh(args.db_name)
    from django.db import connection

    started = time.perf_counter()
    claims: list[dict] = []
    drains: list[dict] = []
    try:
        for r in range(args.rounds):
            for case in ("none", "keys") if r % 2 == 0 else ("keys", "none"):
                claims.append(claim_case(case, args))
                print(json.dumps(claims[-1]), flush=True)
        claims.append(claim_case("busy", args))
        print(json.dumps(claims[-1]), flush=True)
        for case in ("keyrate", "none", "keyrate"):
            claims.append(claim_case(case, args))
            print(json.dumps(claims[-1]), flush=True)
        for i, case in enumerate(("plain", "keyed", "keyrate", "bound", "keyrate", "keyed", "plain")):
            drains.append(drain_case(case, args, i))
            print(json.dumps(drains[-1]), flush=True)
    finally:
        connection.close()
        pgdb.drop(args.db_name)

    def med(rows, case, field):
        return statistics.median(r[field] for r in rows if r["case"] == case)

    summary = {
        "claim_none_median_ms": med(claims, "none", "median_ms"),
        "claim_keys_median_ms": med(claims, "keys", "median_ms"),
        "claim_busy_median_ms": med(claims, "busy", "median_ms"),
        "drain_plain_steady": med(drains, "plain", "steady"),
        "drain_keyed_steady": med(drains, "keyed", "steady"),
        "claim_keyrate_median_ms": med(claims, "keyrate", "median_ms"),
        "drain_keyrate_steady": med(drains, "keyrate", "steady"),
        "bound_share_of_allowed": med(drains, "bound", "share_of_allowed"),
        "bound_busiest_window": med(drains, "bound", "busiest_window"),
        "wall_s": round(time.perf_counter() - started, 1),
        "loadavg": os.getloadavg(),
    }
    summary["claim_keys_ratio"] = round(summary["claim_keys_median_ms"] / summary["claim_none_median_ms"], 2)
    summary["claim_busy_ratio"] = round(summary["claim_busy_median_ms"] / summary["claim_none_median_ms"], 2)
    summary["drain_keyed_share"] = round(summary["drain_keyed_steady"] / summary["drain_plain_steady"], 2)
    summary["claim_keyrate_ratio"] = round(summary["claim_keyrate_median_ms"] / summary["claim_none_median_ms"], 2)
    summary["drain_keyrate_share"] = round(summary["drain_keyrate_steady"] / summary["drain_plain_steady"], 2)
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "claims": claims, "drains": drains, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
