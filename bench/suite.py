"""The Django side of the benchmark: every measurement on ONE database.

``bench/run.py`` starts this module once per database (``python -m bench.suite
--db postgres|sqlite|mariadb ...``) and merges the JSON files it writes. It:

1. creates a fresh database (PostgreSQL and MariaDB: drops and re-creates
   ``fq_bench_suite``; SQLite: a new WAL file in a temporary directory) and
   migrates it;
2. repeats ``--reps`` times, resetting the tables before every phase:
   enqueue one at a time, then drain those jobs with 1 worker process; bulk
   enqueue, then drain with 2 worker processes; pickup latency of an idle
   worker; claim latency at a small and a large queue, and with a large number
   of finished rows retained (one database per scenario, sampled in turn, with
   the query plans of the claim);
3. writes every raw record, the medians and the environment (load average,
   versions, git commit) to ``--out``.

Workers are always the real ``manage.py fq_worker`` command in their own
processes, with ``bench.settings`` (no-op handler for queue ``bench``).
Times of the jobs (``enqueued_at``, ``finished_at``) are epoch ms read by the
database clock, exactly as django-fq records them.

The definitions follow ``../shared/bench/anchors/`` (the harness that measures
the other Django job queues) so the numbers can sit side by side; see
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE = "bench"  # served by bench/benchapp/fq_handlers.py
BATCH_QUEUE = "bench.batch"  # its batch handler (--phases batch)
CLAIM_QUEUE = "claimbench"  # never served by a worker: claimed by this process only
TIME_BIN = "/usr/bin/time"
DRAIN_POLL_S = 0.05  # the drain observer's poll interval (the anchors use 50 ms too)
LATENCY_POLL_S = 0.001  # the latency observer's poll interval (the anchors use 1 ms too)
LATENCY_SEED = 12345  # same gap sequence on every run (the anchors use this seed too)
CLAIM_VISIBILITY_MS = 600_000
PHASES = ("enqueue", "drain", "latency", "claim", "pool", "snapshot", "batch")
#: The snapshot phase: jobs enqueued, claimed and acked while another connection holds a
#: REPEATABLE READ snapshot (issue 15), in batches of SNAPSHOT_BATCH; then SNAPSHOT_READY
#: jobs are enqueued behind them and claimed one at a time.
SNAPSHOT_CHURN = 50_000
SNAPSHOT_BATCH = 1_000
SNAPSHOT_READY = 1_000
#: Lease visibility of the churn's claims: short, so the acked leases' deadlines have passed
#: when the expired-lease check is measured (as they have after any real backlog).
SNAPSHOT_CHURN_VIS_MS = 2_000
#: The snapshot phase's two modes: the same steps without and with the open snapshot.
SNAPSHOT_MODES = ("nosnap", "snap")
#: The pools the "pool" phase compares (fq_worker --pool), each draining the same jobs with one worker.
POOLS = ("threads", "processes")
#: Claim-latency scenarios: 10k ready; 1M ready; 10k ready + 1M finished (sizes from the arguments).
CLAIM_SCENARIOS = ("ready_small", "ready_large", "finished_large")

#: Every metric of ``summary`` (per database). ``tests/test_bench.py`` checks they are all there.
METRICS = (
    "enqueue_single_rate",
    "enqueue_bulk_rate",
    "drain1_steady",
    "drain1_wall_s",
    "drain1_wall_rate",
    "drain1_observed_steady",
    "drain2_steady",
    "drain2_wall_s",
    "drain2_wall_rate",
    "drain2_observed_steady",
    "latency_median_ms",
    "latency_p95_ms",
    "latency_db_median_ms",
    "latency_db_p95_ms",
    "claim1_ready_small_ms",
    "claim1_ready_large_ms",
    "claim1_finished_large_ms",
    "claim100_ready_small_ms",
    "claim100_ready_large_ms",
    "claim100_finished_large_ms",
    "claim1_ready_ratio",
    "claim1_finished_ratio",
    "claim100_ready_ratio",
    "claim100_finished_ratio",
    "worker_rss_mib",
    "pool_threads_c1_steady",
    "pool_processes_c1_steady",
    "pool_threads_c4_steady",
    "pool_processes_c4_steady",
    "snapshot_claim1_nosnap_ms",
    "snapshot_claim1_snap_ms",
    "snapshot_claim1_ratio",
)


# --- small helpers -------------------------------------------------------------------------------


def percentile(values, q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by the nearest-rank method (no interpolation)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    rank = max(1, min(len(xs), int(-(-q * len(xs) // 1))))  # ceil(q*n), clamped to 1..n
    return xs[rank - 1]


def plan_buffers(explained: dict) -> int | None:
    """Shared buffers (hit + read) the top node of each PostgreSQL plan touched, summed; None elsewhere."""
    import re

    total, found = 0, False
    for st in explained["statements"]:
        for line in st["plan"].splitlines():
            m = re.search(r"Buffers: shared (.*)", line)
            if m:
                total += sum(int(x) for x in re.findall(r"(?:hit|read)=(\d+)", m.group(1)))
                found = True
                break  # the first Buffers line is the top node's: it includes its children
    return total if found else None


def describe(values) -> dict:
    """median, min, max and count of the repetitions' values (None values are dropped)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def claim_alias(scenario: str) -> str:
    """The Django database alias of a claim scenario's own database (see bench/settings.py)."""
    return f"claim_{scenario}"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- database setup (before Django is imported) ------------------------------------------------


def pg_admin(sql: str) -> None:
    import psycopg

    conninfo = (
        f"host={os.environ.get('FQ_BENCH_PG_HOST', '127.0.0.1')} port={os.environ.get('FQ_BENCH_PG_PORT', '5432')} "
        f"user={os.environ.get('FQ_BENCH_PG_USER', 'postgres')} dbname=postgres"
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql)


def mysql_admin(sql: str) -> None:
    """Run one statement on the MariaDB/MySQL server as the bench user (no database selected)."""
    import MySQLdb

    conn = MySQLdb.connect(
        host=os.environ.get("FQ_BENCH_MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("FQ_BENCH_MYSQL_PORT", "3306")),
        user=os.environ.get("FQ_BENCH_MYSQL_USER", "root"),
        password=os.environ.get("FQ_BENCH_MYSQL_PASSWORD", ""),
    )
    try:
        conn.cursor().execute(sql)
    finally:
        conn.close()


def prepare_environment(args) -> dict:
    """Point bench.settings at a fresh, empty database; return what the report should say about it."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["FQ_BENCH_DB"] = args.db
    if args.db in ("postgres", "mariadb"):
        name = args.pg_name
        if not name.replace("_", "").isalnum():
            raise SystemExit(f"bad database name {name!r}")
    if args.db == "mariadb":
        os.environ["FQ_BENCH_MYSQL_NAME"] = name
        claim_dbs = {s: f"{name}_{claim_alias(s)}" for s in CLAIM_SCENARIOS}
        for db in (name, *claim_dbs.values()):
            mysql_admin(f"DROP DATABASE IF EXISTS `{db}`")
            mysql_admin(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
        os.environ["FQ_BENCH_CLAIM_DBS"] = ",".join(f"{s}={db}" for s, db in claim_dbs.items())
        return {"database": name, "claim_databases": claim_dbs}
    if args.db == "postgres":
        os.environ["FQ_BENCH_PG_NAME"] = name
        claim_dbs = {s: f"{name}_{claim_alias(s)}" for s in CLAIM_SCENARIOS}
        for db in (name, *claim_dbs.values()):
            pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            pg_admin(f'CREATE DATABASE "{db}"')
        os.environ["FQ_BENCH_CLAIM_DBS"] = ",".join(f"{s}={db}" for s, db in claim_dbs.items())
        return {"database": name, "claim_databases": claim_dbs}
    tmp = tempfile.mkdtemp(prefix="fq-bench-")
    path = os.path.join(tmp, "bench.sqlite3")
    os.environ["FQ_BENCH_SQLITE_PATH"] = path
    claim_dbs = {s: os.path.join(tmp, f"{claim_alias(s)}.sqlite3") for s in CLAIM_SCENARIOS}
    os.environ["FQ_BENCH_CLAIM_DBS"] = ",".join(f"{s}={db}" for s, db in claim_dbs.items())
    return {"database": path, "tmpdir": tmp, "claim_databases": claim_dbs}


def drop_pg_databases(name: str) -> None:
    """Drop a run's PostgreSQL databases: ``name`` and its claim-scenario databases (tests clean up with it)."""
    for db in (name, *(f"{name}_{claim_alias(s)}" for s in CLAIM_SCENARIOS)):
        pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def drop_mysql_databases(name: str) -> None:
    """Drop a run's MariaDB/MySQL databases: ``name`` and its claim-scenario databases (tests clean up with it)."""
    for db in (name, *(f"{name}_{claim_alias(s)}" for s in CLAIM_SCENARIOS)):
        mysql_admin(f"DROP DATABASE IF EXISTS `{db}`")


# --- the measurements (Django imported by main()) ----------------------------------------------


class Observer:
    """A plain DB-API connection, separate from Django's, that watches the jobs table.

    Like the anchors' observer: it is not the code under test, so it uses the
    driver directly (psycopg / mysqlclient / sqlite3, each in autocommit mode).
    """

    def __init__(self, vendor: str, settings_dict: dict):
        self.vendor = vendor
        if vendor == "postgresql":
            import psycopg

            self.conn = psycopg.connect(
                host=settings_dict["HOST"],
                port=settings_dict["PORT"],
                user=settings_dict["USER"],
                dbname=settings_dict["NAME"],
                autocommit=True,
                # Through a transaction pooler (bench/pgbouncer.sh) prepared statements are off.
                prepare_threshold=settings_dict.get("OPTIONS", {}).get("prepare_threshold", 5),
            )
        elif vendor == "mysql":
            import MySQLdb

            self.conn = MySQLdb.connect(
                host=settings_dict["HOST"],
                port=int(settings_dict["PORT"]),
                user=settings_dict["USER"],
                password=settings_dict["PASSWORD"],
                database=settings_dict["NAME"],
                autocommit=True,
            )
            # Each poll sees what committed before it (no REPEATABLE READ snapshot between polls).
            self.conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        else:
            import sqlite3

            self.conn = sqlite3.connect(settings_dict["NAME"], timeout=20, isolation_level=None)

    def rows(self, sql: str, params=()):
        if self.vendor == "mysql":
            cur = self.conn.cursor()
            cur.execute(sql, params or None)
            return cur.fetchall()
        if self.vendor != "postgresql":
            sql = sql.replace("%s", "?")
        cur = self.conn.execute(sql, params)
        return cur.fetchall()

    def one(self, sql: str, params=()):
        rows = self.rows(sql, params)
        return rows[0] if rows else None

    def close(self) -> None:
        self.conn.close()


class Suite:
    def __init__(self, args, db_info: dict):
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from django_fq import db as fqdb
        from django_fq import services
        from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter

        self.args = args
        self.db_info = db_info
        self.connection = connection
        self.fq = services
        self.vendor = connection.vendor
        self.pg = self.vendor == "postgresql"
        self.mysql = self.vendor == "mysql"
        # A database server (PostgreSQL, MariaDB): the claim scenarios have databases of their own on it.
        self.server = self.pg or self.mysql
        self.now_sql = fqdb.now_sql(connection)
        self.JOB = Job._meta.db_table
        self.tables = [t._meta.db_table for t in (Lease, IdempotencyToken, QueueCounter, Job, Queue)]
        self.records: list[dict] = []
        self.explain: dict = {}
        self.logs = args.logs
        os.makedirs(self.logs, exist_ok=True)
        self.worker_env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
        self.worker_env["FQ_BENCH_BATCH"] = str(args.batch)  # bench/benchapp/fq_handlers.py reads it
        self.worker_env.pop("FQ_BENCH_CLAIM_DBS", None)  # the claim databases are this process's business
        self.use_time = os.access(TIME_BIN, os.X_OK)

        log(f"{args.db}: migrating {db_info['database']}")
        call_command("migrate", verbosity=0, interactive=False)
        if self.server:
            for scenario in CLAIM_SCENARIOS:
                call_command("migrate", verbosity=0, interactive=False, database=claim_alias(scenario))
        else:
            # A migrated, empty file to copy back before every phase (faster than deleting a million rows).
            connection.close()
            self.template = os.path.join(db_info["tmpdir"], "template.sqlite3")
            shutil.copyfile(connection.settings_dict["NAME"], self.template)

    # -- state ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty every django-fq table of the main database (no worker may be running)."""
        self.reset_alias(self.connection.alias)

    def observer(self) -> Observer:
        return Observer(self.vendor, self.connection.settings_dict)

    def record(self, rec: dict) -> dict:
        rec["loadavg"] = loadavg()
        self.records.append(rec)
        brief = {k: v for k, v in rec.items() if k not in ("samples_s", "db_samples_ms", "explain", "mem", "cmd")}
        log(json.dumps(brief))
        return rec

    # -- worker processes -----------------------------------------------------------------------

    def worker_cmd(self, *extra: str, queue: str = QUEUE) -> list[str]:
        return [
            sys.executable,
            os.path.join(REPO, "manage.py"),
            "fq_worker",
            "--queue",
            queue,
            "--concurrency",
            str(self.args.concurrency),
            *self.args.worker_arg,
            *extra,
        ]

    def start_worker(self, cmd: list[str], tag: str) -> subprocess.Popen:
        path = os.path.join(self.logs, f"{self.args.db}_{tag}.log")
        logf = open(path, "w")  # noqa: SIM115 - the worker writes to it; closed when the worker is stopped
        full = cmd
        time_file = None
        if self.use_time:
            time_file = path + ".time"
            full = [TIME_BIN, "-v", "-o", time_file, *cmd]
        proc = subprocess.Popen(
            full, cwd=REPO, env=self.worker_env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        proc.bench = {"log": logf, "log_path": path, "time_file": time_file, "hwm_kb": 0, "tree_kb": 0, "cmd": cmd}
        return proc

    @staticmethod
    def _children(pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def _worker_pids(self, proc) -> list[int]:
        """The worker process(es): below /usr/bin/time when it wraps the command."""
        if not self.use_time:
            return [proc.pid]
        return self._children(proc.pid)

    @staticmethod
    def _status_kb(pid: int, field: str) -> int:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def sample_memory(self, procs) -> None:
        """Track each worker's VmHWM (peak RSS so far) and the summed VmRSS of its process tree."""
        for p in procs:
            if p.poll() is not None:
                continue
            stack, tree = list(self._worker_pids(p)), 0
            for pid in list(stack):
                p.bench["hwm_kb"] = max(p.bench["hwm_kb"], self._status_kb(pid, "VmHWM"))
            while stack:
                pid = stack.pop()
                stack.extend(self._children(pid))
                tree += self._status_kb(pid, "VmRSS")
            p.bench["tree_kb"] = max(p.bench["tree_kb"], tree)

    def stop_worker(self, proc, wait_exit: float = 0.0) -> dict:
        """Wait ``wait_exit`` s for the worker to exit by itself, else SIGTERM it (graceful), else SIGKILL."""
        if wait_exit:
            try:
                proc.wait(wait_exit)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            for pid in self._worker_pids(proc):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # our own session only
                proc.wait()
        proc.bench["log"].close()
        maxrss = None
        if proc.bench["time_file"]:
            try:
                with open(proc.bench["time_file"]) as f:
                    for line in f:
                        if "Maximum resident set size" in line:
                            maxrss = int(line.split(":")[1])
                        if "Exit status" in line:
                            proc.bench["exit"] = int(line.split(":")[1])
            except (OSError, ValueError):
                pass
        return {
            "time_v_maxrss_kb": maxrss,
            "vmhwm_kb": proc.bench["hwm_kb"] or None,
            "tree_peak_kb": proc.bench["tree_kb"] or None,
            "exit": proc.bench.get("exit", proc.returncode),
            "log": proc.bench["log_path"],
        }

    # -- phases ---------------------------------------------------------------------------------

    def enqueue_single(self, rep: int) -> None:
        self.reset()
        n = self.args.n
        self.connection.ensure_connection()
        enqueue = self.fq.enqueue
        payload = self.payload
        t0 = time.perf_counter()
        for i in range(n):
            enqueue(QUEUE, payload(i))
        dt = time.perf_counter() - t0
        self.record({"rep": rep, "metric": "enqueue_single", "n": n, "seconds": dt, "rate": n / dt})

    def payload(self, i: int) -> dict:
        """Job ``i``'s payload: ``{"i": i}``, padded with a ``"pad"`` string to about ``--payload-bytes`` of JSON.

        The pad is hex of random bytes (one fixed block), which no database compresses, as the
        base64 documents and images of real large payloads: a run of one letter would be
        compressed to almost nothing by PostgreSQL's TOAST and measure nothing.
        """
        pad = self.args.payload_bytes - 20
        if pad <= 0:
            return {"i": i}
        if getattr(self, "_pad", None) is None or len(self._pad) != pad:
            self._pad = random.Random(20261201).randbytes((pad + 1) // 2).hex()[:pad]
        return {"i": i, "pad": self._pad}

    def enqueue_bulk(self, rep: int) -> None:
        self.reset()
        n = self.args.n
        self.connection.ensure_connection()
        payload = self.payload
        t0 = time.perf_counter()
        # Large payloads go in calls of about 32 MiB (one call of N = 5,000 x 100 KiB would hold 500 MB).
        step = n if self.args.payload_bytes <= 1024 else max(1, (32 << 20) // self.args.payload_bytes)
        results = []
        for start in range(0, n, step):
            results += self.fq.enqueue_many(QUEUE, [{"payload": payload(i)} for i in range(start, min(n, start + step))])
        dt = time.perf_counter() - t0
        assert len(results) == n and all(r.created for r in results)
        self.record({"rep": rep, "metric": "enqueue_bulk", "n": n, "seconds": dt, "rate": n / dt})

    def drain(self, rep: int, workers: int, *, n: int | None = None, extra: tuple[str, ...] = (),
              metric: str | None = None, queue: str = QUEUE, **fields) -> None:
        """Drain the N queued jobs with ``workers`` ``fq_worker --burst`` processes (``extra``: more worker arguments).

        ``metric`` names the record (default ``drain<workers>``); ``fields`` are added to it.
        """
        n = self.args.n if n is None else n
        metric = metric or f"drain{workers}"
        job = self.JOB
        obs = self.observer()
        unfinished_sql = f"SELECT count(*) FROM {job} WHERE state IN ('queued', 'running')"
        queued = obs.one(unfinished_sql)[0]
        if queued != n:
            raise RuntimeError(f"drain{workers}: expected {n} queued jobs, found {queued}")
        cmd = self.worker_cmd("--burst", "--no-progress", *extra, queue=queue)
        spawn_db_ms = obs.one(f"SELECT {self.now_sql}")[0]
        t0 = time.perf_counter()
        tag = f"r{rep}_{metric}" + (f"_{fields['kind']}" if "kind" in fields else "")
        procs = [self.start_worker(cmd, f"{tag}_w{w}") for w in range(workers)]
        t_first, left_first, next_mem = None, n, 0.0
        while True:
            now = time.perf_counter()
            left = obs.one(unfinished_sql)[0]
            if t_first is None and left < n:
                t_first, left_first = time.perf_counter(), left
            if left == 0:
                t_done = time.perf_counter()
                break
            if now >= next_mem:
                self.sample_memory(procs)
                next_mem = now + 0.25
            if all(p.poll() is not None for p in procs) and obs.one(unfinished_sql)[0] > 0:
                raise RuntimeError(f"drain{workers}: every worker exited with {left} jobs unfinished; see {self.logs}")
            if now - t0 > self.args.drain_timeout:
                for p in procs:
                    self.stop_worker(p)
                raise RuntimeError(f"drain{workers}: not finished after {self.args.drain_timeout} s")
            time.sleep(DRAIN_POLL_S)
        mem = [self.stop_worker(p, wait_exit=60) for p in procs]
        ok_n, first_ms, last_ms = obs.one(f"SELECT count(*), min(finished_at), max(finished_at) FROM {job} WHERE state = 'succeeded'")
        total = obs.one(f"SELECT count(*) FROM {job}")[0]
        # Jobs recorded done in the very first millisecond (a batch of acks lands at once): the
        # steady formula counts them as finished within the window; with N = 20,000 that is a small bias.
        first_batch = obs.one(f"SELECT count(*) FROM {job} WHERE state = 'succeeded' AND finished_at = %s", (first_ms,))[0]
        obs.close()
        ok = ok_n == n and total == n and all(m["exit"] == 0 for m in mem)
        span_ms = last_ms - first_ms
        wall_s = (last_ms - spawn_db_ms) / 1000
        self.record(
            {
                "rep": rep,
                "metric": metric,
                **fields,
                "n": n,
                "workers": workers,
                "concurrency": self.args.concurrency,
                "ok": ok,
                "succeeded": ok_n,
                # docs/reference/semantics.md §9: jobs finished per second from the first job recorded done to the last.
                "steady_rate": (n - 1) / (span_ms / 1000) if span_ms > 0 else None,
                "first_to_last_ms": span_ms,
                "done_in_first_ms": first_batch,
                # From spawning the worker(s) to the last job recorded done (both on the DB clock).
                "wall_s": wall_s,
                "wall_rate": n / wall_s,
                "startup_ms": first_ms - spawn_db_ms,
                # The anchors' method: the observer's clock, 50 ms polls, end = first poll that sees 0 left.
                "observed_wall_s": t_done - t0,
                "observed_steady_rate": (left_first / (t_done - t_first)) if t_first and t_done > t_first else None,
                "cmd": cmd,
                "mem": mem,
            }
        )
        if not ok:
            raise RuntimeError(f"drain{workers}: incomplete ({ok_n} of {n} succeeded, {total} rows, exits {[m['exit'] for m in mem]})")

    def pool_drains(self, rep: int) -> None:
        """The cost of ``fq_worker --pool processes``: the same bulk-enqueued no-op jobs drained by one worker
        with ``--pool threads`` and with ``--pool processes``, at each ``--pool-concurrency``, one after the other."""
        n = self.args.pool_n
        for concurrency in self.pool_concurrencies:
            for pool in POOLS:
                self.reset()
                self.connection.ensure_connection()
                self.fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(n)])
                extra = ("--pool", pool, "--concurrency", str(concurrency))
                self.drain(rep, 1, n=n, extra=extra, metric="pool_drain", pool=pool, pool_concurrency=concurrency)

    def batch_drains(self, rep: int) -> None:
        """Batch handlers (docs/how-to/batch-handlers.md): N bulk-enqueued no-op jobs drained by one worker
        with the one-job handler, then the same N with the batch handler (``--batch`` jobs per call),
        one right after the other so both see the same machine."""
        n = self.args.n
        for kind, queue in (("single", QUEUE), ("batch", BATCH_QUEUE)):
            self.reset()
            self.connection.ensure_connection()
            self.fq.enqueue_many(queue, [{"payload": {"i": i}} for i in range(n)])
            # The one-job drain keeps the suite's --concurrency; a batch worker runs --batch-concurrency batches at once.
            extra = ("--concurrency", str(self.args.batch_concurrency)) if kind == "batch" else ()
            self.drain(rep, 1, n=n, extra=extra, metric="batch_drain", queue=queue, kind=kind, batch=self.args.batch)

    @property
    def pool_concurrencies(self) -> list[int]:
        return [int(c) for c in str(self.args.pool_concurrency).split(",") if c.strip()]

    def latency(self, rep: int, variant: str, extra: tuple[str, ...]) -> None:
        """An idle worker; K times: random pause, enqueue one job, poll until it is recorded succeeded."""
        self.reset()
        job = self.JOB
        cmd = self.worker_cmd(*extra)
        proc = self.start_worker(cmd, f"r{rep}_latency_{variant}")
        obs = self.observer()
        done_sql = f"SELECT state, enqueued_at, finished_at FROM {job} WHERE uid = %s"

        def wait_done(uid: str, timeout: float):
            give_up = time.perf_counter() + timeout
            while True:
                row = obs.one(done_sql, (uid,))
                if row and row[0] == "succeeded":
                    return time.perf_counter(), row
                if time.perf_counter() > give_up or proc.poll() is not None:
                    self.stop_worker(proc)
                    raise RuntimeError(f"latency: job {uid} not done (worker log {proc.bench['log_path']})")
                time.sleep(LATENCY_POLL_S)

        try:
            self.connection.ensure_connection()
            # Warm-up job: proves the worker is up; then let it go idle (its poll pause grows).
            wait_done(self.fq.enqueue(QUEUE, {"warmup": True}).id, 120)
            time.sleep(1.5)
            rng = random.Random(LATENCY_SEED)
            samples, db_samples = [], []
            for k in range(self.args.lat_k):
                time.sleep(rng.uniform(0.3, 1.3))
                t0 = time.perf_counter()
                uid = self.fq.enqueue(QUEUE, {"k": k}).id
                t1, row = wait_done(uid, 60)
                samples.append(t1 - t0)
                db_samples.append(row[2] - row[1])
            self.sample_memory([proc])
        finally:
            obs.close()
        mem = self.stop_worker(proc)
        self.record(
            {
                "rep": rep,
                "metric": "latency",
                "variant": variant,
                "k": len(samples),
                "median_ms": statistics.median(samples) * 1000,
                "p95_ms": percentile(samples, 0.95) * 1000,
                "db_median_ms": statistics.median(db_samples),
                "db_p95_ms": percentile(db_samples, 0.95),
                "samples_s": samples,
                "db_samples_ms": db_samples,
                "cmd": cmd,
                "mem": mem,
            }
        )

    # -- claim latency --------------------------------------------------------------------------

    def _insert_ready(self, cur, queue_id: int, n: int, tag: str) -> None:
        """``n`` ready jobs with the column values ``enqueue`` writes (payload ``{"i": i}``)."""
        cols = (
            "uid, queue_id, state, priority, run_at, enqueued_at, changed_at, attempts, max_attempts, generation, "
            "timeout_ms, payload, payload_size, last_error, errors, worker"
        )
        values = "{uid}, %s, 'queued', 0, c.t, c.t, c.t, 0, 25, 0, 0, {payload}, length({payload}), '', '[]'{j}, ''"
        self._insert_series(cur, cols, values, queue_id, n, tag)

    def _insert_finished(self, cur, queue_id: int, n: int, tag: str) -> None:
        """``n`` finished jobs: 3 of 4 succeeded (as ``ack`` leaves them), 1 of 4 dead after 25 nacks."""
        cols = (
            "uid, queue_id, state, priority, run_at, enqueued_at, changed_at, claimed_at, finished_at, attempts, "
            "max_attempts, generation, timeout_ms, payload, payload_size, last_error, errors, worker, "
            "settled_hash, settled_op, settled_args, settled_outcome"
        )
        values = (
            "{uid}, %s, CASE WHEN {dead} THEN 'dead' ELSE 'succeeded' END, 0, c.t - 60000, c.t - 60000, c.t, "
            "c.t - 5, CASE WHEN {dead} THEN NULL ELSE c.t END, CASE WHEN {dead} THEN 25 ELSE 1 END, 25, "
            "CASE WHEN {dead} THEN 25 ELSE 1 END, 0, {payload}, length({payload}), "
            "CASE WHEN {dead} THEN 'boom' ELSE '' END, "
            "CASE WHEN {dead} THEN {dead_errors} "
            "ELSE '[]' END{j}, 'w', {hash64}, CASE WHEN {dead} THEN 'nack' ELSE 'ack' END, {hash32}, "
            "CASE WHEN {dead} THEN '{{\"state\":\"dead\",\"run_at\":null}}' ELSE '{{\"state\":\"succeeded\",\"run_at\":null}}' END{j}"
        )
        self._insert_series(cur, cols, values, queue_id, n, tag)

    def _insert_series(self, cur, cols: str, values: str, queue_id: int, n: int, tag: str) -> None:
        """INSERT ... SELECT over 1..n (generate_series / a recursive CTE / digit tables): fast, all in the database.

        ``values`` may hold ``{uid}``, ``{hash64}``, ``{hash32}``, ``{j}`` (a JSON cast),
        ``{payload}`` (``{"i": i}`` as text), ``{dead}`` (i mod 4 = 0) and ``{dead_errors}``
        (a dead job's error list as text); each backend fills them in its own dialect.
        """
        job = self.JOB
        if self.mysql:
            self._insert_series_mysql(cur, cols, values, queue_id, n, tag)
            return
        # i mod 4 = 0, without '%' (a placeholder character here); || concatenates text.
        values = values.replace("{dead}", "s.i - (s.i / 4) * 4 = 0")
        text = {
            "payload": """'{"i":' || s.i || '}'""",
            "dead_errors": """'[{"at":' || c.t || ',"attempt":25,"kind":"nack","error":"boom","worker":"w"}]'""",
        }
        if self.pg:
            values = values.format(
                uid=f"md5('{tag}' || s.i)",
                hash64=f"md5('a{tag}' || s.i) || md5('b{tag}' || s.i)",
                hash32=f"md5('c{tag}' || s.i)",
                j="::jsonb",  # errors / settled_outcome are jsonb columns on PostgreSQL
                **text,
            )
            sql = (
                f"INSERT INTO {job} ({cols}) SELECT {values} "
                f"FROM generate_series(1, %s) AS s(i), (SELECT {self.now_sql} AS t) AS c"
            )
            cur.execute(sql, [queue_id, n])
        else:
            values = values.format(
                uid="lower(hex(randomblob(16)))",
                hash64="lower(hex(randomblob(32)))",
                hash32="lower(hex(randomblob(16)))",
                j="",
                **text,
            )
            sql = (
                f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %s), "
                f"c(t) AS (SELECT {self.now_sql}) "
                f"INSERT INTO {job} ({cols}) SELECT {values} FROM s, c"
            )
            cur.execute(sql, [n, queue_id])

    def _insert_series_mysql(self, cur, cols: str, values: str, queue_id: int, n: int, tag: str) -> None:
        """MariaDB/MySQL: 1..n from a cross join of digit tables (no recursion limit to raise), CONCAT for text."""
        values = values.replace("{dead}", "MOD(s.i, 4) = 0").format(
            uid=f"MD5(CONCAT('{tag}', s.i))",
            hash64=f"CONCAT(MD5(CONCAT('a{tag}', s.i)), MD5(CONCAT('b{tag}', s.i)))",
            hash32=f"MD5(CONCAT('c{tag}', s.i))",
            j="",  # JSON columns are text with a validity check here
            payload="""CONCAT('{"i":', s.i, '}')""",
            dead_errors="""CONCAT('[{"at":', c.t, ',"attempt":25,"kind":"nack","error":"boom","worker":"w"}]')""",
        )
        digits = "(SELECT 0 AS x UNION ALL " + " UNION ALL ".join(f"SELECT {d}" for d in range(1, 10)) + ")"
        places = max(1, len(str(max(n - 1, 1))))
        number = " + ".join(f"d{k}.x * {10 ** k}" for k in range(places)) + " + 1"
        series = f"(SELECT {number} AS i FROM " + ", ".join(f"{digits} AS d{k}" for k in range(places)) + ")"
        sql = (
            f"INSERT INTO {self.JOB} ({cols}) SELECT {values} "
            f"FROM {series} AS s, (SELECT {self.now_sql} AS t) AS c WHERE s.i <= %s"
        )
        cur.execute(sql, [queue_id, n])

    @contextlib.contextmanager
    def fq_database(self, alias: str):
        """Point django-fq at database ``alias`` (``FQ_DATABASE``, read live on every call)."""
        from django.conf import settings

        settings.FQ_DATABASE = alias
        try:
            yield
        finally:
            settings.FQ_DATABASE = "default"

    def reset_alias(self, alias: str) -> None:
        """Empty the django-fq tables of database ``alias`` (the main one, or a claim scenario's)."""
        from django.db import connections

        conn = connections[alias]
        if self.pg:
            with conn.cursor() as cur:
                cur.execute(f"TRUNCATE {', '.join(self.tables)} RESTART IDENTITY CASCADE")
            return
        if self.mysql:
            # TRUNCATE refuses a table other tables reference unless the checks are off (this session only).
            with conn.cursor() as cur:
                cur.execute("SET FOREIGN_KEY_CHECKS = 0")
                try:
                    for table in self.tables:
                        cur.execute(f"TRUNCATE TABLE {table}")
                finally:
                    cur.execute("SET FOREIGN_KEY_CHECKS = 1")
            return
        conn.close()
        path = conn.settings_dict["NAME"]
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        shutil.copyfile(self.template, path)
        conn.ensure_connection()

    def fill_claim_queue(self, alias: str, ready: int, finished: int) -> None:
        """Queue ``claimbench`` of database ``alias``: ``finished`` finished rows, then ``ready`` ready jobs."""
        from django.db import connections, transaction

        from django_fq.models import Queue, QueueCounter

        with self.fq_database(alias):
            self.fq.configure(CLAIM_QUEUE)
        conn = connections[alias]
        with transaction.atomic(using=alias), conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {Queue._meta.db_table} WHERE name = %s", [CLAIM_QUEUE])
            queue_id = cur.fetchone()[0]
            if finished:
                self._insert_finished(cur, queue_id, finished, "f")
            self._insert_ready(cur, queue_id, ready, "r")
            dead = finished // 4
            # The counters the services would have kept for these rows.
            cur.execute(
                f"INSERT INTO {QueueCounter._meta.db_table} (queue_id, enqueued, claimed, acked, nacked, dead, active) "
                f"VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [queue_id, ready + finished, finished - dead + 25 * dead, finished - dead, 25 * dead, dead, ready],
            )
        with conn.cursor() as cur:
            if self.pg:
                cur.execute(f"VACUUM ANALYZE {self.JOB}")
            elif self.mysql:
                cur.execute(f"ANALYZE TABLE {self.JOB}")
                cur.fetchall()
            else:
                cur.execute("ANALYZE")
                cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def claims(self, rep: int) -> None:
        """claim(1) and claim(100) latency in the three scenarios, sampled in turn so they share the noise.

        Each scenario has a database of its own (alias ``claim_<scenario>``),
        filled fresh every repetition. Sample i claims from every scenario
        once, in an order rotated by i; each timed claim is acked untimed.
        """
        a = self.args
        sizes = {
            "ready_small": (a.claim_small, 0),
            "ready_large": (a.claim_large, 0),
            "finished_large": (a.claim_small, a.claim_large),
        }
        fill_s = {}
        for scenario in CLAIM_SCENARIOS:
            alias = claim_alias(scenario)
            self.reset_alias(alias)
            t0 = time.perf_counter()
            self.fill_claim_queue(alias, *sizes[scenario])
            fill_s[scenario] = time.perf_counter() - t0
        claim, ack_many = self.fq.claim, self.fq.ack_many

        def one(scenario: str, count: int) -> float:
            with self.fq_database(claim_alias(scenario)):
                t = time.perf_counter()
                jobs = claim(CLAIM_QUEUE, count=count, visibility_ms=CLAIM_VISIBILITY_MS)
                dt = time.perf_counter() - t
                if len(jobs) != count:
                    raise RuntimeError(f"claim(count={count}) returned {len(jobs)} jobs in scenario {scenario}")
                ack_many(CLAIM_QUEUE, [(j.receipt, None) for j in jobs])  # untimed: keeps the lease table small
            return dt

        samples = {(s, c): [] for s in CLAIM_SCENARIOS for c in (1, 100)}
        for count, k in ((1, a.claim1_samples), (100, a.claim100_samples)):
            for scenario in CLAIM_SCENARIOS:  # warm-up: connections, caches
                for _ in range(3):
                    one(scenario, count)
            for i in range(k):
                shift = i % len(CLAIM_SCENARIOS)
                for scenario in CLAIM_SCENARIOS[shift:] + CLAIM_SCENARIOS[:shift]:
                    samples[(scenario, count)].append(one(scenario, count))
        for scenario in CLAIM_SCENARIOS:
            ready, finished = sizes[scenario]
            result = {"rep": rep, "metric": "claim", "scenario": scenario, "ready": ready, "finished": finished,
                      "fill_s": fill_s[scenario]}
            for count in (1, 100):
                xs = samples[(scenario, count)]
                result[f"claim{count}_median_ms"] = statistics.median(xs) * 1000
                result[f"claim{count}_p95_ms"] = percentile(xs, 0.95) * 1000
                result[f"claim{count}_samples"] = len(xs)
            if rep == a.reps - 1:  # plans once, from the last repetition
                self.explain[scenario] = {f"claim{c}": self.explain_claim(claim_alias(scenario), c) for c in (1, 100)}
            self.record(result)

    # -- claims under a long-running snapshot (issue 15) ------------------------------------------

    @contextlib.contextmanager
    def held_snapshot(self):
        """Another connection's REPEATABLE READ transaction that has read a row, open for the block.

        Like pg_dump, or a web request left idle in a transaction: on PostgreSQL
        it holds back the horizon below which VACUUM and index-entry killing may
        remove row versions; on MariaDB it holds back InnoDB's purge.
        """
        obs = self.observer()
        try:
            if self.pg:
                obs.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            elif self.mysql:
                cur = obs.conn.cursor()
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            else:
                obs.conn.execute("BEGIN")
            obs.rows("SELECT id FROM django_fq_queue LIMIT 1")  # the snapshot is taken here
            yield obs
        finally:
            with contextlib.suppress(Exception):
                obs.rows("SELECT 1")  # still open at the end: the whole block ran under it
                if self.pg or self.vendor == "sqlite":
                    obs.conn.execute("COMMIT")
                else:
                    obs.conn.cursor().execute("COMMIT")
            obs.close()

    def server_horizon(self) -> dict:
        """PostgreSQL: the oldest transaction holding a snapshot anywhere on the server (other databases too).

        A long-lived connection refreshes its own database's cleanup horizon only
        when the server-wide oldest xmin moves, so another database's long
        transaction can keep this database's dead index entries from being
        marked dead as well (observed on the shared benchmark server): a
        ``nosnap`` measurement taken meanwhile is not a clean baseline.
        """
        if not self.pg:
            return {}
        with self.connection.cursor() as cur:
            cur.execute(
                "SELECT COALESCE(MAX(age(backend_xmin)), 0), "
                "COALESCE(EXTRACT(EPOCH FROM MAX(clock_timestamp() - xact_start)), 0)::float "
                "FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()"
            )
            age, seconds = cur.fetchone()
        return {"server_oldest_xmin_age": int(age), "server_oldest_xact_s": round(float(seconds), 1)}

    def snapshot_churn(self, n: int) -> None:
        """Enqueue, claim and ack ``n`` jobs of ``claimbench`` in batches, as a worker would process them."""
        enqueue_many, claim, ack_many = self.fq.enqueue_many, self.fq.claim, self.fq.ack_many
        done = 0
        while done < n:
            k = min(SNAPSHOT_BATCH, n - done)
            enqueue_many(CLAIM_QUEUE, [{"payload": {"i": done + i}} for i in range(k)])
            jobs = claim(CLAIM_QUEUE, count=k, visibility_ms=SNAPSHOT_CHURN_VIS_MS)
            results = ack_many(CLAIM_QUEUE, [(j.receipt, None) for j in jobs])
            if len(jobs) != k or any(getattr(r, "ok", True) is False for r in results):
                raise RuntimeError(f"snapshot churn: claimed {len(jobs)} of {k}")
            done += k

    def snapshots(self, rep: int) -> None:
        """claim(1) latency after ``--snapshot-churn`` jobs were processed, without and with an open snapshot.

        Each mode: empty tables; churn (enqueue, claim, ack) ``--snapshot-churn``
        jobs (mode ``snap``: while :meth:`held_snapshot` is open); wait until the
        churn's leases are past their deadlines; enqueue SNAPSHOT_READY jobs
        behind them; time ``--claim1-samples`` claims of one job (each acked
        untimed), then the plans of one claim(1) and of one reaper pass
        (``services.reap``), both rolled back. The snapshot stays open until the
        plans are taken. Ratio: snap / nosnap medians of the same repetition.
        """
        a = self.args
        claim, ack_many = self.fq.claim, self.fq.ack_many
        for mode in SNAPSHOT_MODES:
            self.reset()
            self.connection.ensure_connection()
            self.fq.configure(CLAIM_QUEUE)
            with contextlib.ExitStack() as stack:
                if mode == "snap":
                    stack.enter_context(self.held_snapshot())
                t0 = time.perf_counter()
                self.snapshot_churn(a.snapshot_churn)
                churn_s = time.perf_counter() - t0
                time.sleep(SNAPSHOT_CHURN_VIS_MS / 1000 + 0.2)  # every churn lease's deadline is past now
                self.fq.enqueue_many(CLAIM_QUEUE, [{"payload": {"i": i}} for i in range(SNAPSHOT_READY)])
                if self.pg:
                    # Statistics as autovacuum's ANALYZE leaves them on a table in use: after reset()'s
                    # TRUNCATE the planner sees zero pages and reads the claim through
                    # fq_job_state_changed plus a sort, whatever bounds the claim gives it.
                    with self.connection.cursor() as cur:
                        cur.execute("ANALYZE django_fq_job, django_fq_lease")
                horizon = self.server_horizon()  # mode snap: includes the held snapshot itself
                xs = []
                for i in range(3 + a.claim1_samples):
                    t = time.perf_counter()
                    jobs = claim(CLAIM_QUEUE, count=1, visibility_ms=CLAIM_VISIBILITY_MS)
                    dt = time.perf_counter() - t
                    if len(jobs) != 1:
                        raise RuntimeError(f"snapshot phase ({mode}): claim(1) returned {len(jobs)} jobs")
                    ack_many(CLAIM_QUEUE, [(j.receipt, None) for j in jobs])
                    if i >= 3:  # the first three warm the connection and the prepared statements
                        xs.append(dt)
                alias = self.connection.alias
                plans = {
                    "claim1": self.explain_calls(
                        alias, lambda: self.fq.claim(CLAIM_QUEUE, count=1, visibility_ms=CLAIM_VISIBILITY_MS)
                    ),
                    "reap": self.explain_calls(alias, lambda: self.fq.reap(CLAIM_QUEUE)),
                }
            result = {
                **horizon,
                "rep": rep, "metric": "snapshot", "mode": mode, "churn": a.snapshot_churn, "churn_s": churn_s,
                "claim1_median_ms": statistics.median(xs) * 1000, "claim1_p95_ms": percentile(xs, 0.95) * 1000,
                "claim1_samples": len(xs),
                "claim1_buffers": plan_buffers(plans["claim1"]), "reap_buffers": plan_buffers(plans["reap"]),
            }
            if rep == a.reps - 1:
                self.explain[f"snapshot_{mode}"] = plans
            self.record(result)

    def explain_claim(self, alias: str, count: int) -> dict:
        """The plans of every statement one real ``claim()`` runs, on the current data of ``alias``.

        The statements are captured from an actual ``services.claim`` call (rolled
        back), so the plans follow whatever SQL the claim path issues today;
        then each is explained in a second transaction that is rolled back too.
        PostgreSQL: ``EXPLAIN (ANALYZE, BUFFERS)``; SQLite: ``EXPLAIN QUERY PLAN``;
        MariaDB/MySQL: ``EXPLAIN`` (one line per table: access type, key, estimated rows).
        """
        return self.explain_calls(alias, lambda: self.fq.claim(CLAIM_QUEUE, count=count, visibility_ms=CLAIM_VISIBILITY_MS))

    def explain_calls(self, alias: str, call) -> dict:
        """The plans of every statement ``call()`` (a django-fq service call) runs on ``alias``, rolled back."""
        from django.db import connections, transaction

        conn = connections[alias]
        statements: list[tuple[str, object]] = []

        def capture(execute, sql, params, many, context):
            statements.append((sql, params))
            return execute(sql, params, many, context)

        with self.fq_database(alias), conn.execute_wrapper(capture), transaction.atomic(using=alias):
            call()
            transaction.set_rollback(True, using=alias)
        plans, full_scans = [], []
        with transaction.atomic(using=alias), conn.cursor() as cur:
            for sql, params in statements:
                head = sql.lstrip().split(None, 1)[0].upper()
                if head not in ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH"):
                    continue  # savepoints
                if self.pg:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                    plan = "\n".join(r[0] for r in cur.fetchall())
                    scans = [line.strip() for line in plan.splitlines() if "Seq Scan on django_fq_job" in line]
                elif self.mysql:
                    cur.execute("EXPLAIN " + sql, params)
                    names = [d[0] for d in cur.description]
                    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
                    plan = "\n".join(
                        " ".join(f"{k}={v}" for k, v in r.items() if v is not None and k not in ("id", "select_type"))
                        for r in rows
                    )
                    # type=ALL is a full table scan (an index scan shows type=index/range/ref).
                    scans = [f"{r.get('table')}: type=ALL rows={r.get('rows')}" for r in rows
                             if r.get("table") == self.JOB and r.get("type") == "ALL"]
                else:
                    cur.execute("EXPLAIN QUERY PLAN " + sql, params)
                    plan = "\n".join(r[3] for r in cur.fetchall())
                    scans = [
                        line.strip()
                        for line in plan.splitlines()
                        if line.strip().startswith("SCAN django_fq_job") and "USING" not in line
                    ]
                full_scans += scans
                plans.append({"sql": sql, "plan": plan})
            transaction.set_rollback(True, using=alias)
        return {"statements": plans, "job_table_full_scans": full_scans}

    # -- the whole run --------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.args
        phases = set(a.phases.split(","))
        started = time.time()
        env = self.environment()
        env["loadavg_start"] = loadavg()
        for rep in range(a.reps):
            log(f"{a.db}: repetition {rep + 1} of {a.reps}")
            if {"enqueue", "drain"} & phases:
                # Like the anchors: the jobs enqueued one at a time are drained by 1 worker,
                # the bulk-enqueued ones by 2.
                self.enqueue_single(rep)
                if "drain" in phases:
                    self.drain(rep, 1)
                self.enqueue_bulk(rep)
                if "drain" in phases:
                    self.drain(rep, 2)
            if "latency" in phases:
                self.latency(rep, "default", ())
                if not self.pg:
                    # SQLite and MariaDB have no cross-process wakeup: also measure with the idle poll pause held at 10 ms.
                    self.latency(rep, "poll10", ("--poll-interval", "10", "--max-poll-interval", "10"))
                if self.mysql:
                    # MariaDB's stated pickup target is for a worker polling every 50 ms
                    # (docs/performance.md#mariadb-pickup-the-poll-interval-chosen): a random
                    # enqueue waits half a cycle, then 5-16 ms of commits, claim, hand-off and ack
                    # (measured on two machines), which a 10 or 20 ms interval cannot hide.
                    self.latency(rep, "poll50", ("--poll-interval", "50", "--max-poll-interval", "50"))
            if "claim" in phases:
                self.claims(rep)
            if "pool" in phases:
                self.pool_drains(rep)
            if "batch" in phases:
                self.batch_drains(rep)
            if "snapshot" in phases:
                self.snapshots(rep)
        env["loadavg_end"] = loadavg()
        env["seconds"] = round(time.time() - started, 1)
        if "claim" in phases and self.server:
            for scenario in CLAIM_SCENARIOS:  # do not leave millions of rows behind
                self.reset_alias(claim_alias(scenario))
        return {
            "db": a.db,
            "params": {
                "n": a.n,
                "reps": a.reps,
                "lat_k": a.lat_k,
                "concurrency": a.concurrency,
                "worker_args": a.worker_arg,
                "claim_small": a.claim_small,
                "claim_large": a.claim_large,
                "claim1_samples": a.claim1_samples,
                "claim100_samples": a.claim100_samples,
                "quick": a.quick,
                "phases": a.phases,
                "pool_n": a.pool_n,
                "payload_bytes": a.payload_bytes,
                "pool_concurrency": a.pool_concurrency,
                "batch": a.batch,
                "batch_concurrency": a.batch_concurrency,
                "snapshot_churn": a.snapshot_churn,
            },
            "environment": env,
            "summary": self.summary(),
            "explain": self.explain,
            "runs": self.records,
        }

    def summary(self) -> dict:
        recs = self.records

        def vals(metric, field, **match):
            return [
                r[field]
                for r in recs
                if r["metric"] == metric and all(r.get(k) == v for k, v in match.items())
            ]

        out = {
            "enqueue_single_rate": describe(vals("enqueue_single", "rate")),
            "enqueue_bulk_rate": describe(vals("enqueue_bulk", "rate")),
        }
        for w in (1, 2):
            m = f"drain{w}"
            out[f"{m}_steady"] = describe(vals(m, "steady_rate"))
            out[f"{m}_wall_s"] = describe(vals(m, "wall_s"))
            out[f"{m}_wall_rate"] = describe(vals(m, "wall_rate"))
            out[f"{m}_observed_steady"] = describe(vals(m, "observed_steady_rate"))
            out[f"{m}_observed_wall_s"] = describe(vals(m, "observed_wall_s"))
            out[f"{m}_startup_ms"] = describe(vals(m, "startup_ms"))
        for variant, prefix in (("default", "latency"), ("poll10", "latency_poll10"), ("poll50", "latency_poll50")):
            if not vals("latency", "median_ms", variant=variant):
                continue
            pooled = [x * 1000 for xs in vals("latency", "samples_s", variant=variant) for x in xs]
            pooled_db = [x for xs in vals("latency", "db_samples_ms", variant=variant) for x in xs]
            # Median: median of the repetitions' medians (as the anchors report it).
            # p95: over all samples of all repetitions pooled (20 samples make a poor p95 on their own).
            out[f"{prefix}_median_ms"] = describe(vals("latency", "median_ms", variant=variant))
            out[f"{prefix}_p95_ms"] = describe([percentile(pooled, 0.95)])
            out[f"{prefix}_db_median_ms"] = describe(vals("latency", "db_median_ms", variant=variant))
            out[f"{prefix}_db_p95_ms"] = describe([percentile(pooled_db, 0.95)])
            out[f"{prefix}_samples"] = len(pooled)
        for count in (1, 100):
            for scenario in ("ready_small", "ready_large", "finished_large"):
                out[f"claim{count}_{scenario}_ms"] = describe(vals("claim", f"claim{count}_median_ms", scenario=scenario))
            # Ratios within each repetition (same noise), then the median over repetitions.
            small = {r["rep"]: r[f"claim{count}_median_ms"] for r in recs if r.get("scenario") == "ready_small"}
            for scenario, name in (("ready_large", "ready"), ("finished_large", "finished")):
                ratios = [
                    r[f"claim{count}_median_ms"] / small[r["rep"]]
                    for r in recs
                    if r.get("scenario") == scenario and small.get(r["rep"])
                ]
                out[f"claim{count}_{name}_ratio"] = describe(ratios)
        for c in self.pool_concurrencies:
            for pool in POOLS:
                out[f"pool_{pool}_c{c}_steady"] = describe(vals("pool_drain", "steady_rate", pool=pool, pool_concurrency=c))
                out[f"pool_{pool}_c{c}_startup_ms"] = describe(vals("pool_drain", "startup_ms", pool=pool, pool_concurrency=c))
            # What --pool processes adds to each job: the worker's time per job (1 / steady rate) with
            # processes minus with threads, within each repetition (same noise), in ms.
            by_rep: dict = {}
            for r in recs:
                if r["metric"] == "pool_drain" and r["pool_concurrency"] == c and r.get("steady_rate"):
                    by_rep.setdefault(r["rep"], {})[r["pool"]] = r["steady_rate"]
            out[f"pool_processes_c{c}_cost_ms"] = describe(
                [1000 / p["processes"] - 1000 / p["threads"] for p in by_rep.values() if len(p) == len(POOLS)]
            )
        for kind in ("single", "batch"):
            out[f"batch_{kind}_steady"] = describe(vals("batch_drain", "steady_rate", kind=kind))
        # Batch over one-job steady rate within each repetition (same noise), then the median.
        pairs: dict = {}
        for r in recs:
            if r["metric"] == "batch_drain" and r.get("steady_rate"):
                pairs.setdefault(r["rep"], {})[r["kind"]] = r["steady_rate"]
        out["batch_vs_single_ratio"] = describe([p["batch"] / p["single"] for p in pairs.values() if len(p) == 2])
        for mode in SNAPSHOT_MODES:
            out[f"snapshot_claim1_{mode}_ms"] = describe(vals("snapshot", "claim1_median_ms", mode=mode))
            for what in ("claim1", "reap"):
                out[f"snapshot_{what}_{mode}_buffers"] = describe(
                    [b for b in vals("snapshot", f"{what}_buffers", mode=mode) if b is not None]
                )
        plain = {r["rep"]: r["claim1_median_ms"] for r in recs if r["metric"] == "snapshot" and r["mode"] == "nosnap"}
        out["snapshot_claim1_ratio"] = describe(
            [r["claim1_median_ms"] / plain[r["rep"]] for r in recs
             if r["metric"] == "snapshot" and r["mode"] == "snap" and plain.get(r["rep"])]
        )
        rss = []
        for r in recs:
            if r["metric"] == "drain1":
                m = r["mem"][0]
                kb = m["time_v_maxrss_kb"] or m["vmhwm_kb"]
                rss.append(kb / 1024 if kb else None)
        out["worker_rss_mib"] = describe(rss)
        out["worker_rss_method"] = "/usr/bin/time -v maximum RSS" if self.use_time else "VmHWM sampled every 0.25 s"
        idle = [r["mem"]["time_v_maxrss_kb"] or r["mem"]["vmhwm_kb"] for r in recs if r["metric"] == "latency"]
        out["latency_worker_rss_mib"] = describe([kb / 1024 for kb in idle if kb])
        return out

    def environment(self) -> dict:
        import django

        with self.connection.cursor() as cur:
            cur.execute("SELECT sqlite_version()" if self.vendor == "sqlite" else "SELECT version()")
            version = cur.fetchone()[0]

        def git(*args):
            try:
                out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout
                return out.rstrip("\n")
            except (OSError, subprocess.SubprocessError):
                return None

        status = git("status", "--porcelain", "--untracked-files=no")
        return {
            "database": self.db_info["database"],
            "db_version": version,
            "python": platform.python_version(),
            "django": django.get_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "git_commit": (git("rev-parse", "HEAD") or "").strip() or None,
            "git_dirty_files": status.splitlines() if status else [],
            "time_v": self.use_time,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="django-fq benchmark on one database (run by bench/run.py)")
    p.add_argument("--db", choices=("postgres", "sqlite", "mariadb"), required=True)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--logs", required=True, help="directory for worker logs")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--lat-k", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--worker-arg", action="append", default=[], help="extra fq_worker argument (repeatable)")
    p.add_argument("--claim-small", type=int, default=10_000)
    p.add_argument("--claim-large", type=int, default=1_000_000)
    p.add_argument("--claim1-samples", type=int, default=200)
    p.add_argument("--claim100-samples", type=int, default=50)
    p.add_argument("--drain-timeout", type=float, default=900)
    p.add_argument("--pool-n", type=int, default=5000, help="jobs per drain of the pool phase")
    p.add_argument("--pool-concurrency", default="1,4", help="fq_worker --concurrency values of the pool phase (comma-separated)")
    p.add_argument("--pg-name", "--db-name", dest="pg_name", default=os.environ.get("FQ_BENCH_PG_NAME", "fq_bench_suite"),
                   help="PostgreSQL / MariaDB database to (re)create; its claim databases get suffixes")
    p.add_argument("--batch", type=int, default=500, help="jobs per batch handler call of the batch phase (1-1000)")
    p.add_argument("--batch-concurrency", type=int, default=1, help="fq_worker --concurrency of the batch phase (batches at once)")
    p.add_argument("--snapshot-churn", type=int, default=SNAPSHOT_CHURN,
                   help="jobs enqueued, claimed and acked before the snapshot phase's claims (issue 15: 50,000)")
    p.add_argument("--quick", action="store_true", help="recorded in the JSON only; run.py picks the sizes")
    p.add_argument("--payload-bytes", type=int, default=0,
                   help="enqueue/drain phases: pad each payload to about this many bytes of JSON (0: {\"i\": i})")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if args.claim1_samples + 3 + 100 * (args.claim100_samples + 3) > args.claim_small:
        raise SystemExit("--claim-small is too small for the claim samples (each claimed job is used up)")
    sys.path.insert(0, REPO)
    db_info = prepare_environment(args)
    suite = Suite(args, db_info)
    try:
        result = suite.run()
    finally:
        if db_info.get("tmpdir"):
            suite.connection.close()
            shutil.rmtree(db_info["tmpdir"], ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    log(f"{args.db}: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
