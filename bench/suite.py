"""The Django side of the benchmark: every measurement on ONE database.

``bench/run.py`` starts this module once per database (``python -m bench.suite
--db postgres|sqlite ...``) and merges the JSON files it writes. It:

1. creates a fresh database (PostgreSQL: drops and re-creates ``fq_bench_suite``;
   SQLite: a new WAL file in a temporary directory) and migrates it;
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
CLAIM_QUEUE = "claimbench"  # never served by a worker: claimed by this process only
TIME_BIN = "/usr/bin/time"
DRAIN_POLL_S = 0.05  # the drain observer's poll interval (the anchors use 50 ms too)
LATENCY_POLL_S = 0.001  # the latency observer's poll interval (the anchors use 1 ms too)
LATENCY_SEED = 12345  # same gap sequence on every run (the anchors use this seed too)
CLAIM_VISIBILITY_MS = 600_000
PHASES = ("enqueue", "drain", "latency", "claim")
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
)


# --- small helpers -------------------------------------------------------------------------------


def percentile(values, q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by the nearest-rank method (no interpolation)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    rank = max(1, min(len(xs), int(-(-q * len(xs) // 1))))  # ceil(q*n), clamped to 1..n
    return xs[rank - 1]


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


def prepare_environment(args) -> dict:
    """Point bench.settings at a fresh, empty database; return what the report should say about it."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["FQ_BENCH_DB"] = args.db
    if args.db == "postgres":
        name = args.pg_name
        if not name.replace("_", "").isalnum():
            raise SystemExit(f"bad database name {name!r}")
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


# --- the measurements (Django imported by main()) ----------------------------------------------


class Observer:
    """A plain DB-API connection, separate from Django's, that watches the jobs table.

    Like the anchors' observer: it is not the code under test, so it uses the
    driver directly (psycopg in autocommit mode / sqlite3 in autocommit mode).
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
            )
        else:
            import sqlite3

            self.conn = sqlite3.connect(settings_dict["NAME"], timeout=20, isolation_level=None)

    def rows(self, sql: str, params=()):
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
        self.now_sql = fqdb.now_sql(connection)
        self.JOB = Job._meta.db_table
        self.tables = [t._meta.db_table for t in (Lease, IdempotencyToken, QueueCounter, Job, Queue)]
        self.records: list[dict] = []
        self.explain: dict = {}
        self.logs = args.logs
        os.makedirs(self.logs, exist_ok=True)
        self.worker_env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
        self.worker_env.pop("FQ_BENCH_CLAIM_DBS", None)  # the claim databases are this process's business
        self.use_time = os.access(TIME_BIN, os.X_OK)

        log(f"{args.db}: migrating {db_info['database']}")
        call_command("migrate", verbosity=0, interactive=False)
        if self.pg:
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

    def worker_cmd(self, *extra: str) -> list[str]:
        return [
            sys.executable,
            os.path.join(REPO, "manage.py"),
            "fq_worker",
            "--queue",
            QUEUE,
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
        t0 = time.perf_counter()
        for i in range(n):
            enqueue(QUEUE, {"i": i})
        dt = time.perf_counter() - t0
        self.record({"rep": rep, "metric": "enqueue_single", "n": n, "seconds": dt, "rate": n / dt})

    def enqueue_bulk(self, rep: int) -> None:
        self.reset()
        n = self.args.n
        self.connection.ensure_connection()
        t0 = time.perf_counter()
        results = self.fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(n)])
        dt = time.perf_counter() - t0
        assert len(results) == n and all(r.created for r in results)
        self.record({"rep": rep, "metric": "enqueue_bulk", "n": n, "seconds": dt, "rate": n / dt})

    def drain(self, rep: int, workers: int) -> None:
        """Drain the N queued jobs with ``workers`` ``fq_worker --burst`` processes."""
        n = self.args.n
        job = self.JOB
        obs = self.observer()
        unfinished_sql = f"SELECT count(*) FROM {job} WHERE state IN ('queued', 'running')"
        queued = obs.one(unfinished_sql)[0]
        if queued != n:
            raise RuntimeError(f"drain{workers}: expected {n} queued jobs, found {queued}")
        cmd = self.worker_cmd("--burst", "--no-progress")
        spawn_db_ms = obs.one(f"SELECT {self.now_sql}")[0]
        t0 = time.perf_counter()
        procs = [self.start_worker(cmd, f"r{rep}_drain{workers}_w{w}") for w in range(workers)]
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
                "metric": f"drain{workers}",
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
        values = (
            "{uid}, %s, 'queued', 0, c.t, c.t, c.t, 0, 25, 0, 0, "
            "'{{\"i\":' || s.i || '}}', length('{{\"i\":' || s.i || '}}'), '', '[]'{j}, ''"
        )
        self._insert_series(cur, cols, values, queue_id, n, tag)

    def _insert_finished(self, cur, queue_id: int, n: int, tag: str) -> None:
        """``n`` finished jobs: 3 of 4 succeeded (as ``ack`` leaves them), 1 of 4 dead after 25 nacks."""
        cols = (
            "uid, queue_id, state, priority, run_at, enqueued_at, changed_at, claimed_at, finished_at, attempts, "
            "max_attempts, generation, timeout_ms, payload, payload_size, last_error, errors, worker, "
            "settled_hash, settled_op, settled_args, settled_outcome"
        )
        dead = "s.i - (s.i / 4) * 4 = 0"  # i mod 4 = 0, without '%' (a placeholder character here)
        values = (
            "{uid}, %s, CASE WHEN {dead} THEN 'dead' ELSE 'succeeded' END, 0, c.t - 60000, c.t - 60000, c.t, "
            "c.t - 5, CASE WHEN {dead} THEN NULL ELSE c.t END, CASE WHEN {dead} THEN 25 ELSE 1 END, 25, "
            "CASE WHEN {dead} THEN 25 ELSE 1 END, 0, '{{\"i\":' || s.i || '}}', length('{{\"i\":' || s.i || '}}'), "
            "CASE WHEN {dead} THEN 'boom' ELSE '' END, "
            "CASE WHEN {dead} THEN '[{{\"at\":' || c.t || ',\"attempt\":25,\"kind\":\"nack\",\"error\":\"boom\",\"worker\":\"w\"}}]' "
            "ELSE '[]' END{j}, 'w', {hash64}, CASE WHEN {dead} THEN 'nack' ELSE 'ack' END, {hash32}, "
            "CASE WHEN {dead} THEN '{{\"state\":\"dead\",\"run_at\":null}}' ELSE '{{\"state\":\"succeeded\",\"run_at\":null}}' END{j}"
        ).replace("{dead}", dead)
        self._insert_series(cur, cols, values, queue_id, n, tag)

    def _insert_series(self, cur, cols: str, values: str, queue_id: int, n: int, tag: str) -> None:
        """INSERT ... SELECT over 1..n (generate_series / a recursive CTE): fast, all in the database."""
        job = self.JOB
        if self.pg:
            values = values.format(
                uid=f"md5('{tag}' || s.i)",
                hash64=f"md5('a{tag}' || s.i) || md5('b{tag}' || s.i)",
                hash32=f"md5('c{tag}' || s.i)",
                j="::jsonb",  # errors / settled_outcome are jsonb columns on PostgreSQL
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
            )
            sql = (
                f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %s), "
                f"c(t) AS (SELECT {self.now_sql}) "
                f"INSERT INTO {job} ({cols}) SELECT {values} FROM s, c"
            )
            cur.execute(sql, [n, queue_id])

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

    def explain_claim(self, alias: str, count: int) -> dict:
        """The plans of every statement one real ``claim()`` runs, on the current data of ``alias``.

        The statements are captured from an actual ``services.claim`` call (rolled
        back), so the plans follow whatever SQL the claim path issues today;
        then each is explained in a second transaction that is rolled back too.
        PostgreSQL: ``EXPLAIN (ANALYZE, BUFFERS)``; SQLite: ``EXPLAIN QUERY PLAN``.
        """
        from django.db import connections, transaction

        conn = connections[alias]
        statements: list[tuple[str, object]] = []

        def capture(execute, sql, params, many, context):
            statements.append((sql, params))
            return execute(sql, params, many, context)

        with self.fq_database(alias), conn.execute_wrapper(capture), transaction.atomic(using=alias):
            self.fq.claim(CLAIM_QUEUE, count=count, visibility_ms=CLAIM_VISIBILITY_MS)
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
                    # SQLite has no wakeup: also measure with the idle poll pause held at 10 ms.
                    self.latency(rep, "poll10", ("--poll-interval", "10", "--max-poll-interval", "10"))
            if "claim" in phases:
                self.claims(rep)
        env["loadavg_end"] = loadavg()
        env["seconds"] = round(time.time() - started, 1)
        if "claim" in phases and self.pg:
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
        for variant, prefix in (("default", "latency"), ("poll10", "latency_poll10")):
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
            cur.execute("SELECT version()" if self.pg else "SELECT sqlite_version()")
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
    p.add_argument("--db", choices=("postgres", "sqlite"), required=True)
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
    p.add_argument("--pg-name", default=os.environ.get("FQ_BENCH_PG_NAME", "fq_bench_suite"))
    p.add_argument("--quick", action="store_true", help="recorded in the JSON only; run.py picks the sizes")
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
