"""Deep workflows: enqueue and cancel cost a bounded number of statements, whatever the depth (docs/performance.md).

``Workflow.enqueue`` writes one call per queue (and per round after a step
that may coalesce), and the edges of the whole write at once;
``workflows.cancel`` cancels the workflow as a set. These tests hold the
contract of both (docs/how-to/workflows.md, docs/reference/semantics.md §9
"Dependencies") on chains long enough that a per-level cost would show.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_fq import batches, storage, workflows
from django_fq import services as fq
from django_fq.exceptions import InvalidArgument, InvalidState, ReceiptCancelled
from django_fq.models import Dependency, Job
from django_fq.workflows import MAX_STEPS, Workflow

from .helpers import check_key_counts, claim_one

pytestmark = pytest.mark.django_db

OTHER = "tests:svc-other"


def chain(n: int, queues: tuple[str, ...], *, prefix: str = "step", after: list | None = None, **options) -> Workflow:
    """A workflow of ``n`` steps ``step0 → step1 → …``, alternating over ``queues``."""
    wf = Workflow()
    prev = None
    for i in range(n):
        ups = [prev] if prev is not None else list(after or [])
        prev = wf.step(queues[i % len(queues)], {"i": i}, name=f"{prefix}{i}", after=ups, **options)
    return wf


def statements(fn) -> tuple[int, object]:
    with CaptureQueriesContext(connection) as ctx:
        out = fn()
    return len(ctx.captured_queries), out


def states(ids: dict[str, str]) -> dict[str, str]:
    found = dict(Job.objects.filter(uid__in=list(ids.values())).values_list("uid", "state"))
    return {name: found[uid] for name, uid in ids.items()}


def test_a_chain_of_max_steps_enqueues_and_runs_in_order(q):
    wf = chain(MAX_STEPS, (q, OTHER))
    ids = wf.enqueue()
    assert len(ids) == MAX_STEPS
    got = states(ids)
    assert got["step0"] == "queued"
    assert {got[f"step{i}"] for i in range(1, MAX_STEPS)} == {"waiting"}
    assert Dependency.objects.filter(job__uid__in=list(ids.values())).count() == MAX_STEPS - 1
    assert fq.stats(q).counts["waiting"] + fq.stats(OTHER).counts["waiting"] == MAX_STEPS - 1
    # The edges are named after the steps, and release the chain one step at a time, across queues.
    for i in range(3):
        queue = (q, OTHER)[i % 2]
        job = claim_one(queue)
        assert job.id == ids[f"step{i}"]
        fq.ack(queue, job.receipt, result={"i": i})
    nxt = claim_one(OTHER)
    assert nxt.id == ids["step3"] and fq.results(OTHER, nxt.id)["step2"] == {"i": 2}


def test_enqueue_statements_do_not_grow_with_the_chain(q):
    small, _ = statements(lambda: chain(100, (q, OTHER), prefix="a").enqueue())
    large, _ = statements(lambda: chain(1000, (q, OTHER), prefix="b").enqueue())
    # Per queue and per 500 rows, not per level: the level-by-level write took 14 per step.
    assert large <= small + 40, (small, large)
    assert small <= 60, small


def test_cancel_statements_do_not_grow_with_the_chain(q):
    small_ids = chain(100, (q, OTHER), prefix="a").enqueue()
    large_ids = chain(1000, (q, OTHER), prefix="b").enqueue()
    small, out = statements(lambda: workflows.cancel(q, small_ids["a0"]))
    assert out.cancelled == 100
    large, out = statements(lambda: workflows.cancel(q, large_ids["b0"]))
    assert out.cancelled == 1000
    assert large <= small + 40, (small, large)
    assert set(states(large_ids).values()) == {"cancelled"}


def test_an_error_at_step_27_writes_nothing_and_names_it(q):
    wf = Workflow()
    prev = None
    for i in range(50):
        options = {"priority": 2**40} if i == 27 else {}
        prev = wf.step((q, OTHER)[i % 2], i, name=f"step{i}", after=[prev] if prev else [], **options)
    with pytest.raises(InvalidArgument) as err:
        wf.enqueue()
    assert err.value.field == "steps[step27].priority"
    assert "step27" in err.value.message
    assert Job.objects.count() == 0 and Dependency.objects.count() == 0


@pytest.mark.parametrize("how", ["unique_key", "idempotency"])
def test_a_middle_step_coalesces_onto_a_queued_job(q, how):
    existing = fq.enqueue(q, "old", **{how: "K"})
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    m = wf.step(q, "m", name="m", after=[a], **{how: "K"})
    c = wf.step(OTHER, "c", name="c", after=[m])
    wf.step(q, "d", name="d", after=[c])
    ids = wf.enqueue()
    assert ids["m"] == existing.id
    assert list(ids) == ["a", "m", "c", "d"]
    assert states(ids) == {"a": "queued", "m": "queued", "c": "waiting", "d": "waiting"}
    # The existing job keeps its own dependencies (none): only c and d have edges here.
    assert not Dependency.objects.filter(job__uid=existing.id).exists()
    first = claim_one(q)
    assert first.id == existing.id
    fq.ack(q, first.receipt)
    assert states(ids)["c"] == "queued"


def test_a_middle_step_coalescing_onto_a_succeeded_job_releases_its_dependents(q):
    done = fq.enqueue(q, "old", idempotency="T")
    job = claim_one(q)
    fq.ack(q, job.receipt, result=7)
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    m = wf.step(q, "m", name="m", after=[a], idempotency="T")
    c = wf.step(OTHER, "c", name="c", after=[m])
    wf.step(OTHER, "d", name="d", after=[c])
    ids = wf.enqueue()
    assert ids["m"] == done.id
    assert states(ids) == {"a": "queued", "m": "succeeded", "c": "queued", "d": "waiting"}
    got = claim_one(OTHER)
    assert got.id == ids["c"] and fq.results(OTHER, got.id)["m"] == 7


def test_a_middle_step_coalescing_onto_a_dead_job_cancels_the_rest_of_the_chain(q):
    fq.configure(q, max_attempts=1)
    dead = fq.enqueue(q, "old", idempotency="T")
    fq.nack(q, claim_one(q).receipt, error="boom")
    assert fq.get(q, dead.id).state == "dead"
    fq.configure(OTHER)
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    m = wf.step(q, "m", name="m", after=[a], idempotency="T")
    prev = m
    for i in range(6):
        prev = wf.step((OTHER, q)[i % 2], i, name=f"c{i}", after=[prev])
    wf.step(OTHER, "cb", name="cb", after=[prev], on_failure="run")
    ids = wf.enqueue()
    got = states(ids)
    assert got["a"] == "queued" and got["m"] == "dead"
    assert {got[f"c{i}"] for i in range(6)} == {"cancelled"}
    assert got["cb"] == "queued"  # its run edge counts the cancelled step as finished
    assert fq.get(OTHER, ids["c0"]).last_error == f"cancelled: dependency {dead.id} is dead"
    assert fq.get(q, ids["c1"]).last_error == f"cancelled: dependency {ids['c0']} is cancelled"
    assert fq.stats(OTHER).counts["cancelled"] == 3
    assert fq.stats(q).counts["cancelled"] == 3
    assert fq.stats(OTHER).counts["waiting"] == 0


def test_a_chain_after_a_dead_job_is_cancelled_at_enqueue_in_bounded_statements(q):
    fq.configure(q, max_attempts=1)
    dead = fq.enqueue(q, "old")
    fq.nack(q, claim_one(q).receipt, error="boom")
    small, _ = statements(lambda: chain(20, (q, OTHER), prefix="a", after=[dead.id]).enqueue())
    large, ids = statements(lambda: chain(600, (q, OTHER), prefix="b", after=[dead.id]).enqueue())
    assert set(states(ids).values()) == {"cancelled"}
    assert large <= small + 40, (small, large)
    assert fq.get(OTHER, ids["b1"]).last_error == f"cancelled: dependency {ids['b0']} is cancelled"
    assert fq.stats(q).counts["cancelled"] == 310 and fq.stats(OTHER).counts["cancelled"] == 310
    assert fq.stats(q).counts["waiting"] == 0


def cancel_one_by_one(queue: str, job_id: str) -> None:
    """The cancel of a workflow job by job, in dependency order: what workflows.cancel must leave."""
    for step in workflows.show(queue, job_id).steps:
        if step["state"] not in ("succeeded", "cancelled"):
            try:
                fq.cancel(step["queue"], step["id"])
            except InvalidState:
                pass


def build(queues: tuple[str, str], keyed: str, tag: str) -> tuple[dict[str, str], dict]:
    """One workflow over two queues with every kind of step a cancel meets; some of it run first."""
    fq.configure(queues[0], max_attempts=1)
    fq.configure(keyed, key_concurrency=1)
    batch = batches.create(queues[1])
    wf = Workflow()
    head = wf.step(queues[0], "head", name="head")
    dying = wf.step(queues[0], "dying", name="dying")
    prev = head
    links = []
    for i in range(12):
        prev = wf.step(queues[i % 2], i, name=f"c{i}", after=[prev], **({"batch": batch.id} if i == 5 else {}))
        links.append(prev)
    waits = wf.step(queues[1], "wait", name="w", after=[dying], on_failure="wait")
    wf.add_edges(waits, [links[1]])
    keyed_step = wf.step(keyed, "k", name="k", concurrency_key="key", after=[prev], on_failure="run")
    other_key = wf.step(keyed, "k2", name="k2", concurrency_key="key")
    wf.step(queues[1], "after-k", name="ak", after=[keyed_step, other_key])
    ids = wf.enqueue()
    running = claim_one(queues[0])
    assert running.id == ids["head"]
    dead = claim_one(queues[0])
    assert dead.id == ids["dying"]
    fq.nack(queues[0], dead.receipt, error="boom")
    key_job = claim_one(keyed)
    assert key_job.id == ids["k2"]
    return ids, {"running": running, "batch": batch.id, "tag": tag}


def outcome(ids: dict[str, str], queues: tuple[str, ...]) -> dict:
    """What a cancel left, with job ids replaced by step names (two workflows compare equal)."""
    names = {uid: name for name, uid in ids.items()}
    jobs = {}
    for name, uid in ids.items():
        job = Job.objects.get(uid=uid)
        error = job.last_error or ""
        for other, step in names.items():
            error = error.replace(other, f"<{step}>")
        jobs[name] = (job.state, error, len(job.errors or []), job.waiting_on)
    pending = sorted(
        (names[j], names[u])
        for j, u in Dependency.objects.filter(pending=True, job__uid__in=list(ids.values())).values_list(
            "job__uid", "upstream__uid"
        )
    )
    stats = [(fq.stats(q).counts, fq.stats(q).totals) for q in queues]
    return {"jobs": jobs, "pending": pending, "stats": stats}


def test_a_set_cancel_leaves_what_a_cancel_job_by_job_leaves(db):
    left, right = ("tests:l1", "tests:l2"), ("tests:r1", "tests:r2")
    ids_l, extra_l = build(left, "tests:lk", "l")
    ids_r, extra_r = build(right, "tests:rk", "r")
    out = workflows.cancel(left[1], ids_l["c3"])
    cancel_one_by_one(right[1], ids_r["c3"])
    assert out.cancelled == len(ids_l) and out.finished == 0
    got, want = outcome(ids_l, (*left, "tests:lk")), outcome(ids_r, (*right, "tests:rk"))
    assert got == want
    assert {state for state, *_ in got["jobs"].values()} == {"cancelled"}
    assert got["jobs"]["c4"][1] == "cancelled: dependency <c3> is cancelled"
    # Exact counts, per queue: every job of the workflow is counted cancelled once, none active.
    for queue, n in ((left[0], 8), (left[1], 8), ("tests:lk", 2)):
        stats = fq.stats(queue)
        assert stats.counts["cancelled"] == n, queue
        assert sum(stats.counts[s] for s in ("waiting", "scheduled", "ready", "running", "dead")) == 0
    assert batches.get(extra_l["batch"]).cancelled == batches.get(extra_r["batch"]).cancelled == 1
    # The running head's lease ended; the key's slot went back.
    with pytest.raises(ReceiptCancelled):
        fq.ack(left[0], extra_l["running"].receipt)
    check_key_counts("tests:lk")
    assert fq.claim("tests:lk") == [] and fq.claim(left[0]) == [] and fq.claim(left[1]) == []


def test_a_dependent_that_joins_while_the_cancel_plans_is_cancelled_too(q, monkeypatch):
    ids = chain(10, (q, OTHER)).enqueue()
    store_type = type(storage.for_connection(connection))
    real = store_type.cancel_unfinished
    late: list[str] = []

    def join_then_cancel(self, conn, **kwargs):
        if not late:  # after the plan was read, before the jobs are locked: a new dependent commits
            late.append(fq.enqueue(q, "late", depends_on=[ids["step5"]]).id)
        return real(self, conn, **kwargs)

    monkeypatch.setattr(store_type, "cancel_unfinished", join_then_cancel)
    out = workflows.cancel(q, ids["step0"])
    assert out.cancelled == 10
    assert fq.get(q, late[0]).state == "cancelled"
    assert fq.get(q, late[0]).last_error == f"cancelled: dependency {ids['step5']} is cancelled"
    assert not Dependency.objects.filter(pending=True, upstream__uid__in=list(ids.values())).exists()


def test_steps_after_a_step_of_the_same_write_keep_their_priority_delay_and_key(q):
    fq.configure(OTHER, key_concurrency=1)
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    wf.step(OTHER, "k1", name="k1", after=[a], concurrency_key="K", priority=5)
    wf.step(OTHER, "k2", name="k2", after=[a], concurrency_key="K", priority=9)
    wf.step(OTHER, "late", name="late", after=[a], delay_ms=3_600_000)
    ids = wf.enqueue()
    assert states(ids) == {"a": "queued", "k1": "waiting", "k2": "waiting", "late": "waiting"}
    check_key_counts(OTHER)  # a waiting job takes no slot of its key
    fq.ack(q, claim_one(q).receipt)
    check_key_counts(OTHER)
    assert fq.get(OTHER, ids["late"]).state == "scheduled"
    got = fq.claim(OTHER, count=5)
    assert [j.id for j in got] == [ids["k2"]]  # the higher priority first, one at a time for its key
    fq.ack(OTHER, got[0].receipt)
    assert [j.id for j in fq.claim(OTHER, count=5)] == [ids["k1"]]
    check_key_counts(OTHER)
