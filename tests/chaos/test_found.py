"""Engine bugs the chaos work found, each pinned by a test (fast tier).

1. PostgreSQL, a queue with a concurrency limit: a claim locked the queue row
   ``FOR UPDATE``, which waits for every transaction holding it ``FOR KEY
   SHARE`` — and every enqueue holds that until it commits. A caller's long
   transaction that enqueued one job into the queue therefore stopped every
   claim on it, when an enqueue inside a long caller transaction must never
   block the queue. Seen as stalled consumers of the limited queue in the
   stress scenario.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_fq import services as fq
from tests.adversarial.helpers import Background

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


def test_open_caller_transaction_that_enqueued_does_not_block_claims_of_a_limited_queue():
    q = "chaos.found.limited"
    fq.configure(q, concurrency=2)
    fq.enqueue(q, {"n": 1})
    enqueued, release = threading.Event(), threading.Event()

    def caller():
        try:
            with transaction.atomic():
                fq.enqueue(q, {"n": 2})  # holds the queue row FOR KEY SHARE until commit
                enqueued.set()
                release.wait(60)
        finally:
            connections.close_all()

    held = Background(caller, name="caller-transaction").start()
    try:
        assert enqueued.wait(30)
        claim = Background(lambda: fq.claim(q, count=1, visibility_ms=60_000), name="claimer").start()
        claim.thread.join(20)
        blocked = claim.thread.is_alive()
    finally:
        release.set()
        held.join(60)
    claim.join(60)
    assert not blocked, "the claim waited for the caller's open transaction"
    assert claim.error is None and len(claim.value) == 1 and claim.value[0].payload == {"n": 1}
