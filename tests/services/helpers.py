"""Helpers shared by the contract tests of the Python API."""

from __future__ import annotations

import dataclasses
from collections import Counter

from django_fq import services as fq
from django_fq.models import ConcurrencyKey, IdempotencyToken, Job, Lease, Queue

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


# --- per-key limits (docs/reference/semantics.md §9 "Per-key limits") ---------------------------


def running_by_key(queue: str) -> Counter:
    """The queue's running jobs per concurrency key, as the database has them now."""
    qid = Queue.objects.get(name=queue).id
    return Counter(Job.objects.filter(queue_id=qid, state="running").values_list("concurrency_key", flat=True))


def key_admitted(queue: str, key: str) -> int:
    """The ``admitted`` count of the queue's key row (0 without one)."""
    row = ConcurrencyKey.objects.filter(queue__name=queue, key=key).first()
    return 0 if row is None else row.admitted


def check_key_counts(queue: str) -> None:
    """Every key row counts exactly its key's queued and running jobs (the invariant the limit rests on).

    Waiting (dependencies) and held (no slot yet) jobs count nowhere.
    """
    qid = Queue.objects.get(name=queue).id
    active = Counter(
        Job.objects.filter(queue_id=qid, state__in=("queued", "running"), concurrency_key__isnull=False).values_list(
            "concurrency_key", flat=True
        )
    )
    rows = dict(ConcurrencyKey.objects.filter(queue_id=qid).values_list("key", "admitted"))
    assert {k: v for k, v in rows.items() if v} == dict(active)
def most_in_a_window(instants: list[int], window_ms: int) -> int:
    """The most of ``instants`` (epoch ms) in any half-open window [s, s + window_ms); the busiest starts at one."""
    instants = sorted(instants)
    most, lo = 0, 0
    for hi, t in enumerate(instants):
        while instants[lo] <= t - window_ms:
            lo += 1
        most = max(most, hi - lo + 1)
    return most
