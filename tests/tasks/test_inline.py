"""Django Tasks under django-fq's inline mode: a task enqueued through the backend runs at commit, like any job."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_fq import services as fq
from django_fq.tasks import TaskResultStatus, task_backends
from django_fq.testing import JobFailed, inline
from tests.tasks import sample
from tests.tasks.sample import Boom
from tests.testapp.models import Done

pytestmark = pytest.mark.django_db(transaction=True)

Q = "tk.default"


def test_a_task_runs_when_its_transaction_commits_and_its_result_is_stored(backend):
    with inline() as mode:
        with transaction.atomic():
            result = sample.record.enqueue("inline")
            assert backend.get_result(result.id).status == TaskResultStatus.READY
        done = backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value["label"] == "inline" and done.return_value["attempt"] == 1
    assert Done.objects.filter(job_id=result.id).exists()
    assert [(j.id, j.outcome) for j in mode.jobs] == [(result.id, "succeeded")]


def test_a_failing_task_raises_at_commit_and_is_recorded_as_a_failed_attempt(backend):
    fq.configure(Q, backoff_ms=60_000)
    with inline(), pytest.raises(JobFailed) as caught, transaction.atomic():
        result = sample.explode.enqueue("kaput")  # raised at the commit, once the attempt is recorded
    assert isinstance(caught.value.__cause__, Boom)
    failed = backend.get_result(result.id)
    assert failed.status == TaskResultStatus.READY  # 3 attempts: the first failed, a retry waits
    assert [e.exception_class_path for e in failed.errors] == ["tests.tasks.sample.Boom"]


def test_an_on_commit_backend_writes_then_runs_the_task_at_commit(backend):
    with inline() as mode:
        with transaction.atomic():
            result = sample.record.using(backend="oncommit").enqueue("committed")
        # At commit the provisional id became the job id, and the job ran.
        assert [(j.id, j.outcome) for j in mode.jobs] == [(result.id, "succeeded")]
    assert task_backends["oncommit"].get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert Done.objects.count() == 1
