"""Stats and prune (docs/reference/semantics.md §6, §9): counts, totals, wait/run times, retention."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import JobNotFound, QueueNotFound
from django_fq.types import STATE_NAMES, TOTAL_NAMES, ReapResult

from .helpers import claim_one, rows

pytestmark = pytest.mark.django_db

DAY = 86_400_000


def test_counts_per_state_are_exact(q):
    fq.enqueue_many(q, [{"payload": n, "delay_ms": 60_000} for n in range(2)])  # scheduled
    fq.enqueue_many(q, [{"payload": n} for n in range(9)])
    a, b, c, d, e, _f = fq.claim(q, count=6)
    fq.ack(q, a.receipt)
    fq.ack(q, b.receipt)
    fq.nack(q, c.receipt, permanent=True)
    fq.cancel(q, d.id)
    fq.nack(q, e.receipt, delay_ms=60_000)  # scheduled again
    # f stays running; 3 never claimed stay ready.
    stats = fq.stats(q)
    assert stats.queue == q
    assert stats.counts == {
        "waiting": 0, "scheduled": 3, "ready": 3, "running": 1, "succeeded": 2, "dead": 1, "cancelled": 1,
    }  # fmt: skip
    assert set(stats.counts) == set(STATE_NAMES)
    assert sum(stats.counts.values()) == rows(q)["jobs"]


def test_stats_of_a_missing_queue(db):
    with pytest.raises(QueueNotFound):
        fq.stats("missing")


def test_totals(q, frozen):
    fq.configure(q, max_attempts=2, backoff_ms=0)
    zero = fq.stats(q)
    assert zero.totals == dict.fromkeys(TOTAL_NAMES, 0)
    assert set(zero.totals) >= {
        "enqueued", "deduplicated", "claimed", "acked", "nacked", "expired",
        "retried", "cancelled", "dead", "released",
    }  # fmt: skip

    ids = [fq.enqueue(q, n, idempotency=f"t{n}").id for n in range(6)]  # enqueued 6
    fq.enqueue(q, 0, idempotency="t0")  # deduplicated 1
    fq.enqueue_many(q, [{"payload": 1, "idempotency": "t1"}, {"payload": 9, "idempotency": "t9"}])  # +1 dup, +1 new
    j0, j1, j2, j3, j4, _j5, j9 = fq.claim(q, count=10, visibility_ms=1000)  # claimed 7
    fq.ack(q, j0.receipt)  # acked 1
    fq.nack(q, j1.receipt)  # nacked 1 (attempt 1 of 2: back to ready)
    fq.nack(q, j2.receipt, permanent=True)  # nacked 2, dead 1
    fq.release(q, j3.receipt)  # released 1
    fq.cancel(q, j4.id)  # cancelled 1
    fq.retry(q, j2.id)  # retried 1
    fq.ack(q, j9.receipt)  # acked 2
    frozen.advance(1000)
    assert fq.reap(q).expired == 1  # j5: expired 1 (attempt 1 of 2)
    again = {j.id: j for j in fq.claim(q, count=10, visibility_ms=1000)}  # j1, j2, j3, j5: claimed 11
    assert set(again) == {ids[1], ids[2], ids[3], ids[5]}
    fq.nack(q, again[ids[1]].receipt)  # nacked 3, dead 2 (second attempt)
    frozen.advance(1000)
    assert fq.reap(q) == ReapResult(expired=3, timed_out=0, dead=1)  # j5 dead 3

    stats = fq.stats(q)
    assert stats.totals == {
        "enqueued": 7,
        "deduplicated": 2,
        "claimed": 11,
        "acked": 2,
        "nacked": 3,
        "released": 1,
        "expired": 4,
        "timed_out": 0,
        "retried": 1,
        "cancelled": 1,
        "dead": 3,
    }
    assert stats.counts["dead"] == 2  # j1 and j5; j2 was retried and is ready again after its expiry
    assert stats.counts["succeeded"] == 2 and stats.counts["cancelled"] == 1


def test_wait_and_run_times(q, frozen):
    fq.enqueue(q, "a")
    frozen.advance(500)
    a = claim_one(q)
    stats = fq.stats(q)
    assert (stats.wait_ms_sum, stats.wait_count, stats.run_ms_sum, stats.run_count) == (500, 1, 0, 0)
    frozen.advance(300)
    fq.ack(q, a.receipt)
    stats = fq.stats(q)
    assert (stats.wait_ms_sum, stats.wait_count, stats.run_ms_sum, stats.run_count) == (500, 1, 300, 1)

    # A delayed job waits from the moment it became eligible, not from its enqueue.
    fq.enqueue(q, "b", delay_ms=1000)
    frozen.advance(1500)
    b = claim_one(q)
    # A nacked attempt adds wait time to the next claim but no run time.
    frozen.advance(50)
    fq.nack(q, b.receipt, delay_ms=200)
    frozen.advance(260)
    b2 = claim_one(q)
    frozen.advance(70)
    fq.ack(q, b2.receipt)
    stats = fq.stats(q)
    assert stats.wait_count == 3
    assert stats.wait_ms_sum == 500 + 500 + 60
    assert (stats.run_ms_sum, stats.run_count) == (300 + 70, 2)


def test_wait_time_is_at_least_the_time_spent_waiting(q, clock):
    """The same measure with the moving clock: enqueue, 500 ms later claim."""
    fq.enqueue(q, {})
    clock.advance(500)
    claim_one(q)
    stats = fq.stats(q)
    assert stats.wait_count == 1
    assert 500 <= stats.wait_ms_sum < 60_000


def test_totals_unchanged_by_fold_counters(q, frozen):
    fq.enqueue_many(q, [{"payload": n} for n in range(5)])
    fq.enqueue(q, 0, idempotency="x")
    fq.enqueue(q, 0, idempotency="x")
    jobs = fq.claim(q, count=3)
    frozen.advance(25)
    fq.ack(q, jobs[0].receipt)
    fq.nack(q, jobs[1].receipt)
    fq.release(q, jobs[2].receipt)
    before = fq.stats(q)
    fq.fold_counters()
    assert fq.stats(q) == before
    fq.fold_counters()
    assert fq.stats(q) == before
    fq.enqueue(q, 1)
    after = fq.stats(q)
    assert after.totals["enqueued"] == before.totals["enqueued"] + 1
    fq.fold_counters()
    assert fq.stats(q) == after


def test_totals_are_per_queue(q):
    fq.enqueue(q, 1)
    fq.enqueue("other", 1)
    fq.enqueue("other", 2)
    fq.fold_counters()
    assert fq.stats(q).totals["enqueued"] == 1
    assert fq.stats("other").totals["enqueued"] == 2


# --- prune -------------------------------------------------------------------------------------


def test_prune_removes_old_finished_jobs_but_keeps_dead_and_recent(q, frozen):
    old_ok = fq.enqueue(q, "old ok").id
    fq.ack(q, claim_one(q).receipt)
    old_cancel = fq.enqueue(q, "old cancel").id
    fq.cancel(q, old_cancel)
    old_dead = fq.enqueue(q, "old dead").id
    fq.nack(q, claim_one(q).receipt, permanent=True)
    waiting = fq.enqueue(q, "ready").id
    later = fq.enqueue(q, "scheduled", delay_ms=DAY).id
    frozen.advance(5000)
    running = fq.enqueue(q, "running", priority=1).id
    assert claim_one(q).id == running
    recent_ok = fq.enqueue(q, "recent ok", priority=1).id
    fq.ack(q, claim_one(q).receipt)
    recent_cancel = fq.enqueue(q, "recent cancel").id
    fq.cancel(q, recent_cancel)
    frozen.advance(2000)

    result = fq.prune(retention_ms=5000)
    assert (result.jobs, result.tokens) == (2, 0)
    for gone in (old_ok, old_cancel):
        with pytest.raises(JobNotFound):
            fq.get(q, gone)
    for kept in (old_dead, waiting, later, running, recent_ok, recent_cancel):
        fq.get(q, kept)
    # Dead jobs stay however old they get.
    frozen.advance(365 * DAY)
    assert fq.prune(retention_ms=1).jobs == 2 + 0  # recent_ok and recent_cancel; not old_dead
    assert fq.get(q, old_dead).state == "dead"
    # Totals survive the pruning.
    assert fq.stats(q).totals["acked"] == 2


def test_prune_default_retention_is_seven_days(q, frozen):
    job_id = fq.enqueue(q, {}).id
    fq.ack(q, claim_one(q).receipt)
    frozen.advance(7 * DAY - 1)
    assert fq.prune().jobs == 0
    fq.get(q, job_id)
    frozen.advance(2)
    assert fq.prune().jobs == 1
    with pytest.raises(JobNotFound):
        fq.get(q, job_id)


def test_prune_retention_setting(q, frozen, settings):
    settings.FQ_FINISHED_RETENTION_MS = 1000
    fq.enqueue(q, {})
    fq.ack(q, claim_one(q).receipt)
    frozen.advance(999)
    assert fq.prune().jobs == 0
    frozen.advance(2)
    assert fq.prune().jobs == 1


def test_prune_removes_expired_tokens_only(q, frozen):
    fq.enqueue(q, 1, idempotency="short", idempotency_retention_ms=1000)
    long = fq.enqueue(q, 2, idempotency="long", idempotency_retention_ms=DAY).id
    frozen.advance(1000)
    result = fq.prune()
    assert (result.jobs, result.tokens) == (0, 1)
    assert rows(q)["tokens"] == 1
    assert fq.enqueue(q, 3, idempotency="long").id == long
    assert fq.enqueue(q, 4, idempotency="short").created is True


def test_prune_respects_its_limit(q, frozen):
    for n in range(5):
        fq.enqueue(q, n)
    for job in fq.claim(q, count=5):
        fq.ack(q, job.receipt)
    frozen.advance(10)
    assert fq.prune(retention_ms=1, limit=2).jobs == 2
    assert fq.prune(retention_ms=1).jobs == 3
    assert rows(q)["jobs"] == 0
