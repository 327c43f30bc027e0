"""delete_queue racing the verbs that write into the queue (PostgreSQL, where they really run at once).

docs/reference/semantics.md §2: deleting a queue deletes its jobs, leases and tokens; enqueue creates a
queue. §8: errors are clear and change nothing. A verb racing a deletion may lose
(QueueNotFound, or its job deleted with the queue) but must never surface a raw
database IntegrityError (a 500 over REST, a traceback on the CLI).

The interleavings are forced, not hoped for: a hook inside the first verb runs
delete_queue on another connection at the exact point of the race.
"""

from __future__ import annotations

import importlib

import pytest

from django_fq import services as fq
from django_fq.exceptions import JobNotFound, QueueNotFound
from django_fq.models import Job, Lease, Queue, QueueCounter

from .helpers import Background, wait_for_lock_waiter

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

enqueue_module = importlib.import_module("django_fq.services.enqueue")
leases_module = importlib.import_module("django_fq.services.leases")


def test_delete_queue_waits_for_an_enqueue_in_flight_and_deletes_its_job(monkeypatch):
    """delete_queue starts between enqueue's queue lookup and its commit (the general path).

    The enqueue holds the queue row FOR KEY SHARE, so delete_queue waits for it
    to commit and then deletes its job too: no error on either side, and no job
    outlives its queue (jobs have no database-level foreign key to it).
    """
    q = "adv.del.enqueue"
    fq.configure(q)
    qid = Queue.objects.get(name=q).id
    real_lookup = enqueue_module.get_or_create_queue
    deleting: list[Background] = []

    def lookup_then_delete(name, **kw):
        found = real_lookup(name, **kw)
        if not deleting:
            deleting.append(Background(lambda: fq.delete_queue(name)).start())
            wait_for_lock_waiter(1, thread=deleting[0])  # delete_queue is blocked on our lock
        return found

    monkeypatch.setattr(enqueue_module, "get_or_create_queue", lookup_then_delete)
    # A unique key takes the general path (the plain path is one statement, tested below).
    result = fq.enqueue(q, {"n": 1}, unique_key="k")
    assert result.created
    assert deleting[0].join().error is None, deleting[0].error
    assert not Queue.objects.filter(name=q).exists()
    assert not Job.objects.filter(queue_id=qid).exists()


def test_plain_enqueues_racing_delete_queue_leave_no_orphan_job():
    """One-statement enqueues from 4 threads while delete_queue runs again and again.

    Every enqueue either lands in a queue that exists at the end, or in one that
    delete_queue deleted together with its jobs; none raises a database error.
    """
    import threading
    import time

    q = "adv.del.plain"
    fq.configure(q)
    stop = threading.Event()
    workers = [Background(lambda: _enqueue_until(q, stop)) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(15):
            try:
                fq.delete_queue(q)
            except QueueNotFound:
                pass
            time.sleep(0.01)
    finally:
        stop.set()
    for w in workers:
        assert w.join().error is None, w.error
        assert w.value > 0
    live = set(Queue.objects.values_list("id", flat=True))
    assert set(Job.objects.values_list("queue_id", flat=True)) <= live
    if Queue.objects.filter(name=q).exists():
        stats = fq.stats(q)
        assert stats.counts["ready"] == Job.objects.filter(queue__name=q).count()


def _enqueue_until(q: str, stop) -> int:
    done = 0
    while not stop.is_set():
        fq.enqueue(q, {"n": done})
        done += 1
    return done


def test_delete_queue_while_a_claim_is_in_flight_raises_no_raw_integrity_error(monkeypatch):
    """A claim (queue with a concurrency limit: one transaction) has taken a job; delete_queue runs meanwhile.

    delete_queue removes the leases it can see, then waits on the job row the claim
    locked; the claim commits its new lease (and a counter shard); delete_queue then
    deletes the job and the queue and its commit fails on the foreign keys of the
    rows the claim added: IntegrityError (a 500 from DELETE /queues/<q>/).
    """
    q = "adv.del.claim"
    fq.configure(q, concurrency=5)
    fq.enqueue(q, {"n": 1})
    real_add = leases_module.add_counters
    deleting: list[Background] = []

    def add_counters_during_delete(conn, queue_id, **deltas):
        if "claimed" in deltas and not deleting:
            deleting.append(Background(lambda: fq.delete_queue(q), "adv-delete").start())
            wait_for_lock_waiter(thread=deleting[0])  # delete_queue now waits for the claimed job's row lock
        return real_add(conn, queue_id, **deltas)

    monkeypatch.setattr(leases_module, "add_counters", add_counters_during_delete)
    try:
        claimed = fq.claim(q, visibility_ms=60_000)
    except QueueNotFound:
        claimed = []
    deleting[0].join()

    assert deleting[0].error is None, f"delete_queue failed: {deleting[0].error!r}"
    # The queue is gone with everything it owned: nothing dangling.
    assert not Queue.objects.filter(name=q).exists()
    assert Lease.objects.count() == 0 and Job.objects.count() == 0 and QueueCounter.objects.count() == 0
    for job in claimed:
        with pytest.raises((QueueNotFound, JobNotFound)):
            fq.ack(q, job.receipt)
