"""Workflows against plain jobs, in one run: enqueue, hand-off latency, drain (issue 16's benchmark).

    .venv/bin/python bench/workflows.py                 # PostgreSQL, N = 20,000, 2 drains of each kind
    .venv/bin/python bench/workflows.py --quick         # smoke test: N = 2,000, 1 drain each, 5 latency samples
    .venv/bin/python bench/workflows.py --db sqlite     # or mariadb (speed targets are PostgreSQL's)

Three measurements, each beside its plain counterpart on the same database in
the same run (docs/performance.md#workflows):

* **enqueue**: the wall time of ``Workflow.enqueue()`` of a 1,000-step
  fan-out/fan-in (one root, 998 steps after it, one step after all of
  them), ``--rounds`` times, each into a fresh queue; ``enqueue_many`` of
  1,000 plain jobs for scale.
* **hand-off latency**: one idle ``fq_worker`` (queue ``bench.stamp``, whose
  handler returns ``time.time()`` read first thing). K times, interleaved:
  *plain*: a random 0.3–1.3 s pause, t0, ``enqueue`` of one job, wait until it
  succeeded, sample = handler start − t0; *hand-off*: a job of the worker's
  queue depending on two jobs of a queue nobody serves, both claimed by this
  process, the first acked beforehand; a random pause, t0, the ack of the
  second (the last dependency) as a worker's completer makes it
  (``ack_many`` with the claim's ``has_dependents`` hint), sample = the
  dependent's handler start − t0. The enqueue's and the ack's own wall time
  are recorded too (``plain_enqueue_call``, ``handoff_ack_call``): the rest
  of each sample is commit → wakeup → claim → handler.
  Both clocks are this host's ``time.time()``; the database-clock figures
  beside them are ``claimed_at − enqueued_at`` (plain) and the dependent's
  ``claimed_at`` − the dependency's ``finished_at`` (hand-off), in whole ms.
* **drain**: N no-op jobs drained by one ``fq_worker --concurrency 256``
  (queue ``bench``), plain (one ``enqueue_many``) and as one workflow:
  a root, N − 2 − G steps after it, G fan-in steps each after up to 1,000 of
  them (a job depends on at most 1,000), one final step after the G
  (N = 20,000: 1 → 19,978 → 20 → 1). Steady rate = (N − 1) / (last
  ``finished_at`` − first ``finished_at``), database clock, as the suite's
  drain; the two kinds alternate, ``--reps`` of each.

The database is ``--db-name`` (default ``fq_bench_workflows``; PostgreSQL and
MariaDB: dropped and created at the start, dropped at the end; SQLite: a
temporary file). Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.suite import Observer, mysql_admin, percentile, pg_admin  # noqa: E402

QUEUE = "bench"  # bench/benchapp/fq_handlers.py: no-op
STAMP_QUEUE = "bench.stamp"  # its handler returns {"t": time.time()}
DEP_QUEUE = "bench.deps"  # served by nobody: this process claims and acks the dependencies
LATENCY_SEED = 12345
#: A job depends on at most this many (django_fq.services.dependencies.MAX_DEPENDENCIES).
FAN_IN = 1000


def log(msg: str) -> None:
    print(f"[workflows {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare(db: str, name: str) -> dict:
    """Point bench.settings at a fresh, empty database."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["FQ_BENCH_DB"] = db
    if not name.replace("_", "").isalnum():
        raise SystemExit(f"bad database name {name!r}")
    if db == "postgres":
        os.environ["FQ_BENCH_PG_NAME"] = name
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        pg_admin(f'CREATE DATABASE "{name}"')
        return {"database": name}
    if db == "mariadb":
        os.environ["FQ_BENCH_MYSQL_NAME"] = name
        mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
        mysql_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return {"database": name}
    tmp = tempfile.mkdtemp(prefix="fq-bench-wf-")
    os.environ["FQ_BENCH_SQLITE_PATH"] = os.path.join(tmp, "workflows.sqlite3")
    return {"database": os.environ["FQ_BENCH_SQLITE_PATH"], "tmpdir": tmp}


def drop(db: str, name: str, info: dict) -> None:
    from django.db import connections

    connections.close_all()
    if db == "postgres":
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    elif db == "mariadb":
        mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
    elif info.get("tmpdir"):
        shutil.rmtree(info["tmpdir"], ignore_errors=True)


def fan_shape(n: int) -> tuple[int, int]:
    """(middle steps, fan-in steps) of an n-job workflow 1 → middle → fan-ins → 1, each fan-in after ≤ 1,000."""
    if n < 4:
        raise SystemExit("--n must be at least 4")
    rest = n - 2  # middle + fan-ins
    groups = -(-rest // (FAN_IN + 1))
    while -(-(rest - groups) // FAN_IN) > groups:
        groups += 1
    return rest - groups, groups


class Bench:
    def __init__(self, args) -> None:
        import django

        django.setup()
        from django.apps import apps
        from django.core.management import call_command
        from django.db import connection

        from django_fq import services

        self.args = args
        self.fq = services
        self.connection = connection
        self.vendor = connection.vendor
        self.tables = [m._meta.db_table for m in apps.get_app_config("django_fq").get_models()]
        call_command("migrate", verbosity=0, interactive=False)
        self.worker_env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
        self.logs = tempfile.mkdtemp(prefix="fq-bench-wf-logs-")
        self.out: dict = {
            "db": args.db,
            "n": args.n,
            "concurrency": args.concurrency,
            "reps": args.reps,
            "lat_k": args.lat_k,
            "rounds": args.rounds,
            "loadavg_start": list(os.getloadavg()),
        }

    # -- helpers --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty every django-fq table (no worker running)."""
        with self.connection.cursor() as cur:
            if self.vendor == "postgresql":
                cur.execute(f"TRUNCATE {', '.join(self.tables)} RESTART IDENTITY CASCADE")
                return
            if self.vendor == "mysql":
                cur.execute("SET FOREIGN_KEY_CHECKS = 0")
                try:
                    for t in self.tables:
                        cur.execute(f"TRUNCATE TABLE {t}")
                finally:
                    cur.execute("SET FOREIGN_KEY_CHECKS = 1")
                return
            cur.execute("PRAGMA foreign_keys = OFF")
            try:
                for t in self.tables:
                    cur.execute(f"DELETE FROM {t}")
            finally:
                cur.execute("PRAGMA foreign_keys = ON")

    def observer(self) -> Observer:
        return Observer(self.vendor, self.connection.settings_dict)

    def start_worker(self, queue: str, tag: str) -> subprocess.Popen:
        cmd = [
            sys.executable,
            os.path.join(REPO, "manage.py"),
            "fq_worker",
            "--queue",
            queue,
            "--concurrency",
            str(self.args.concurrency),
            *self.args.worker_arg,
        ]
        logf = open(os.path.join(self.logs, f"{tag}.log"), "w")  # noqa: SIM115 - closed in stop_worker
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=self.worker_env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        proc.logf = logf  # type: ignore[attr-defined]
        return proc

    @staticmethod
    def stop_worker(proc: subprocess.Popen) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # our own session only
                proc.wait()
        proc.logf.close()  # type: ignore[attr-defined]
        return proc.returncode

    # -- enqueue --------------------------------------------------------------------------------

    def enqueue_phase(self) -> None:
        from django_fq.workflows import Workflow

        times: dict[str, list[float]] = {"plain": [], "workflow": []}
        for r in range(self.args.rounds):
            queue = f"wf-enqueue-{r}"
            self.fq.configure(queue)
            t0 = time.perf_counter()
            self.fq.enqueue_many(queue, [{"payload": {"n": i}} for i in range(1000)])
            times["plain"].append(time.perf_counter() - t0)
            queue = f"wf-enqueue-{r}-wf"
            self.fq.configure(queue)
            wf = Workflow()
            root = wf.step(queue, {"n": 0}, name="root")
            middle = [wf.step(queue, {"n": i}, name=f"s{i}", after=[root]) for i in range(1, 999)]
            wf.step(queue, {"n": 999}, name="join", after=middle)
            t0 = time.perf_counter()
            ids = wf.enqueue()
            times["workflow"].append(time.perf_counter() - t0)
            assert len(ids) == 1000
        self.out["enqueue_1000_s"] = {
            k: {"median": round(statistics.median(v), 4), "min": round(min(v), 4), "samples": [round(x, 4) for x in v]}
            for k, v in times.items()
        }
        log(f"enqueue: {json.dumps({k: v['median'] for k, v in self.out['enqueue_1000_s'].items()})}")

    # -- hand-off latency -----------------------------------------------------------------------

    def latency_phase(self) -> None:
        self.reset()
        proc = self.start_worker(STAMP_QUEUE, "latency")
        obs = self.observer()
        sql = "SELECT state, result, enqueued_at, claimed_at FROM django_fq_job WHERE uid = %s"

        def wait_done(uid: str, timeout: float = 60.0):
            give_up = time.perf_counter() + timeout
            while True:
                row = obs.one(sql, (uid,))
                if row and row[0] == "succeeded":
                    return row
                if time.perf_counter() > give_up or proc.poll() is not None:
                    raise RuntimeError(f"latency: job {uid} not done (worker logs in {self.logs})")
                time.sleep(0.001)

        plain, handoff, plain_db, handoff_db = [], [], [], []
        plain_call, handoff_call = [], []  # the enqueue's / the ack's own wall time (ms)
        try:
            self.fq.configure(DEP_QUEUE)
            wait_done(self.fq.enqueue(STAMP_QUEUE, {"warmup": True}).id, 120)
            time.sleep(1.5)
            rng = random.Random(LATENCY_SEED)
            for k in range(self.args.lat_k):
                # Plain pickup.
                time.sleep(rng.uniform(0.3, 1.3))
                t0 = time.time()
                uid = self.fq.enqueue(STAMP_QUEUE, {"k": k}).id
                plain_call.append((time.time() - t0) * 1000)
                row = wait_done(uid)
                plain.append((json.loads(row[1])["t"] - t0) * 1000)
                plain_db.append(row[3] - row[2])
                # Hand-off: the dependent of two jobs; the first acked now, the second after the pause.
                a = self.fq.enqueue(DEP_QUEUE, {"k": k, "dep": 1}).id
                b = self.fq.enqueue(DEP_QUEUE, {"k": k, "dep": 2}).id
                dependent = self.fq.enqueue(STAMP_QUEUE, {"k": k}, depends_on=[a, b]).id
                claimed = {j.id: j for j in self.fq.claim(DEP_QUEUE, count=2, visibility_ms=600_000)}
                self.fq.ack(DEP_QUEUE, claimed[a].receipt)
                time.sleep(rng.uniform(0.3, 1.3))
                t0 = time.time()
                # As a worker's completer acks it: its claim said others depend on it (the hint).
                self.fq.ack_many(DEP_QUEUE, [(claimed[b].receipt, None)], has_dependents=[b])
                handoff_call.append((time.time() - t0) * 1000)
                row = wait_done(dependent)
                handoff.append((json.loads(row[1])["t"] - t0) * 1000)
                acked_at = obs.one("SELECT finished_at FROM django_fq_job WHERE uid = %s", (b,))[0]
                handoff_db.append(row[3] - acked_at)
        finally:
            obs.close()
            exit_code = self.stop_worker(proc)

        def stats(xs):
            return {
                "median": round(statistics.median(xs), 3),
                "p95": round(percentile(xs, 0.95), 3),
                "samples": [round(x, 3) for x in xs],
            }

        self.out["latency_ms"] = {
            "plain": stats(plain),
            "handoff": stats(handoff),
            "plain_db": stats(plain_db),
            "handoff_db": stats(handoff_db),
            "plain_enqueue_call": stats(plain_call),
            "handoff_ack_call": stats(handoff_call),
            "worker_exit": exit_code,
        }
        lat = self.out["latency_ms"]
        log(
            f"latency: plain {lat['plain']['median']}/{lat['plain']['p95']} ms, "
            f"hand-off {lat['handoff']['median']}/{lat['handoff']['p95']} ms (median/p95)"
        )

    # -- drain ----------------------------------------------------------------------------------

    def enqueue_workflow(self, n: int) -> None:
        """The drain's workflow, as ``enqueue_many`` calls with ``depends_on`` (past the builder's 10,000 steps)."""
        middle, groups = fan_shape(n)
        root = self.fq.enqueue(QUEUE, {"i": 0}).id
        mids: list[str] = []
        for start in range(0, middle, 5000):
            items = [{"payload": {"i": 1 + i}, "depends_on": [root]} for i in range(start, min(middle, start + 5000))]
            mids += [r.id for r in self.fq.enqueue_many(QUEUE, items)]
        per = -(-middle // groups)
        joins = [
            r.id for r in self.fq.enqueue_many(
                QUEUE, [{"payload": {"join": g}, "depends_on": mids[g * per:(g + 1) * per]} for g in range(groups)]
            )
        ]  # fmt: skip
        self.fq.enqueue(QUEUE, {"final": True}, depends_on=joins)
        self.shape = {"root": 1, "middle": middle, "fan_in": groups, "final": 1}

    def drain(self, kind: str, rep: int) -> dict:
        n = self.args.n
        self.reset()
        self.connection.ensure_connection()
        t0 = time.perf_counter()
        if kind == "plain":
            for start in range(0, n, 10_000):
                self.fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(start, min(n, start + 10_000))])
        else:
            self.enqueue_workflow(n)
        enqueue_s = time.perf_counter() - t0
        self.connection.close()
        obs = self.observer()
        left_sql = "SELECT count(*) FROM django_fq_job WHERE state <> 'succeeded'"
        proc = self.start_worker(QUEUE, f"drain_{kind}_{rep}")
        start = time.perf_counter()
        try:
            while obs.one(left_sql)[0]:
                if proc.poll() is not None:
                    raise RuntimeError(f"drain {kind}: the worker exited (logs in {self.logs})")
                if time.perf_counter() - start > self.args.drain_timeout:
                    raise RuntimeError(f"drain {kind}: not finished after {self.args.drain_timeout} s")
                time.sleep(0.05)
            ok, first, last = obs.one(
                "SELECT count(*), min(finished_at), max(finished_at) FROM django_fq_job WHERE state = 'succeeded'"
            )
        finally:
            obs.close()
            exit_code = self.stop_worker(proc)
        if ok != n:
            raise RuntimeError(f"drain {kind}: {ok} of {n} succeeded")
        span = last - first
        rec = {
            "kind": kind,
            "rep": rep,
            "n": n,
            "enqueue_s": round(enqueue_s, 3),
            "first_to_last_ms": span,
            "steady_rate": round((n - 1) / (span / 1000), 1) if span > 0 else None,
            "worker_exit": exit_code,
            "loadavg": list(os.getloadavg()),
        }
        log(f"drain: {json.dumps(rec)}")
        return rec

    def drain_phase(self) -> None:
        runs = []
        for rep in range(self.args.reps):
            for kind in ("plain", "workflow"):
                runs.append(self.drain(kind, rep))
        rates = {
            k: [r["steady_rate"] for r in runs if r["kind"] == k and r["steady_rate"]] for k in ("plain", "workflow")
        }
        summary = {k: round(statistics.median(v), 1) if v else None for k, v in rates.items()}
        # Per repetition: each workflow drain against the plain drain just before it.
        ratios = [w / p for p, w in zip(rates["plain"], rates["workflow"], strict=False)]
        self.out["drain"] = {
            "shape": self.shape,
            "runs": runs,
            "steady_rate_median": summary,
            "ratio_per_rep": [round(x, 3) for x in ratios],
            "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        }

    def targets(self) -> list[dict]:
        out = []
        if "enqueue_1000_s" in self.out:
            v = self.out["enqueue_1000_s"]["workflow"]["median"]
            out.append({"target": "enqueue a 1,000-step workflow < 0.5 s (PostgreSQL)", "value": v, "met": v < 0.5})
        if "latency_ms" in self.out:
            lat = self.out["latency_ms"]
            for q in ("median", "p95"):
                d = lat["handoff"][q] - lat["plain"][q]
                out.append({"target": f"hand-off {q} within 2 ms of plain pickup", "value": round(d, 3), "met": d <= 2})
        if self.out.get("drain", {}).get("ratio_median") is not None:
            v = self.out["drain"]["ratio_median"]
            out.append({"target": "workflow drain ≥ 70 % of plain", "value": v, "met": v >= 0.7})
        return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", choices=("postgres", "sqlite", "mariadb"), default="postgres")
    p.add_argument("--quick", action="store_true", help="N = 2,000, 1 drain each, 5 latency samples, 2 rounds")
    p.add_argument("--n", type=int, help="jobs per drain (default 20,000; quick 2,000)")
    p.add_argument("--reps", type=int, help="drains of each kind (default 2; quick 1)")
    p.add_argument("--lat-k", type=int, help="latency samples of each kind (default 30; quick 5)")
    p.add_argument("--rounds", type=int, help="enqueue rounds (default 7; quick 2)")
    p.add_argument(
        "--concurrency", type=int, default=256, help="fq_worker --concurrency (default 256, as bench/run.py)"
    )
    p.add_argument("--worker-arg", action="append", default=[], metavar="ARG", help="extra fq_worker argument")
    p.add_argument("--phases", default="enqueue,latency,drain", help="comma-separated: enqueue,latency,drain")
    p.add_argument("--drain-timeout", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--db-name", default="fq_bench_workflows", help="PostgreSQL / MariaDB database (re-created)")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    quick = {"n": 2000, "reps": 1, "lat_k": 5, "rounds": 2}
    full = {"n": 20_000, "reps": 2, "lat_k": 30, "rounds": 7}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"enqueue", "latency", "drain"}
    if unknown:
        raise SystemExit(f"--phases: unknown {', '.join(sorted(unknown))}")
    info = prepare(args.db, args.db_name)
    try:
        bench = Bench(args)
        for phase in phases:
            getattr(bench, f"{phase}_phase")()
        bench.out["targets"] = bench.targets()
        bench.out["loadavg_end"] = list(os.getloadavg())
        text = json.dumps(bench.out, indent=1)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        shutil.rmtree(bench.logs, ignore_errors=True)
    finally:
        drop(args.db, args.db_name, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
