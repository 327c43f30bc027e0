"""Attacks on a queue's rate limit (docs/reference/semantics.md §9 "Rate limits"): racing claimers,
a caller's stale snapshot, a configure() racing the claims."""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, connection, connections

from django_fq import services as fq
from django_fq.models import Job, Queue
from tests.services.helpers import most_in_a_window
from tests.threads import elsewhere

from .helpers import after_the_limits_read, repeatable_read

Q = "atk-rate"


def _claimed_instants() -> list[int]:
    qid = Queue.objects.get(name=Q).id
    return list(Job.objects.filter(queue_id=qid, claimed_at__isnull=False).values_list("claimed_at", flat=True))


@pytest.mark.django_db(transaction=True)
def test_racing_claimers_never_pass_the_limit_in_any_window():
    """Four threads, each its own connection, claim batches of assorted sizes while lowering and raising
    the limit: every window of the database's claim instants holds at most the highest limit in force."""
    fq.configure(Q, rate_limit=7, rate_window_ms=150)
    fq.enqueue_many(Q, [{"payload": i} for i in range(400)])
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer(count: int):
        try:
            while not stop.is_set():
                for j in fq.claim(Q, count=count, visibility_ms=600_000):
                    fq.ack(Q, j.receipt)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in (1, 2, 5, 9)]
    for t in threads:
        t.start()
    try:
        for limit in (3, 7, 5, 7):
            elsewhere(lambda limit=limit: fq.configure(Q, rate_limit=limit))
            threading.Event().wait(0.4)  # let the claimers run a few windows under this limit
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    instants = _claimed_instants()
    assert len(instants) > 20
    assert most_in_a_window(instants, 150) <= 7


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_a_claim_in_a_snapshot_older_than_the_last_claim_does_not_count_from_it():
    """A caller's REPEATABLE READ snapshot taken before another claim filled the window: PostgreSQL fails
    the claim with a serialization failure (the caller retries); MariaDB/MySQL read the newest log."""
    fq.configure(Q, rate_limit=1, rate_window_ms=600_000)
    fq.enqueue_many(Q, [{"payload": i} for i in range(3)])
    assert len(elsewhere(lambda: fq.claim(Q))) == 1  # the queue's first claim: its counter row exists now
    fq.configure(Q, rate_limit=2)
    taken: list = []
    if connection.vendor == "postgresql":
        with pytest.raises(DatabaseError) as info, repeatable_read("django_fq_rate_log"):
            assert len(elsewhere(lambda: fq.claim(Q))) == 1  # fills the window of 2
            taken = fq.claim(Q, count=5)
        assert getattr(info.value.__cause__, "sqlstate", None) == "40001", info.value
    else:
        with repeatable_read("django_fq_rate_log"):
            assert len(elsewhere(lambda: fq.claim(Q))) == 1
            taken = fq.claim(Q, count=5)
    assert taken == []
    assert len(_claimed_instants()) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_a_claim_uses_the_rate_limit_in_force_when_it_locks_the_queue():
    """The claim reads the policy (limit 3), configure(rate_limit=1) commits, then the claim locks the queue:
    it must judge the window by 1 (re-read under the lock), not by the 3 it read first."""
    fq.configure(Q, rate_limit=3, rate_window_ms=600_000)
    fq.enqueue_many(Q, [{"payload": i} for i in range(5)])
    assert len(fq.claim(Q)) == 1
    with after_the_limits_read(lambda: fq.configure(Q, rate_limit=1)) as changed:
        second = fq.claim(Q, count=5)
    assert changed and changed[0].error is None
    assert second == [] and second.rate_wait_ms > 0
    assert len(_claimed_instants()) == 1
