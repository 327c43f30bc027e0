"""Run chaos scenarios on a fresh database: ``python -m tests.chaos.run [options]`` (``make chaos``).

    python -m tests.chaos.run                                   # every scenario, PostgreSQL and SQLite, full size
    python -m tests.chaos.run --scenario kill-storm --db postgres
    python -m tests.chaos.run --scenario kill-storm --minutes 30  # soak: storm for 30 minutes
    python -m tests.chaos.run --scenario stress --seconds 20      # CI size

Scenarios: kill-storm (20,000 jobs, 4 workers, kill -9 every 1–2 s),
workflow-storm (a 2,000-step workflow under the same storm: every step after
its dependencies, the group callback once), batch-storm (a batch of 5,000
members added in 4 calls, some dead, some cancelled: the callback once with
the real counts),
db-restart (the server restarted twice under load; PostgreSQL and MariaDB),
partition (a worker in its own network namespace cut off past its lease;
PostgreSQL only, root), stress (8 producers, 4 consumers, 2 reapers, a
pruner; 2 minutes), sqlite-writer (4 workers and a busy writer thread; SQLite
only), patroni-failover (kill -9 of the primary's postmaster, then a switchover, on
an etcd + two-node Patroni cluster on 127.0.0.1:5433/5434 of its own; root,
Debian's patroni and etcd-server; PostgreSQL only). ``all`` runs those that
apply to the database.

PostgreSQL: 127.0.0.1:5432, user postgres; the database ``fq_chaos``
(``--pg-name``) is dropped and created again. MariaDB/MySQL (``--db mariadb``):
127.0.0.1:3306, user root without a password, the same database name dropped
and created again. SQLite: a new WAL file in the
output directory. Logs of every child process and ``summary.json`` go to
``--out`` (default ``var/chaos/<UTC time>``). Prints one summary line per
scenario; exits 1 when any invariant broke or anything else went wrong.
The database restart scenario restarts the whole local server (PostgreSQL:
``pg_ctlcluster``; MariaDB: ``service mariadb restart``): every session of
every database on it is ended.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_ONLY = {"partition", "patroni-failover"}
SERVER_ONLY = {"db-restart"}  # a database server to restart: PostgreSQL or MariaDB
SQLITE_ONLY = {"sqlite-writer"}
ORDER = ["kill-storm", "workflow-storm", "batch-storm", "stress", "db-restart", "partition", "sqlite-writer",
         "patroni-failover"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="all", choices=["all", *ORDER])
    p.add_argument("--db", default="both", choices=["both", "all", "postgres", "sqlite", "mariadb"],
                   help="both: PostgreSQL and SQLite (default); all: also MariaDB")
    p.add_argument("--jobs", type=int, help="kill-storm jobs (default 20000), sqlite-writer jobs (default 3000), "
                   "batch-storm members (default 5000)")
    p.add_argument("--seconds", type=float, help="stress and db-restart duration (default 120 and 30)")
    p.add_argument("--minutes", type=float, help="soak: run kill-storm/stress/db-restart/sqlite-writer this long")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="output directory (default var/chaos/<UTC time>)")
    p.add_argument("--pg-name", "--db-name", dest="pg_name", default="fq_chaos",
                   help="PostgreSQL / MariaDB database to drop and create (default fq_chaos)")
    p.add_argument("--async-settle", action="store_true",
                   help="patroni-failover: the workers keep FQ_SYNCHRONOUS_SETTLE False (acks may be forgotten; counted)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p.parse_args(argv)


def applies(scenario: str, db: str) -> bool:
    return not (
        (scenario in PG_ONLY and db != "postgres")
        or (scenario in SERVER_ONLY and db == "sqlite")
        or (scenario in SQLITE_ONLY and db != "sqlite")
    )


def prepare(db: str, out: Path, pg_name: str) -> None:
    """Point ``tests.chaos.settings`` at a fresh database, set Django up and migrate."""
    os.environ["FQ_TEST_DB"] = db
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.chaos.settings"
    if db == "postgres":
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{pg_name}"')
        os.environ["FQ_CHILD_DB_NAME"] = pg_name
    elif db == "mariadb":
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=3306, user="root", password="")
        try:
            cur = conn.cursor()
            cur.execute(f"DROP DATABASE IF EXISTS `{pg_name}`")
            cur.execute(f"CREATE DATABASE `{pg_name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
        os.environ["FQ_CHILD_DB_NAME"] = pg_name
    else:
        path = out / "chaos.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        os.environ["FQ_CHILD_DB_NAME"] = str(path)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def run_one_db(args, db: str, out: Path) -> int:
    """Run the chosen scenarios on ``db`` in this process; print their summary lines; 0 when all passed."""
    prepare(db, out, args.pg_name)
    from tests.chaos import flows, scenarios

    every = {**scenarios.SCENARIOS, **flows.SCENARIOS}

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"[{db} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    names = [s for s in ORDER if args.scenario in ("all", s) and applies(s, db)]
    results, failed = [], 0
    for name in names:
        kwargs = {"progress": progress}
        if name == "kill-storm":
            kwargs.update(jobs=args.jobs or 20_000, minutes=args.minutes, seed=args.seed)
        elif name == "workflow-storm":
            kwargs.update(seed=args.seed)
        elif name == "batch-storm":
            kwargs.update(members=args.jobs or 5000, seed=args.seed)
        elif name == "sqlite-writer":
            kwargs.update(jobs=args.jobs or 3000, minutes=args.minutes)
        elif name == "stress":
            kwargs.update(seconds=(args.minutes * 60 if args.minutes else args.seconds or 120.0), seed=args.seed)
        elif name == "patroni-failover":
            kwargs.update(sync_settle=not args.async_settle)
        elif name == "db-restart":
            kwargs.update(seconds=(args.minutes * 60 if args.minutes else args.seconds or 30.0))
        progress(f"{name}: starting")
        try:
            outcome = every[name](out, **kwargs)
        except NotImplementedError as exc:  # a RuntimeError too, but django-fq failing, not a scenario that cannot run
            failed += 1
            print(f"chaos {name}: FAILED on {db}: django-fq raised NotImplementedError: {exc}", flush=True)
            continue
        except RuntimeError as exc:  # a scenario that cannot run here says why
            print(f"chaos {name}: skipped on {db}: {exc}", flush=True)
            continue
        line = outcome.line()
        print(f"{line} [{db}]", flush=True)
        if not outcome.ok:
            failed += 1
            print(outcome.describe(), file=sys.stderr, flush=True)
        results.append({"scenario": name, "db": db, "line": line, "ok": outcome.ok, "notes": outcome.notes,
                        "problems": outcome.problems, "violations": outcome.report.violations,
                        "report": {k: v for k, v in vars(outcome.report).items() if k not in ("violations", "by_kind")}})
    with open(out / f"summary-{db}.json", "w", encoding="utf-8") as fh:
        json.dump({"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine(),
                   "args": vars(args), "results": results}, fh, indent=2, default=str)
    return 1 if failed else 0


def machine() -> str:
    """A short description of this machine: CPUs, memory, kernel, Python."""
    try:
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) // 1024 // 1024
    except OSError:
        mem = 0
    return f"{os.cpu_count()} CPUs, {mem} GiB RAM, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out or ROOT / "var" / "chaos" / datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ"))
    out.mkdir(parents=True, exist_ok=True)
    dbs = {"both": ["postgres", "sqlite"], "all": ["postgres", "sqlite", "mariadb"]}.get(args.db, [args.db])
    if len(dbs) == 1:
        return run_one_db(args, dbs[0], out)
    # Django's settings pick the database once per process: one child per database.
    code = 0
    for db in dbs:
        child = [sys.executable, "-m", "tests.chaos.run", *_passthrough(argv), "--db", db, "--out", str(out)]
        code |= subprocess.run(child, cwd=ROOT).returncode
    print(f"chaos: logs and summary-*.json in {out}")
    return code


def _passthrough(argv) -> list[str]:
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--db", "--out"):
            skip = True
            continue
        if a.startswith(("--db=", "--out=")):
            continue
        kept.append(a)
    return kept


if __name__ == "__main__":
    raise SystemExit(main())
