"""A settle that had to wait for the lease row's lock must judge the deadline after the wait.

Found while writing the docs (exact-deadline rule, docs/reference/semantics.md §5 and §9 "no receipt
is accepted at or after its deadline"). On PostgreSQL the settle verbs read
the lease with ``SELECT … CASE WHEN l.deadline > now … FOR UPDATE OF l``. The
``CASE`` is computed when the row is read, before the row lock is granted. If
another transaction holds that lock and then rolls back (so the row is
unchanged and PostgreSQL does not re-check it), the waiting call goes on with
a liveness verdict from before its wait: an ack arriving before the deadline
but granted the lock after it still succeeds.

It runs on every database with row locks (MariaDB/MySQL: the lease is locked,
then judged by a second read), with the holder, the waiting ack and the
probe each on a connection of its own.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

from django_fq import db
from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt
from tests.adversarial.helpers import Background, wait_for_lock_waiter

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

QUEUE = "docs-found:late-ack"
LOCK_LEASE = "SELECT 1 FROM django_fq_lease WHERE job_id = (SELECT seq FROM django_fq_job WHERE uid = %s) FOR UPDATE"


def test_ack_granted_the_lease_lock_after_the_deadline_is_refused():
    fq.enqueue(QUEUE, {"n": 1})
    job = fq.claim(QUEUE, visibility_ms=200)[0]
    locked, release = threading.Event(), threading.Event()

    def hold_then_roll_back():
        # Holds the lease row lock, then rolls back: the row is unchanged.
        with transaction.atomic():
            with connections["default"].cursor() as cur:
                cur.execute(LOCK_LEASE, [job.id])
                assert [tuple(r) for r in cur.fetchall()] == [(1,)]
            locked.set()
            assert release.wait(30)
            transaction.set_rollback(True)

    holder = Background(hold_then_roll_back, "late-ack-holder").start()
    side = None
    try:
        assert locked.wait(10), holder.error
        side = Background(lambda: fq.ack(QUEUE, job.receipt), "late-ack").start()
        # The ack is now blocked on the lock; keep it there until the deadline has passed.
        wait_for_lock_waiter(thread=side)
        assert side.thread.is_alive(), f"the ack never waited for the lease lock: {side.value!r} {side.error!r}"
        while db.db_now_ms() <= job.deadline:
            time.sleep(0.01)
    finally:
        release.set()
        holder.join()
        if side is not None:
            side.join()
    assert holder.error is None, holder.error

    # The lease was no longer valid when the ack was allowed to act on it.
    assert isinstance(side.error, InvalidReceipt), (side.value, side.error)
    assert fq.get(QUEUE, job.id).state != "succeeded"
