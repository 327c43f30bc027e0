"""The floor of pickup latency on this machine: a bare LISTEN/NOTIFY queue in plain psycopg.

    .venv/bin/python bench/pickup_floor.py            # 30 samples
    .venv/bin/python bench/pickup_floor.py --k 100

Measured exactly like the suite's pickup latency (an idle worker; a random
0.3–1.3 s pause; t0; enqueue one job; an observer polls every 1 ms until the
job is recorded done), but the "queue" is the least a LISTEN/NOTIFY queue can
be, with none of django-fq's guarantees:

* enqueue: one autocommitted ``INSERT`` + ``pg_notify`` (a durable commit, as
  django-fq's enqueue is);
* worker: one process, no threads, no Django. It blocks on its LISTEN
  connection; on a notification it claims the oldest queued row with one
  ``UPDATE … FOR UPDATE SKIP LOCKED … RETURNING`` and marks it done with a
  second ``UPDATE`` (``synchronous_commit = off``, as django-fq's claims and
  acks). No lease, receipt, attempt count, counters, queue-full check or
  handler call.

The result is what any queue that claims and settles in separate round trips
pays on this machine before doing any work of its own; docs/performance.md
compares django-fq's pickup latency with it. The table lives in its own
database (``fq_bench_floor``, dropped and created at the start), on the
server the suite uses (``FQ_BENCH_PG_HOST`` / ``_PORT`` / ``_USER``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.suite import percentile

DB = "fq_bench_floor"
CHANNEL = "fq_bench_floor"


def dsn(dbname: str) -> str:
    host = os.environ.get("FQ_BENCH_PG_HOST", "127.0.0.1")
    port = os.environ.get("FQ_BENCH_PG_PORT", "5432")
    user = os.environ.get("FQ_BENCH_PG_USER", "postgres")
    return f"host={host} port={port} user={user} dbname={dbname}"


def worker() -> None:
    """Claim and finish one job per notification, until killed."""
    import psycopg

    listen = psycopg.connect(dsn(DB), autocommit=True)
    listen.execute(f"LISTEN {CHANNEL}")
    work = psycopg.connect(dsn(DB), autocommit=True)
    work.execute("SET synchronous_commit = off")
    claim = (
        "UPDATE floor_job SET state = 'running' WHERE id = (SELECT id FROM floor_job WHERE state = 'queued' "
        "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
    )
    for _note in listen.notifies():
        row = work.execute(claim, prepare=True).fetchone()
        if row:
            work.execute("UPDATE floor_job SET state = 'done', done_at = clock_timestamp() WHERE id = %s", row, prepare=True)


def main(argv=None) -> int:
    import psycopg

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=30, help="samples (default 30)")
    args = p.parse_args(argv)

    with psycopg.connect(dsn("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DB}"')
    client = psycopg.connect(dsn(DB), autocommit=True)
    client.execute(
        "CREATE TABLE floor_job (id bigserial PRIMARY KEY, state text NOT NULL, payload text NOT NULL, "
        "enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(), done_at timestamptz)"
    )
    client.execute("CREATE INDEX floor_job_queued ON floor_job (id) WHERE state = 'queued'")
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"])
    observer = psycopg.connect(dsn(DB), autocommit=True)
    enqueue = (
        "WITH x AS (INSERT INTO floor_job (state, payload) VALUES ('queued', %s) RETURNING id) "
        f"SELECT id, pg_notify('{CHANNEL}', '') FROM x"
    )
    done = "SELECT state, EXTRACT(EPOCH FROM done_at - enqueued_at) * 1000 FROM floor_job WHERE id = %s"
    total, calls, db_side = [], [], []
    try:
        time.sleep(1.5)  # the worker connects and goes idle
        rng = random.Random(12345)
        for k in range(args.k):
            time.sleep(rng.uniform(0.3, 1.3))
            t0 = time.perf_counter()
            job = client.execute(enqueue, (json.dumps({"k": k}),), prepare=True).fetchone()[0]
            calls.append(time.perf_counter() - t0)
            give_up = t0 + 10
            while True:
                state, ms = observer.execute(done, (job,), prepare=True).fetchone()
                if state == "done":
                    break
                if time.perf_counter() > give_up:
                    raise SystemExit(f"job {job} not done after 10 s")
                time.sleep(0.001)
            total.append(time.perf_counter() - t0)
            db_side.append(float(ms))
    finally:
        child.kill()
        child.wait()
        for conn in (client, observer):
            conn.close()
        with psycopg.connect(dsn("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    ms = [t * 1000 for t in total]
    print(f"bare LISTEN/NOTIFY queue, {args.k} samples (ms): median {statistics.median(ms):.2f}, p95 {percentile(ms, 0.95):.2f}")
    print(f"  of which the enqueue call: median {statistics.median(calls) * 1000:.2f}")
    print(f"  database clock, enqueued → done: median {statistics.median(db_side):.2f}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
