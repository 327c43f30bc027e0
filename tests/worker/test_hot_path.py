"""The per-job objects a worker makes on its hot path are the ones the plain constructors make.

``Outcome.ok``, ``JobContext.from_claim`` (with a lease) and the claim's ``ClaimedJob``
instances skip keyword calls and frozen ``__init__`` steps (docs/performance.md, third
round); each is compared here with what the ordinary construction gives.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from django_fq import services as fq
from django_fq.types import ClaimedJob, SettleResult
from django_fq.worker.context import JobContext, LeaseState
from django_fq.worker.state import Outcome, Running


def test_outcome_ok_is_the_dataclass_outcome():
    for result in (None, {"a": [1, 2]}, "x"):
        fast, plain = Outcome.ok(result, 12), Outcome("ok", result=result, elapsed_ms=12)
        assert fast == plain and repr(fast) == repr(plain) and type(fast) is Outcome
        assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.kind = "failed"  # type: ignore[misc]


def _claimed(metadata):
    return ClaimedJob(
        id="ab" * 16, queue="t.ok", payload={"n": 1}, receipt="fq1.x", deadline=40_000, attempts=2,
        max_attempts=5, priority=3, enqueued_at=1_000, claimed_at=10_000, metadata=metadata,
    )  # fmt: skip


@pytest.mark.parametrize("metadata", [None, {"tags": ["a"]}])
def test_job_context_from_claim_fills_what_init_fills(metadata):
    claimed = _claimed(metadata)
    lease = LeaseState(claimed.deadline, 5.0)
    fast = JobContext.from_claim(claimed, lease)
    plain = JobContext(
        id=claimed.id, queue=claimed.queue, payload=claimed.payload, attempts=claimed.attempts,
        max_attempts=claimed.max_attempts, deadline=claimed.deadline, enqueued_at=claimed.enqueued_at,
        claimed_at=claimed.claimed_at, lease=lease, metadata=claimed.metadata,
    )  # fmt: skip
    for name in JobContext.__slots__:
        assert getattr(fast, name) == getattr(plain, name), name
    assert fast.deadline == claimed.deadline and fast.metadata == (metadata or {})
    # Through a Running, as the worker makes it: the handler sees the claim, never the receipt.
    running = Running(claimed, 30_000, time.monotonic(), time.monotonic(), 1 / 3)
    assert running.context._lease is running.state and "fq1" not in repr(running.context)


@pytest.mark.django_db
def test_claimed_jobs_equal_the_dataclass_made_from_their_fields():
    fq.configure("t.hot")
    fq.enqueue_many("t.hot", [{"payload": {"n": n}, "metadata": {"tags": ["t"]} if n else None} for n in range(3)])
    jobs = fq.claim("t.hot", count=3)
    assert len(jobs) == 3
    for job in jobs:
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(ClaimedJob)}
        assert ClaimedJob(**fields) == job and type(job) is ClaimedJob
        assert repr(ClaimedJob(**fields)) == repr(job) and "fq1." not in repr(job)
        with pytest.raises(dataclasses.FrozenInstanceError):
            job.payload = None  # type: ignore[misc]
    assert sorted(j.payload["n"] for j in jobs) == [0, 1, 2]


@pytest.mark.django_db
def test_the_settle_results_of_an_ack_batch_equal_the_dataclass():
    fq.configure("t.hot.ack")
    fq.enqueue_many("t.hot.ack", [{"payload": n} for n in range(3)])
    jobs = fq.claim("t.hot.ack", count=3)
    results = fq.ack_many("t.hot.ack", [(j.receipt, None) for j in jobs])
    assert results == [SettleResult(id=j.id, state="succeeded") for j in jobs]
    assert [repr(r) for r in results] == [repr(SettleResult(id=j.id, state="succeeded")) for j in jobs]


@pytest.mark.django_db(transaction=True)
def test_the_connection_pass_after_a_handler_sees_the_opened_connections():
    # dbconn._opened is connections.all(initialized_only=True) in one lookup per alias.
    from django.db import connections

    from django_fq.worker import dbconn

    with connections["default"].cursor() as cur:
        cur.execute("SELECT 1")
    assert dbconn._opened() == connections.all(initialized_only=True)
    assert connections["default"] in dbconn._opened()
