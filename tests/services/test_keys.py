"""Per-key concurrency (docs/reference/semantics.md §9 "Per-key limits"), on every database.

A job's ``concurrency_key`` and the queue's ``key_concurrency`` (K): at most K
jobs of one key run at once, jobs of other keys are not held up behind a busy
key, and every way a lease or an admitted job ends gives its key's slot back
at once, exactly once.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidArgument, InvalidPolicy, InvalidReceipt
from django_fq.models import ConcurrencyKey, Job
from tests.threads import in_threads

from .helpers import check_key_counts, claim_one, key_admitted, running_by_key

pytestmark = pytest.mark.django_db


def _ids(jobs) -> list[str]:
    return [j.id for j in jobs]


# --- the limit, and no head-of-line blocking ---------------------------------------------------


def test_a_busy_key_does_not_hold_up_other_keys_or_unkeyed_jobs(q):
    fq.configure(q, key_concurrency=1)
    a = [fq.enqueue(q, f"a{n}", concurrency_key="a").id for n in range(5)]
    b = fq.enqueue(q, "b", concurrency_key="b").id
    plain = fq.enqueue(q, "plain").id
    assert _ids(fq.claim(q, count=10)) == [a[0], b, plain]
    assert fq.claim(q, count=10) == []
    assert fq.get(q, a[1]).state == "ready"  # waiting for its key, reported as ready
    check_key_counts(q)


def test_one_claim_never_takes_more_of_a_key_than_it_has_room_for(q):
    fq.configure(q, key_concurrency=2)
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": "k"} for n in range(6)])
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": "j"} for n in range(6)])
    got = fq.claim(q, count=100)
    assert Counter(j.payload for j in got) == Counter({0: 2, 1: 2})
    assert running_by_key(q) == Counter({"k": 2, "j": 2})


def test_jobs_without_a_key_are_not_limited(q):
    fq.configure(q, key_concurrency=1)
    fq.enqueue_many(q, [{"payload": n} for n in range(20)])
    assert len(fq.claim(q, count=20)) == 20


def test_keys_compare_byte_for_byte(q):
    fq.configure(q, key_concurrency=1)
    for key in ("a", "A", "a "):
        fq.enqueue(q, key, concurrency_key=key)
    assert len(fq.claim(q, count=10)) == 3


def test_the_limit_is_per_queue(q):
    fq.configure(q, key_concurrency=1)
    fq.configure("tests:other", key_concurrency=1)
    fq.enqueue(q, 1, concurrency_key="k")
    fq.enqueue("tests:other", 2, concurrency_key="k")
    assert len(fq.claim(q)) == 1
    assert len(fq.claim("tests:other")) == 1


def test_a_key_without_a_limit_is_recorded_and_not_limited(q):
    job = fq.enqueue(q, 1, concurrency_key="k").id
    fq.enqueue(q, 2, concurrency_key="k")
    assert fq.get(q, job).concurrency_key == "k"
    assert len(fq.claim(q, count=5)) == 2
    assert not ConcurrencyKey.objects.exists()  # a queue without a limit keeps no key rows


# --- order within a key ----------------------------------------------------------------------------


def test_a_key_runs_its_jobs_in_priority_then_enqueue_order(q):
    fq.configure(q, key_concurrency=1)
    first = fq.enqueue(q, "first", concurrency_key="k").id  # admitted at once
    low = fq.enqueue(q, "low", concurrency_key="k").id
    high = fq.enqueue(q, "high", concurrency_key="k", priority=9).id
    low2 = fq.enqueue(q, "low2", concurrency_key="k").id
    order = []
    while True:
        got = fq.claim(q, count=5)
        if not got:
            break
        assert len(got) == 1
        order.append(got[0].id)
        fq.ack(q, got[0].receipt)
    assert order == [first, high, low, low2]


def test_a_batch_of_one_key_is_admitted_in_claim_order(q):
    fq.configure(q, key_concurrency=1)
    ids = [r.id for r in fq.enqueue_many(q, [{"payload": 0, "concurrency_key": "k"}, {"payload": 1, "concurrency_key": "k", "priority": 5}])]
    assert claim_one(q).id == ids[1]


# --- every end of a lease gives the slot back, once ------------------------------------------------


@pytest.fixture
def two(q):
    """Queue ``q`` with key_concurrency 1 and two jobs of key ``k``; the first is claimed."""
    fq.configure(q, key_concurrency=1, backoff_ms=60_000)
    first = fq.enqueue(q, "first", concurrency_key="k").id
    second = fq.enqueue(q, "second", concurrency_key="k").id
    running = claim_one(q, visibility_ms=1000)
    assert running.id == first and fq.claim(q) == []
    return running, second


def test_ack_gives_the_slot_back(q, two):
    running, second = two
    fq.ack(q, running.receipt)
    assert claim_one(q).id == second
    check_key_counts(q)


def test_ack_many_gives_the_slots_back(q):
    fq.configure(q, key_concurrency=1)
    for key in ("a", "b"):
        for n in range(2):
            fq.enqueue(q, n, concurrency_key=key)
    got = fq.claim(q, count=10)
    assert len(got) == 2
    fq.ack_many(q, [(j.receipt, None) for j in got])
    assert sorted(j.payload for j in fq.claim(q, count=10)) == [1, 1]
    check_key_counts(q)


def test_nack_with_a_delay_holds_the_job_and_admits_the_next(q, two, frozen):
    running, second = two
    fq.nack(q, running.receipt, delay_ms=500)
    assert claim_one(q).id == second  # the retrying job does not keep its key's slot
    assert fq.get(q, running.id).state == "scheduled"
    check_key_counts(q)


def test_nack_without_delay_keeps_the_slot_for_the_same_job(q, two):
    running, _ = two
    fq.nack(q, running.receipt, delay_ms=0)
    assert claim_one(q).id == running.id
    assert fq.claim(q) == []
    check_key_counts(q)


def test_dead_gives_the_slot_back(q, two):
    running, second = two
    fq.nack(q, running.receipt, permanent=True)
    assert claim_one(q).id == second


def test_release_keeps_the_place_and_snooze_gives_the_slot_back(q, two, frozen):
    running, second = two
    fq.release(q, running.receipt)
    again = claim_one(q)
    assert again.id == running.id
    fq.release(q, again.receipt, delay_ms=500)  # a snooze
    assert claim_one(q).id == second
    check_key_counts(q)


def test_expiry_gives_the_slot_back(q, two, frozen):
    _, second = two
    frozen.advance(1000)  # at the deadline: expired (§5)
    got = fq.claim(q, count=5)
    # The expired job waits out its backoff held; its key's slot went to the next job.
    assert _ids(got) == [second]
    check_key_counts(q)


def test_timeout_gives_the_slot_back(q, frozen):
    fq.configure(q, key_concurrency=1, backoff_ms=60_000)
    first = fq.enqueue(q, 1, concurrency_key="k", timeout_ms=200).id
    second = fq.enqueue(q, 2, concurrency_key="k").id
    assert claim_one(q).id == first
    frozen.advance(200)
    assert fq.reap(q).timed_out == 1
    assert claim_one(q).id == second


@pytest.mark.parametrize("which", ["running", "queued"])
def test_cancel_gives_the_slot_back(q, which):
    fq.configure(q, key_concurrency=1)
    first = fq.enqueue(q, 1, concurrency_key="k").id
    second = fq.enqueue(q, 2, concurrency_key="k").id
    if which == "running":
        claim_one(q)
    fq.cancel(q, first)
    assert claim_one(q).id == second
    check_key_counts(q)


def test_cancel_of_a_held_job_changes_no_slot(q, two):
    running, second = two
    fq.cancel(q, second)
    assert fq.claim(q) == []
    fq.ack(q, running.receipt)
    assert key_admitted(q, "k") == 0


def test_a_replayed_or_stale_ack_gives_no_slot_back_twice(q, two, frozen):
    running, second = two
    third = fq.enqueue(q, "third", concurrency_key="k").id
    fq.ack(q, running.receipt)
    assert fq.ack(q, running.receipt).replay  # the replay changes nothing
    taken = claim_one(q, visibility_ms=1000)
    assert taken.id == second
    assert fq.ack(q, running.receipt).replay
    assert fq.claim(q) == []  # still one slot, held by `second`
    frozen.advance(1000)
    assert fq.reap(q).expired == 1
    with pytest.raises(InvalidReceipt):
        fq.ack(q, taken.receipt)  # expired: gives nothing back
    assert claim_one(q).id == third
    assert fq.claim(q) == []
    check_key_counts(q)


# --- delayed jobs ------------------------------------------------------------------------------------


def test_a_delayed_job_does_not_block_its_keys_ready_jobs(q, frozen):
    fq.configure(q, key_concurrency=1)
    later = fq.enqueue(q, "later", concurrency_key="k", delay_ms=1000).id
    now = fq.enqueue(q, "now", concurrency_key="k").id
    job = claim_one(q)
    assert job.id == now
    fq.ack(q, job.receipt)
    assert fq.claim(q) == []
    frozen.advance(1000)
    assert claim_one(q).id == later  # the claim admits it once due (its key has room)
    check_key_counts(q)


def test_the_reaper_admits_a_held_job_that_became_due(q, frozen):
    fq.configure(q, key_concurrency=1)
    job = fq.enqueue(q, "later", concurrency_key="k", delay_ms=1000).id
    frozen.advance(1000)
    fq.reap()
    assert Job.objects.get(uid=job).state == "queued"
    assert claim_one(q).id == job


def test_requeue_of_a_held_job_admits_it_when_its_key_has_room(q, frozen):
    fq.configure(q, key_concurrency=1)
    job = fq.enqueue(q, "later", concurrency_key="k", delay_ms=60_000).id
    assert fq.requeue(q, job).state == "ready"
    assert claim_one(q).id == job


def test_retry_of_a_dead_keyed_job_waits_for_its_key(q):
    fq.configure(q, key_concurrency=1)
    dead = fq.enqueue(q, 1, concurrency_key="k").id
    fq.nack(q, claim_one(q).receipt, permanent=True)
    other = fq.enqueue(q, 2, concurrency_key="k").id
    running = claim_one(q)
    assert running.id == other
    assert fq.retry(q, dead).state == "ready"
    assert fq.claim(q) == []  # its key is full
    fq.ack(q, running.receipt)
    assert claim_one(q).id == dead
    check_key_counts(q)


# --- changing the limit -------------------------------------------------------------------------------


def test_raising_the_limit_admits_more_at_once(q):
    fq.configure(q, key_concurrency=1)
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": "k"} for n in range(5)])
    assert len(fq.claim(q, count=10)) == 1
    fq.configure(q, key_concurrency=3)
    assert [j.payload for j in fq.claim(q, count=10)] == [1, 2]
    check_key_counts(q)


def test_lowering_the_limit_admits_no_more_until_the_key_is_under_it(q):
    fq.configure(q, key_concurrency=3)
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": "k"} for n in range(6)])
    running = fq.claim(q, count=2)
    fq.configure(q, key_concurrency=1)
    assert fq.claim(q, count=10) == []  # 2 running > 1: the queued third waits again
    fq.ack(q, running[0].receipt)
    assert fq.claim(q, count=10) == []  # 1 running = 1
    fq.ack(q, running[1].receipt)
    assert [j.payload for j in fq.claim(q, count=10)] == [2]
    check_key_counts(q)


def test_setting_a_limit_on_a_queue_with_waiting_keyed_jobs(q):
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": "k"} for n in range(4)])
    running = claim_one(q)
    fq.configure(q, key_concurrency=1)
    assert fq.claim(q, count=10) == []
    fq.ack(q, running.receipt)
    assert claim_one(q).payload == 1
    check_key_counts(q)


def test_lifting_the_limit_frees_every_held_job(q):
    fq.configure(q, key_concurrency=1)
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": "k"} for n in range(4)])
    running = claim_one(q)
    fq.configure(q, key_concurrency=0)
    assert [j.payload for j in fq.claim(q, count=10)] == [1, 2, 3]
    assert not ConcurrencyKey.objects.exists()
    fq.ack(q, running.receipt)  # no key rows to count against: nothing breaks


# --- validation and inspection ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "x" * 201, 5, "a\x00b", ["k"]])
def test_a_bad_concurrency_key_is_refused_and_nothing_written(q, bad):
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue(q, 1, concurrency_key=bad)
    assert err.value.field == "concurrency_key"
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue_many(q, [{"payload": 1}, {"payload": 2, "concurrency_key": bad}])
    assert err.value.field == "items[1].concurrency_key"
    assert not Job.objects.exists()


def test_a_key_of_200_characters_is_taken(q):
    key = "k" * 200
    assert fq.get(q, fq.enqueue(q, 1, concurrency_key=key).id).concurrency_key == key


@pytest.mark.parametrize("bad", [-1, 100_001, "1", 1.5])
def test_key_concurrency_bounds(q, bad):
    with pytest.raises(InvalidPolicy) as err:
        fq.configure(q, key_concurrency=bad)
    assert err.value.field == "key_concurrency"
    assert fq.policy(q).key_concurrency == 0


def test_policy_and_listings_show_keys_and_held_jobs(q):
    fq.configure(q, key_concurrency=1)
    assert fq.policy(q).key_concurrency == 1
    ids = [r.id for r in fq.enqueue_many(q, [{"payload": n, "concurrency_key": "k"} for n in range(3)])]
    page = fq.jobs(q, state="ready")
    assert [j.id for j in page.jobs] == ids  # held jobs are ready, listed in claim order
    assert {j.concurrency_key for j in page.jobs} == {"k"}
    assert fq.stats(q).counts["ready"] == 3


def test_a_held_job_keeps_its_unique_key(q):
    fq.configure(q, key_concurrency=1)
    fq.enqueue(q, 1, concurrency_key="k")
    held = fq.enqueue(q, 2, concurrency_key="k", unique_key="u")
    assert fq.enqueue(q, 3, unique_key="u").id == held.id


def test_deleting_the_queue_removes_its_keys(q):
    fq.configure(q, key_concurrency=1)
    fq.enqueue(q, 1, concurrency_key="k")
    fq.delete_queue(q)
    assert not ConcurrencyKey.objects.exists()


# --- concurrent claimers ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_threads_claiming_and_acking_never_run_two_jobs_of_one_key():
    """Six threads claim and ack at once: at no claim does a key have two live leases."""
    queue = "tests:keys-threads"
    fq.configure(queue, key_concurrency=1)
    fq.enqueue_many(queue, [{"payload": n, "concurrency_key": f"k{n % 5}"} for n in range(60)])
    start = threading.Barrier(6, timeout=60)
    errors: list = []
    done: list = []
    lock = threading.Lock()

    def worker(_):
        start.wait()
        idle = 0
        while idle < 50:
            got = fq.claim(queue, count=3)
            if not got:
                idle += 1
                continue
            idle = 0
            # The database's own view: no key has two running jobs at any instant.
            errors.extend(k for k, n in running_by_key(queue).items() if n > 1)
            for j in got:
                fq.ack(queue, j.receipt)
            with lock:
                done.extend(j.payload for j in got)

    in_threads(6, worker, timeout_s=120)
    assert errors == []
    assert sorted(done) == list(range(60))
    check_key_counts(queue)
