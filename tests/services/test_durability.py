"""Lease changes django-fq commits itself skip the WAL flush on PostgreSQL, unless told not to.

Enqueues always wait for the flush, and nothing django-fq runs inside the
caller's transaction changes that transaction's durability.
"""

from __future__ import annotations

import contextlib

import pytest
from django.db import connection, transaction

from django_fq import services as fq

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

Q = "tests:durability"


@contextlib.contextmanager
def statements():
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def relaxed(seen: list[str]) -> bool:
    return any("synchronous_commit" in sql for sql in seen)


def cycle() -> dict[str, list[str]]:
    """Enqueue, claim, extend, nack, claim, release, claim, ack: the SQL of each step."""
    out = {}
    with statements() as out["enqueue"]:
        fq.enqueue(Q, {"n": 1})
    with statements() as out["claim"]:
        job = fq.claim(Q)[0]
    with statements() as out["extend"]:
        fq.extend(Q, job.receipt, visibility_ms=60_000)
    with statements() as out["nack"]:
        fq.nack(Q, job.receipt, delay_ms=0)
    job = fq.claim(Q)[0]
    with statements() as out["release"]:
        fq.release(Q, job.receipt)
    job = fq.claim(Q)[0]
    with statements() as out["ack"]:
        fq.ack(Q, job.receipt)
    assert fq.get(Q, job.id).state == "succeeded"
    return out


def test_lease_changes_skip_the_flush_and_enqueue_does_not():
    steps = cycle()
    assert not relaxed(steps["enqueue"])
    for name in ("claim", "extend", "nack", "release", "ack"):
        assert relaxed(steps[name]), name


def test_the_setting_makes_every_commit_wait_for_the_flush(settings):
    settings.FQ_SYNCHRONOUS_SETTLE = True
    steps = cycle()
    assert not any(relaxed(sql) for sql in steps.values())


def test_the_callers_transaction_keeps_its_durability():
    fq.enqueue(Q, {"n": 1})
    with transaction.atomic():
        with statements() as seen:
            job = fq.claim(Q)[0]
            fq.ack(Q, job.receipt)
        with connection.cursor() as cur:
            cur.execute("SHOW synchronous_commit")
            assert cur.fetchone()[0] == "on"
    assert not relaxed(seen)
