"""MariaDB / MySQL: a settle locks the leases it names, and waits for no other.

A locking read in InnoDB locks every row it passes, not only those it returns.
The settles' lease lock once went through the ``(queue_id, deadline)`` index
the optimizer picks for a small table, which passes every lease of the queue:
two workers' acks then waited on each other's leases and one was rolled back
(error 1213; the MariaDB kill storm saw about 150 per 8,000 jobs, retried).
Here another transaction holds one lease of the queue, and an ack of other
jobs of the same queue must not wait for it.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from django_fq import services as fq
from django_fq.storage.base import LEASE_TABLE

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]

#: Seconds a lock wait may last in the acking session before the server gives up (1205).
WAIT_S = 2


def _hold_lease(job_seq: int, held: threading.Event, done: threading.Event, errors: list) -> None:
    """Keep the lease row of ``job_seq`` locked (FOR UPDATE) until ``done`` is set."""
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(f"SELECT job_id FROM {LEASE_TABLE} WHERE job_id = %s FOR UPDATE", [job_seq])
                assert cur.fetchone() is not None
            held.set()
            done.wait(30)
    except BaseException as exc:  # reported to the test thread
        errors.append(exc)
        held.set()
    finally:
        connections.close_all()


@pytest.mark.parametrize("acked", [1, 8])
def test_an_ack_waits_for_no_lease_it_does_not_name(acked):
    from django_fq.models import Job

    queue = f"locks:ack{acked}"
    fq.configure(queue)
    # Enough leases that the (queue_id, deadline) index looks cheap to the optimizer.
    fq.enqueue_many(queue, [{"payload": i} for i in range(40)])
    claimed = []
    for visibility in (30_000, 40_000, 50_000, 60_000):  # deadlines spread, so the held lease sits among them
        claimed += fq.claim(queue, count=10, visibility_ms=visibility)
    assert len(claimed) == 40
    seq_of = dict(Job.objects.filter(uid__in=[c.id for c in claimed]).values_list("uid", "seq"))
    # The held lease's deadline is the earliest: a scan in deadline order meets it first.
    held_job, others = claimed[0], claimed[-acked:]

    held, done, errors = threading.Event(), threading.Event(), []
    holder = threading.Thread(target=_hold_lease, args=(seq_of[held_job.id], held, done, errors), daemon=True)
    holder.start()
    try:
        assert held.wait(30) and not errors, errors
        with connection.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = %s", [WAIT_S])
        # Without the fix this waits WAIT_S per try and raises error 1205 after its retries.
        results = fq.ack_many(queue, [(c.receipt, None) for c in others])
        assert [r.state for r in results] == ["succeeded"] * acked
    finally:
        done.set()
        holder.join(30)
        with connection.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
    assert not errors, errors
    assert fq.ack(queue, held_job.receipt).state == "succeeded"  # the held one was untouched
