"""Dependencies for Django Tasks (docs/tasks.md "Dependencies and chains"): chain, enqueue_after, upstream()."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_fq import services as fq
from django_fq.exceptions import InvalidDependency
from django_fq.models import Job
from django_fq.tasks import InvalidTaskBackend, TaskResultStatus, call, chain, enqueue_after, upstream
from django_fq.testing import drain
from tests.tasks import sample

pytestmark = pytest.mark.django_db

Q, LOW = "tk.default", "tk.low"


def test_a_chain_passes_the_first_tasks_result_to_the_next():
    first, second = chain(call(sample.fetch_page, 7), call(sample.summarize.using(queue_name="low"), extra=1))
    assert fq.get(LOW, second.id).state == "waiting"
    second.refresh()
    assert second.status == TaskResultStatus.READY
    drain(Q, LOW)
    first.refresh()
    second.refresh()
    assert first.return_value == {"page": 7}
    assert second.status == TaskResultStatus.SUCCESSFUL and second.return_value == {"summary": 8}
    edge = fq.get(LOW, second.id).depends_on[0]
    assert (edge["id"], edge["name"]) == (first.id, "fetch_page")


def test_enqueue_after_several_tasks_and_a_plain_job_id():
    a = sample.add.enqueue(1, 2)
    b = sample.fetch_page.enqueue(3)
    plain = fq.enqueue(Q, {"not": "a task"}).id
    job = fq.claim(Q)[0]  # the oldest: the task a
    assert job.id == a.id
    fq.ack(Q, job.receipt, result=3)
    fq.ack(Q, fq.claim(Q)[0].receipt, result={"page": 3})
    fq.ack(Q, fq.claim(Q)[0].receipt, result="plain")
    later = enqueue_after([a, b, plain], sample.gather)
    drain(Q)
    later.refresh()
    assert later.return_value == sorted([["add", 3], ["fetch_page", {"page": 3}], [plain, "plain"]])


def test_a_chain_is_all_or_nothing():
    with pytest.raises(InvalidDependency), transaction.atomic():
        sample.add.enqueue(0, 0)
        enqueue_after("f" * 32, sample.gather)
    assert not Job.objects.exists()
    with pytest.raises(InvalidDependency) as exc:
        enqueue_after(sample.add.enqueue(1, 1), sample.gather, on_failure="later")
    assert exc.value.field == "depends_on[0].on_failure"


def test_a_failed_step_cancels_the_rest_of_the_chain_unless_told_to_run():
    boom, after = chain(call(sample.explode, "no"), sample.gather)
    drain(Q, run_scheduled=True)
    boom.refresh()
    after.refresh()
    assert boom.status == TaskResultStatus.FAILED and fq.get(Q, boom.id).state == "dead"
    assert after.status == TaskResultStatus.FAILED and fq.get(Q, after.id).state == "cancelled"
    bad, anyway = chain(call(sample.explode, "no"), sample.gather, on_failure="run")
    drain(Q, run_scheduled=True)
    anyway.refresh()
    assert fq.get(Q, bad.id).state == "dead"
    assert anyway.status == TaskResultStatus.SUCCESSFUL and anyway.return_value == [["explode", None]]


def test_on_commit_backends_and_outside_a_task():
    with pytest.raises(InvalidTaskBackend):
        enqueue_after(sample.add.enqueue(1, 1), sample.add.using(backend="oncommit"), 2, 2)
    with pytest.raises(RuntimeError):
        upstream()
