#!/usr/bin/env python
"""The database's ceiling for a drain: the storage layer's claim and ack statements, no worker.

    PYTHONPATH=. .venv/bin/python bench/sql_ceiling.py [--n 20000] [--batches 1,100,500]
        [--explain-jobs 2000] [--pg-name fq_bench_ceiling] [--out FILE.json]

PostgreSQL only (127.0.0.1:5432, user postgres, trust; ``FQ_BENCH_PG_*`` as in
``bench/settings.py``). The database ``--pg-name`` is dropped and re-created,
and dropped again at the end unless ``--keep``.

For each batch size *b* the script fills ``--n`` ready no-op jobs (one bulk
enqueue per 5,000), then claims *b* jobs with
:meth:`~django_fq.storage.base.Store.claim_statement` and acks them with
:meth:`~django_fq.storage.base.Store.ack_matching` (the two statements a
PostgreSQL drain runs per batch, with the relaxed commit the worker uses) until
the queue is empty, and reports:

* ``jobs_s``: jobs claimed and acked per second of wall time (one connection,
  the Python side reduced to building the JSON of the acks);
* ``wal_bytes_job``: ``pg_current_wal_lsn()`` difference over the loop per job
  (the server's whole WAL: other sessions on the server add to it);
* per statement, from ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of every statement
  over a second fill of ``--explain-jobs`` jobs: server time (ms), WAL records,
  full-page images and bytes, shared buffers hit / read / dirtied, per job;
* per table, rows inserted / updated (of which HOT) / deleted per job, from
  ``pg_stat_user_tables`` over the explained run.

The numbers are written to ``docs/performance.md`` ("What the database does
per job"). Claim receipts are random hex digests here: the receipts' secrets
are the worker's business, the database only compares digests.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# The suite's admin connection (FQ_BENCH_PG_*), importable once the repository is on the path.
from bench.suite import pg_admin  # noqa: E402

QUEUE = "ceiling"
TABLES = ("django_fq_job", "django_fq_lease", "django_fq_counter")
EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "
#: The claim's payload cap (bytes): the services' own (django_fq.services.leases.CLAIM_PAYLOAD_CAP_BYTES).
CAP = 32 * 1024 * 1024


class Explaining:
    """A cursor that runs every statement under ``EXPLAIN (ANALYZE, …)`` and keeps the plans' totals."""

    def __init__(self, cur, sink: list):
        self.cur, self.sink = cur, sink

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cur.close()

    def execute(self, sql, params=None):
        self.cur.execute(EXPLAIN + sql, params)
        self.sink.append(self.cur.fetchone()[0][0])

    def fetchall(self):
        return []  # the claimed jobs are read back by their digests (see claimed_by_hash)


#: What :func:`plan_totals` sums: the plan nodes' counters, and their time ("ms", all loops).
KEYS = ("ms", "WAL Records", "WAL FPI", "WAL Bytes", "Shared Hit Blocks", "Shared Read Blocks", "Shared Dirtied Blocks")


def _value(node: dict, key: str) -> float:
    if key == "ms":  # a node's time is per loop
        return node.get("Actual Total Time", 0) * node.get("Actual Loops", 0)
    return node.get(key, 0)


def _own(node: dict, key: str) -> float:
    """``key`` of ``node`` less its children's: what the node did itself.

    A ``CTE Scan`` does nothing itself (the first scan of a CTE runs the CTE,
    whose own nodes count that work), and a CTE's definition is not subtracted
    from the node it hangs under: data-modifying CTEs nobody reads run after
    the main query, outside every other node.
    """
    if node["Node Type"] == "CTE Scan":
        return 0
    kids = [c for c in node.get("Plans", []) if not str(c.get("Subplan Name", "")).startswith("CTE ")]
    return _value(node, key) - sum(_value(c, key) for c in kids)


def _parts(node: dict, part: str):
    """``(part, node)`` for every node, ``part`` being the name of the CTE the node belongs to ("main": none)."""
    name = str(node.get("Subplan Name", ""))
    if name.startswith("CTE "):
        part = name[4:]
    yield part, node
    for c in node.get("Plans", []):
        yield from _parts(c, part)


def plan_totals(plans: list[dict]) -> dict:
    """Sums over ``EXPLAIN (FORMAT JSON)`` results of one statement: totals and per CTE.

    ``{"all": {key: total}, "parts": {cte: {key: total}}}`` over :data:`KEYS`;
    "ms" of "all" is the server's execution time, of a part the time of its
    own nodes (instrumented: slower than without EXPLAIN, in proportion).
    """
    out = {"all": dict.fromkeys(KEYS, 0.0), "parts": {}}
    for p in plans:
        out["all"]["ms"] += p["Execution Time"]
        for part, node in _parts(p["Plan"], "main"):
            mine = out["parts"].setdefault(part, dict.fromkeys(KEYS, 0.0))
            for k in KEYS:
                v = _own(node, k)
                mine[k] += v
                if k != "ms":
                    out["all"][k] += v
    return out


def table_stats(conn) -> dict:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
            "WHERE relname = ANY(%s)",
            [list(TABLES)],
        )
        return {r[0]: r[1:] for r in cur.fetchall()}


def fill(n: int) -> None:
    from django_fq.services.enqueue import enqueue_many

    done = 0
    while done < n:
        k = min(5000, n - done)
        enqueue_many(QUEUE, [{"payload": {"i": done + i}} for i in range(k)])
        done += k
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE django_fq_job")
        cur.execute("VACUUM ANALYZE django_fq_lease")


def wal_lsn(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cur.fetchone()[0])


def claimed_by_hash(conn, hashes: list[str]) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT j.uid, l.generation, l.receipt_hash FROM django_fq_lease l JOIN django_fq_job j ON j.seq = l.job_id "
            "WHERE l.receipt_hash = ANY(%s)",
            [hashes],
        )
        return cur.fetchall()


def acks_json(claimed: list[tuple]) -> str:
    return json.dumps([{"uid": u, "gen": g, "hash": h, "result": None, "args": ""} for u, g, h in claimed])


def drain(store, conn, b: int, *, explain: bool, limit: int | None = None) -> dict:
    """Claim ``b`` and ack them until the queue is empty (or ``limit`` jobs are done); timings, or the plans' totals when ``explain``."""
    claim_plans: list = []
    ack_plans: list = []
    from django_fq.services import leases

    real_hot = store.hot_cursor
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM django_fq_queue WHERE name = %s", [QUEUE])
        qid = cur.fetchone()[0]
    jobs = rounds = 0
    t_claim = t_ack = 0.0
    while limit is None or jobs < limit:
        hashes = [secrets.token_hex(32) for _ in range(b)]
        if explain:
            store.hot_cursor = lambda c, **kw: Explaining(real_hot(c, **kw), claim_plans)
        t0 = time.perf_counter()
        rows = store.claim_statement(
            conn, queue_name=QUEUE, count=b, visibility_ms=None, worker="ceiling", after_reap=False, cap=CAP,
            hashes=hashes, relaxed=True,
        )  # fmt: skip
        t1 = time.perf_counter()
        if explain:
            store.hot_cursor = real_hot
            claimed = claimed_by_hash(conn, hashes)
        else:
            if rows and rows[0][4] is None:
                raise SystemExit("the claim took the slower path (a concurrency limit or an expired lease)")
            claimed = [(r[6], r[8], hashes[r[15] - 1]) for r in rows if r[5] is not None]
        if not claimed:
            store.hot_cursor = real_hot
            break
        store.hot_cursor = real_hot
        # Every FLOOR_RAISE_JOBS jobs claimed, a raise of the claim floor, as the worker's claims make.
        leases._claimed(conn, qid, len(claimed))
        if explain:
            store.hot_cursor = lambda c, **kw: Explaining(real_hot(c, **kw), ack_plans)
        t2 = time.perf_counter()
        store.ack_matching(conn, queue_name=QUEUE, requests_json=acks_json(claimed), relaxed=True)
        t3 = time.perf_counter()
        store.hot_cursor = real_hot
        t_claim += t1 - t0
        t_ack += t3 - t2
        jobs += len(claimed)
        rounds += 1
    return {"jobs": jobs, "rounds": rounds, "claim_s": t_claim, "ack_s": t_ack,
            "plans": [claim_plans[len(claim_plans) // 2], ack_plans[len(ack_plans) // 2]] if ack_plans else None,
            "claim": plan_totals(claim_plans) if explain else None,
            "ack": plan_totals(ack_plans) if explain else None}  # fmt: skip


def per_job(d: dict | None, jobs: int) -> dict | None:
    if d is None:
        return None
    return {"all": {k: v / jobs for k, v in d["all"].items()},
            "parts": {p: {k: v / jobs for k, v in t.items()} for p, t in d["parts"].items()}}  # fmt: skip


def print_parts(b: int, label: str, rec: dict) -> None:
    for name in ("claim", "ack"):
        for part, p in [("all", rec[name]["all"]), *sorted(rec[name]["parts"].items())]:
            if part != "all" and not (p["WAL Records"] or p["Shared Hit Blocks"] > 0.05):
                continue
            print(f"b={b:4d} {label} {name:5s} {part:7s} per job: {1000 * p['ms']:6.1f} us, WAL {p['WAL Records']:5.2f} rec "
                  f"{p['WAL FPI']:5.3f} FPI {p['WAL Bytes']:6.0f} B, buffers hit {p['Shared Hit Blocks']:5.1f} "
                  f"read {p['Shared Read Blocks']:4.2f} dirtied {p['Shared Dirtied Blocks']:5.2f}")  # fmt: skip


def start_and_end(store, conn, args) -> list[dict]:
    """Fill ``--explain-at-n`` jobs; explain the first and the last ``--explain-jobs`` of their drain.

    What a long drain does to the statements: the same claim and ack, on a
    queue just filled (a fresh claim index, a table of ready rows) and on the
    same queue near its end (the rows and index entries the drain left).
    """
    out = []
    k = args.explain_jobs
    for b in [int(x) for x in args.batches.split(",")]:
        fill(args.explain_at_n)
        first = drain(store, conn, b, explain=True, limit=k)
        t0 = time.perf_counter()
        mid = drain(store, conn, b, explain=False, limit=args.explain_at_n - 2 * k)
        mid_s = time.perf_counter() - t0
        last = drain(store, conn, b, explain=True)
        rec = {"batch": b, "at_n": args.explain_at_n, "middle_jobs_s": mid["jobs"] / mid_s,
               "first": {"jobs": first["jobs"], "claim": per_job(first["claim"], first["jobs"]),
                         "ack": per_job(first["ack"], first["jobs"]), "plans": first["plans"]},
               "last": {"jobs": last["jobs"], "claim": per_job(last["claim"], last["jobs"]),
                        "ack": per_job(last["ack"], last["jobs"]), "plans": last["plans"]}}  # fmt: skip
        print(f"b={b:4d} N={args.explain_at_n}: unexplained middle {rec['middle_jobs_s']:,.0f} jobs/s", flush=True)
        print_parts(b, "first", rec["first"])
        print_parts(b, "last ", rec["last"])
        out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="jobs per timed drain")
    ap.add_argument("--batches", default="1,100,500", help="claim/ack batch sizes, comma-separated")
    ap.add_argument("--explain-jobs", type=int, default=2_000, help="jobs per explained drain")
    ap.add_argument("--pg-name", default="fq_bench_ceiling")
    ap.add_argument("--reps", type=int, default=1, help="timed drains per batch size")
    ap.add_argument("--keep", action="store_true", help="keep the database")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument(
        "--setup-sql",
        action="append",
        default=[],
        help="SQL run after migrating (repeatable): to measure a schema variant, e.g. an index dropped",
    )
    ap.add_argument(
        "--explain-at-n",
        type=int,
        default=0,
        metavar="N",
        help="also fill N jobs and explain the first and the last --explain-jobs of their drain (each batch size)",
    )
    args = ap.parse_args()

    os.environ["FQ_BENCH_DB"] = "postgres"
    os.environ["FQ_BENCH_PG_NAME"] = args.pg_name
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    pg_admin(f'DROP DATABASE IF EXISTS "{args.pg_name}"')
    pg_admin(f'CREATE DATABASE "{args.pg_name}"')
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from django_fq import storage

        call_command("migrate", verbosity=0, interactive=False)
        connection.ensure_connection()
        with connection.cursor() as cur:
            for sql in args.setup_sql:
                cur.execute(sql)
        store = storage.for_connection(connection)
        results = []
        for b in [int(x) for x in args.batches.split(",")]:
            for rep in range(args.reps):
                fill(args.n)
                w0 = wal_lsn(connection)
                t0 = time.perf_counter()
                timed = drain(store, connection, b, explain=False)
                wall = time.perf_counter() - t0
                wal = wal_lsn(connection) - w0
                n = timed["jobs"]
                results.append({"batch": b, "rep": rep, "jobs": n, "jobs_s": n / wall, "wall_s": wall,
                                "claim_us_job": 1e6 * timed["claim_s"] / n, "ack_us_job": 1e6 * timed["ack_s"] / n,
                                "wal_bytes_job": wal / n})  # fmt: skip
                print(f"b={b:4d} rep {rep}: {n / wall:9,.0f} jobs/s  claim {1e6 * timed['claim_s'] / n:6.1f} us/job  "
                      f"ack {1e6 * timed['ack_s'] / n:6.1f} us/job  WAL {wal / n:6.0f} B/job (whole server)", flush=True)  # fmt: skip
            fill(args.explain_jobs)
            s0 = table_stats(connection)
            ex = drain(store, connection, b, explain=True)
            s1 = table_stats(connection)
            n = ex["jobs"]
            rows = {t: dict(zip(("ins", "upd", "hot_upd", "del"), [(a - z) / n for a, z in zip(s1[t], s0[t], strict=True)], strict=True))
                    for t in TABLES}  # fmt: skip
            rec = {"batch": b, "explained_jobs": n, "claim": per_job(ex["claim"], n), "ack": per_job(ex["ack"], n),
                   "rows": rows}  # fmt: skip
            results.append(rec)
            for name in ("claim", "ack"):
                for part, p in [("all", rec[name]["all"]), *sorted(rec[name]["parts"].items())]:
                    if part != "all" and not (p["WAL Records"] or p["Shared Hit Blocks"] > 0.05):
                        continue
                    print(f"b={b:4d} {name:5s} {part:7s} per job: {1000 * p['ms']:6.1f} us, WAL {p['WAL Records']:5.2f} rec "
                          f"{p['WAL FPI']:5.3f} FPI {p['WAL Bytes']:6.0f} B, buffers hit {p['Shared Hit Blocks']:5.1f} "
                          f"read {p['Shared Read Blocks']:4.2f} dirtied {p['Shared Dirtied Blocks']:5.2f}")  # fmt: skip
            print("          rows per job: " + "; ".join(
                f"{t.removeprefix('django_fq_')} " + " ".join(f"{k} {v:.2f}" for k, v in r.items() if v)
                for t, r in rows.items()))  # fmt: skip
        if args.explain_at_n:
            results += start_and_end(store, connection, args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"n": args.n, "setup_sql": args.setup_sql, "results": results}, f, indent=1)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            pg_admin(f'DROP DATABASE IF EXISTS "{args.pg_name}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
