"""Helpers shared by the contract tests of the Python API."""

from __future__ import annotations

import dataclasses

from django_fq import services as fq
from django_fq.models import IdempotencyToken, Job, Lease, Queue

QUEUE = "tests:svc"


class FrozenClock:
    """A database clock that stands still until told to move.

    The SQL clock expression becomes a constant read once from the database;
    moves go through the ``clock`` fixture's offset, added inside the same
    expression. Nothing here reads Python's clock.
    """

    def __init__(self, clock, settings, start: int):
        self._clock = clock
        self._settings = settings
        self.start = start

    @property
    def now(self) -> int:
        return self.start + int(getattr(self._settings, "FQ_TEST_CLOCK_OFFSET_MS", 0))

    def advance(self, ms: int) -> None:
        self._clock.advance(ms)

    def set(self, instant: int) -> None:
        self._clock.advance(instant - self.now)


def snapshot(queue: str, job_id: str) -> dict:
    """Everything ``get`` reports about a job, as a plain dict (for before/after comparisons)."""
    return dataclasses.asdict(fq.get(queue, job_id))


def claim_one(queue: str, **kwargs):
    """Claim exactly one job (fails the test if none or several come back)."""
    jobs = fq.claim(queue, **kwargs)
    assert len(jobs) == 1, jobs
    return jobs[0]


def rows(queue: str) -> dict:
    """Raw row counts of one queue's jobs, leases and tokens (bypassing the API)."""
    qid = Queue.objects.filter(name=queue).values_list("id", flat=True).first()
    return {
        "jobs": Job.objects.filter(queue_id=qid).count(),
        "leases": Lease.objects.filter(queue_id=qid).count(),
        "tokens": IdempotencyToken.objects.filter(queue_id=qid).count(),
    }


def most_in_a_window(instants: list[int], window_ms: int) -> int:
    """The most of ``instants`` (epoch ms) in any half-open window [s, s + window_ms); the busiest starts at one."""
    instants = sorted(instants)
    most, lo = 0, 0
    for hi, t in enumerate(instants):
        while instants[lo] <= t - window_ms:
            lo += 1
        most = max(most, hi - lo + 1)
    return most
