"""A settle that had to wait for the lease row's lock must judge the deadline after the wait.

Found while writing the docs (exact-deadline rule, docs/reference/semantics.md §5 and §9 "no receipt
is accepted at or after its deadline"). On PostgreSQL the settle verbs read
the lease with ``SELECT … CASE WHEN l.deadline > now … FOR UPDATE OF l``. The
``CASE`` is computed when the row is read, before the row lock is granted. If
another transaction holds that lock and then rolls back (so the row is
unchanged and PostgreSQL does not re-check it), the waiting call goes on with
a liveness verdict from before its wait: an ack arriving before the deadline
but granted the lock after it still succeeds.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection, connections

from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

QUEUE = "docs-found:late-ack"
NOW_MS = "SELECT FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"


def _connect():
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params)


def test_ack_granted_the_lease_lock_after_the_deadline_is_refused():
    fq.enqueue(QUEUE, {"n": 1})
    job = fq.claim(QUEUE, visibility_ms=200)[0]

    holder = _connect()  # holds the lease row lock, then rolls back (changes nothing)
    probe = _connect()
    probe.autocommit = True
    outcome = {}

    def late_ack():
        try:
            outcome["value"] = fq.ack(QUEUE, job.receipt)
        except Exception as exc:  # handed to the test thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    try:
        holder.execute(
            "SELECT 1 FROM django_fq_lease l JOIN django_fq_job j ON j.seq = l.job_id WHERE j.uid = %s FOR UPDATE OF l",
            [job.id],
        )
        side = threading.Thread(target=late_ack, daemon=True)
        side.start()
        # The ack is now blocked on the lock; keep it there until the deadline has passed.
        give_up = time.monotonic() + 10
        while probe.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()[0] < 1:
            assert time.monotonic() < give_up, "the ack never waited for the lease lock"
            time.sleep(0.01)
        while probe.execute(NOW_MS).fetchone()[0] <= job.deadline:
            time.sleep(0.01)
        holder.rollback()
        side.join(30)
        assert not side.is_alive()
    finally:
        holder.close()
        probe.close()

    # The lease was no longer valid when the ack was allowed to act on it.
    assert isinstance(outcome.get("error"), InvalidReceipt), outcome
    assert fq.get(QUEUE, job.id).state != "succeeded"
