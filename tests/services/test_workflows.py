"""The workflow builder (django_fq.workflows): one transaction, all or nothing; show and cancel a workflow."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_fq import services as fq
from django_fq import workflows
from django_fq.exceptions import InvalidDependency, PayloadTooLarge
from django_fq.models import Job
from django_fq.workflows import Workflow, WorkflowError

from .helpers import claim_one

pytestmark = pytest.mark.django_db

REPORTS = "tests:svc-reports"


def drain(queue: str) -> list[str]:
    """Run every job of ``queue`` as it becomes ready, one at a time; return the ids in run order."""
    ran = []
    while jobs := fq.claim(queue):
        fq.ack(queue, jobs[0].receipt)
        ran.append(jobs[0].id)
    return ran


def test_split_chunks_then_a_report(q):
    wf = Workflow()
    split = wf.step(q, {"file": "a.csv"}, name="split")
    chunks = wf.group(*(wf.step(q, {"chunk": i}, name=f"chunk-{i}", after=[split]) for i in range(4)))
    wf.callback(chunks, REPORTS, {"file": "a.csv"}, name="report")
    ids = wf.enqueue()
    assert list(ids) == ["split", "chunk-0", "chunk-1", "chunk-2", "chunk-3", "report"]
    assert fq.get(REPORTS, ids["report"]).state == "waiting"
    ran = drain(q)
    assert ran[0] == ids["split"] and set(ran[1:]) == {ids[f"chunk-{i}"] for i in range(4)}
    assert fq.get(REPORTS, ids["report"]).state == "ready"
    info = workflows.show(q, ids["chunk-2"])
    assert info.steps[0]["id"] == ids["split"] and info.steps[-1]["id"] == ids["report"]
    assert len(info.steps) == 6 and not info.truncated


def test_callback_runs_once_the_group_finished_whatever_the_outcomes(q):
    wf = Workflow()
    a, b = wf.step(q, "a", name="a"), wf.step(q, "b", name="b")
    wf.callback(wf.group(a, b), REPORTS, "done", name="cb")
    ids = wf.enqueue()
    job = claim_one(q)
    fq.nack(q, job.receipt, permanent=True)
    assert fq.get(REPORTS, ids["cb"]).state == "waiting"
    drain(q)
    assert fq.get(REPORTS, ids["cb"]).state == "ready"


def test_chain(q):
    wf = Workflow()
    steps = [wf.step(q, i, name=str(i)) for i in range(3)]
    wf.chain(*steps)
    ids = wf.enqueue()
    assert drain(q) == [ids["0"], ids["1"], ids["2"]]


def test_inside_the_callers_transaction_a_rollback_leaves_nothing(q):
    wf = Workflow()
    wf.step(q, "x", name="x")
    with pytest.raises(RuntimeError), transaction.atomic():
        wf.enqueue()
        raise RuntimeError
    assert not Job.objects.exists()


def test_errors_name_the_step_and_write_nothing(q):
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    b = wf.step(q, "b", name="b", after=[a])
    wf.add_edges(a, [b])
    with pytest.raises(WorkflowError) as err:
        wf.enqueue()
    assert "cycle" in err.value.message and err.value.field in ("steps[a].after", "steps[b].after")

    with pytest.raises(WorkflowError, match="used twice"):
        wf.step(q, "again", name="a")
    other = Workflow().step(q, "elsewhere", name="z")
    with pytest.raises(WorkflowError) as err:
        Workflow().step(q, "x", name="x", after=[other])
    assert err.value.field == "steps[z]"

    wf = Workflow()
    first = wf.step(q, "ok", name="ok")
    wf.step(q, "x", name="missing-dep", after=[first, "e" * 32])
    with pytest.raises(InvalidDependency) as err:
        wf.enqueue()
    assert err.value.field == "steps[missing-dep].depends_on[1]" and "missing-dep" in err.value.message
    assert not Job.objects.exists()


def test_a_bad_payload_names_the_step(q, settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 100
    wf = Workflow()
    wf.step(q, "ok", name="ok")
    wf.step(q, "x" * 200, name="big")
    with pytest.raises(PayloadTooLarge) as err:
        wf.enqueue()
    assert err.value.field == "steps[big].payload"
    assert not Job.objects.exists()


def test_step_limit(q, monkeypatch):
    monkeypatch.setattr(workflows, "MAX_STEPS", 3)
    wf = Workflow()
    for i in range(4):
        wf.step(q, i, name=f"s{i}")
    with pytest.raises(WorkflowError) as err:
        wf.enqueue()
    assert err.value.field == "steps[s3]"  # the first step past the limit


def test_cancel_a_workflow_cancels_every_unfinished_step(q):
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    b = wf.step(q, "b", name="b", after=[a])
    c = wf.step(q, "c", name="c", after=[b], on_failure="run")
    wf.step(q, "d", name="d", after=[c])
    ids = wf.enqueue()
    running = claim_one(q)
    assert running.id == ids["a"]
    out = workflows.cancel(q, ids["d"])
    assert out.cancelled == 4
    assert {fq.get(q, i).state for i in ids.values()} == {"cancelled"}
    assert fq.claim(q) == []
