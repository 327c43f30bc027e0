"""The claim floor keeps the claim order exact (docs/reference/semantics.md §3, §5, §6).

A floor may skip only jobs that can never again be eligible. Each test here
makes one way a job can become queued below a floor (an enqueue whose
transaction is open across raises, a nack with or without a backoff, an
expiry, a release, a snooze, a retry, a delayed job becoming due), with real
concurrent transactions where the edge is a race, and checks that claims
still hand the jobs out in claim order. The floor exists only where the store
keeps one (PostgreSQL): elsewhere the first test checks that nothing is written.

Ripeness waits for every older transaction of the test database (other test
sessions' too), so the helpers poll with a deadline: another session's short
transaction may hold a raise back for a moment.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq import storage
from django_fq.models import ClaimFloor, Job, Queue
from django_fq.services import leases

QUEUE = "tests:floor"
DEADLINE_S = 30


def _supported() -> bool:
    return storage.for_connection(connection).supports_claim_floor


@pytest.fixture
def fq_queue(transactional_db):
    fq.configure(QUEUE, backoff_ms=1, max_backoff_ms=1)
    return Queue.objects.get(name=QUEUE).id


@pytest.fixture
def floor_queue(fq_queue):
    if not _supported():
        pytest.skip("the store keeps no claim floor")
    return fq_queue


def seq_of(job_id: str) -> int:
    return Job.objects.get(uid=job_id).seq


def floor(qid: int) -> ClaimFloor:
    return ClaimFloor.objects.get(queue_id=qid)


def raise_until(qid: int, pred, what: str) -> ClaimFloor:
    """Raise the floor until ``pred(floor row)`` holds (polling; fails after DEADLINE_S)."""
    end = time.monotonic() + DEADLINE_S
    while True:
        leases.raise_claim_floor(qid)
        row = ClaimFloor.objects.filter(queue_id=qid).first()
        if row is not None and pred(row):
            return row
        assert time.monotonic() < end, f"floor never {what}: {row and vars(row)}"
        time.sleep(0.02)


def settle(qid: int) -> ClaimFloor:
    """Raise until the job floor has nothing pending (as high as this moment allows; lease_from keeps moving).

    At least three raises: the first may only create the row, the second only set a candidate.
    """
    calls = []

    def settled(r):
        calls.append(1)
        return len(calls) >= 3 and (r.pend_seq is None or r.pend_seq == r.seq)

    return raise_until(qid, settled, "settled")


def churn(n: int) -> None:
    """Enqueue, claim and ack ``n`` jobs."""
    fq.enqueue_many(QUEUE, [{"payload": {"churn": i}} for i in range(n)])
    for job in fq.claim(QUEUE, count=n):
        fq.ack(QUEUE, job.receipt)


def claim_ids(n: int = 1000) -> list[str]:
    return [j.id for j in fq.claim(QUEUE, count=n)]


class Held:
    """``fn`` run on another thread inside a transaction that stays open until :meth:`commit`."""

    def __init__(self, fn):
        self.fn = fn
        self.done = threading.Event()
        self.go = threading.Event()
        self.value = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.done.wait(DEADLINE_S), "held transaction never ran"
        if self.error:
            raise self.error

    def _run(self):
        from django.db import connections

        try:
            with transaction.atomic():
                self.value = self.fn()
                self.done.set()
                assert self.go.wait(DEADLINE_S)
        except BaseException as exc:  # re-raised in the test's thread
            self.error = exc
            self.done.set()
        finally:
            connections.close_all()

    def commit(self):
        self.go.set()
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive()
        if self.error:
            raise self.error


def test_without_a_floor_capability_nothing_is_written(fq_queue):
    if _supported():
        pytest.skip("this store keeps a floor (the other tests cover it)")
    churn(5)
    assert leases.raise_claim_floor(fq_queue) is False
    assert not ClaimFloor.objects.exists()


def test_the_floor_rises_past_finished_jobs_and_the_claim_order_holds(floor_queue):
    churn(20)
    ids = [r.id for r in fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(5)])]
    row = raise_until(floor_queue, lambda r: r.seq == seq_of(ids[0]), "reached the first queued job")
    assert row.lease_from > 0  # no lease left: lease_from moved up to the raise's clock
    assert claim_ids() == ids


def test_a_claim_passes_the_floor_row_by_priority_bands(floor_queue):
    churn(10)
    settle(floor_queue)
    low = fq.enqueue(QUEUE, {"p": -5}, priority=-5).id
    mid = [fq.enqueue(QUEUE, {"p": 0, "i": i}).id for i in range(2)]
    high = fq.enqueue(QUEUE, {"p": 5}, priority=5).id
    assert claim_ids() == [high, *mid, low]


def test_an_enqueue_open_across_raises_is_claimed_in_its_place(floor_queue):
    churn(5)
    settle(floor_queue)

    def enqueue_held():
        uid = fq.enqueue(QUEUE, {"held": True}).id
        return uid, seq_of(uid)  # its own transaction sees it

    held = Held(enqueue_held)
    x, x_seq = held.value
    try:
        assert not Job.objects.filter(uid=x).exists()  # not committed: invisible here
        churn(5)
        later = fq.enqueue(QUEUE, {"later": True}).id
        assert x_seq < seq_of(later)
        # Every raise while the enqueue is open: candidates come from snapshots that cannot
        # see the held job, so they must wait; the floor itself must never pass the job's seq.
        for _ in range(5):
            leases.raise_claim_floor(floor_queue)
            assert floor(floor_queue).seq <= x_seq
            time.sleep(0.02)
    finally:
        held.commit()
    assert settle(floor_queue).seq == x_seq
    assert claim_ids() == [x, later]


def test_an_open_enqueue_holds_the_pending_floor_until_it_ends(floor_queue):
    churn(5)
    settle(floor_queue)
    held = Held(lambda: fq.enqueue(QUEUE, {"held": True}).id)
    try:
        churn(5)
        # A candidate past everything this snapshot sees; once one is pending, the open
        # enqueue (older than it) keeps it from being used, however often a raise comes.
        pending = raise_until(floor_queue, lambda r: r.pend_seq is not None and r.pend_seq > r.seq, "pending")
        for _ in range(5):
            assert leases.raise_claim_floor(floor_queue) is False  # not ripe: nothing written
            assert floor(floor_queue).seq == pending.seq
    finally:
        held.commit()
    x = held.value
    row = settle(floor_queue)
    assert row.seq == seq_of(x)  # lowered to the job the pending candidate could not see
    assert claim_ids() == [x]


@pytest.mark.parametrize("delay_ms", [0, 200])
def test_a_nacked_job_below_the_floor_is_claimed_in_its_place(floor_queue, clock, delay_ms):
    a = fq.enqueue(QUEUE, {"a": 1}).id
    lease = fq.claim(QUEUE)[0]
    assert lease.id == a
    churn(10)
    raise_until(floor_queue, lambda r: r.seq > seq_of(a), "passed the running job")
    fq.nack(QUEUE, lease.receipt, delay_ms=delay_ms)
    assert floor(floor_queue).seq <= seq_of(a)
    d = fq.enqueue(QUEUE, {"d": 1}).id
    if delay_ms:
        assert claim_ids(1) == [d]  # A is not due yet
        d2 = fq.enqueue(QUEUE, {"d": 2}).id
        settle(floor_queue)
        assert floor(floor_queue).seq <= seq_of(a)  # never past a queued job, due or not
        clock.advance(delay_ms)
        assert claim_ids() == [a, d2]
    else:
        settle(floor_queue)
        assert claim_ids() == [a, d]


@pytest.mark.parametrize("pending_first", [False, True])
def test_a_nack_open_across_raises_is_claimed_in_its_place(floor_queue, pending_first):
    a = fq.enqueue(QUEUE, {"a": 1}).id
    assert settle(floor_queue).seq == seq_of(a)
    lease = fq.claim(QUEUE)[0]
    churn(5)
    if pending_first:  # a candidate past the running job is pending when the nack comes: the nack lowers it
        raise_until(floor_queue, lambda r: r.pend_seq is not None and r.pend_seq > seq_of(a), "pending past A")
    held = Held(lambda: fq.nack(QUEUE, lease.receipt, delay_ms=0))
    try:
        for _ in range(5):  # candidates computed meanwhile see A running; none may become the floor
            leases.raise_claim_floor(floor_queue)
            assert floor(floor_queue).seq <= seq_of(a)
            time.sleep(0.02)
    finally:
        held.commit()
    assert settle(floor_queue).seq == seq_of(a)
    later = fq.enqueue(QUEUE, {"later": 1}).id
    assert claim_ids() == [a, later]


def test_a_raise_waits_for_a_nack_that_lowered_the_floor(floor_queue):
    a = fq.enqueue(QUEUE, {"a": 1}).id
    lease = fq.claim(QUEUE)[0]
    churn(5)
    raise_until(floor_queue, lambda r: r.seq > seq_of(a), "passed the running job")
    held = Held(lambda: fq.nack(QUEUE, lease.receipt, delay_ms=0))
    try:
        assert leases.raise_claim_floor(floor_queue) is False  # the nack holds the row it lowered
    finally:
        held.commit()
    assert floor(floor_queue).seq <= seq_of(a)
    assert claim_ids() == [a]


def test_an_expired_lease_below_the_floor_is_reaped_and_claimed_in_its_place(floor_queue, clock):
    a = fq.enqueue(QUEUE, {"a": 1}).id
    fq.claim(QUEUE, visibility_ms=1000)
    churn(5)
    row = raise_until(floor_queue, lambda r: r.seq > seq_of(a), "passed the running job")
    assert row.lease_from <= Job.objects.get(uid=a).lease.deadline
    clock.advance(1000)
    later = fq.enqueue(QUEUE, {"later": 1}).id
    clock.advance(5)  # past the 1 ms backoff
    # The claim finds the expired lease (its deadline is above lease_from), reaps it, and the
    # job, back under the floor, comes first.
    assert claim_ids() == [a, later]


def test_the_reaper_of_one_queue_reads_leases_from_the_floor(floor_queue, clock):
    a = fq.enqueue(QUEUE, {"a": 1}).id
    fq.claim(QUEUE, visibility_ms=1000)
    churn(5)
    raise_until(floor_queue, lambda r: r.seq > seq_of(a), "passed the running job")
    clock.advance(1000)
    assert fq.reap(QUEUE).expired == 1
    assert floor(floor_queue).seq <= seq_of(a)
    clock.advance(5)
    assert claim_ids() == [a]


@pytest.mark.parametrize("delay_ms", [None, 200])
def test_a_released_or_snoozed_job_below_the_floor_is_claimed_in_its_place(floor_queue, clock, delay_ms):
    a = fq.enqueue(QUEUE, {"a": 1}).id
    lease = fq.claim(QUEUE)[0]
    churn(5)
    raise_until(floor_queue, lambda r: r.seq > seq_of(a), "passed the running job")
    fq.release(QUEUE, lease.receipt, delay_ms=delay_ms)
    assert floor(floor_queue).seq <= seq_of(a)
    later = fq.enqueue(QUEUE, {"later": 1}).id
    if delay_ms:
        clock.advance(delay_ms)
    assert claim_ids() == [a, later]


def test_a_retried_dead_job_below_the_floor_is_claimed_in_its_place(floor_queue):
    a = fq.enqueue(QUEUE, {"a": 1}, max_attempts=1).id
    fq.nack(QUEUE, fq.claim(QUEUE)[0].receipt)
    assert fq.get(QUEUE, a).state == "dead"
    churn(5)
    raise_until(floor_queue, lambda r: r.seq > seq_of(a), "passed the dead job")
    fq.retry(QUEUE, a)
    assert floor(floor_queue).seq <= seq_of(a)
    later = fq.enqueue(QUEUE, {"later": 1}).id
    assert claim_ids() == [a, later]


def test_a_delayed_job_holds_the_floor_until_it_runs(floor_queue, clock):
    a = fq.enqueue(QUEUE, {"a": 1}, delay_ms=1000).id
    churn(10)
    assert settle(floor_queue).seq == seq_of(a)  # the jobs after it are done, but it is still queued
    later = fq.enqueue(QUEUE, {"later": 1}).id
    assert claim_ids() == [later]
    clock.advance(1000)
    assert claim_ids() == [a]


def test_a_requeued_job_is_claimed_in_its_place(floor_queue):
    a = fq.enqueue(QUEUE, {"a": 1}, delay_ms=60_000).id
    churn(5)
    settle(floor_queue)
    later = fq.enqueue(QUEUE, {"later": 1}).id
    fq.requeue(QUEUE, a)
    assert claim_ids() == [a, later]


def test_raises_during_claims_keep_every_claim_in_order(floor_queue, monkeypatch):
    """The raise the claim path makes itself (every FLOOR_RAISE_JOBS jobs), with nacks in between."""
    monkeypatch.setattr(leases, "FLOOR_RAISE_JOBS", 3)
    ids = [r.id for r in fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(40)])]
    handed: list[str] = []
    failed_once: set[str] = set()
    while True:
        jobs = fq.claim(QUEUE, count=2)
        if not jobs:
            break
        for job in jobs:
            if ids.index(job.id) % 7 == 0 and job.id not in failed_once:
                failed_once.add(job.id)
                fq.nack(QUEUE, job.receipt, delay_ms=0)  # back in its place, below the floor
            else:
                handed.append(job.id)
                fq.ack(QUEUE, job.receipt)
    assert sorted(handed, key=ids.index) == ids
    # The claims raised it: the row exists and holds a candidate at least (its use waits for every
    # transaction of the server older than the raise, which another session may hold open a while).
    row = floor(floor_queue)
    assert row.seq > 0 or row.pend_seq is not None


def test_deleting_the_queue_deletes_its_floor(floor_queue):
    churn(3)
    settle(floor_queue)
    fq.delete_queue(QUEUE)
    assert not ClaimFloor.objects.filter(queue_id=floor_queue).exists()


def test_next_claim_floor_waits_for_ripeness_and_lowers_by_what_it_finds():
    row = {"priority": 0, "seq": 10, "lease_from": 100, "pend_seq": 50, "pend_lease_from": 500, "pend_xmax": 1000}
    facts = {"ripe": False, "first_seq": 60, "max_seq": 70, "lease_min": None, "started_ms": 900}
    assert leases.next_claim_floor(row, facts) is None  # a transaction older than the candidate may run
    facts["ripe"] = True
    assert leases.next_claim_floor(row, facts) == {
        "seq": 50, "lease_from": 500, "pend_seq": 60, "pend_lease_from": 900, "pending": True,
    }  # fmt: skip
    facts["first_seq"], facts["lease_min"] = 40, 300  # committed below the candidate meanwhile
    assert leases.next_claim_floor(row, facts) == {
        "seq": 40, "lease_from": 300, "pend_seq": None, "pend_lease_from": None, "pending": False,
    }  # fmt: skip
    nothing_queued = {"ripe": False, "first_seq": None, "max_seq": 70, "lease_min": None, "started_ms": 100}
    fresh = {"priority": 0, "seq": 0, "lease_from": 0, "pend_seq": None, "pend_lease_from": None, "pend_xmax": None}
    assert leases.next_claim_floor(fresh, nothing_queued) == {
        "seq": 0, "lease_from": 0, "pend_seq": 71, "pend_lease_from": 100, "pending": True,
    }  # fmt: skip
    settled = {**fresh, "seq": 71, "lease_from": 100}
    assert leases.next_claim_floor(settled, {**nothing_queued, "first_seq": 71}) is None
