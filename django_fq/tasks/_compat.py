"""The one place that knows which Tasks framework is installed.

Django 6.x ships ``django.tasks``; on Django 5.2 the same API comes from the
``django_tasks`` backport (``pip install "django-fq[tasks]"``). Everything
else in :mod:`django_fq.tasks` imports the framework's names from here, so the
rest of the code reads the same on both.
"""

from __future__ import annotations

try:  # Django 6.x
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 5.2 with the backport
    # mypy checks against Django 6.x, so it sees these as redefinitions of the names above.
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends  # type: ignore[assignment,no-redef]
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "django_fq.tasks needs Django's Tasks framework: Django 6.x, or on Django 5.2 the "
            'backport package: pip install "django-fq[tasks]"'
        ) from exc
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[assignment]
    from django_tasks.base import (  # type: ignore[assignment]
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend  # type: ignore[assignment]
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[assignment]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[assignment]
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK = "django_tasks"

__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
