"""Batches under concurrency, with real threads on the real database (docs/reference/semantics.md §9 "Batches").

The last members of a sealed batch finishing at the same moment (acks, a
dead nack, the reaper, a seal racing the last ack) enqueue the callback
exactly once, with the counts of every member: the finishers serialise on
the batch row's lock.
"""

from __future__ import annotations

import json

import pytest

from django_fq import batches
from django_fq import services as fq
from django_fq.models import Job

from .helpers import QUEUE
from .test_dependency_races import _at_once, _hold_while_waiting

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 8
REPORTS = "tests:svc-batch-reports"


def _fired() -> list[dict]:
    return [
        json.loads(m or "{}").get("batch")
        for m in Job.objects.filter(queue__name=REPORTS).values_list("metadata", flat=True)
    ]


@pytest.mark.parametrize("verb", ["ack", "ack_many", "mixed"])
def test_the_last_members_finishing_at_once_fire_the_callback_once(verb):
    fq.configure(QUEUE)
    for n in range(ROUNDS):
        Job.objects.filter(queue__name=REPORTS).delete()
        b = batches.create(QUEUE, callback=(REPORTS, n))
        batches.add(b.id, [{"payload": i} for i in range(4)])
        batches.seal(b.id)
        jobs = fq.claim(QUEUE, count=4)
        assert len(jobs) == 4
        if verb == "ack":
            calls = [lambda j=j: fq.ack(QUEUE, j.receipt) for j in jobs]
        elif verb == "ack_many":
            calls = [lambda j=j: fq.ack_many(QUEUE, [(j.receipt, None)]) for j in jobs]
        else:
            calls = [lambda j=jobs[0]: fq.nack(QUEUE, j.receipt, error="x", permanent=True)]
            calls += [lambda j=j: fq.ack(QUEUE, j.receipt) for j in jobs[1:]]
        _at_once(*calls)
        dead = int(verb == "mixed")
        assert _fired() == [{"id": b.id, "total": 4, "succeeded": 4 - dead, "dead": dead, "cancelled": 0}]
        assert batches.get(b.id).state == "finished"


def test_the_seal_racing_the_last_ack_fires_once():
    fq.configure(QUEUE)
    for n in range(ROUNDS):
        Job.objects.filter(queue__name=REPORTS).delete()
        b = batches.create(QUEUE, callback=(REPORTS, n))
        batches.add(b.id, [{"payload": 1}])
        (job,) = fq.claim(QUEUE)
        _at_once(lambda job=job: fq.ack(QUEUE, job.receipt), lambda b=b: batches.seal(b.id))
        assert _fired() == [{"id": b.id, "total": 1, "succeeded": 1, "dead": 0, "cancelled": 0}]


def test_the_reaper_racing_an_ack_fires_once(clock):
    fq.configure(QUEUE, max_attempts=1)
    for n in range(ROUNDS):
        Job.objects.filter(queue__name=REPORTS).delete()
        b = batches.create(QUEUE, callback=(REPORTS, n))
        batches.add(b.id, [{"payload": 1}, {"payload": 2}])
        batches.seal(b.id)
        expiring = fq.claim(QUEUE, visibility_ms=1000)[0]
        acked = fq.claim(QUEUE, visibility_ms=600_000)[0]
        clock.advance(2000)
        _at_once(lambda: fq.reap(QUEUE), lambda acked=acked: fq.ack(QUEUE, acked.receipt))
        assert expiring.id != acked.id
        assert _fired() == [{"id": b.id, "total": 2, "succeeded": 1, "dead": 1, "cancelled": 0}]


@pytest.mark.row_locks
def test_an_add_waits_for_the_seal_and_is_refused():
    """The seal holds the batch row while the add waits on it: the add then sees the batch sealed."""
    from django_fq.exceptions import InvalidState

    fq.configure(QUEUE)
    b = batches.create(QUEUE, callback=(REPORTS, "r"))
    batches.add(b.id, [{"payload": 1}])

    def add():
        try:
            batches.add(b.id, [{"payload": 2}])
        except InvalidState as exc:
            return exc.field

    _, field = _hold_while_waiting(lambda: batches.seal(b.id), add)
    assert field == "items[0].batch"
    assert batches.get(b.id).total == 1
    assert Job.objects.filter(queue__name=QUEUE).count() == 1
