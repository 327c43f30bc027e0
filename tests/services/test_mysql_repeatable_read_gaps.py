"""MariaDB / MySQL: an enqueue inside a caller's open REPEATABLE READ transaction stalls no other producer.

Under InnoDB's REPEATABLE READ a locking read that finds no row locks the
index gap where the row would be, until the transaction ends; every other
transaction's insert into that gap then waits (or deadlocks). The reads an
enqueue depends on (counter shard, unique key holder, token rows) must
therefore not lock rows that may be absent. Each case: a producer enqueues in
its REPEATABLE READ transaction and keeps it open; another producer (its own
connection, django-fq's own transaction) must finish without waiting for it
(docs/reference/semantics.md §9; the same property as
tests/services/test_enqueue.py::test_an_open_caller_transaction_does_not_block_the_queue,
which runs at the session's isolation).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq.models import Job
from tests.adversarial.helpers import Background

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]

CASES = {
    # first producer's options, second producer's options
    "plain-then-plain": ({}, {}),  # a new counter shard each
    "key-then-plain": ({"unique_key": "slow"}, {}),
    "plain-then-key": ({}, {"unique_key": "fast"}),
    "key-then-key": ({"unique_key": "slow"}, {"unique_key": "fast"}),
    "token-then-token": ({"idempotency": "slow"}, {"idempotency": "fast"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_open_repeatable_read_enqueue_does_not_stall_another_producer(case):
    first, second = CASES[case]
    q = f"rr-gap:{case}"
    fq.configure(q)
    enqueued, release = threading.Event(), threading.Event()

    def open_producer():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with transaction.atomic():
            fq.enqueue(q, "slow", **first)
            enqueued.set()
            assert release.wait(30)

    holder = Background(open_producer, "rr-open-producer").start()
    other = None
    try:
        assert enqueued.wait(10), holder.error
        other = Background(lambda: fq.enqueue(q, "fast", **second), "rr-other-producer").start()
        other.thread.join(10)
        stalled = other.thread.is_alive()
    finally:
        release.set()
        holder.join()
        if other is not None:
            other.join()
    assert not stalled, "the second producer waited for the open REPEATABLE READ transaction"
    assert holder.error is None and other.error is None, (holder.error, other.error)
    assert other.value.created is True
    assert sorted(fq.get(q, uid).payload for uid in Job.objects.filter(queue__name=q).values_list("uid", flat=True)) == [
        "fast",
        "slow",
    ]
