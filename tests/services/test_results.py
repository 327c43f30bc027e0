"""Results flow forward (docs/how-to/workflows.md "Results flow forward"): job.upstream, results(), the size bound."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

import django_fq
from django_fq import services as fq
from django_fq.exceptions import InvalidDependency, JobNotFound, PermanentFailure, ResultsTooLarge
from django_fq.services import upstream as results_mod
from django_fq.testing import drain
from django_fq.worker.context import JobContext
from django_fq.workflows import Workflow

pytestmark = pytest.mark.django_db

OTHER = "tests:svc-results-other"


def test_a_chain_passes_each_result_to_the_next_step(q):
    seen = []

    def add(job):
        before = dict(job.upstream)
        seen.append((job.payload["n"], before))
        return {"total": sum(v["total"] for v in before.values()) + job.payload["n"]}

    wf = Workflow()
    wf.chain(*(wf.step(q, {"n": n}, name=f"s{n}") for n in (1, 2, 3)))
    ids = wf.enqueue()
    drain(q, handlers={q: add})
    assert seen == [(1, {}), (2, {"s1": {"total": 1}}), (3, {"s2": {"total": 3}})]
    assert fq.get(q, ids["s3"]).result == {"total": 6}


def test_a_diamond_reads_both_upstream_results_by_step_name(q):
    got = {}

    def run(job):
        if job.payload == "join":
            got["upstream"] = dict(job.upstream)
            got["entries"] = [(e.name, e.queue, e.state) for e in job.upstream.entries]
            return "joined"
        return {"from": job.payload}

    wf = Workflow()
    top = wf.step(q, "top", name="top")
    left = wf.step(q, "left", name="left", after=[top])
    right = wf.step(OTHER, "right", name="right", after=[top])
    wf.step(q, "join", name="join", after=[left, right])
    ids = wf.enqueue()
    drain(q, OTHER, handlers={q: run, OTHER: run})
    assert got["upstream"] == {"left": {"from": "left"}, "right": {"from": "right"}}
    assert got["entries"] == [("left", q, "succeeded"), ("right", OTHER, "succeeded")]
    # The same from outside a handler, by name or by job id.
    up = django_fq.results(q, ids["join"])
    assert up["left"] == {"from": "left"} and up[ids["right"]] == {"from": "right"}
    assert up.entry("right").id == ids["right"] and up.size == len('{"from":"right"}') + len('{"from":"left"}')


def test_a_dead_upstream_under_run_shows_dead_with_no_result(q):
    got = {}

    def run(job):
        if job.payload == "bad":
            raise PermanentFailure("no")
        if job.payload == "report":
            got["up"] = job.upstream
        return job.payload

    wf = Workflow()
    bad, good = wf.step(q, "bad", name="bad"), wf.step(q, "good", name="good")
    wf.callback(wf.group(bad, good), q, "report", name="report")
    wf.enqueue()
    drain(q, handlers={q: run})
    up = got["up"]
    assert dict(up) == {"bad": None, "good": "good"}
    assert (up.entry("bad").state, up.entry("bad").on_failure, up.entry("bad").succeeded) == ("dead", "run", False)
    assert up.entry("good").state == "succeeded"


def test_a_cancelled_upstream_under_run_shows_cancelled(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[{"id": a, "on_failure": "run", "name": "first"}]).id
    fq.cancel(q, a)
    up = fq.results(q, b)
    assert dict(up) == {"first": None}
    assert up.entry("first").state == "cancelled" and up.entry(a).size == 0


def test_unnamed_edges_are_keyed_by_job_id_and_unfinished_ones_have_no_result(q):
    a = fq.enqueue(q, "a").id
    c = fq.enqueue(OTHER, "c").id
    b = fq.enqueue(q, "b", depends_on=[a, c]).id
    job = fq.claim(q)[0]
    assert job.id == a
    fq.ack(q, job.receipt, result=[1, 2])
    up = fq.results(q, b)
    assert list(up) == [a, c] and up[a] == [1, 2] and up[c] is None
    assert up.entry(c).state == "ready"
    assert fq.results(q, a) == {}


def test_results_of_a_job_of_another_queue_is_not_found(q):
    a = fq.enqueue(q, "a").id
    fq.configure(OTHER)
    with pytest.raises(JobNotFound):
        fq.results(OTHER, a)
    with pytest.raises(JobNotFound):
        fq.results(q, "not-an-id")


def test_an_edge_name_is_validated(q):
    a, b = fq.enqueue(q, "a").id, fq.enqueue(q, "b").id
    with pytest.raises(InvalidDependency) as exc:
        fq.enqueue(q, "c", depends_on=[{"id": a, "name": "x"}, {"id": b, "name": "x"}])
    assert exc.value.field == "depends_on[1].name"
    with pytest.raises(InvalidDependency) as exc:
        fq.enqueue(q, "c", depends_on=[{"id": a, "name": ""}])
    assert exc.value.field == "depends_on[0].name"
    with pytest.raises(InvalidDependency) as exc:
        fq.enqueue(q, "c", depends_on=[{"id": a, "name": 5}])
    assert exc.value.field == "depends_on[0].name"
    assert fq.stats(q).counts["waiting"] == 0


def test_the_step_name_is_on_the_dependency_edge(q):
    wf = Workflow()
    first = wf.step(q, 1, name="first")
    outside = fq.enqueue(q, "outside").id
    wf.step(q, 2, name="second", after=[first, outside])
    ids = wf.enqueue()
    edges = fq.get(q, ids["second"]).depends_on  # oldest dependency first: outside was enqueued before the workflow
    assert [(e["id"], e.get("name")) for e in edges] == [(outside, None), (ids["first"], "first")]
    assert list(fq.results(q, ids["second"])) == ["first", outside]  # edge order: as the builder wrote them


def test_results_above_the_claim_limit_are_refused_naming_the_size(q, monkeypatch):
    monkeypatch.setattr(results_mod, "MAX_RESULTS_BYTES", 100)
    ups = []
    for i in range(3):
        ups.append(fq.enqueue(q, i).id)
        job = fq.claim(q)[0]
        fq.ack(q, job.receipt, result="x" * 40)  # 42 bytes of JSON each
    b = fq.enqueue(OTHER, "b", depends_on=ups).id
    with pytest.raises(ResultsTooLarge) as exc:
        fq.results(OTHER, b)
    err = exc.value.as_dict()
    assert (err["code"], err["size"], err["limit"]) == ("results_too_large", 126, 100)
    assert "126 bytes" in err["message"]
    # A handler reading job.upstream gets the same error: its attempt fails, the worker goes on.
    report = drain(OTHER, handlers={OTHER: lambda job: dict(job.upstream)})
    assert len(report.jobs) == 1
    failed = fq.get(OTHER, b)
    assert failed.state == "scheduled" and "126 bytes together" in failed.last_error
    # Within the limit, the subset the REST API may see is read.
    assert len(fq.results(OTHER, b, queues={OTHER})) == 0


def test_results_are_counted_in_bytes_of_utf8(q, monkeypatch):
    monkeypatch.setattr(results_mod, "MAX_RESULTS_BYTES", 20)
    a = fq.enqueue(q, "a").id
    fq.ack(q, fq.claim(q)[0].receipt, result="ééééééééé")  # 11 characters of JSON, 20 bytes
    b = fq.enqueue(q, "b", depends_on=[a]).id
    assert fq.results(q, b).size == 20
    monkeypatch.setattr(results_mod, "MAX_RESULTS_BYTES", 19)
    with pytest.raises(ResultsTooLarge):
        fq.results(q, b)


@pytest.mark.django_db(transaction=True)
def test_results_past_32_mib_are_refused_without_reading_them(q):
    """33 results of 1 MiB each (the default FQ_MAX_PAYLOAD_BYTES): 33 MiB, past the 32 MiB claim limit."""
    big = "x" * (1024 * 1024 - 2)  # 1 MiB of JSON with its quotes
    ups = []
    for _ in range(33):
        ups.append(fq.enqueue(q, None).id)
        fq.ack(q, fq.claim(q)[0].receipt, result=big)
    b = fq.enqueue(q, "b", depends_on=ups).id
    with pytest.raises(ResultsTooLarge) as exc:
        fq.results(q, b)
    assert exc.value.extra == {"size": 33 * 1024 * 1024, "limit": 32 * 1024 * 1024}


@pytest.mark.django_db(transaction=True)
def test_aupstream_reads_the_results_from_an_async_handler(q):
    a = fq.enqueue(q, "a").id
    fq.ack(q, fq.claim(q)[0].receipt, result={"ok": 1})
    b = fq.enqueue(q, "b", depends_on=[{"id": a, "name": "a"}]).id
    job = JobContext(id=b, queue=q, payload="b", attempts=1, max_attempts=1, deadline=0, enqueued_at=0)

    async def handler():
        first = await job.aupstream()
        again = await job.aupstream()
        await sync_to_async(connections.close_all)()  # the executor thread's connection: not left to the teardown
        return first, again

    first, again = asyncio.run(handler())
    assert dict(first) == {"a": {"ok": 1}} and again is first and job.upstream is first


def test_export_import_keeps_the_edge_names_and_the_results_they_key(q):
    import io

    from django_fq import backup
    from django_fq.models import Dependency, Job, Queue

    a = fq.enqueue(q, "a").id
    fq.ack(q, fq.claim(q)[0].receipt, result={"rows": 5})
    b = fq.enqueue(q, "b", depends_on=[{"id": a, "name": "import"}]).id
    out = io.StringIO()
    backup.export_jsonl(out)
    Dependency.objects.all().delete()
    Job.objects.all().delete()
    Queue.objects.all().delete()
    backup.import_jsonl(out.getvalue().splitlines())
    assert dict(fq.results(q, b)) == {"import": {"rows": 5}}
    assert fq.get(q, b).depends_on[0]["name"] == "import"
