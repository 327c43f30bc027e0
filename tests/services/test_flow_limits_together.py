"""A queue with every limit at once: concurrency, key_concurrency and a rate limit (docs/reference/semantics.md §9).

Each limit is tested on its own in its own file; this one checks they compose: the claim
hands out no more than the tightest of them allows, on every database.
"""

from __future__ import annotations

from collections import Counter

from django_fq import services as fq

from .helpers import QUEUE


def _keys(jobs) -> Counter:
    return Counter(fq.get(QUEUE, j.id).concurrency_key for j in jobs)


def test_key_concurrency_and_a_rate_limit_both_hold(frozen):
    fq.configure(QUEUE, key_concurrency=1, rate_limit=3, rate_window_ms=1000)
    for key in "abcde":
        fq.enqueue_many(QUEUE, [{"payload": n, "concurrency_key": key} for n in range(3)])
    first = fq.claim(QUEUE, count=100)
    # The rate limit: 3 a second though 5 keys have room; one job per key, in claim order.
    assert _keys(first) == Counter("abc") and [j.payload for j in first] == [0, 0, 0]
    assert first.rate_wait_ms == 1000

    for job in first:
        fq.ack(QUEUE, job.receipt)  # their keys have room again, the window has not moved
    assert fq.claim(QUEUE, count=100) == []

    frozen.advance(1000)
    second = fq.claim(QUEUE, count=100)
    # The acks gave a, b and c their slots back: their next jobs come first, in enqueue order.
    assert _keys(second) == Counter("abc") and [j.payload for j in second] == [1, 1, 1]


def test_the_queue_limit_key_limit_and_rate_limit_give_the_smallest(frozen):
    fq.configure(QUEUE, concurrency=2, key_concurrency=2, rate_limit=10, rate_window_ms=60_000)
    fq.enqueue_many(QUEUE, [{"payload": n, "concurrency_key": "k"} for n in range(5)])
    got = fq.claim(QUEUE, count=100)
    assert len(got) == 2  # concurrency 2 and key_concurrency 2; the rate would allow 10
    assert fq.claim(QUEUE, count=100) == []
    fq.ack(QUEUE, got[0].receipt)
    assert len(fq.claim(QUEUE, count=100)) == 1
    assert fq.stats(QUEUE).counts["running"] == 2
