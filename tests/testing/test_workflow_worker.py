"""A workflow drained by a real worker (threads, the batched completer): no step runs before its dependencies succeeded."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.models import Job
from django_fq.workflows import Workflow

from .handlers import OK

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_fan_out_fan_in_workflow_runs_each_step_after_its_dependencies(fq_worker):
    wf = Workflow()
    root = wf.step(OK, {"n": 0}, name="root")
    middle = [wf.step(OK, {"n": i}, name=f"m{i}", after=[root]) for i in range(1, 41)]
    tail = wf.step(OK, {"n": 41}, name="join", after=middle)
    wf.step(OK, {"n": 42}, name="last", after=[tail])
    ids = wf.enqueue()
    running = fq_worker(OK, concurrency=8)
    assert running.wait(OK, ids["last"]).state == "succeeded"
    rows = {j.uid: j for j in Job.objects.filter(uid__in=ids.values())}
    assert {j.state for j in rows.values()} == {"succeeded"}
    assert all(j.attempts == 1 for j in rows.values())

    def after(step, before):
        return rows[ids[step]].claimed_at >= rows[ids[before]].finished_at

    assert all(after(f"m{i}", "root") for i in range(1, 41))
    assert all(after("join", f"m{i}") for i in range(1, 41))
    assert after("last", "join")
    assert fq.stats(OK).counts["waiting"] == 0


async def _join_async(job):
    """An ``async def`` join step: its dependencies' results, read with ``await job.aupstream()``."""
    upstream = await job.aupstream()
    return {key: value["n"] for key, value in upstream.items()}


def test_a_real_worker_hands_each_result_to_the_join_step_sync_and_async(fq_worker):
    from .handlers import record

    join_q = "tt.join-async"
    wf = Workflow()
    top = wf.step(OK, {"n": 1}, name="top")
    left = wf.step(OK, {"n": 2}, name="left", after=[top])
    right = wf.step(OK, {"n": 3}, name="right", after=[top])
    wf.step(join_q, None, name="join", after=[left, right])
    ids = wf.enqueue()
    running = fq_worker(OK, join_q, concurrency=4, handlers={OK: record, join_q: _join_async})
    done = running.wait(join_q, ids["join"])
    assert done.state == "succeeded", done.last_error
    assert done.result == {"left": 2, "right": 3}
