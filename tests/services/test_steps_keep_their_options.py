"""A step keeps the meaning of every enqueue option (issue 16, "Rules that make it exact"; docs/how-to/workflows.md).

Idempotency tokens, priorities, attempts, timeouts, the queue's concurrency
limit and the queue-full limit apply to a job with dependencies as to any
other: while it waits, and once its last dependency releases it.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import QueueFull
from django_fq.workflows import Workflow

from .helpers import claim_one

pytestmark = pytest.mark.django_db


def _ack_one(queue: str) -> str:
    job = claim_one(queue)
    fq.ack(queue, job.receipt)
    return job.id


def test_an_idempotency_token_of_a_waiting_job_returns_it_and_keeps_its_dependencies(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a], idempotency="step-b")
    again = fq.enqueue(q, "other", idempotency="step-b")
    assert (again.id, again.created) == (b.id, False)
    assert fq.get(q, b.id).state == "waiting" and fq.get(q, b.id).payload == "b"
    assert _ack_one(q) == a
    assert fq.get(q, b.id).state == "ready"
    # The token outlives the release and the job's success, as for any job.
    assert _ack_one(q) == b.id
    assert fq.enqueue(q, "late", idempotency="step-b").id == b.id


def test_a_workflow_step_coalesced_by_its_token_is_the_earlier_job_and_its_dependents_wait_for_it(q):
    first = Workflow()
    first.step(q, "load", name="load", idempotency="load-orders")
    ids1 = first.enqueue()
    second = Workflow()
    load = second.step(q, "load again", name="load", idempotency="load-orders")
    second.step(q, "report", name="report", after=[load])
    ids2 = second.enqueue()
    assert ids2["load"] == ids1["load"]
    assert fq.get(q, ids2["report"]).state == "waiting"
    assert fq.stats(q).totals["enqueued"] == 2  # load once, report once
    assert _ack_one(q) == ids1["load"]
    assert fq.get(q, ids2["report"]).state == "ready"


def test_released_jobs_are_claimed_by_priority_then_enqueue_order(q):
    root = fq.enqueue(q, "root", priority=10).id
    low = fq.enqueue(q, "low", depends_on=[root], priority=1).id
    high = fq.enqueue(q, "high", depends_on=[root], priority=9).id
    low_too = fq.enqueue(q, "low too", depends_on=[root], priority=1).id
    plain = fq.enqueue(q, "plain", priority=5).id  # ready all along, enqueued after the three
    assert _ack_one(q) == root
    order = [_ack_one(q) for _ in range(4)]
    assert order == [high, plain, low, low_too]


def test_a_released_step_keeps_its_attempts_and_timeout(q):
    fq.configure(q, backoff_ms=0)
    root = fq.enqueue(q, "root").id
    step = fq.enqueue(q, "step", depends_on=[root], max_attempts=2, timeout_ms=45_000).id
    assert _ack_one(q) == root
    info = fq.get(q, step)
    assert (info.state, info.max_attempts, info.timeout_ms, info.attempts) == ("ready", 2, 45_000, 0)
    job = claim_one(q)
    assert job.id == step and job.attempts == 1
    fq.nack(q, job.receipt, error="once")
    job = claim_one(q)
    fq.nack(q, job.receipt, error="twice")
    assert fq.get(q, step).state == "dead"  # its own max_attempts, not the queue's 25


def test_the_queue_concurrency_limit_holds_for_released_steps(q):
    fq.configure(q, concurrency=2)
    root = fq.enqueue(q, "root").id
    fan = [fq.enqueue(q, i, depends_on=[root]).id for i in range(5)]
    assert _ack_one(q) == root
    assert fq.stats(q).counts["ready"] == 5
    held = fq.claim(q, count=5, visibility_ms=60_000)
    assert len(held) == 2 and {j.id for j in held} <= set(fan)
    assert fq.claim(q, count=5) == []
    fq.ack(q, held[0].receipt)
    assert len(fq.claim(q, count=5, visibility_ms=60_000)) == 1


def test_waiting_jobs_count_against_the_queue_full_limit(q, settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = 3
    a = fq.enqueue(q, "a").id
    fq.enqueue(q, "b", depends_on=[a])
    fq.enqueue(q, "c", depends_on=[a])
    with pytest.raises(QueueFull):
        fq.enqueue(q, "d", depends_on=[a])
    with pytest.raises(QueueFull):
        fq.enqueue(q, "e")
    assert fq.stats(q).counts["waiting"] == 2
