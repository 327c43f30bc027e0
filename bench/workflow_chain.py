"""Enqueue and cancel of a chain of N steps (``step0 → step1 → …``, one queue): wall time and statements.

    FQ_TEST_DB=postgres FQ_TEST_PG_TEST_NAME=test_fq_chain .venv/bin/python bench/workflow_chain.py 100 1000 10000
    FQ_TEST_DB=sqlite .venv/bin/python bench/workflow_chain.py 1000

The database is the test suite's (``tests.settings``, chosen by ``FQ_TEST_DB``
and the ``FQ_TEST_*`` variables; created at the start, dropped at the end).
For each N (default 100, 1,000, 10,000): ``Workflow.enqueue()`` of the chain
into a fresh queue, then ``workflows.cancel`` of its head; the wall time of
each (``time.perf_counter``) and the statements it sent (counted by a
``connection.execute_wrapper``, so there is no cap as with Django's query
log), one JSON line per N. Results: docs/performance.md#deep-workflow-chains.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402


def measure(n: int) -> dict:
    from django_fq import workflows

    queue = f"bench.chain-{n}"
    wf = workflows.Workflow()
    prev = None
    for i in range(n):
        prev = wf.step(queue, {"i": i}, name=f"step{i}", after=[prev] if prev else [])
    sent = [0]

    def count(execute, sql, params, many, context):
        sent[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        t0 = time.perf_counter()
        ids = wf.enqueue()
        enqueue_s = time.perf_counter() - t0
        enqueue_statements, sent[0] = sent[0], 0
        t0 = time.perf_counter()
        out = workflows.cancel(queue, ids["step0"])
        cancel_s = time.perf_counter() - t0
    return {
        "n": n,
        "enqueue_s": round(enqueue_s, 3),
        "enqueue_statements": enqueue_statements,
        "cancel_s": round(cancel_s, 3),
        "cancel_statements": sent[0],
        "cancelled": out.cancelled,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [100, 1000, 10000]
    old = setup_databases(verbosity=0, interactive=False)
    try:
        for n in sizes:
            print(json.dumps(measure(n)), flush=True)
        from django_fq.services import history

        history.TALLY.flush()  # before the database goes
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
