"""Fixtures of the Tasks backend tests.

``TASKS`` is installed here, at import, before ``tests.tasks.sample`` is
imported: ``@task`` builds its ``Task`` with the backend's task class when the
module loads, so the backend must be configured by then. Both frameworks
reset their backend cache on ``setting_changed``; the signal is sent so a
cache filled earlier in the session is dropped.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test.signals import setting_changed

from tests.tasks.config import TEST_TASKS

settings.TASKS = TEST_TASKS
setting_changed.send(sender=None, setting="TASKS", value=TEST_TASKS, enter=True)

from django_fq.tasks import task_backends  # noqa: E402  (after TASKS is set)


@pytest.fixture
def backend():
    """The ``default`` FqBackend (queues ``tk.default``, ``tk.low``)."""
    return task_backends["default"]


@pytest.fixture
def signals():
    """Records ``task_enqueued`` / ``task_started`` / ``task_finished`` as ``(name, id, status, attempt)``."""
    from django_fq.tasks import _compat

    seen: list[tuple] = []

    def recorder(name):
        def receive(sender, task_result, **kwargs):
            seen.append((name, task_result.id, str(task_result.status), task_result.attempts, sender))

        return receive

    receivers = {name: recorder(name) for name in ("enqueued", "started", "finished")}
    _compat.task_enqueued.connect(receivers["enqueued"], weak=False)
    _compat.task_started.connect(receivers["started"], weak=False)
    _compat.task_finished.connect(receivers["finished"], weak=False)
    yield seen
    _compat.task_enqueued.disconnect(receivers["enqueued"])
    _compat.task_started.disconnect(receivers["started"])
    _compat.task_finished.disconnect(receivers["finished"])
