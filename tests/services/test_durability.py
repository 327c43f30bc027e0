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


def test_the_releasing_ack_relaxes_its_commit_in_its_locking_statement():
    """The ack of a job others depend on: the lock statement itself turns the flush off (no
    ``SET LOCAL`` round trip of its own), and its dependent is released."""
    up = fq.enqueue(Q, {"n": 1}).id
    dependent = fq.enqueue(Q, {"n": 2}, depends_on=[up]).id
    job = fq.claim(Q)[0]
    assert job.id == up and job.has_dependents
    settings_seen: list[str] = []

    def record(execute, sql, params, many, context):
        out = execute(sql, params, many, context)
        if "FOR UPDATE OF l" in sql and "set_config('synchronous_commit'" in sql:
            # Read on the same connection (another cursor), inside the ack's transaction, after the lock.
            with connection.cursor() as cur:
                cur.execute("SELECT current_setting('synchronous_commit')")
                settings_seen.append(cur.fetchone()[0])
        return out

    with statements() as seen, connection.execute_wrapper(record):
        fq.ack_many(Q, [(job.receipt, None)], has_dependents=[up])
    assert settings_seen == ["off"]
    assert not any(sql.lstrip().upper().startswith("SET LOCAL") for sql in seen)
    assert fq.get(Q, dependent).state == "ready"
    # Inside the caller's transaction nothing changes its durability.
    up2 = fq.enqueue(Q, {"n": 3}).id
    fq.enqueue(Q, {"n": 4}, depends_on=[up2])
    with transaction.atomic():
        job = fq.claim(Q)[0]
        with statements() as seen:
            fq.ack_many(Q, [(job.receipt, None)], has_dependents=[up2])
        with connection.cursor() as cur:
            cur.execute("SHOW synchronous_commit")
            assert cur.fetchone()[0] == "on"
    assert not relaxed(seen)
