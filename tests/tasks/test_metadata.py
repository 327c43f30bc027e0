"""Django Tasks enqueues go through the enqueue middleware: the way a task's job gets metadata."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import EnqueueRefused
from tests.tasks import sample

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_enqueue_runs_the_enqueue_middleware(backend, settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.tag_task", "tests.middleware.mw.add_tenant"]
    result = sample.add.enqueue(1, b=2)
    queue = backend.fq_queues["default"]
    info = fq.get(queue, result.id)
    assert info.metadata == {"tags": ["task:add", "stamped"], "tenant": "acme"}
    assert [j.id for j in fq.jobs(queue, tag="task:add").jobs] == [result.id]


def test_an_enqueue_middleware_can_refuse_a_task(backend, settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.refuse_all_tasks"]
    with pytest.raises(EnqueueRefused):
        sample.add.enqueue(1, b=2)
    assert fq.queues() == []
