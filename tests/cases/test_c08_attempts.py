"""C08 — Attempts are counted right: attempts = claims, and a lease expiry is an attempt."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.types import ReapResult

from .procs import advance_to

pytestmark = pytest.mark.django_db


def test_c08_single_attempt_nack_is_dead_with_one_attempt():
    queue = "c08-a"
    job = fq.enqueue(queue, {"n": 1}, max_attempts=1).id
    [claimed] = fq.claim(queue, visibility_ms=60_000)
    assert (claimed.attempts, claimed.max_attempts) == (1, 1)

    out = fq.nack(queue, claimed.receipt, error="boom", delay_ms=0)  # dead wins over any delay
    assert (out.state, out.run_at) == ("dead", None)
    info = fq.get(queue, job)
    assert (info.state, info.attempts, info.last_error) == ("dead", 1, "boom")
    assert [(e["kind"], e["attempt"], e["error"]) for e in info.errors] == [("nack", 1, "boom")]
    assert fq.claim(queue) == []
    totals = fq.stats(queue).totals
    assert (totals["claimed"], totals["nacked"], totals["dead"]) == (1, 1, 1)


@pytest.mark.parametrize("expiry_by", ["reaper", "next_claim"])
def test_c08_overrunning_the_lease_twice_uses_up_two_attempts(clock, expiry_by):
    """No heartbeat: each claim's lease runs out. After exactly 2 claims the job is dead."""
    queue = "c08-b"
    fq.configure(queue, backoff_ms=10_000, max_backoff_ms=10_000)
    job = fq.enqueue(queue, {"n": 1}, max_attempts=2).id

    def expire(deadline: int):
        advance_to(clock, deadline)
        if expiry_by == "reaper":
            return fq.reap()
        assert fq.claim(queue) == []  # the claim handles the expiry first, then finds nothing due
        return None

    [first] = fq.claim(queue, visibility_ms=1000)
    assert first.attempts == 1
    reaped = expire(first.deadline)
    if reaped is not None:
        assert reaped == ReapResult(expired=1, timed_out=0, dead=0)
    info = fq.get(queue, job)
    assert (info.state, info.attempts, info.run_at) == ("scheduled", 1, first.deadline + 10_000)

    advance_to(clock, info.run_at)
    [second] = fq.claim(queue, visibility_ms=1000)
    assert (second.id, second.attempts) == (job, 2)
    reaped = expire(second.deadline)
    if reaped is not None:
        assert reaped == ReapResult(expired=1, timed_out=0, dead=1)

    info = fq.get(queue, job)
    assert (info.state, info.attempts, info.lease_deadline) == ("dead", 2, None)
    assert [(e["kind"], e["attempt"]) for e in info.errors] == [("expired", 1), ("expired", 2)]
    assert info.last_error == info.errors[-1]["error"] != ""
    advance_to(clock, second.deadline + 3_600_000)
    assert fq.claim(queue) == []
    assert fq.reap() == ReapResult(0, 0, 0)
    totals = fq.stats(queue).totals
    assert (totals["claimed"], totals["expired"], totals["dead"], totals["nacked"]) == (2, 2, 1, 0)
