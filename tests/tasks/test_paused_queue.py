"""A Tasks backend queue while paused (docs/reference/semantics.md §9 "Pause"): enqueue works, no worker runs it."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.tasks import TaskResultStatus
from tests.tasks import sample

from .test_running import Q, drain

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_enqueued_into_a_paused_queue_waits_ready_and_runs_after_the_resume(backend):
    fq.configure(Q)
    fq.pause(Q)
    result = sample.add.enqueue(2, 3)
    assert backend.get_result(result.id).status == TaskResultStatus.READY

    stats = drain(Q)
    assert (stats.claimed, stats.ok) == (0, 0)
    assert backend.get_result(result.id).status == TaskResultStatus.READY

    fq.resume(Q)
    assert drain(Q).ok == 1
    done = backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
