"""MariaDB / MySQL: what a claim or settle in a caller's REPEATABLE READ transaction still lets through.

Reads there that must see the newest commit lock (Store.fresh_read_sql), and
the locks last until the caller commits. They are kept to what the verb
writes next, or shared: a caller's open transaction that claimed from a queue
without a concurrency limit, or nacked one of its jobs, must not stall another
producer's enqueue into that queue (docs/reference/semantics.md §9: a
caller's long transaction must not block the queue).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from tests.adversarial.helpers import Background

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]


def _open_repeatable_read(work, done: threading.Event, release: threading.Event):
    def run():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with transaction.atomic():
            fq.stats(work.queue)  # the snapshot is taken by this first read
            work()
            done.set()
            assert release.wait(30)

    return run


class _Claim:
    def __init__(self, queue: str, nack: bool = False):
        self.queue, self.nack = queue, nack

    def __call__(self):
        job = fq.claim(self.queue)[0]
        if self.nack:
            fq.nack(self.queue, job.receipt, delay_ms=0, error="again later")


@pytest.mark.parametrize("nack", [False, True], ids=["claimed", "claimed-and-nacked"])
def test_an_open_repeatable_read_claim_stalls_no_producer(nack):
    q = f"rr-claim:{nack}"
    fq.configure(q)
    fq.enqueue(q, "held")
    fq.enqueue(q, "free")
    done, release = threading.Event(), threading.Event()
    holder = Background(_open_repeatable_read(_Claim(q, nack), done, release), "rr-open-claimer").start()
    others = []
    try:
        assert done.wait(10), holder.error
        others = [Background(lambda: fq.enqueue(q, "new"), "rr-producer").start()]
        for other in others:
            other.thread.join(10)
        stalled = [o.thread.name for o in others if o.thread.is_alive()]
    finally:
        release.set()
        holder.join()
        for other in others:
            other.join()
    assert not stalled, f"{stalled} waited for the open REPEATABLE READ transaction"
    assert holder.error is None and all(o.error is None for o in others), [holder.error, *(o.error for o in others)]
    assert others[0].value.created is True


@pytest.mark.xfail(
    strict=True,
    reason="known gap (0.1.0): the claim's expiry step reads expired leases with a locking range read, which "
    "in a caller's REPEATABLE READ transaction locks the end of the lease index until the caller commits; a "
    "plain read would miss leases that expired after the snapshot (claims never skip expiry handling)",
)
def test_an_open_repeatable_read_claim_stalls_no_other_claimer():
    q = "rr-claim:other"
    fq.configure(q)
    fq.enqueue(q, "held")
    fq.enqueue(q, "free")
    done, release = threading.Event(), threading.Event()
    holder = Background(_open_repeatable_read(_Claim(q), done, release), "rr-open-claimer").start()
    other = None
    try:
        assert done.wait(10), holder.error
        other = Background(lambda: fq.claim(q), "rr-other-claimer").start()
        other.thread.join(10)
        stalled = other.thread.is_alive()
    finally:
        release.set()
        holder.join()
        if other is not None:
            other.join()
    assert not stalled, "another worker's claim waited for the open REPEATABLE READ transaction"
    assert [j.payload for j in other.value] == ["free"]
