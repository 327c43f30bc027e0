"""Claims (docs/reference/semantics.md §5): bounds, order, concurrency, the 32 MiB cap, long polls."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from django_fq import services as fq
from django_fq.exceptions import CountOutOfRange, InvalidArgument, InvalidQueueName, QueueNotFound, VisibilityOutOfRange

from .helpers import QUEUE, claim_one, rows

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024
DAY = 86_400_000


# --- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1001, -1, True, "1", 1.0, None])
def test_count_out_of_range_is_rejected_and_changes_nothing(q, count):
    job_id = fq.enqueue(q, {}).id
    with pytest.raises(CountOutOfRange) as err:
        fq.claim(q, count=count)
    assert err.value.field == "count"
    assert fq.get(q, job_id).state == "ready"
    assert fq.stats(q).totals["claimed"] == 0


def test_count_bounds_accepted(q):
    fq.enqueue_many(q, [{"payload": n} for n in range(1005)])
    assert len(fq.claim(q, count=1)) == 1
    assert len(fq.claim(q, count=1000)) == 1000
    assert len(fq.claim(q, count=1000)) == 4


@pytest.mark.parametrize("vis", [0, DAY + 1, -5, 1.5, "100", True])
def test_visibility_out_of_range_is_rejected_and_changes_nothing(q, vis):
    job_id = fq.enqueue(q, {}).id
    with pytest.raises(VisibilityOutOfRange) as err:
        fq.claim(q, visibility_ms=vis)
    assert err.value.field == "visibility_ms"
    assert fq.get(q, job_id).state == "ready"
    assert fq.get(q, job_id).attempts == 0


@pytest.mark.parametrize("vis", [1, DAY])
def test_visibility_bounds_accepted(q, frozen, vis):
    fq.enqueue(q, {})
    job = claim_one(q, visibility_ms=vis)
    assert job.claimed_at == frozen.now
    assert job.deadline == frozen.now + vis
    assert fq.get(q, job.id).lease_deadline == job.deadline


def test_default_visibility_comes_from_the_policy(q, frozen):
    fq.enqueue(q, {})
    assert claim_one(q).deadline == frozen.now + 30_000
    fq.configure(q, visibility_ms=1234)
    fq.enqueue(q, {})
    assert claim_one(q).deadline == frozen.now + 1234


@pytest.mark.parametrize("wait", [-1, 20_001, "5"])
def test_wait_ms_out_of_range_is_rejected(q, wait):
    with pytest.raises(InvalidArgument) as err:
        fq.claim(q, wait_ms=wait)
    assert err.value.field == "wait_ms"


def test_claim_of_a_missing_queue_raises_and_does_not_create_it(db):
    with pytest.raises(QueueNotFound):
        fq.claim("nope")
    with pytest.raises(QueueNotFound):
        fq.policy("nope")
    with pytest.raises(InvalidQueueName):
        fq.claim("bad name")


def test_empty_list_when_nothing_is_eligible(q):
    assert fq.claim(q) == []
    fq.enqueue(q, {}, delay_ms=60_000)
    assert fq.claim(q, count=10) == []
    fq.enqueue(q, {})
    claim_one(q)
    assert fq.claim(q, count=10) == []  # the running job is never handed out again


# --- what a claim returns ----------------------------------------------------------------


def test_claimed_job_fields(q, frozen):
    fq.configure(q, max_attempts=7)
    res = fq.enqueue(q, {"hello": "world"}, priority=4)
    enqueued_at = frozen.now
    frozen.advance(250)
    job = claim_one(q, visibility_ms=5000, worker="w-1")
    assert job.id == res.id
    assert job.queue == q
    assert job.payload == {"hello": "world"}
    assert job.priority == 4
    assert job.attempts == 1
    assert job.max_attempts == 7
    assert job.enqueued_at == enqueued_at
    assert job.claimed_at == enqueued_at + 250
    assert job.deadline == enqueued_at + 250 + 5000
    assert isinstance(job.receipt, str) and job.receipt
    info = fq.get(q, job.id)
    assert (info.state, info.attempts, info.claimed_at, info.worker) == ("running", 1, job.claimed_at, "w-1")


def test_attempts_are_incremented_by_each_claim(q):
    fq.enqueue(q, {})
    for expected in (1, 2, 3):
        job = claim_one(q)
        assert job.attempts == expected
        assert fq.get(q, job.id).attempts == expected
        fq.nack(q, job.receipt, delay_ms=0)
    assert fq.stats(q).totals["claimed"] == 3


def test_each_claim_gets_a_new_receipt(q):
    fq.enqueue(q, {})
    first = claim_one(q)
    fq.nack(q, first.receipt, delay_ms=0)
    second = claim_one(q)
    assert second.id == first.id
    assert second.receipt != first.receipt


# --- order -------------------------------------------------------------------------------


def test_priority_then_fifo(q):
    spec = [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1), ("f", 2**31 - 1), ("g", 0), ("h", -(2**31))]
    ids = {name: fq.enqueue(q, name, priority=prio).id for name, prio in spec}
    expected = ["f", "b", "d", "a", "c", "g", "e", "h"]
    got = [claim_one(q).payload for _ in range(3)]
    got += [j.payload for j in fq.claim(q, count=10)]
    assert got == expected
    assert fq.claim(q) == []
    assert set(ids) == set(got)


def test_fifo_is_enqueue_order_not_time(q, frozen):
    # All enqueued in the same database millisecond: the sequence still orders them.
    names = [f"job-{n}" for n in range(30)]
    fq.enqueue_many(q, [{"payload": n} for n in names[:10]])
    for n in names[10:]:
        fq.enqueue(q, n)
    assert [j.payload for j in fq.claim(q, count=30)] == names


def test_delayed_jobs_join_in_enqueue_order_once_eligible(q, frozen):
    fq.enqueue(q, "a", delay_ms=1000)
    fq.enqueue(q, "b")
    fq.enqueue(q, "c", delay_ms=500)
    fq.enqueue(q, "d", delay_ms=1000)
    fq.enqueue(q, "e", delay_ms=2000)
    fq.enqueue(q, "f", delay_ms=200, priority=1)
    assert [j.payload for j in fq.claim(q, count=10)] == ["b"]
    frozen.advance(999)
    assert [j.payload for j in fq.claim(q, count=10)] == ["f", "c"]
    frozen.advance(1)
    fq.enqueue(q, "g")
    # a and d became eligible at the same instant as g was enqueued, but came first.
    assert [j.payload for j in fq.claim(q, count=10)] == ["a", "d", "g"]
    frozen.advance(1000)
    assert [j.payload for j in fq.claim(q, count=10)] == ["e"]


def test_a_retried_job_keeps_its_place_in_line(q, frozen):
    first = fq.enqueue(q, "first").id
    job = claim_one(q)
    fq.enqueue(q, "second")
    fq.nack(q, job.receipt, delay_ms=100)
    frozen.advance(100)
    # Same priority: the original enqueue order decides, not the time it became eligible again.
    assert fq.claim(q, count=2)[0].id == first


# --- concurrency limit ---------------------------------------------------------------------


def test_concurrency_limit(q, frozen):
    fq.configure(q, concurrency=2, backoff_ms=0)
    fq.enqueue_many(q, [{"payload": n} for n in range(5)])
    held = fq.claim(q, count=5, visibility_ms=1000)
    assert [j.payload for j in held] == [0, 1]
    assert fq.claim(q, count=5) == []
    fq.ack(q, held[0].receipt)
    assert [j.payload for j in fq.claim(q, count=5, visibility_ms=1000)] == [2]
    assert fq.claim(q) == []
    # Raising the limit takes effect at once.
    fq.configure(q, concurrency=3)
    assert [j.payload for j in fq.claim(q, count=5, visibility_ms=1000)] == [3]
    assert fq.stats(q).counts["running"] == 3
    # Expired leases free their slots (the claim handles expiry first).
    frozen.advance(1000)
    got = fq.claim(q, count=5)
    assert len(got) == 3
    assert fq.stats(q).counts["running"] == 3


def test_zero_concurrency_means_unlimited(q):
    fq.enqueue_many(q, [{"payload": n} for n in range(50)])
    assert len(fq.claim(q, count=50)) == 50


def test_concurrency_is_per_queue(q):
    fq.configure(q, concurrency=1)
    fq.configure("other", concurrency=1)
    fq.enqueue(q, 1)
    fq.enqueue(q, 2)
    fq.enqueue("other", 3)
    assert len(fq.claim(q, count=5)) == 1
    assert len(fq.claim("other", count=5)) == 1


# --- 32 MiB claim cap ----------------------------------------------------------------------


def _payload_of_size(size: int) -> str:
    """A JSON string whose compact encoding is exactly ``size`` bytes (two quotes + letters)."""
    return "x" * (size - 2)


def test_claim_stops_before_passing_32_mib(q, settings, frozen):
    settings.FQ_MAX_PAYLOAD_BYTES = 20 * MIB
    a = fq.enqueue(q, _payload_of_size(17 * MIB)).id
    b = fq.enqueue(q, _payload_of_size(17 * MIB)).id
    first = fq.claim(q, count=2)
    assert [j.id for j in first] == [a]
    second = fq.claim(q, count=2)
    assert [j.id for j in second] == [b]
    assert len(second[0].payload) == 17 * MIB - 2


def test_claim_cap_is_inclusive_and_small_jobs_fill_up(q, settings, frozen):
    settings.FQ_MAX_PAYLOAD_BYTES = 20 * MIB
    a = fq.enqueue(q, _payload_of_size(16 * MIB)).id
    b = fq.enqueue(q, _payload_of_size(16 * MIB)).id
    c = fq.enqueue(q, _payload_of_size(2)).id  # "" : 2 bytes, passes 32 MiB by 2 bytes
    got = fq.claim(q, count=10)
    assert [j.id for j in got] == [a, b]  # exactly 32 MiB together
    assert [j.id for j in fq.claim(q, count=10)] == [c]


# --- long poll ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_long_poll_returns_a_job_enqueued_during_the_wait():
    fq.configure(QUEUE)
    started = threading.Event()
    errors = []

    def producer():
        try:
            started.wait(5)
            time.sleep(0.2)
            fq.enqueue(QUEUE, {"late": True})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    t = threading.Thread(target=producer)
    t.start()
    begin = time.monotonic()
    started.set()
    got = fq.claim(QUEUE, wait_ms=10_000)
    elapsed = time.monotonic() - begin
    t.join()
    assert errors == []
    assert [j.payload for j in got] == [{"late": True}]
    assert elapsed < 9.0, "the long poll must return when the job arrives, not at the end of the wait"


@pytest.mark.django_db(transaction=True)
def test_long_poll_returns_empty_after_the_wait():
    fq.configure(QUEUE)
    fq.enqueue(QUEUE, {}, delay_ms=60_000)
    begin = time.monotonic()
    assert fq.claim(QUEUE, wait_ms=200) == []
    assert time.monotonic() - begin >= 0.2
    assert rows(QUEUE)["leases"] == 0


@pytest.mark.django_db(transaction=True)
def test_long_poll_picks_up_a_job_that_becomes_due():
    fq.configure(QUEUE)
    fq.enqueue(QUEUE, "soon", delay_ms=150)
    got = fq.claim(QUEUE, wait_ms=5000)
    assert [j.payload for j in got] == ["soon"]


def test_long_poll_returns_at_once_when_a_job_is_ready(q):
    fq.enqueue(q, "now")
    begin = time.monotonic()
    assert [j.payload for j in fq.claim(q, wait_ms=20_000)] == ["now"]
    assert time.monotonic() - begin < 10
