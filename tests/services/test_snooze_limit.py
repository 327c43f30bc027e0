"""The snooze count and its bound (docs/reference/semantics.md §9 "Verbs and arguments"), on every database."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import SnoozeLimit
from django_fq.models import Job
from django_fq.validation import MAX_SNOOZES

from .helpers import claim_one


def test_a_snooze_is_counted_a_plain_release_is_not_and_attempts_are_given_back(q):
    job = fq.enqueue(q, {}).id
    for n in (1, 2, 3):
        fq.release(q, claim_one(q).receipt, delay_ms=0)
        info = fq.get(q, job)
        assert (info.snoozes, info.attempts) == (n, 0)
    fq.release(q, claim_one(q).receipt)  # a release without delay_ms (a worker shutting down)
    assert fq.get(q, job).snoozes == 3


def test_the_snooze_limit_refuses_the_next_snooze_and_changes_nothing(q):
    assert MAX_SNOOZES == 1000
    job = fq.enqueue(q, {}).id
    Job.objects.filter(uid=job).update(snoozes=MAX_SNOOZES - 1)  # as after 999 snoozes
    fq.release(q, claim_one(q).receipt, delay_ms=0)
    assert fq.get(q, job).snoozes == MAX_SNOOZES
    lease = claim_one(q)
    before = fq.get(q, job)
    with pytest.raises(SnoozeLimit) as err:
        fq.release(q, lease.receipt, delay_ms=5)
    assert err.value.code == "snooze_limit" and err.value.field == "delay_ms"
    assert "snooze limit reached" in err.value.message and "1000" in err.value.message
    after = fq.get(q, job)
    assert after == before and after.state == "running"
    # The lease is still held: the attempt can be settled as usual, a plain release included.
    assert fq.release(q, lease.receipt).state == "ready"


def test_retry_resets_the_snooze_count(q):
    fq.configure(q, max_attempts=1)
    job = fq.enqueue(q, {}).id
    fq.release(q, claim_one(q).receipt, delay_ms=0)
    fq.nack(q, claim_one(q).receipt, error="boom")
    assert fq.get(q, job).state == "dead" and fq.get(q, job).snoozes == 1
    assert fq.retry(q, job).snoozes == 0


@pytest.mark.slow  # 2,000 round trips (8 s on SQLite); the fast tier starts from 999 (above)
def test_a_job_can_be_snoozed_exactly_a_thousand_times(q):
    """The real number, through the API: the 1,000th snooze passes, the 1,001st is refused."""
    job = fq.enqueue(q, {}).id
    for _ in range(MAX_SNOOZES):
        fq.release(q, claim_one(q).receipt, delay_ms=0)
    assert fq.get(q, job).snoozes == MAX_SNOOZES and fq.get(q, job).attempts == 0
    with pytest.raises(SnoozeLimit):
        fq.release(q, claim_one(q).receipt, delay_ms=0)
