"""The workflow and batch storms' checkers (fast tier): quiet on a clean run, and they catch what they claim.

A small workflow of the storm's shape and a small batch are run in-process
(claim, start row, run row, ack, in the order the engine allows), checked
clean, then one fact at a time is falsified as a buggy engine would have
left it, and the checker must say so.
"""

from __future__ import annotations

import random

import pytest
from django.db import connection

from django_fq import batches
from django_fq import services as fq

from . import flows, invariants
from .fq_handlers import upstream_counts

pytestmark = pytest.mark.django_db(transaction=True)


def _sql(sql, params=()):
    with connection.cursor() as cur:
        cur.execute(sql, list(params))


def _run_all(queues, *, fail=()):
    """Claim, start, run and settle every job of ``queues`` until none is left (``fail``: nack these permanently)."""
    while True:
        got = [(q, j) for q in queues for j in fq.claim(q, count=100, visibility_ms=60_000)]
        if not got:
            return
        for q, job in got:
            started = invariants.now_ms()
            seen, bad = upstream_counts(fq.results(q, job.id))
            invariants.record_start(job.id, job.claimed_at, job.attempts, started, upstream_seen=seen, upstream_bad=bad, pid=1)
            if job.id in fail:
                fq.nack(q, job.receipt, error="no", permanent=True)
                continue
            invariants.record_run(job.id, job.claimed_at, job.attempts, started, lambda _end: False, tag="test", pid=1)
            fq.ack(q, job.receipt, result={"ok": True})


@pytest.fixture
def audit():
    flows._fresh([flows.FLOW, flows.FLOW_CB, flows.BATCH, flows.BATCH_CB])
    invariants.install()
    try:
        yield
    finally:
        invariants.uninstall()


@pytest.fixture
def workflow(audit):
    wf, deps, cb = flows.build_workflow(random.Random(1), head=2, fan=3, chains=2, chain_len=2)
    ids = wf.enqueue()
    assert len(ids) == 2 + 3 + 3 + 1 + 4 + 1
    _run_all([flows.FLOW, flows.FLOW_CB])
    return ids, deps, cb


def test_a_clean_workflow_run_passes(workflow):
    assert flows.check_workflow(*workflow) == []
    assert invariants.check([flows.FLOW, flows.FLOW_CB], visibility_ms=60_000).ok


def test_a_run_started_before_its_dependency_succeeded_is_caught(workflow):
    ids, deps, cb = workflow
    finished = fq.get(flows.FLOW, ids["join"]).finished_at
    job = fq.get(flows.FLOW, ids["chain-0-0"])
    _sql("INSERT INTO fqchaos_start VALUES (%s, %s, 2, 1, %s, 1, 0)", [job.id, job.claimed_at, finished - 1])
    problems = flows.check_workflow(ids, deps, cb)
    assert any("step chain-0-0: run started at" in p for p in problems), problems


def test_a_lease_granted_before_the_dependencies_succeeded_is_caught(workflow):
    ids, deps, cb = workflow
    before = fq.get(flows.FLOW, ids["mix-1"]).finished_at - 10
    _sql("UPDATE fqchaos_lease SET claimed_at = %s WHERE job_seq = (SELECT seq FROM django_fq_job WHERE uid = %s)",
         [before, ids["join"]])
    problems = flows.check_workflow(ids, deps, cb)
    assert any("step join: lease granted at" in p for p in problems), problems


def test_a_second_callback_a_bad_upstream_and_a_step_left_waiting_are_caught(workflow):
    ids, deps, cb = workflow
    fq.enqueue(flows.FLOW_CB, {"again": True})
    _sql("UPDATE fqchaos_start SET upstream_bad = 1 WHERE job_uid = %s", [ids["fan-2"]])
    late = fq.enqueue(flows.FLOW, {}, depends_on=[fq.enqueue(flows.FLOW, {}).id]).id
    problems = flows.check_workflow(ids, deps, cb)
    assert any("callback's queue got 2 jobs" in p for p in problems), problems
    assert any("step fan-2: job.upstream had 1 entries (1 not succeeded)" in p for p in problems), problems
    assert any("left unfinished" in p and "'waiting': 1" in p for p in problems), problems
    assert fq.get(flows.FLOW, late).state == "waiting"


@pytest.fixture
def batch(audit):
    b = batches.create(flows.BATCH, callback={"queue": flows.BATCH_CB, "payload": {}})
    added = [r.id for r in batches.add(b.id, [{"payload": {"n": n}} for n in range(4)])]
    fq.cancel(flows.BATCH, added[3])
    _run_all([flows.BATCH], fail={added[2]})
    batches.seal(b.id)
    _run_all([flows.BATCH_CB])
    return b.id, added


def test_a_clean_batch_run_passes_and_the_callback_carries_the_counts(batch):
    batch_id, added = batch
    problems = flows.check_batch(batch_id, added)
    assert problems == [], problems
    info = batches.get(batch_id)
    assert (info.succeeded, info.dead, info.cancelled) == (2, 1, 1)


def test_wrong_batch_counts_and_a_second_callback_are_caught(batch):
    batch_id, added = batch
    _sql("UPDATE django_fq_batch SET succeeded = succeeded + 1 WHERE uid = %s", [batch_id])
    problems = flows.check_batch(batch_id, added)
    assert any("the batch row counts" in p for p in problems), problems
    fq.enqueue(flows.BATCH_CB, {"again": True})
    problems = flows.check_batch(batch_id, added)
    assert any("the callback's queue got 2 jobs" in p for p in problems), problems


def test_a_member_missing_from_the_batch_is_caught(batch):
    batch_id, added = batch
    problems = flows.check_batch(batch_id, [*added, fq.enqueue(flows.BATCH, {}).id])
    assert any("members: 4 in the database, 5 added" in p for p in problems), problems
