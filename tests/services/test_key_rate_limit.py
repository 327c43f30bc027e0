"""Per-key rate limits (docs/reference/semantics.md §9 "Per-key limits"), on every database.

A queue's ``key_rate_limit`` R over its ``rate_window_ms`` W: at most R claims
of one concurrency key in any window of W (database clock), other keys and
unkeyed jobs not held up behind a rate-limited key, and every way a job goes
back to the queue (nack, expiry, release, snooze) needing a token again.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidPolicy
from django_fq.models import ConcurrencyKey, Job, KeyClaim, Queue

from .helpers import check_key_counts, claim_one, most_in_a_window

pytestmark = pytest.mark.django_db


def _keys(jobs) -> Counter:
    return Counter(fq.get(j.queue, j.id).concurrency_key for j in jobs)


def _wake_at(queue: str, key: str) -> int | None:
    return ConcurrencyKey.objects.get(queue__name=queue, key=key).wake_at


def _enqueue(queue: str, key: str | None, n: int) -> list[str]:
    return [r.id for r in fq.enqueue_many(queue, [{"payload": i, "concurrency_key": key} for i in range(n)])]


# --- the limit, per key, on the database clock ----------------------------------------------------


def test_at_most_the_limit_per_key_in_a_window_while_other_keys_flow(q, frozen):
    fq.configure(q, key_rate_limit=2, rate_window_ms=1000)
    _enqueue(q, "a", 5)
    _enqueue(q, "b", 3)
    plain = fq.enqueue(q, "plain").id
    first = fq.claim(q, count=100)
    assert _keys(first) == Counter({"a": 2, "b": 2, None: 1})
    assert plain in {j.id for j in first}
    assert fq.claim(q, count=100) == []
    fresh = fq.enqueue(q, "c", concurrency_key="c").id  # another key is not held up behind a and b
    assert claim_one(q).id == fresh
    frozen.advance(999)
    assert fq.claim(q, count=100) == []
    frozen.advance(1)  # the first claims are one window old: their tokens are free
    assert _keys(fq.claim(q, count=100)) == Counter({"a": 2, "b": 1})
    check_key_counts(q)


def test_finishing_a_job_frees_no_token(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=60_000)
    _enqueue(q, "k", 2)
    fq.ack(q, claim_one(q).receipt)
    assert fq.claim(q) == []  # the claim, not the run, holds the token
    frozen.advance(60_000)
    assert len(fq.claim(q)) == 1


def test_the_held_key_wakes_exactly_when_its_next_token_frees(q, frozen):
    fq.configure(q, key_rate_limit=2, rate_window_ms=500)
    _enqueue(q, "k", 1)
    c1 = claim_one(q).claimed_at
    frozen.advance(100)
    _enqueue(q, "k", 3)
    c2 = claim_one(q).claimed_at
    assert _wake_at(q, "k") == c1 + 500  # the oldest claim of the window frees the next token
    frozen.advance(c1 + 499 - frozen.now)
    assert fq.claim(q) == []
    frozen.advance(1)
    assert claim_one(q).claimed_at == c1 + 500
    assert _wake_at(q, "k") == c2 + 500


def test_no_window_ever_holds_more_than_the_limit(q, frozen):
    fq.configure(q, key_rate_limit=3, rate_window_ms=100)
    for key in ("a", "b", "c"):
        _enqueue(q, key, 20)
    instants: dict[str | None, list[int]] = defaultdict(list)
    steps = [7, 13, 1, 29, 50, 3, 97, 100, 0, 41]
    for step in steps * 6:
        for job in fq.claim(q, count=4):
            instants[fq.get(q, job.id).concurrency_key].append(job.claimed_at)
            fq.ack(q, job.receipt)
        frozen.advance(step)
    assert set(instants) == {"a", "b", "c"}
    for key, seen in instants.items():
        assert most_in_a_window(seen, 100) <= 3, key
        assert len(seen) >= 20  # every window the clock crossed let the key's jobs through


def test_every_claim_of_a_keyed_job_is_logged_with_its_instant(q, frozen):
    fq.configure(q, key_rate_limit=5, rate_window_ms=1000)
    _enqueue(q, "k", 2)
    fq.enqueue(q, "plain")
    got = fq.claim(q, count=10)
    qid = Queue.objects.get(name=q).id
    assert sorted(KeyClaim.objects.filter(queue_id=qid).values_list("key", "at")) == [
        ("k", j.claimed_at) for j in got if fq.get(q, j.id).concurrency_key == "k"
    ]


def test_both_key_limits_hold_together(q, frozen):
    fq.configure(q, key_concurrency=1, key_rate_limit=2, rate_window_ms=1000)
    _enqueue(q, "k", 4)
    first = claim_one(q)
    assert fq.claim(q) == []  # the slot is taken
    fq.ack(q, first.receipt)
    second = claim_one(q)
    fq.ack(q, second.receipt)
    assert fq.claim(q) == []  # a free slot, but both tokens are taken
    frozen.advance(1000)
    assert len(fq.claim(q, count=5)) == 1
    check_key_counts(q)


# --- a job going back to the queue needs a token again ------------------------------------------


@pytest.fixture
def spent(q, frozen):
    """Queue ``q`` with key_rate_limit 1 per second and two jobs of key ``k``; the first is claimed."""
    fq.configure(q, key_rate_limit=1, rate_window_ms=1000, backoff_ms=0)
    _enqueue(q, "k", 2)
    job = claim_one(q, visibility_ms=100)
    return job


@pytest.mark.parametrize("how", ["nack", "release", "expire"])
def test_a_job_going_back_waits_for_a_token(q, frozen, spent, how):
    if how == "nack":
        fq.nack(q, spent.receipt, error="again", delay_ms=0)
    elif how == "release":
        fq.release(q, spent.receipt)
    else:
        frozen.advance(100)
        fq.reap()
    assert fq.get(q, spent.id).state == "ready"  # reported as ready, held for its key
    assert Job.objects.get(uid=spent.id).state == "held"
    assert fq.claim(q) == []
    frozen.advance(spent.claimed_at + 1000 - frozen.now)
    again = claim_one(q)
    assert again.id == spent.id  # its place in claim order is kept
    check_key_counts(q)


def test_snooze_waits_for_its_delay_and_a_token(q, frozen, spent):
    fq.release(q, spent.receipt, delay_ms=1500)  # a snooze
    frozen.advance(1000)
    other = claim_one(q)  # the token freed; the snoozed job is not due yet
    assert other.id != spent.id
    frozen.advance(500)
    assert fq.claim(q) == []  # due, but the other claim holds the token for its window
    frozen.advance(other.claimed_at + 1000 - frozen.now)
    assert claim_one(q).id == spent.id


def test_cancelling_an_admitted_job_hands_its_token_on_at_once(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=60_000)
    ids = _enqueue(q, "k", 2)
    assert Job.objects.get(uid=ids[0]).state == "queued" and Job.objects.get(uid=ids[1]).state == "held"
    fq.cancel(q, ids[0])
    assert claim_one(q).id == ids[1]


def test_a_released_workflow_job_enters_key_rate_admission(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=60_000)
    _enqueue(q, "k", 1)
    fq.ack(q, claim_one(q).receipt)
    parent = fq.enqueue(q, "parent").id
    child = fq.enqueue(q, "child", concurrency_key="k", depends_on=[parent]).id
    fq.ack(q, claim_one(q).receipt)  # the parent: the child is released, its key has no token left
    assert Job.objects.get(uid=child).state == "held"
    assert fq.claim(q) == []
    frozen.advance(60_000)
    assert claim_one(q).id == child


# --- configure: on, off, and what was in flight ----------------------------------------------------


def test_turning_it_on_holds_what_is_over_the_limit(q, frozen):
    _enqueue(q, "k", 5)
    fq.configure(q, key_rate_limit=2, rate_window_ms=1000)
    assert Counter(Job.objects.filter(queue__name=q).values_list("state", flat=True)) == {"queued": 2, "held": 3}
    assert len(fq.claim(q, count=10)) == 2
    check_key_counts(q)


def test_claims_made_before_it_was_turned_on_count_against_it(q, frozen):
    _enqueue(q, "k", 3)
    first = claim_one(q)  # no per-key rate limit yet: the claim logs nothing
    fq.configure(q, key_rate_limit=1, rate_window_ms=1000)
    assert fq.claim(q) == []  # the running job's claim of this window holds the one token
    frozen.advance(first.claimed_at + 1000 - frozen.now)
    assert len(fq.claim(q)) == 1


def test_turning_it_off_frees_every_held_job_and_the_log(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=60_000)
    _enqueue(q, "k", 4)
    claim_one(q)
    fq.configure(q, key_rate_limit=0)
    assert len(fq.claim(q, count=10)) == 3
    qid = Queue.objects.get(name=q).id
    assert not KeyClaim.objects.filter(queue_id=qid).exists()
    assert not Job.objects.filter(queue_id=qid, state="held").exists()


def test_raising_the_limit_admits_more_at_once(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=60_000)
    _enqueue(q, "k", 4)
    claim_one(q)
    fq.configure(q, key_rate_limit=3)
    assert len(fq.claim(q, count=10)) == 2  # three in the window, the first included


def test_a_shorter_window_frees_tokens_at_once(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=60_000)
    _enqueue(q, "k", 2)
    claim_one(q)
    frozen.advance(2000)
    fq.configure(q, rate_window_ms=1000)  # the claim is older than the new window
    assert len(fq.claim(q)) == 1


def test_the_reaper_admits_a_key_whose_token_freed_and_prunes_old_claims(q, frozen):
    fq.configure(q, key_rate_limit=1, rate_window_ms=1000)
    ids = _enqueue(q, "k", 2)
    claim_one(q)
    frozen.advance(1000)
    fq.reap()
    assert Job.objects.get(uid=ids[1]).state == "queued"  # admitted by the reaper, before any claim
    assert not KeyClaim.objects.filter(queue__name=q).exists()  # one window old: pruned


def test_deleting_the_queue_deletes_its_key_claims(q, frozen):
    fq.configure(q, key_rate_limit=1)
    _enqueue(q, "k", 1)
    claim_one(q)
    qid = Queue.objects.get(name=q).id
    assert KeyClaim.objects.filter(queue_id=qid).exists()
    fq.delete_queue(q)
    assert not KeyClaim.objects.filter(queue_id=qid).exists()


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1_000_001, "5", 2.5, True])
def test_a_bad_key_rate_limit_names_the_field_and_writes_nothing(q, bad):
    with pytest.raises(InvalidPolicy) as info:
        fq.configure(q, key_rate_limit=bad, concurrency=3)
    assert info.value.field == "key_rate_limit"
    assert fq.policy(q).key_rate_limit == 0 and fq.policy(q).concurrency == 0


def test_key_rate_limit_bounds_are_inclusive(q):
    assert fq.configure(q, key_rate_limit=1_000_000).key_rate_limit == 1_000_000
    assert fq.configure(q, key_rate_limit=0).key_rate_limit == 0
