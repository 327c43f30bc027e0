"""Queues and their policy (docs/reference/semantics.md §2): configure, policy, queues, delete_queue."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidPolicy, InvalidQueueName, JobNotFound, QueueNotFound
from django_fq.models import IdempotencyToken, Job, Lease, Queue
from django_fq.types import STATE_NAMES, QueuePolicy

from .helpers import claim_one, rows

pytestmark = pytest.mark.django_db

DAY = 86_400_000

#: (field, lowest accepted, highest accepted) per docs/reference/semantics.md §2.
BOUNDS = [
    ("concurrency", 0, 100_000),
    ("max_attempts", 1, 1000),
    ("backoff_ms", 0, DAY),
    ("max_backoff_ms", 0, 30 * DAY),
    ("visibility_ms", 1, DAY),
    ("idempotency_retention_ms", 1, 30 * DAY),
    ("timeout_ms", 0, 7 * DAY),
]


def test_defaults_match_the_spec():
    pol = fq.configure("fresh")
    assert pol == QueuePolicy(
        concurrency=0,
        max_attempts=25,
        backoff_ms=1000,
        max_backoff_ms=3_600_000,
        visibility_ms=30_000,
        idempotency_retention_ms=300_000,
        timeout_ms=0,
    )
    assert fq.policy("fresh") == pol


def test_enqueue_creates_a_queue_with_the_default_policy():
    fq.enqueue("made-by-enqueue", {"x": 1})
    assert fq.policy("made-by-enqueue") == QueuePolicy()


@pytest.mark.parametrize("field,lo,hi", BOUNDS)
def test_policy_bounds(field, lo, hi):
    # max_backoff_ms must stay >= backoff_ms; keep backoff_ms at 0 to probe it alone.
    base = {"backoff_ms": 0} if field == "max_backoff_ms" else {}
    if field == "backoff_ms":
        base = {"max_backoff_ms": 30 * DAY}
    fq.configure("bounds", **base)
    before = fq.policy("bounds")

    for bad in (lo - 1, hi + 1):
        with pytest.raises(InvalidPolicy) as err:
            fq.configure("bounds", **{field: bad})
        assert err.value.field == field
        assert fq.policy("bounds") == before, "a rejected configure must change nothing"

    assert getattr(fq.configure("bounds", **{field: lo}), field) == lo
    assert getattr(fq.policy("bounds"), field) == lo
    assert getattr(fq.configure("bounds", **{field: hi}), field) == hi
    assert getattr(fq.policy("bounds"), field) == hi


@pytest.mark.parametrize("bad", [True, "5", 5.0, [5]])
def test_policy_values_must_be_integers(bad):
    fq.configure("types")
    with pytest.raises(InvalidPolicy) as err:
        fq.configure("types", max_attempts=bad)
    assert err.value.field == "max_attempts"
    assert fq.policy("types").max_attempts == 25


def test_unknown_policy_field_is_rejected():
    with pytest.raises(InvalidPolicy) as err:
        fq.configure("unknown-field", retries=3)
    assert err.value.field == "retries"
    with pytest.raises(QueueNotFound):
        fq.policy("unknown-field")


def test_max_backoff_below_backoff_is_rejected_in_one_call():
    fq.configure("mb")
    with pytest.raises(InvalidPolicy) as err:
        fq.configure("mb", backoff_ms=5000, max_backoff_ms=4999)
    assert err.value.field == "max_backoff_ms"
    assert fq.policy("mb") == QueuePolicy()


def test_max_backoff_below_stored_backoff_is_rejected():
    fq.configure("mb2", backoff_ms=10_000, max_backoff_ms=20_000)
    with pytest.raises(InvalidPolicy):
        fq.configure("mb2", max_backoff_ms=9_999)
    with pytest.raises(InvalidPolicy):
        fq.configure("mb2", backoff_ms=20_001)
    pol = fq.policy("mb2")
    assert (pol.backoff_ms, pol.max_backoff_ms) == (10_000, 20_000)
    # Equal is fine.
    assert fq.configure("mb2", max_backoff_ms=10_000).max_backoff_ms == 10_000


def test_rejected_configure_of_a_missing_queue_does_not_create_it():
    with pytest.raises(InvalidPolicy):
        fq.configure("never", backoff_ms=5000, max_backoff_ms=10)
    with pytest.raises(InvalidPolicy):
        fq.configure("never", visibility_ms=0)
    with pytest.raises(QueueNotFound):
        fq.policy("never")
    assert not Queue.objects.filter(name="never").exists()


def test_configure_only_changes_given_fields():
    fq.configure("partial", concurrency=3, max_attempts=7)
    pol = fq.configure("partial", backoff_ms=250)
    assert (pol.concurrency, pol.max_attempts, pol.backoff_ms) == (3, 7, 250)
    assert pol.visibility_ms == 30_000


@pytest.mark.parametrize(
    "name",
    ["", "x" * 201, "has space", "slash/y", "é", "star*", "new\nline", None, 42],
)
def test_invalid_queue_names_are_rejected(name):
    with pytest.raises(InvalidQueueName):
        fq.configure(name)
    with pytest.raises(InvalidQueueName):
        fq.policy(name)
    with pytest.raises(InvalidQueueName):
        fq.enqueue(name, {})
    assert Queue.objects.count() == 0


@pytest.mark.parametrize("name", ["a", "x" * 200, "docs:native", "A-Z_0.9:x"])
def test_valid_queue_names(name):
    fq.configure(name)
    assert fq.policy(name) == QueuePolicy()
    assert [i.name for i in fq.queues()] == [name]


def test_policy_of_a_missing_queue_raises_and_does_not_create_it():
    with pytest.raises(QueueNotFound) as err:
        fq.policy("missing")
    assert err.value.code == "queue_not_found"
    assert not Queue.objects.filter(name="missing").exists()
    assert fq.queues() == []
    # Other read verbs do not create it either.
    for call in (
        lambda: fq.stats("missing"),
        lambda: fq.jobs("missing"),
        lambda: fq.get("missing", "0" * 32),
        lambda: fq.claim("missing"),
        lambda: fq.delete_queue("missing"),
    ):
        with pytest.raises(QueueNotFound):
            call()
    assert not Queue.objects.filter(name="missing").exists()


def test_queues_lists_every_queue_with_policy_and_counts():
    fq.configure("b-queue", concurrency=2)
    fq.enqueue("a-queue", {"n": 1})
    fq.enqueue("a-queue", {"n": 2})
    fq.enqueue("a-queue", {"n": 3}, delay_ms=60_000)
    claim_one("a-queue")
    listed = {i.name: i for i in fq.queues()}
    assert set(listed) == {"a-queue", "b-queue"}
    assert listed["b-queue"].policy == QueuePolicy(concurrency=2)
    assert listed["a-queue"].policy == QueuePolicy()
    assert set(listed["a-queue"].counts) == set(STATE_NAMES)
    assert listed["a-queue"].counts == {
        "waiting": 0,
        "scheduled": 1,
        "ready": 1,
        "running": 1,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
    }
    assert listed["b-queue"].counts == dict.fromkeys(STATE_NAMES, 0)
    assert isinstance(listed["a-queue"].created_at, int)


def test_delete_queue_removes_jobs_leases_and_tokens():
    fq.configure("doomed", max_attempts=3)
    fq.configure("other")
    ids = [fq.enqueue("doomed", {"n": n}, idempotency=f"tok-{n}").id for n in range(3)]
    claim_one("doomed")
    keep = fq.enqueue("other", {"keep": True}, idempotency="tok-0").id
    claim_one("other")
    assert rows("doomed") == {"jobs": 3, "leases": 1, "tokens": 3}
    qid = Queue.objects.get(name="doomed").id

    fq.delete_queue("doomed")

    assert not Job.objects.filter(queue_id=qid).exists()
    assert not Lease.objects.filter(queue_id=qid).exists()
    assert not IdempotencyToken.objects.filter(queue_id=qid).exists()
    with pytest.raises(QueueNotFound):
        fq.policy("doomed")
    with pytest.raises(QueueNotFound):
        fq.get("doomed", ids[0])
    assert [i.name for i in fq.queues()] == ["other"]
    # The other queue is untouched.
    assert rows("other") == {"jobs": 1, "leases": 1, "tokens": 1}
    assert fq.get("other", keep).state == "running"

    # Re-creating the queue starts from scratch: default policy, no tokens, no totals.
    res = fq.enqueue("doomed", {"n": 0}, idempotency="tok-0")
    assert res.created is True and res.id not in ids
    assert fq.policy("doomed") == QueuePolicy()
    assert fq.stats("doomed").totals["enqueued"] == 1
    with pytest.raises(JobNotFound):
        fq.get("doomed", ids[1])


def test_a_queue_keeps_policy_and_totals_when_empty():
    fq.configure("kept", max_attempts=4, backoff_ms=10)
    fq.enqueue("kept", {"n": 1})
    job = claim_one("kept")
    fq.ack("kept", job.receipt)
    fq.prune(retention_ms=0)
    assert rows("kept")["jobs"] == 0

    assert fq.policy("kept") == QueuePolicy(max_attempts=4, backoff_ms=10)
    stats = fq.stats("kept")
    assert stats.counts == dict.fromkeys(STATE_NAMES, 0)
    assert stats.totals["enqueued"] == 1
    assert stats.totals["claimed"] == 1
    assert stats.totals["acked"] == 1
    assert [i.name for i in fq.queues()] == ["kept"]
