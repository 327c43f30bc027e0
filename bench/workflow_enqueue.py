"""Time to enqueue a 1,000-step workflow through :class:`django_fq.workflows.Workflow` (PostgreSQL by default).

    .venv/bin/python bench/workflow_enqueue.py              # 7 rounds of each shape
    .venv/bin/python bench/workflow_enqueue.py --rounds 15 --db sqlite

Shapes, 1,000 steps each, all in one queue:

* ``fan-out``: one root and 999 steps after it;
* ``fan-out-in``: one root, 998 steps after it, one step after all of them;
* ``chain-of-groups``: 10 groups of 100 steps, every step of a group after the
  first step of the group before (900 edges, 10 levels: one call, docs/performance.md#deep-workflow-chains);
* ``plain``: ``enqueue_many`` of 1,000 jobs without dependencies, for scale.

Each round enqueues into a fresh queue of a database of its own
(``fq_bench_workflow``, dropped and created at the start; SQLite: a temporary
file), and the wall time of ``Workflow.enqueue()`` (or ``enqueue_many``) is
taken with ``time.perf_counter``; the median and the fastest round are printed
as JSON. Results: docs/performance.md#enqueue-a-1000-step-workflow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DB_NAME = "fq_bench_workflow"


def _fresh_database(db: str) -> None:
    if db == "postgres":
        import psycopg

        host = os.environ.get("FQ_BENCH_PG_HOST", "127.0.0.1")
        user = os.environ.get("FQ_BENCH_PG_USER", "postgres")
        with psycopg.connect(f"host={host} user={user} dbname=postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
            conn.execute(f"CREATE DATABASE {DB_NAME}")
        os.environ["FQ_BENCH_PG_NAME"] = DB_NAME
    elif db == "sqlite":
        os.environ["FQ_BENCH_SQLITE_PATH"] = os.path.join(tempfile.mkdtemp(), "workflow.sqlite3")
    os.environ["FQ_BENCH_DB"] = db
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"


def _drop_database(db: str) -> None:
    if db != "postgres":
        return
    from django.db import connections

    connections.close_all()
    import psycopg

    host = os.environ.get("FQ_BENCH_PG_HOST", "127.0.0.1")
    user = os.environ.get("FQ_BENCH_PG_USER", "postgres")
    with psycopg.connect(f"host={host} user={user} dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")


def build(shape: str, queue: str):
    from django_fq.workflows import Workflow

    wf = Workflow()
    if shape == "fan-out":
        root = wf.step(queue, {"n": 0}, name="root")
        for i in range(1, 1000):
            wf.step(queue, {"n": i}, name=f"s{i}", after=[root])
    elif shape == "fan-out-in":
        root = wf.step(queue, {"n": 0}, name="root")
        middle = [wf.step(queue, {"n": i}, name=f"s{i}", after=[root]) for i in range(1, 999)]
        wf.step(queue, {"n": 999}, name="join", after=middle)
    elif shape == "chain-of-groups":
        before = None
        for g in range(10):
            after = [before] if before else []
            group = [wf.step(queue, {"g": g, "i": i}, name=f"g{g}-{i}", after=after) for i in range(100)]
            before = group[0]
    else:
        raise ValueError(shape)
    return wf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("postgres", "sqlite", "mariadb"), default="postgres")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    _fresh_database(args.db)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django_fq import services as fq

    out: dict = {"db": args.db, "rounds": args.rounds, "steps": 1000, "seconds": {}}
    try:
        for shape in ("plain", "fan-out", "fan-out-in", "chain-of-groups"):
            times = []
            for r in range(args.rounds):
                queue = f"wf-{shape}-{r}"
                fq.configure(queue)
                if shape == "plain":
                    items = [{"payload": {"n": i}} for i in range(1000)]
                    start = time.perf_counter()
                    fq.enqueue_many(queue, items)
                    times.append(time.perf_counter() - start)
                    continue
                wf = build(shape, queue)
                start = time.perf_counter()
                ids = wf.enqueue()
                times.append(time.perf_counter() - start)
                assert len(ids) == 1000
            out["seconds"][shape] = {"median": round(statistics.median(times), 4), "min": round(min(times), 4)}
    finally:
        _drop_database(args.db)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
