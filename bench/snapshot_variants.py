"""Claim-scan and expired-lease-check variants after a churn, with or without a held snapshot (PostgreSQL).

    .venv/bin/python bench/snapshot_variants.py                 # 50,000 jobs, snapshot held
    .venv/bin/python bench/snapshot_variants.py --no-snapshot   # the same without it
    .venv/bin/python bench/snapshot_variants.py --plans         # print every plan too

The evidence behind "Claims under a long-running snapshot" in
docs/performance.md. It migrates django-fq into its own database
(``fq_bench_snapshot_variants``, dropped and created at the start, on the server the
suite uses), creates the queue ``exp`` and, while another connection holds a
``REPEATABLE READ`` transaction that read a row first (unless
``--no-snapshot``), makes ``--churn`` jobs go through the row versions a
claim and an ack leave: enqueued with ``services.enqueue_many`` in batches of
1,000, then per batch the claim's ``UPDATE`` to running, a lease inserted, the
lease deleted and the ack's ``UPDATE`` to succeeded, in plain SQL (far faster
than the services, same dead versions). Then 1,000 jobs are enqueued behind
them and 50 of them given live leases (deadline in 10 minutes), as a running
worker would hold.

Each variant is run once under ``EXPLAIN (ANALYZE, BUFFERS)`` and 30 times
timed, each in a transaction rolled back, so every run sees the same data.
Reported per variant: the shared buffers of the top plan node and the median
time in ms. The variants are candidate shapes of the claim's scan and of the
expired-lease check, not django-fq's statements as they are (those are in the
suite's ``snapshot`` phase plans).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DB = "fq_bench_snapshot_variants"
NOW = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"
BATCH = 1_000
READY = 1_000
LIVE_LEASES = 50
RUNS = 30

#: name -> SQL (parameters: q queue id, p and s the floor's priority and sequence number).
VARIANTS = {
    "claim scan as today": (
        f"SELECT seq FROM django_fq_job WHERE queue_id = %(q)s AND state = 'queued' AND run_at <= (SELECT {NOW}) "
        "ORDER BY priority DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED"
    ),
    # Above the floor's priority, at it from its sequence number on, below it: in claim order, and
    # the outer LIMIT stops pulling (and locking) once it has n rows.
    "claim scan with a keyset floor (three bands)": (
        f"WITH c AS (SELECT {NOW} AS t) SELECT seq FROM ("
        "SELECT seq FROM (SELECT seq FROM django_fq_job WHERE queue_id = %(q)s AND state = 'queued' "
        "AND priority > %(p)s AND run_at <= (SELECT t FROM c) ORDER BY priority DESC, seq LIMIT 1 "
        "FOR UPDATE SKIP LOCKED) AS above "
        "UNION ALL SELECT seq FROM (SELECT seq FROM django_fq_job WHERE queue_id = %(q)s AND state = 'queued' "
        "AND priority = %(p)s AND seq >= %(s)s AND run_at <= (SELECT t FROM c) ORDER BY seq LIMIT 1 "
        "FOR UPDATE SKIP LOCKED) AS at_floor "
        "UNION ALL SELECT seq FROM (SELECT seq FROM django_fq_job WHERE queue_id = %(q)s AND state = 'queued' "
        "AND priority < %(p)s AND run_at <= (SELECT t FROM c) ORDER BY priority DESC, seq LIMIT 1 "
        "FOR UPDATE SKIP LOCKED) AS below) AS u LIMIT 1"
    ),
    "expired-lease check as today (clock as a filter)": (
        f"SELECT EXISTS (SELECT 1 FROM django_fq_lease l WHERE l.queue_id = %(q)s AND l.deadline <= {NOW})"
    ),
    "expired-lease check, clock in an InitPlan (index condition)": (
        f"SELECT EXISTS (SELECT 1 FROM django_fq_lease l WHERE l.queue_id = %(q)s AND l.deadline <= (SELECT {NOW}))"
    ),
    "expired-lease check as MIN(deadline) <= now": (
        f"SELECT (SELECT MIN(deadline) FROM django_fq_lease l WHERE l.queue_id = %(q)s) <= {NOW}"
    ),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--churn", type=int, default=50_000, help="jobs processed before the measurements")
    p.add_argument("--no-snapshot", action="store_true", help="hold no snapshot during the churn")
    p.add_argument("--plans", action="store_true", help="print every plan")
    args = p.parse_args(argv)

    import psycopg

    host = os.environ.get("FQ_BENCH_PG_HOST", "127.0.0.1")
    port = os.environ.get("FQ_BENCH_PG_PORT", "5432")
    user = os.environ.get("FQ_BENCH_PG_USER", "postgres")
    with psycopg.connect(host=host, port=port, user=user, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DB}"')
    os.environ.update(DJANGO_SETTINGS_MODULE="bench.settings", FQ_BENCH_DB="postgres", FQ_BENCH_PG_NAME=DB)
    sys.path.insert(0, REPO)
    import django

    django.setup()
    from django.core.management import call_command

    from django_fq import services

    call_command("migrate", verbosity=0, interactive=False)
    conn = psycopg.connect(host=host, port=port, user=user, dbname=DB, autocommit=True)

    def run(sql, params=None):
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else None

    services.configure("exp")
    qid = run("SELECT id FROM django_fq_queue WHERE name = 'exp'")[0][0]
    holder = psycopg.connect(host=host, port=port, user=user, dbname=DB, autocommit=True)
    if not args.no_snapshot:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT id FROM django_fq_queue LIMIT 1").fetchall()
    t0 = time.time()
    for _ in range(args.churn // BATCH):
        services.enqueue_many("exp", [{"payload": {"i": i}} for i in range(BATCH)])
        seqs = [r[0] for r in run(
            "SELECT seq FROM django_fq_job WHERE queue_id = %s AND state = 'queued' ORDER BY priority DESC, seq "
            "LIMIT %s FOR UPDATE SKIP LOCKED", [qid, BATCH])]
        run(f"UPDATE django_fq_job SET state = 'running', attempts = attempts + 1, generation = generation + 1, "
            f"claimed_at = {NOW}, changed_at = {NOW} WHERE seq = ANY(%s)", [seqs])
        run(f"INSERT INTO django_fq_lease (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, "
            f"timeout_at, worker) SELECT s, %s, 1, md5(s::text), {NOW}, {NOW} + 1000, NULL, 'w' "
            f"FROM unnest(%s::bigint[]) AS s", [qid, seqs])
        run("DELETE FROM django_fq_lease WHERE job_id = ANY(%s)", [seqs])
        run(f"UPDATE django_fq_job SET state = 'succeeded', finished_at = {NOW}, changed_at = {NOW} "
            f"WHERE seq = ANY(%s)", [seqs])
    churn_s = time.time() - t0
    time.sleep(1.2)  # every churn lease's deadline (claim + 1,000 ms) is past
    services.enqueue_many("exp", [{"payload": {"i": i}} for i in range(READY)])
    live = [r[0] for r in run(
        "SELECT seq FROM django_fq_job WHERE queue_id = %s AND state = 'queued' ORDER BY seq DESC LIMIT %s",
        [qid, LIVE_LEASES])]
    run("UPDATE django_fq_job SET state = 'running' WHERE seq = ANY(%s)", [live])
    run(f"INSERT INTO django_fq_lease (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, timeout_at, "
        f"worker) SELECT s, %s, 1, md5(s::text), {NOW}, {NOW} + 600000, NULL, 'w' FROM unnest(%s::bigint[]) AS s",
        [qid, live])
    run("ANALYZE django_fq_job")
    run("ANALYZE django_fq_lease")
    # The floor a writer-kept design would hold here: the first live queued row's key.
    floor_p, floor_s = run(
        "SELECT priority, seq FROM django_fq_job WHERE queue_id = %s AND state = 'queued' "
        "ORDER BY priority DESC, seq LIMIT 1", [qid])[0]
    params = {"q": qid, "p": floor_p, "s": floor_s}
    mode = "no snapshot" if args.no_snapshot else "snapshot held"
    print(f"{args.churn:,} jobs processed in {churn_s:.1f} s, {mode}; load average {os.getloadavg()[0]:.1f}")
    for name, sql in VARIANTS.items():
        conn.execute("BEGIN")
        plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params).fetchall()]
        conn.execute("ROLLBACK")
        times = []
        for _ in range(RUNS):
            conn.execute("BEGIN")
            t = time.perf_counter()
            conn.execute(sql, params).fetchall()
            times.append(time.perf_counter() - t)
            conn.execute("ROLLBACK")
        buffers = next((line.strip() for line in plan if "Buffers:" in line), "Buffers: none")
        print(f"- {name}: {buffers}; median {statistics.median(times) * 1000:.3f} ms")
        if args.plans:
            print("\n".join("    " + line for line in plan))
    if not args.no_snapshot:
        holder.execute("COMMIT")
    holder.close()
    conn.close()
    from django.db import connections

    connections.close_all()
    with psycopg.connect(host=host, port=port, user=user, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
