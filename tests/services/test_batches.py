"""Batches (docs/reference/semantics.md §9 "Batches"): members, seal, counts, the callback exactly once."""

from __future__ import annotations

import json

import pytest

from django_fq import batches
from django_fq import services as fq
from django_fq.exceptions import BatchNotFound, InvalidArgument, InvalidState
from django_fq.models import Batch, BatchMember, Job

from .helpers import claim_one

pytestmark = pytest.mark.django_db

REPORTS = "tests:svc-reports"


def callbacks(queue: str = REPORTS) -> list[dict]:
    """The jobs of ``queue`` as ``{"payload", "batch"}`` (the counts the callback carries in its metadata)."""
    out = []
    for job in Job.objects.filter(queue__name=queue).order_by("seq"):
        meta = json.loads(job.metadata or "{}")
        out.append({"payload": job.payload_value, "batch": meta.get("batch"), "meta": meta})
    return out


def finish(queue: str, outcome: str) -> str:
    """Claim one job of ``queue`` and finish it: ``succeeded`` (ack), ``dead`` (permanent nack)."""
    job = claim_one(queue)
    if outcome == "succeeded":
        fq.ack(queue, job.receipt)
    else:
        fq.nack(queue, job.receipt, error="boom", permanent=True)
    return job.id


def test_mixed_outcomes_fire_the_callback_once_with_the_counts(q):
    b = batches.create(q, callback={"queue": REPORTS, "payload": {"report": "orders"}, "metadata": {"k": 1}})
    assert b.state == "open" and b.total == 0
    first = batches.add(b.id, [{"payload": i} for i in range(3)])
    second = batches.add(b.id, [{"payload": i} for i in range(3, 5)])
    solo = fq.enqueue(q, "solo", batch=b.id)
    assert len(first) == 3 and len(second) == 2 and solo.created
    info = batches.get(b.id)
    assert (info.total, info.done, info.progress) == (6, 0, 0.0)
    fq.cancel(q, second[0].id)
    finish(q, "succeeded")
    finish(q, "dead")
    assert batches.get(b.id).done == 3
    batches.seal(b.id)
    assert callbacks() == []
    finish(q, "succeeded")
    finish(q, "succeeded")
    assert callbacks() == []
    finish(q, "succeeded")
    info = batches.get(b.id)
    assert info.state == "finished" and (info.succeeded, info.dead, info.cancelled, info.total) == (4, 1, 1, 6)
    fired = callbacks()
    assert len(fired) == 1
    assert fired[0]["payload"] == {"report": "orders"} and fired[0]["meta"]["k"] == 1
    assert fired[0]["batch"] == {"id": b.id, "total": 6, "succeeded": 4, "dead": 1, "cancelled": 1}
    assert info.callback_job == Job.objects.get(queue__name=REPORTS).uid
    with pytest.raises(InvalidState) as err:
        fq.enqueue(q, "late", batch=b.id)
    assert err.value.field == "batch"


def test_seal_after_every_member_finished_fires_in_the_seal(q):
    b = batches.create(q, callback=(REPORTS, "done"))
    batches.add(b.id, [{"payload": 1}, {"payload": 2}])
    finish(q, "succeeded")
    finish(q, "dead")
    assert batches.get(b.id).state == "open" and callbacks() == []
    info = batches.seal(b.id)
    assert info.state == "finished"
    assert [c["batch"]["succeeded"] for c in callbacks()] == [1]
    assert batches.seal(b.id).state == "finished"  # again: nothing more
    assert len(callbacks()) == 1


def test_an_empty_batch_sealed_fires_at_once(q):
    b = batches.create(q, callback={"payload": "empty"})
    info = batches.seal(b.id)
    assert info.state == "finished" and info.progress == 1.0
    fired = callbacks(q)
    assert fired == [
        {
            "payload": "empty",
            "batch": {"id": b.id, "total": 0, "succeeded": 0, "dead": 0, "cancelled": 0},
            "meta": fired[0]["meta"],
        }
    ]


def test_a_retried_dead_member_is_waited_for_again(q):
    b = batches.create(q, callback=(REPORTS, "r"))
    batches.add(b.id, [{"payload": 1}, {"payload": 2}])
    dead = finish(q, "dead")
    batches.seal(b.id)
    assert batches.get(b.id).dead == 1
    fq.retry(q, dead)
    assert batches.get(b.id).dead == 0
    finish(q, "succeeded")
    assert callbacks() == []
    finish(q, "succeeded")
    assert [c["batch"]["succeeded"] for c in callbacks()] == [2]


def test_after_the_callback_a_redriven_member_moves_the_counts_but_never_fires_again(q):
    b = batches.create(q, callback=(REPORTS, "r"))
    batches.add(b.id, [{"payload": 1}])
    dead = finish(q, "dead")
    batches.seal(b.id)
    assert callbacks()[0]["batch"]["dead"] == 1
    fq.retry(q, dead)
    finish(q, "succeeded")
    info = batches.get(b.id)
    assert (info.state, info.succeeded, info.dead) == ("finished", 1, 0)
    assert len(callbacks()) == 1


def test_a_cancelled_dead_member_counts_as_cancelled(q):
    b = batches.create(q)
    [job] = batches.add(b.id, [{"payload": 1}])
    finish(q, "dead")
    fq.cancel(q, job.id)
    info = batches.seal(b.id)
    assert (info.state, info.dead, info.cancelled) == ("finished", 0, 1)


def test_lease_expiry_into_dead_counts_by_the_reaper(q, clock):
    fq.configure(q, max_attempts=1)
    b = batches.create(q, callback=(REPORTS, "r"))
    batches.add(b.id, [{"payload": 1}])
    batches.seal(b.id)
    fq.claim(q, visibility_ms=1000)
    clock.advance(2000)
    fq.reap(q)
    assert callbacks()[0]["batch"]["dead"] == 1


def test_a_member_cancelled_by_its_dependency_counts_as_cancelled(q):
    up = fq.enqueue(q, "up").id
    b = batches.create(q, callback=(REPORTS, "r"))
    [m] = batches.add(b.id, [{"payload": "m", "depends_on": [up]}])
    batches.seal(b.id)
    fq.cancel(q, up)
    assert fq.get(q, m.id).state == "cancelled"
    assert callbacks()[0]["batch"]["cancelled"] == 1


def test_cancel_of_a_batch_cancels_unfinished_members_and_fires_nothing(q):
    b = batches.create(q, callback=(REPORTS, "r"))
    ids = [r.id for r in batches.add(b.id, [{"payload": i} for i in range(4)])]
    finish(q, "succeeded")
    running = claim_one(q)
    info = batches.cancel(b.id)
    assert (info.state, info.succeeded, info.cancelled) == ("cancelled", 1, 3)
    assert {fq.get(q, i).state for i in ids} == {"succeeded", "cancelled"}
    assert running.id in ids and callbacks() == []
    with pytest.raises(InvalidState):
        batches.seal(b.id)


def test_members_list_and_filter(q):
    b = batches.create(q)
    ids = [r.id for r in batches.add(b.id, [{"payload": i} for i in range(5)])]
    done = finish(q, "succeeded")
    assert [m["id"] for m in batches.members(b.id)] == ids
    assert batches.members(b.id, state="succeeded") == [{"id": done, "state": "succeeded"}]
    assert [m["id"] for m in batches.members(b.id, limit=2, after=ids[1])] == ids[2:4]
    with pytest.raises(InvalidArgument) as err:
        batches.members(b.id, state="nope")
    assert err.value.field == "state"
    assert [x.id for x in batches.list_batches(q)] == [b.id]
    assert batches.list_batches(q, state="sealed") == []


def test_validation_names_the_field(q):
    fq.configure(REPORTS)
    other = batches.create(REPORTS)
    with pytest.raises(BatchNotFound) as err:
        fq.enqueue(q, "x", batch=other.id)  # another queue's batch
    assert err.value.field == "batch"
    with pytest.raises(BatchNotFound) as err:
        fq.enqueue_many(q, [{"payload": 1}, {"payload": 2, "batch": "0" * 32}])
    assert err.value.field == "items[1].batch"
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue(q, "x", batch="nope")
    assert err.value.field == "batch"
    with pytest.raises(InvalidArgument) as err:
        batches.create(q, callback={"payload": 1, "unique_key": "k"})
    assert err.value.field == "callback.unique_key"
    with pytest.raises(InvalidArgument) as err:
        batches.create(q, callback={"payload": 1, "priority": "high"})
    assert err.value.field == "callback.priority"
    with pytest.raises(InvalidArgument) as err:
        batches.create(q, callback={"payload": 1, "metadata": {"batch": 1}})
    assert err.value.field == "callback.metadata.batch"
    with pytest.raises(BatchNotFound):
        batches.get(other.id, queue=q)
    assert Job.objects.filter(queue__name=q).count() == 0
    assert Batch.objects.count() == 1


def test_a_deduplicated_item_joins_nothing(q):
    b = batches.create(q)
    first = fq.enqueue(q, "x", idempotency="t1").id
    [again] = batches.add(b.id, [{"payload": "x", "idempotency": "t1"}])
    assert again.id == first and not again.created
    assert batches.get(b.id).total == 0


def test_delete_queue_deletes_its_batches_without_a_callback(q):
    b = batches.create(q, callback=(REPORTS, "r"))
    batches.add(b.id, [{"payload": 1}])
    batches.seal(b.id)
    fq.delete_queue(q)
    assert not Batch.objects.exists() and not BatchMember.objects.exists()
    assert callbacks() == []


def test_prune_keeps_members_of_an_unfinished_batch_and_drops_finished_batches(q):
    b = batches.create(q)
    [m1, m2] = batches.add(b.id, [{"payload": 1}, {"payload": 2}])
    finish(q, "succeeded")
    plain = fq.enqueue(q, "plain").id
    fq.cancel(q, plain)
    fq.prune(retention_ms=0)
    assert not Job.objects.filter(uid=plain).exists()  # a finished job outside any batch goes
    assert [m["id"] for m in batches.members(b.id)] == [m1.id, m2.id]  # kept: the batch is open
    batches.cancel(b.id)
    fq.prune(retention_ms=0)
    assert not Batch.objects.exists() and not BatchMember.objects.exists()
    assert not Job.objects.filter(queue__name=q).exists()


def test_cancel_of_a_large_batch_is_set_based_and_keeps_what_cancel_means(q):
    """1,200 members in every state: a bounded number of statements per 500 members (was a
    transaction per member), the same outcome as ``cancel`` of each one."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from django_fq import conf
    from django_fq.exceptions import ReceiptCancelled

    fq.configure(q, max_attempts=1)
    outside = fq.enqueue("tests:svc-outside", "outside-dependency").id  # nobody claims it
    b = batches.create(q, callback=(REPORTS, "r"))
    items = [{"payload": {"i": i}} for i in range(1190)]
    items += [{"payload": {"i": "later"}, "delay_ms": 3_600_000} for _ in range(5)]
    items += [{"payload": {"i": "waits"}, "depends_on": [outside]} for _ in range(5)]
    ids = [r.id for r in batches.add(b.id, items)]
    # Finished before the cancel: 3 succeeded, 2 dead; 4 running when it comes.
    done = [finish(q, "succeeded") for _ in range(3)]
    dead = [finish(q, "dead") for _ in range(2)]
    running = [claim_one(q) for _ in range(4)]
    # Dependents outside the batch, one per policy, on a queued member.
    member = ids[100]
    dep_cancel = fq.enqueue(q, "dep-cancel", depends_on=[member]).id
    dep_run = fq.enqueue(q, "dep-run", depends_on=[{"id": member, "on_failure": "run"}]).id
    before = fq.stats(q).totals
    with CaptureQueriesContext(connections[conf.database()]) as queries:
        info = batches.cancel(b.id)
    unfinished = len(ids) - 5
    assert (info.state, info.succeeded, info.dead, info.cancelled) == ("cancelled", 3, 2, unfinished)
    states = {i: fq.get(q, i).state for i in ids}
    assert {i for i, s in states.items() if s == "succeeded"} == set(done)
    assert {i for i, s in states.items() if s == "dead"} == set(dead)
    assert sum(s == "cancelled" for s in states.values()) == unfinished
    # Three chunks of at most 500: a bounded number of statements each (one job's cancel took ~10).
    assert len(queries) <= 60, len(queries)
    # A running member's receipt now says it was cancelled; its history has the cancel entry.
    with pytest.raises(ReceiptCancelled):
        fq.ack(q, running[0].receipt)
    got = fq.get(q, running[1].id)
    assert got.errors[-1]["kind"] == "cancel" and got.errors[-1]["error"] == "cancelled"
    assert got.errors[-1]["attempt"] == 1
    waits = fq.get(q, ids[-1])
    assert waits.state == "cancelled" and [e["kind"] for e in waits.errors] == ["cancel"]
    # The dependents' policies: the default cancels, "run" releases.
    assert fq.get(q, dep_cancel).state == "cancelled"
    assert fq.get(q, dep_run).state == "ready"
    # Queue counters: every cancelled job once (the members and the cancelled dependent).
    after = fq.stats(q).totals
    assert after["cancelled"] - before["cancelled"] == unfinished + 1
    assert fq.stats(q).counts["running"] == 0
    # No callback, ever; cancelling again changes nothing.
    assert callbacks() == []
    again = batches.cancel(b.id)
    assert (again.succeeded, again.dead, again.cancelled) == (3, 2, unfinished)
    assert fq.stats(q).totals["cancelled"] == after["cancelled"]


def test_cancel_of_a_batch_keeps_the_newest_history_entries(q):
    """A member whose history is full drops its oldest entry for the cancel's, as ``cancel`` does."""
    fq.configure(q, max_attempts=1000)
    b = batches.create(q)
    [m] = batches.add(b.id, [{"payload": 1}])
    for n in range(100):
        job = claim_one(q)
        fq.nack(q, job.receipt, error=f"try {n}", delay_ms=0)
    assert len(fq.get(q, m.id).errors) == 100
    batches.cancel(b.id)
    errors = fq.get(q, m.id).errors
    assert len(errors) == 100
    assert errors[0]["error"] == "try 1" and errors[-2]["error"] == "try 99"
    assert errors[-1]["kind"] == "cancel"
