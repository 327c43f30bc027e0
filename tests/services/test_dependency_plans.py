"""The hand-off reads by index, never a scan of the workflow (issue 16, "Rules that make it exact").

Releasing a dependent costs in proportion to the direct dependents of the
job that finished: the statements that settle its edges find them by the
``fq_dep_upstream`` index and their jobs by primary key. Checked on each
database by its own planner: with 3,000 other jobs and 1,500 edges in the
tables (each upstream job with one dependent, statistics gathered), every
statement an ack, a batched ack, a permanent nack (which cancels the
dependents) and a cancel send that touches the edge table is explained, and
no plan may read the edge table or the job table whole (PostgreSQL ``Seq
Scan``, SQLite ``SCAN``, MariaDB/MySQL access type ``ALL`` or ``index``).
Small tables (queues, counter shards, leases) may be scanned: the planners
prefer that for a handful of rows.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection

from django_fq import services as fq

# Transactional: MariaDB/MySQL's ANALYZE TABLE commits the test's transaction implicitly, so
# the tables are flushed after the test instead of rolled back.
pytestmark = pytest.mark.django_db(transaction=True)

OTHER = "tests:svc-plans"
BIG = ("django_fq_dependency", "django_fq_job")
_NOT_ALIAS = {"where", "set", "on", "using", "join", "left", "inner", "group", "order", "for", "limit", "values",
              "select", "union", "returning", "as", "natural", "cross", "full", "right", "straight_join", "force",
              "use", "ignore", "lock", "window", "having"}


@pytest.fixture
def crowded(q):
    """1,500 upstream jobs with one dependent each in another queue, and fresh planner statistics."""
    roots = [r.id for r in fq.enqueue_many(OTHER, [{"payload": n} for n in range(1500)])]
    fq.enqueue_many(OTHER, [{"payload": n, "depends_on": [r]} for n, r in enumerate(roots)])
    with connection.cursor() as cur:
        if connection.vendor == "mysql":
            cur.execute("ANALYZE TABLE django_fq_dependency, django_fq_job")
            cur.fetchall()
        else:
            cur.execute("ANALYZE")
    return q


def _statements(action) -> list[tuple[str, object]]:
    """``(sql, params)`` of every statement ``action()`` sends that names the edge table."""
    seen = []

    def wrap(execute, sql, params, many, context):
        if "django_fq_dependency" in sql and not many:
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrap):
        action()
    return seen


def _names(sql: str) -> set[str]:
    """The big tables and the aliases the statement gives them."""
    names = set(BIG)
    for m in re.finditer(r"\b(django_fq_dependency|django_fq_job)\s+(?:AS\s+)?([A-Za-z_][A-Za-z_0-9]*)", sql, re.I):
        if m.group(2).lower() not in _NOT_ALIAS:
            names.add(m.group(2))
    return names


def _full_reads(sql: str, params) -> list[str]:
    """The lines of the statement's plan that read a big table whole (empty: found by index only)."""
    names = _names(sql)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("EXPLAIN " + sql, params)
            lines = [row[0] for row in cur.fetchall()]
            return [line for line in lines if any(f"Seq Scan on {t} " in line for t in BIG)]
        if connection.vendor == "sqlite":
            cur.execute("EXPLAIN QUERY PLAN " + sql, params)
            details = [row[-1] for row in cur.fetchall()]
            return [d for d in details if (m := re.match(r"SCAN (\w+)", d)) and m.group(1) in names]
        cur.execute("EXPLAIN " + sql, params)
        cols = [c[0].lower() for c in cur.description]
        rows = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
        return [str(r) for r in rows if r.get("table") in names and r.get("type") in ("ALL", "index")]


def _check(action) -> int:
    statements = _statements(action)
    for sql, params in statements:
        full = _full_reads(sql, params)
        assert not full, f"{sql[:400]}\nreads a table whole: {full}"
    return len(statements)


def _waiting_after(q: str, n: int) -> str:
    up = fq.enqueue(q, "up").id
    for i in range(n):
        fq.enqueue(q, i, depends_on=[up])
    return up


def test_acks_nacks_and_cancels_settle_edges_by_index(crowded):
    q = crowded
    _waiting_after(q, 3)
    job = fq.claim(q)[0]
    assert _check(lambda: fq.ack(q, job.receipt)) >= 1, "an ack"
    assert fq.stats(q).counts["ready"] == 3
    for job in fq.claim(q, count=3):
        fq.ack(q, job.receipt)

    _waiting_after(q, 2)
    _waiting_after(q, 2)
    jobs = fq.claim(q, count=2)
    assert _check(lambda: fq.ack_many(q, [(j.receipt, None) for j in jobs])) >= 1, "a batched ack"
    assert fq.stats(q).counts["ready"] == 4
    for job in fq.claim(q, count=4):
        fq.ack(q, job.receipt)

    _waiting_after(q, 3)
    job = fq.claim(q)[0]
    assert _check(lambda: fq.nack(q, job.receipt, error="no", permanent=True)) >= 1, "a permanent nack"
    assert fq.stats(q).counts["cancelled"] == 3

    up = _waiting_after(q, 3)
    assert _check(lambda: fq.cancel(q, up)) >= 1, "a cancel"
    assert fq.stats(q).counts["cancelled"] == 7
