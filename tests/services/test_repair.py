"""Repair and inspection (docs/reference/semantics.md §6, §9): retry, cancel, get, jobs, wait."""

from __future__ import annotations

import dataclasses
import json

import pytest

from django_fq import services as fq
from django_fq.exceptions import (
    CountOutOfRange,
    InvalidArgument,
    InvalidCursor,
    InvalidReceipt,
    InvalidState,
    JobNotFound,
    QueueNotFound,
    WaitTimeout,
)
from django_fq.types import STATE_NAMES

from .helpers import claim_one, rows, snapshot

pytestmark = pytest.mark.django_db


def _make_dead(q, **options):
    job_id = fq.enqueue(q, {"dead": True}, **options).id
    job = claim_one(q)
    assert job.id == job_id
    assert fq.nack(q, job.receipt, permanent=True, error="broken").state == "dead"
    return job


def _make(q, state, payload=None):
    """A job of ``q`` in reported ``state``; returns its id (and leaves no other job ready)."""
    if state == "scheduled":
        return fq.enqueue(q, payload, delay_ms=60_000).id
    job_id = fq.enqueue(q, payload).id
    if state == "ready":
        return job_id
    if state == "cancelled":
        fq.cancel(q, job_id)
        return job_id
    job = claim_one(q)
    assert job.id == job_id
    if state == "succeeded":
        fq.ack(q, job.receipt)
    elif state == "dead":
        fq.nack(q, job.receipt, permanent=True)
    return job_id


# --- retry ----------------------------------------------------------------------------------


def test_retry_makes_a_dead_job_ready_with_attempts_reset(q, frozen):
    fq.configure(q, max_attempts=2)
    job_id = fq.enqueue(q, {"n": 1}).id
    fq.nack(q, claim_one(q).receipt, delay_ms=0)
    last = claim_one(q)
    assert fq.nack(q, last.receipt, error="second").state == "dead"
    frozen.advance(5000)

    info = fq.retry(q, job_id)
    assert (info.state, info.attempts, info.run_at) == ("ready", 0, frozen.now)
    assert info.payload == {"n": 1}
    assert fq.stats(q).totals["retried"] == 1
    # Old receipts stay invalid (a repeat of the very nack may only be a replay).
    for call in (lambda: fq.ack(q, last.receipt), lambda: fq.extend(q, last.receipt, visibility_ms=10)):
        with pytest.raises(InvalidReceipt):
            call()
    assert fq.get(q, job_id).state == "ready"
    # A full set of attempts again.
    job = claim_one(q)
    assert (job.id, job.attempts) == (job_id, 1)
    assert fq.nack(q, job.receipt, delay_ms=0).state == "ready"
    assert fq.nack(q, claim_one(q).receipt).state == "dead"


@pytest.mark.parametrize("state", ["scheduled", "ready", "running", "succeeded", "cancelled"])
def test_retry_of_a_job_that_is_not_dead_is_a_state_error(q, state):
    job_id = _make(q, state)
    before = snapshot(q, job_id)
    with pytest.raises(InvalidState) as err:
        fq.retry(q, job_id)
    assert err.value.code == "invalid_state"
    assert snapshot(q, job_id) == before
    assert fq.stats(q).totals["retried"] == 0


def test_retry_when_another_active_job_holds_the_unique_key(q):
    dead = _make_dead(q, unique_key="k")
    holder = fq.enqueue(q, {"new": True}, unique_key="k")
    assert holder.created is True
    before = snapshot(q, dead.id)
    with pytest.raises(InvalidState) as err:
        fq.retry(q, dead.id)
    assert holder.id in str(err.value)
    assert snapshot(q, dead.id) == before
    # Once the holder is finished the retry goes through.
    fq.cancel(q, holder.id)
    assert fq.retry(q, dead.id).state == "ready"
    assert fq.enqueue(q, {}, unique_key="k").id == dead.id


def test_retry_unknown_job(q):
    with pytest.raises(JobNotFound):
        fq.retry(q, "0" * 32)
    other = _make_dead("other")
    with pytest.raises(JobNotFound):
        fq.retry(q, other.id)
    assert fq.get("other", other.id).state == "dead"


# --- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["scheduled", "ready", "running", "dead"])
def test_cancel_from_each_active_or_dead_state(q, frozen, state):
    job_id = _make(q, state, payload={"s": state})
    assert fq.get(q, job_id).state == state
    frozen.advance(10)
    info = fq.cancel(q, job_id)
    assert info.state == "cancelled"
    assert info.finished_at == frozen.now
    assert info.lease_deadline is None
    assert info.errors[-1]["kind"] == "cancel"
    assert fq.get(q, job_id).state == "cancelled"
    assert rows(q)["leases"] == 0
    frozen.advance(3_600_000)
    assert fq.claim(q, count=10) == []
    stats = fq.stats(q)
    assert stats.totals["cancelled"] == 1
    assert stats.counts["cancelled"] == 1 and stats.counts[state] == 0


def test_cancel_of_a_running_job_frees_its_concurrency_slot(q):
    fq.configure(q, concurrency=1)
    fq.enqueue(q, 1)
    fq.enqueue(q, 2)
    running = claim_one(q)
    assert fq.claim(q) == []
    fq.cancel(q, running.id)
    assert claim_one(q).payload == 2


@pytest.mark.parametrize("state", ["succeeded", "cancelled"])
def test_cancel_of_a_finished_job_is_a_state_error(q, state):
    job_id = _make(q, state)
    before = snapshot(q, job_id)
    with pytest.raises(InvalidState):
        fq.cancel(q, job_id)
    assert snapshot(q, job_id) == before
    assert fq.stats(q).totals["cancelled"] == (1 if state == "cancelled" else 0)


def test_cancel_unknown_job(q):
    with pytest.raises(JobNotFound):
        fq.cancel(q, "f" * 32)
    other = fq.enqueue("other", {}).id
    with pytest.raises(JobNotFound):
        fq.cancel(q, other)
    assert fq.get("other", other).state == "ready"


# --- get ------------------------------------------------------------------------------------


def test_get_reports_metadata_payload_result_and_errors(q, frozen):
    fq.configure(q, max_attempts=5)
    res = fq.enqueue(q, {"p": [1, 2]}, priority=7, idempotency="tok", unique_key="uk", timeout_ms=9000)
    t0 = frozen.now
    info = fq.get(q, res.id)
    assert info.id == res.id and info.queue == q
    assert (info.state, info.priority, info.attempts, info.max_attempts) == ("ready", 7, 0, 5)
    assert (info.enqueued_at, info.run_at, info.changed_at) == (t0, t0, t0)
    assert (info.idempotency, info.unique_key, info.timeout_ms) == ("tok", "uk", 9000)
    assert (info.payload, info.result, info.errors, info.last_error) == ({"p": [1, 2]}, None, [], "")
    assert (info.claimed_at, info.finished_at, info.lease_deadline) == (None, None, None)

    frozen.advance(100)
    job = claim_one(q, visibility_ms=1000, worker="w7")
    info = fq.get(q, res.id)
    assert (info.state, info.claimed_at, info.lease_deadline, info.worker) == ("running", t0 + 100, t0 + 1100, "w7")
    frozen.advance(100)
    fq.nack(q, job.receipt, error="oops", delay_ms=0)
    fq.ack(q, claim_one(q).receipt, result={"r": True})
    info = fq.get(q, res.id)
    assert info.state == "succeeded"
    assert info.result == {"r": True}
    assert info.attempts == 2
    assert info.finished_at == t0 + 200
    assert [e["error"] for e in info.errors] == ["oops"]
    assert info.errors[0]["attempt"] == 1 and info.errors[0]["worker"] == "w7"


def test_get_never_includes_a_receipt(q):
    fq.enqueue(q, {"a": 1})
    fq.enqueue(q, {"b": 2})
    fq.enqueue(q, {"c": 3})
    claimed = fq.claim(q, count=3, worker="w")
    fq.nack(q, claimed[1].receipt, error="e")
    fq.ack(q, claimed[2].receipt)
    secrets = [c.receipt for c in claimed] + [c.receipt.rsplit(".", 1)[1] for c in claimed]
    texts = []
    for c in claimed:
        info = fq.get(q, c.id)
        texts += [repr(info), json.dumps(dataclasses.asdict(info), default=str)]
    for state in (None, *STATE_NAMES):
        page = fq.jobs(q, state=state, count=10)
        texts += [repr(page), json.dumps(dataclasses.asdict(page), default=str)]
    texts += [repr(fq.stats(q)), repr(fq.queues())]
    for text in texts:
        assert "fq1." not in text
        for secret in secrets:
            assert secret not in text


def test_get_of_a_job_of_another_queue_or_unknown(q):
    mine = fq.enqueue(q, {}).id
    theirs = fq.enqueue("other", {}).id
    for bad in (theirs, "0" * 32, "", "not-an-id", None, 5):
        with pytest.raises(JobNotFound):
            fq.get(q, bad)
    assert fq.get(q, mine).id == mine
    with pytest.raises(QueueNotFound):
        fq.get("missing", mine)


# --- jobs: listing and pagination --------------------------------------------------------------


def _page_all(q, state, count):
    """Every job of the listing, following cursors; also checks each page's size."""
    seen, cursor, pages = [], None, 0
    while True:
        page = fq.jobs(q, state=state, cursor=cursor, count=count)
        pages += 1
        assert len(page.jobs) <= count
        if page.next_cursor is not None:
            assert len(page.jobs) == count
        seen += page.jobs
        cursor = page.next_cursor
        if cursor is None:
            return seen
        assert pages < 100


@pytest.fixture
def populated(q, frozen):
    """A queue with jobs in every state, several of them sharing instants and priorities."""
    made = {s: [] for s in STATE_NAMES}
    # succeeded: acked at distinct and at equal instants
    for n, step in enumerate([0, 10, 0, 0, 25, 5]):
        job_id = fq.enqueue(q, {"s": n}).id
        frozen.advance(step)
        fq.ack(q, claim_one(q).receipt)
        made["succeeded"].append(job_id)
    for n, step in enumerate([3, 0, 7, 0]):
        made["dead"].append(fq.enqueue(q, n, max_attempts=1).id)
        frozen.advance(step)
        fq.nack(q, claim_one(q).receipt)
    for n, step in enumerate([0, 4, 0, 9, 1]):
        made["cancelled"].append(fq.enqueue(q, n).id)
        frozen.advance(step)
        fq.cancel(q, made["cancelled"][-1])
    for n, step in enumerate([2, 0, 0, 6]):
        made["running"].append(fq.enqueue(q, n).id)
        frozen.advance(step)
        claim_one(q)
    for prio in [0, 3, 0, 3, -1, 0, 3, 2**31 - 1, -(2**31)]:
        made["ready"].append(fq.enqueue(q, None, priority=prio).id)
    for delay, prio in [(500, 0), (100, 0), (500, 1), (100, 0), (300, 0), (500, 0), (100, 2), (700, -3)]:
        made["scheduled"].append(fq.enqueue(q, None, delay_ms=delay, priority=prio).id)
    return made


def _info(q, ids):
    return [fq.get(q, i) for i in ids]


def test_ready_listing_is_in_claim_order(q, populated):
    ids = populated["ready"]
    expected = [j.id for j in sorted(_info(q, ids), key=lambda j: (-j.priority, ids.index(j.id)))]
    for count in (1, 2, 3, 1000):
        listed = _page_all(q, "ready", count)
        assert [j.id for j in listed] == expected, count
        assert all(j.state == "ready" for j in listed)
    # ... which is exactly the order claims take them in.
    assert [j.id for j in fq.claim(q, count=100)] == expected


def test_scheduled_listing_is_by_run_at_then_claim_order(q, populated):
    ids = populated["scheduled"]
    expected = [j.id for j in sorted(_info(q, ids), key=lambda j: (j.run_at, -j.priority, ids.index(j.id)))]
    for count in (1, 3, 1000):
        listed = _page_all(q, "scheduled", count)
        assert [j.id for j in listed] == expected, count
        assert all(j.state == "scheduled" for j in listed)


def test_other_listings_are_newest_first_by_last_transition(q, populated):
    for state in ("running", "succeeded", "dead", "cancelled"):
        for count in (1, 2, 1000):
            listed = _page_all(q, state, count)
            assert sorted(j.id for j in listed) == sorted(populated[state]), (state, count)
            assert len({j.id for j in listed}) == len(listed), "every job exactly once"
            stamps = [j.changed_at for j in listed]
            assert stamps == sorted(stamps, reverse=True), (state, count)
            assert all(j.state == state for j in listed)


def test_listing_without_state_covers_every_job_once(q, populated):
    everything = [i for ids in populated.values() for i in ids]
    for count in (1, 4, 1000):
        listed = _page_all(q, None, count)
        assert sorted(j.id for j in listed) == sorted(everything), count
        assert len(listed) == len(everything)


def test_listings_carry_no_payload(q, populated):
    for state in (None, *STATE_NAMES):
        for job in fq.jobs(q, state=state, count=1000).jobs:
            assert job.payload is None and job.result is None


def test_cursor_is_stable_while_jobs_are_added(q):
    original = [fq.enqueue(q, n, priority=n % 2).id for n in range(9)]
    first = fq.jobs(q, state="ready", count=4)
    for n in range(5):
        fq.enqueue(q, f"late-{n}", priority=-1)
    seen = list(first.jobs)
    cursor = first.next_cursor
    while cursor:
        page = fq.jobs(q, state="ready", cursor=cursor, count=4)
        seen += page.jobs
        cursor = page.next_cursor
    ids = [j.id for j in seen]
    assert len(ids) == len(set(ids)) == 14
    assert set(original) <= set(ids)
    assert [fq.get(q, i).payload for i in ids[-5:]] == [f"late-{n}" for n in range(5)]


def test_jobs_default_and_bounds_of_count(q):
    fq.enqueue_many(q, [{"payload": n} for n in range(25)])
    page = fq.jobs(q)
    assert len(page.jobs) == 20 and page.next_cursor is not None
    assert len(fq.jobs(q, count=1000).jobs) == 25
    assert fq.jobs(q, count=1000).next_cursor is None
    for bad in (0, 1001, -1, "5", True):
        with pytest.raises(CountOutOfRange) as err:
            fq.jobs(q, count=bad)
        assert err.value.field == "count"


def test_jobs_of_an_empty_queue(q):
    for state in (None, *STATE_NAMES):
        page = fq.jobs(q, state=state)
        assert page.jobs == [] and page.next_cursor is None


def test_bad_cursor_is_rejected(q):
    fq.enqueue_many(q, [{"payload": n} for n in range(5)])
    good = fq.jobs(q, state="ready", count=2).next_cursor
    assert good
    for bad in ("garbage", "", "!!!!", good[:-2], good + "AAAA", "x" * 600, 12, ["a"], "W251bGwsWzFdXQ"):
        with pytest.raises(InvalidCursor) as err:
            fq.jobs(q, state="ready", cursor=bad)
        assert err.value.field == "cursor"
    # A cursor belongs to the listing it came from.
    with pytest.raises(InvalidCursor):
        fq.jobs(q, state="scheduled", cursor=good)
    with pytest.raises(InvalidCursor):
        fq.jobs(q, cursor=good)


def test_bad_state_filter_is_rejected(q):
    for bad in ("queued", "READY", "done", ""):
        with pytest.raises(InvalidArgument) as err:
            fq.jobs(q, state=bad)
        assert err.value.field == "state"


# --- wait -------------------------------------------------------------------------------------


def test_wait_returns_a_finished_job(q):
    job_id = fq.enqueue(q, {}).id
    fq.ack(q, claim_one(q).receipt, result=42)
    info = fq.wait(q, job_id, timeout_ms=1000)
    assert (info.state, info.result) == ("succeeded", 42)
    dead = _make_dead(q)
    assert fq.wait(q, dead.id, timeout_ms=0).state == "dead"


def test_wait_times_out_on_an_unfinished_job(q):
    job_id = fq.enqueue(q, {}).id
    with pytest.raises(WaitTimeout):
        fq.wait(q, job_id, timeout_ms=50)
    with pytest.raises(JobNotFound):
        fq.wait(q, "0" * 32, timeout_ms=10)


def test_requeue_makes_a_scheduled_job_ready_now(q):
    job = fq.enqueue(q, {"n": 1}, delay_ms=3_600_000).id
    assert fq.get(q, job).state == "scheduled"
    info = fq.requeue(q, job)
    assert info.state == "ready" and info.attempts == 0
    assert fq.claim(q)[0].id == job
    with pytest.raises(InvalidState):
        fq.requeue(q, job)  # running
    ready = fq.enqueue(q, {"n": 2}).id
    before = fq.get(q, ready)
    assert fq.requeue(q, ready).run_at == before.run_at  # already ready: unchanged
    with pytest.raises(JobNotFound):
        fq.requeue(q, "0" * 32)
