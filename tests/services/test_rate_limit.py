"""Rate limits per queue (docs/reference/semantics.md §9 "Rate limits"), on every database.

The window is judged on the database clock; these tests freeze it (``frozen``) and move it
by the test-only offset setting, so every boundary is hit to the millisecond.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidPolicy
from django_fq.models import Queue, QueueRate, RateLog

from .helpers import QUEUE, most_in_a_window


def _enqueue(n: int, queue: str = QUEUE) -> list[str]:
    return [fq.enqueue(queue, {"i": i}).id for i in range(n)]


def _limit(rate_limit: int, window_ms: int = 1000, queue: str = QUEUE, **more) -> None:
    fq.configure(queue, rate_limit=rate_limit, rate_window_ms=window_ms, **more)


def test_a_full_window_stops_the_claim_and_says_when_the_next_slot_frees(frozen):
    _limit(3)
    _enqueue(10)
    jobs = fq.claim(QUEUE, count=10)
    assert len(jobs) == 3
    assert {j.claimed_at for j in jobs} == {frozen.now}
    assert jobs.rate_wait_ms == 1000
    assert jobs.rate_limited_until == frozen.now + 1000


def test_the_window_is_exact_to_the_millisecond(frozen):
    """A job whose predecessor by ``rate_limit`` claims was claimed ``rate_window_ms`` ago may go: not 1 ms sooner."""
    _limit(2, 1000)
    _enqueue(6)
    start = frozen.now
    assert len(fq.claim(QUEUE, count=5)) == 2
    frozen.advance(999)
    late = fq.claim(QUEUE, count=5)
    assert late == [] and late.rate_wait_ms == 1 and late.rate_limited_until == start + 1000
    frozen.advance(1)
    assert [j.claimed_at for j in fq.claim(QUEUE, count=5)] == [start + 1000] * 2


def test_the_window_slides_with_each_claim_instant(frozen):
    """Not a fixed bucket: each slot frees one window after its own claim."""
    _limit(3, 1000)
    _enqueue(10)
    t0 = frozen.now
    assert len(fq.claim(QUEUE, count=1)) == 1  # at t0
    frozen.advance(400)
    assert len(fq.claim(QUEUE, count=5)) == 2  # at t0 + 400: the window holds 3
    frozen.advance(599)
    blocked = fq.claim(QUEUE, count=5)
    assert blocked == [] and blocked.rate_limited_until == t0 + 1000
    frozen.advance(1)  # t0 + 1000: the first slot is free, the two of t0 + 400 are not
    got = fq.claim(QUEUE, count=5)
    assert len(got) == 1 and got.rate_limited_until == t0 + 1400 and got.rate_wait_ms == 400
    frozen.advance(400)
    assert len(fq.claim(QUEUE, count=5)) == 2


def test_every_window_holds_at_most_the_limit(frozen):
    """Claims of assorted sizes at assorted instants: no window of rate_window_ms ever holds more than the limit."""
    limit, window = 5, 100
    _limit(limit, window)
    _enqueue(200)
    instants: list[int] = []
    for step, count in [(0, 3), (10, 4), (30, 1), (60, 9), (90, 2), (100, 7), (101, 1), (150, 5), (199, 6), (200, 3)]:
        frozen.set(frozen.start + step)
        instants += [j.claimed_at for j in fq.claim(QUEUE, count=count)]
    instants.sort()
    assert most_in_a_window(instants, window) == limit
    # No idle slack: each claim took every slot its window had free: 3 at 0, 2 at 10, the 3 of 0
    # again at 100, the 2 of 10 at 150 (none at 101: they free at 110), the 3 of 100 at 200.
    assert len(instants) == 13


def test_a_claim_of_k_jobs_counts_k(frozen):
    _limit(4, 1000)
    _enqueue(10)
    assert len(fq.claim(QUEUE, count=3)) == 3
    assert len(fq.claim(QUEUE, count=3)) == 1


def test_released_nacked_and_expired_claims_give_no_slot_back(frozen):
    """A rate limit counts claims started, whatever became of them."""
    _limit(3, 10_000, visibility_ms=100)
    _enqueue(5)
    a, b, _c = fq.claim(QUEUE, count=3)
    fq.release(QUEUE, a.receipt)
    fq.nack(QUEUE, b.receipt, delay_ms=0)
    frozen.advance(100)  # c's lease expires; the claim's expiry handling ends it
    assert fq.claim(QUEUE, count=3) == []
    frozen.advance(10_000 - 100)
    assert len(fq.claim(QUEUE, count=5)) == 3


def test_no_wait_is_reported_when_the_queue_ran_out_first(frozen):
    _limit(5)
    _enqueue(2)
    got = fq.claim(QUEUE, count=10)
    assert len(got) == 2 and got.rate_wait_ms == 0 and got.rate_limited_until is None
    empty = fq.claim(QUEUE, count=10)
    assert empty == [] and empty.rate_wait_ms == 0


def test_concurrency_and_rate_limit_both_hold(frozen):
    _limit(5, 1000, concurrency=2)
    _enqueue(10)
    first = fq.claim(QUEUE, count=10)
    assert len(first) == 2  # the concurrency limit: no rate wait to report
    assert first.rate_wait_ms == 0
    for j in first:
        fq.ack(QUEUE, j.receipt)
    second = fq.claim(QUEUE, count=10)
    assert len(second) == 2
    for j in second:
        fq.ack(QUEUE, j.receipt)
    # 4 of 5 used: the window admits one more, the concurrency limit two.
    third = fq.claim(QUEUE, count=10)
    assert len(third) == 1 and third.rate_wait_ms == 1000


def test_lowering_the_limit_counts_the_claims_already_logged(frozen):
    _limit(10, 1000)
    _enqueue(20)
    assert len(fq.claim(QUEUE, count=6)) == 6
    _limit(4, 1000)
    assert fq.claim(QUEUE, count=5) == []
    _limit(8, 1000)
    assert len(fq.claim(QUEUE, count=5)) == 2
    frozen.advance(1000)
    assert len(fq.claim(QUEUE, count=20)) == 8


def test_a_longer_window_counts_the_logged_claims_too(frozen):
    _limit(2, 100)
    _enqueue(10)
    assert len(fq.claim(QUEUE, count=2)) == 2
    frozen.advance(100)
    _limit(2, 1000)
    got = fq.claim(QUEUE, count=2)
    assert got == [] and got.rate_wait_ms == 900


def test_the_log_keeps_the_last_limit_claims_only(frozen):
    _limit(3, 10)
    _enqueue(20)
    for _ in range(6):
        fq.claim(QUEUE, count=10)
        frozen.advance(10)
    qid = Queue.objects.get(name=QUEUE).id
    assert sorted(RateLog.objects.filter(queue_id=qid).values_list("n", flat=True)) == [15, 16, 17]
    assert QueueRate.objects.get(queue_id=qid).next_n == 18


def test_a_queue_without_a_rate_limit_writes_no_rate_rows(q):
    _enqueue(5, q)
    fq.configure(q, concurrency=3, rate_window_ms=500)  # a window without a limit is stored, and does nothing
    assert fq.policy(q).rate_window_ms == 500 and fq.policy(q).rate_limit == 0
    assert len(fq.claim(q, count=5)) == 3
    assert not RateLog.objects.exists() and not QueueRate.objects.exists()


def test_a_paused_rate_limited_queue_logs_nothing(frozen):
    _limit(3)
    _enqueue(3)
    fq.pause(QUEUE)
    assert fq.claim(QUEUE, count=3) == []
    assert not RateLog.objects.exists()
    fq.resume(QUEUE)
    assert len(fq.claim(QUEUE, count=3)) == 3


def test_deleting_the_queue_deletes_its_rate_rows(frozen):
    _limit(3)
    _enqueue(3)
    fq.claim(QUEUE, count=3)
    assert RateLog.objects.exists()
    fq.delete_queue(QUEUE)
    assert not RateLog.objects.exists() and not QueueRate.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("rate_limit", -1), ("rate_limit", 1_000_001), ("rate_window_ms", 0), ("rate_window_ms", 86_400_001),
     ("rate_limit", "5"), ("rate_window_ms", 1.5), ("rate_limit", True)],
)
def test_bad_rate_policy_names_the_field_and_writes_nothing(q, field, value):
    before = fq.policy(q)
    with pytest.raises(InvalidPolicy) as err:
        fq.configure(q, **{field: value})
    assert err.value.field == field
    assert fq.policy(q) == before


def test_rate_policy_bounds_are_inclusive(q):
    assert fq.configure(q, rate_limit=1_000_000, rate_window_ms=86_400_000).rate_limit == 1_000_000
    p = fq.configure(q, rate_limit=1, rate_window_ms=1)
    assert (p.rate_limit, p.rate_window_ms) == (1, 1)
    assert fq.configure(q, rate_limit=0).rate_limit == 0


def test_a_long_poll_waits_for_the_next_slot(db):
    """With the real (moving) database clock: the long poll returns the job once the window lets it through."""
    _limit(1, 300)
    _enqueue(2)
    first = fq.claim(QUEUE, count=1)
    second = fq.claim(QUEUE, count=1, wait_ms=5000)
    assert len(second) == 1
    assert second[0].claimed_at - first[0].claimed_at >= 300
