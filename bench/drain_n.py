#!/usr/bin/env python
"""Why a 1-process drain slows down with N: a bulk fill of N no-op jobs, one drain, a time series.

    PYTHONPATH=. .venv/bin/python bench/drain_n.py --n 200000 [--pg-name fq_bench_drain_n]
        [--setup-sql "ALTER TABLE …"] [--out FILE.json]

PostgreSQL only (``FQ_BENCH_PG_*`` as in ``bench/settings.py``; the database is
dropped and re-created). The drain is the suite's own (``bench/suite.py``:
``fq_worker --burst --concurrency 256``, the 50 ms observer), after one
``enqueue_many`` fill. Beside it a sampler connection records, every second,
``pg_stat_user_tables`` of the job, lease, counter and floor tables (live and
dead tuples, autovacuum and autoanalyze counts) and the size of every index of
the job and lease tables. Afterwards the script reports the jobs finished in
each tenth of the drain (from ``finished_at``, the database clock), so a rate
that falls *during* the drain can be told from one that is lower from the
start.

``--setup-sql`` runs after the migrations (repeatable): an A/B variant, e.g.
per-table autovacuum settings, without a migration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench import suite as bsuite  # noqa: E402

TABLES = ("django_fq_job", "django_fq_lease", "django_fq_counter", "django_fq_claim_floor")


def sample(conn) -> dict:
    """One sample of the tables' statistics and the job and lease indexes' sizes (pages)."""
    cur = conn.cursor()
    cur.execute(
        "SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, n_tup_hot_upd, n_tup_upd, "
        "seq_scan, seq_tup_read, idx_scan, idx_tup_fetch "
        "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        (list(TABLES),),
    )
    tables = {
        r[0]: dict(
            zip(
                (
                    "live",
                    "dead",
                    "autovacuums",
                    "autoanalyzes",
                    "hot",
                    "upd",
                    "seq_scan",
                    "seq_tup_read",
                    "idx_scan",
                    "idx_tup_fetch",
                ),
                r[1:],
                strict=True,
            )
        )
        for r in cur.fetchall()
    }
    cur.execute(
        "SELECT c.relname, c2.relname, pg_relation_size(c2.oid) / 8192 FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_class c2 ON c2.oid = i.indexrelid "
        "WHERE c.relname IN ('django_fq_job', 'django_fq_lease')"
    )
    indexes = {r[1]: r[2] for r in cur.fetchall()}
    cur.execute("SELECT pg_relation_size('django_fq_job') / 8192, pg_relation_size('django_fq_lease') / 8192")
    heap = cur.fetchone()
    # CPU seconds of every backend of this database, by what it last ran (observer, worker, sampler).
    cur.execute(
        "SELECT pid, left(query, 100) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    )
    backends = {pid: {"query": q, "cpu_s": cpu_seconds(pid)} for pid, q in cur.fetchall()}
    # Server-wide (other databases add to them): buffers written by backends themselves (a full
    # shared_buffers evicting dirty pages), and their WAL flushes.
    cur.execute(
        "SELECT buffers_backend, buffers_backend_fsync, buffers_alloc, buffers_clean, buffers_checkpoint "
        "FROM pg_stat_bgwriter"
    )
    bgw = dict(zip(("backend", "backend_fsync", "alloc", "clean", "checkpoint"), cur.fetchone(), strict=True))
    return {
        "t": time.time(),
        "tables": tables,
        "index_pages": indexes,
        "heap_pages": {"job": heap[0], "lease": heap[1]},
        "backends": backends,
        "bgwriter": bgw,
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process ``pid`` (s), from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--pg-name", default="fq_bench_drain_n")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--setup-sql", action="append", default=[])
    p.add_argument("--worker-arg", action="append", default=[])
    p.add_argument(
        "--poll",
        type=float,
        default=bsuite.DRAIN_POLL_S,
        help="the drain observer's poll interval, s (the suite's and the anchors': 0.05)",
    )
    p.add_argument(
        "--auto-explain",
        type=float,
        default=0.0,
        metavar="RATE",
        help="log the plans (ANALYZE, BUFFERS) of this fraction of the statements to the server log",
    )
    p.add_argument("--keep", action="store_true", help="keep the database")
    p.add_argument(
        "--ordered-uids",
        action="store_true",
        help="experiment: fill with job ids that sort in enqueue order (ms time, index, 64 random bits)",
    )
    p.add_argument("--out")
    a = p.parse_args(argv)
    out = a.out or f"/tmp/drain_n_{int(time.time())}.json"
    logs = out + ".logs"
    args = bsuite.parse_args(
        [
            "--db",
            "postgres",
            "--out",
            out,
            "--logs",
            logs,
            "--n",
            str(a.n),
            "--reps",
            "1",
            "--pg-name",
            a.pg_name,
            "--concurrency",
            str(a.concurrency),
            "--phases",
            "drain",
            *(f"--worker-arg={w}" for w in a.worker_arg),
        ]
    )
    bsuite.DRAIN_POLL_S = a.poll
    info = bsuite.prepare_environment(args)
    s = bsuite.Suite(args, info)
    import psycopg

    sd = s.connection.settings_dict
    conn = psycopg.connect(host=sd["HOST"], port=sd["PORT"], user=sd["USER"], dbname=sd["NAME"], autocommit=True)
    for sql in a.setup_sql:
        conn.execute(sql)
    if a.auto_explain:
        # New connections of this database only (the worker's): the server log gets the plans.
        for setting in (
            "session_preload_libraries = 'auto_explain'",
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_nested_statements = on",
            f"auto_explain.sample_rate = {a.auto_explain}",
        ):
            conn.execute(f'ALTER DATABASE "{a.pg_name}" SET {setting}')
    load0 = os.getloadavg()
    if a.ordered_uids:
        import secrets

        from django_fq.storage import postgres as pgstore

        def ordered(n: int) -> list[str]:
            head = f"{time.time_ns() // 1_000_000:011x}"
            rand = secrets.token_bytes(8 * n).hex()
            return [f"{head}{i:05x}{rand[16 * i : 16 * i + 16]}" for i in range(n)]

        pgstore.new_uids = ordered
    s.enqueue_bulk(0)
    # As a table in use would be: statistics, and the fill's visibility map (not what the drain measures).
    conn.execute("VACUUM ANALYZE django_fq_job")
    samples, stop = [sample(conn)], threading.Event()

    def sampler():
        c = psycopg.connect(host=sd["HOST"], port=sd["PORT"], user=sd["USER"], dbname=sd["NAME"], autocommit=True)
        while not stop.wait(1.0):
            samples.append(sample(c))
        c.close()

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    s.drain(0, 1)
    stop.set()
    th.join()
    samples.append(sample(conn))
    rec = s.records[-1]
    cur = conn.cursor()
    # Jobs finished in each tenth of the drain (first to last finished_at), empty tenths included.
    cur.execute(
        "WITH b AS (SELECT width_bucket(finished_at, (SELECT min(finished_at) FROM django_fq_job), "
        "(SELECT max(finished_at) FROM django_fq_job) + 1, 10) AS b FROM django_fq_job) "
        "SELECT g, (SELECT count(*) FROM b WHERE b.b = g) FROM generate_series(1, 10) AS g ORDER BY g"
    )
    deciles = [{"bucket": b, "jobs": n} for b, n in cur.fetchall()]
    span = rec["first_to_last_ms"] / 1000 / 10
    # CPU of each backend over the drain (first to last sample it was seen in), by role.
    first_seen: dict = {}
    last_seen: dict = {}
    observers = set()
    for smp in samples:
        for pid, b in smp.get("backends", {}).items():
            if "WHERE state IN ('queued', 'running')" in b["query"]:
                observers.add(pid)
            if b["cpu_s"] is None:
                continue
            first_seen.setdefault(pid, b["cpu_s"])
            last_seen[pid] = b["cpu_s"]
    server_cpu = {"observer": 0.0, "worker": 0.0}
    for pid, cpu in last_seen.items():
        server_cpu["observer" if pid in observers else "worker"] += cpu - first_seen[pid]
    worker_cpu = None
    tf = rec["mem"][0]["log"] + ".time"
    if os.path.exists(tf):
        with open(tf) as f:
            t = dict(line.strip().split(": ", 1) for line in f if ": " in line)
        worker_cpu = float(t["User time (seconds)"]) + float(t["System time (seconds)"])
    result = {
        "n": a.n,
        "poll_s": a.poll,
        "setup_sql": a.setup_sql,
        "steady_rate": rec["steady_rate"],
        "wall_rate": rec["wall_rate"],
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "jobs_by_tenth": [d["jobs"] for d in deciles],
        "rate_by_tenth": [round(d["jobs"] / span) if span > 0 else None for d in deciles],
        "server_cpu_us_per_job": {k: round(1e6 * v / a.n, 1) for k, v in server_cpu.items()},
        "worker_cpu_us_per_job": round(1e6 * worker_cpu / a.n, 1) if worker_cpu else None,
        "samples": samples,
        "record": rec,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    last = samples[-1]
    print(
        json.dumps(
            {
                "n": a.n,
                "poll": a.poll,
                "setup": a.setup_sql,
                "steady": round(rec["steady_rate"]),
                "wall_rate": round(rec["wall_rate"]),
                "load": [round(x, 1) for x in load0],
                "by_tenth": result["rate_by_tenth"],
                "server_cpu_us_per_job": result["server_cpu_us_per_job"],
                "worker_cpu_us_per_job": result["worker_cpu_us_per_job"],
                "bgwriter": {k: v - samples[0]["bgwriter"][k] for k, v in last["bgwriter"].items()},
                "heap_pages_end": last["heap_pages"],
                "job_end": last["tables"].get("django_fq_job"),
                "lease_end": last["tables"].get("django_fq_lease"),
                "index_pages_end": last["index_pages"],
                "out": out,
            },
            indent=None,
        )
    )
    conn.close()
    if not a.keep:
        bsuite.drop_pg_databases(a.pg_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
