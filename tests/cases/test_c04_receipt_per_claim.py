"""C04 — A receipt belongs to one claim, not to a job.

W1 claims J (r1, 1 s lease); the deadline passes; expiry is handled (by the
reaper, or by the reap step W2's own claim runs first); W2 claims J (r2).
Every use of r1 fails with the invalid-receipt error and changes nothing;
r2 settles the job.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt, ReceiptCancelled

from .procs import advance_to

pytestmark = pytest.mark.django_db


def _state(queue: str, job: str):
    """Everything an errant settle could change: the job and the queue's stats."""
    stats = fq.stats(queue)
    return fq.get(queue, job), stats.counts, stats.totals


def _assert_rejected(call) -> None:
    with pytest.raises(InvalidReceipt) as caught:
        call()
    assert not isinstance(caught.value, ReceiptCancelled)
    assert caught.value.field == "receipt"


@pytest.mark.parametrize("expiry_by", ["reaper", "next_claim"])
def test_c04_old_receipt_cannot_settle_the_next_claim(clock, expiry_by):
    queue = "c04"
    fq.configure(queue, backoff_ms=0, max_attempts=5)
    job = fq.enqueue(queue, {"n": 1}).id
    [w1] = fq.claim(queue, visibility_ms=1000, worker="w1")
    r1 = w1.receipt

    # At the deadline r1 is dead even before anyone handled the expiry.
    advance_to(clock, w1.deadline)
    before = _state(queue, job)
    assert before[0].state == "running"
    _assert_rejected(lambda: fq.ack(queue, r1))
    _assert_rejected(lambda: fq.extend(queue, r1, visibility_ms=60_000))
    assert _state(queue, job) == before

    if expiry_by == "reaper":
        assert fq.reap().expired == 1
    [w2] = fq.claim(queue, visibility_ms=60_000, worker="w2")
    r2 = w2.receipt
    assert (w2.id, w2.attempts) == (job, 2)
    assert r2 != r1

    before = _state(queue, job)
    assert before[0].state == "running"
    assert before[0].lease_deadline == w2.deadline and before[0].worker == "w2"
    for late in (
        lambda: fq.ack(queue, r1, result={"from": "w1"}),
        lambda: fq.extend(queue, r1, visibility_ms=86_400_000),
        lambda: fq.nack(queue, r1, error="w1 failed"),
        lambda: fq.release(queue, r1),
    ):
        _assert_rejected(late)
        assert _state(queue, job) == before  # lease, attempts, history, totals all as they were

    done = fq.ack(queue, r2, result={"from": "w2"})
    assert (done.id, done.state, done.replay) == (job, "succeeded", False)
    info = fq.get(queue, job)
    assert (info.state, info.attempts, info.result) == ("succeeded", 2, {"from": "w2"})
    assert [e["kind"] for e in info.errors] == ["expired"]

    # After the job finished, r1 is still refused, and r2 only replays its own ack.
    _assert_rejected(lambda: fq.ack(queue, r1))
    assert fq.ack(queue, r2, result={"from": "w2"}).replay is True
    _assert_rejected(lambda: fq.ack(queue, r2))  # not the very same settle (another result)
    _assert_rejected(lambda: fq.nack(queue, r2))
    assert fq.get(queue, job).result == {"from": "w2"}
    assert fq.stats(queue).totals["acked"] == 1
