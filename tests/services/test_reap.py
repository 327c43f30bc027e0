"""Expiry handling (docs/reference/semantics.md §5, §9): reap turns expired leases into failed attempts."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt, QueueNotFound
from django_fq.types import ReapResult

from .helpers import claim_one, rows

pytestmark = pytest.mark.django_db


def test_reap_requeues_an_expired_lease_after_the_backoff_from_the_deadline(q, frozen):
    fq.configure(q, backoff_ms=1000, max_attempts=5)
    job_id = fq.enqueue(q, {}).id
    job = claim_one(q, visibility_ms=2000)
    frozen.set(job.deadline - 1)
    assert fq.reap() == ReapResult(0, 0, 0)
    assert fq.get(q, job_id).state == "running"

    frozen.set(job.deadline)
    assert fq.reap() == ReapResult(expired=1, timed_out=0, dead=0)
    info = fq.get(q, job_id)
    assert (info.state, info.run_at, info.attempts) == ("scheduled", job.deadline + 1000, 1)
    assert info.lease_deadline is None
    assert info.errors[-1]["kind"] == "expired" and info.errors[-1]["attempt"] == 1
    assert info.last_error
    assert rows(q)["leases"] == 0
    assert fq.stats(q).totals["expired"] == 1
    with pytest.raises(InvalidReceipt):
        fq.ack(q, job.receipt)

    # Second expiry, reaped late: still counted from the deadline, with the next backoff step.
    frozen.set(job.deadline + 1000)
    second = claim_one(q, visibility_ms=500)
    assert second.attempts == 2
    frozen.set(second.deadline + 10_000)
    assert fq.reap(q).expired == 1
    info = fq.get(q, job_id)
    assert (info.run_at, info.attempts, info.state) == (second.deadline + 2000, 2, "ready")


def test_reap_makes_the_job_dead_when_out_of_attempts(q, frozen):
    job_id = fq.enqueue(q, {}, max_attempts=1).id
    job = claim_one(q, visibility_ms=100)
    frozen.set(job.deadline)
    assert fq.reap() == ReapResult(expired=1, timed_out=0, dead=1)
    info = fq.get(q, job_id)
    assert (info.state, info.attempts) == ("dead", 1)
    stats = fq.stats(q)
    assert stats.totals["dead"] == 1 and stats.totals["expired"] == 1
    assert stats.counts["dead"] == 1
    frozen.advance(3_600_000)
    assert fq.claim(q) == []


def test_every_expiry_is_an_attempt(q, frozen):
    fq.configure(q, max_attempts=2, backoff_ms=0)
    job_id = fq.enqueue(q, {}).id
    for attempt in (1, 2):
        job = claim_one(q, visibility_ms=100)
        assert job.attempts == attempt
        frozen.set(job.deadline)
        fq.reap()
    info = fq.get(q, job_id)
    assert (info.state, info.attempts) == ("dead", 2)
    assert [e["kind"] for e in info.errors] == ["expired", "expired"]


def test_timed_out_even_if_extended(q, frozen):
    fq.configure(q, backoff_ms=1000)
    job_id = fq.enqueue(q, {}, timeout_ms=3000).id
    claimed_at = frozen.now
    job = claim_one(q, visibility_ms=1000)
    frozen.advance(900)
    assert fq.extend(q, job.receipt, visibility_ms=1500) == claimed_at + 2400
    frozen.advance(1400)
    assert fq.extend(q, job.receipt, visibility_ms=5000) == claimed_at + 3000
    frozen.set(claimed_at + 2999)
    assert fq.reap() == ReapResult(0, 0, 0)
    frozen.set(claimed_at + 3000)
    assert fq.reap() == ReapResult(expired=0, timed_out=1, dead=0)
    info = fq.get(q, job_id)
    assert (info.state, info.run_at, info.attempts) == ("scheduled", claimed_at + 4000, 1)
    assert info.errors[-1]["kind"] == "timeout"
    assert "timeout" in info.last_error
    totals = fq.stats(q).totals
    assert (totals["timed_out"], totals["expired"]) == (1, 0)
    with pytest.raises(InvalidReceipt):
        fq.ack(q, job.receipt)


def test_timeout_on_the_last_attempt_is_dead(q, frozen):
    job_id = fq.enqueue(q, {}, timeout_ms=500, max_attempts=1).id
    job = claim_one(q, visibility_ms=60_000)
    assert job.deadline == frozen.now + 500
    frozen.set(job.deadline)
    assert fq.reap() == ReapResult(expired=0, timed_out=1, dead=1)
    assert fq.get(q, job_id).state == "dead"


def test_reap_of_one_queue_leaves_the_others(q, frozen):
    fq.enqueue(q, "mine")
    fq.enqueue("other", "theirs")
    mine = claim_one(q, visibility_ms=100)
    theirs = claim_one("other", visibility_ms=100)
    frozen.advance(100)
    assert fq.reap(q).expired == 1
    assert fq.get(q, mine.id).state in ("scheduled", "ready")
    assert fq.get("other", theirs.id).state == "running"
    assert fq.reap().expired == 1
    assert fq.get("other", theirs.id).state in ("scheduled", "ready")


def test_reap_limit(q, frozen):
    fq.enqueue_many(q, [{"payload": n} for n in range(5)])
    fq.claim(q, count=5, visibility_ms=100)
    frozen.advance(100)
    assert fq.reap(limit=2).expired == 2
    assert fq.stats(q).counts["running"] == 3
    assert fq.reap().expired == 3
    assert fq.reap() == ReapResult(0, 0, 0)


def test_reap_of_a_missing_queue(db):
    with pytest.raises(QueueNotFound):
        fq.reap("missing")


def test_settled_leases_are_not_reaped(q, frozen):
    fq.enqueue_many(q, [{"payload": n} for n in range(3)])
    a, b, c = fq.claim(q, count=3, visibility_ms=100)
    fq.ack(q, a.receipt)
    fq.nack(q, b.receipt, delay_ms=0)
    fq.release(q, c.receipt)
    frozen.advance(1000)
    assert fq.reap() == ReapResult(0, 0, 0)
    assert fq.get(q, a.id).state == "succeeded"
    assert fq.get(q, b.id).attempts == 1
    assert fq.get(q, c.id).attempts == 0
