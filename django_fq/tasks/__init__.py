"""django-fq as a backend for Django's Tasks framework.

``django.tasks`` on Django 6.x; on Django 5.2 the ``django_tasks`` backport
(``pip install "django-fq[tasks]"``). Configure::

    TASKS = {"default": {"BACKEND": "django_fq.tasks.FqBackend", "QUEUES": ["default"]}}

then ``@task`` functions are enqueued as fq jobs and ``manage.py fq_worker``
runs them. See ``docs/tasks.md``.

Re-exported here: the backend and its task class, the framework's ``task``
decorator and result types (whichever framework is installed), and the
exception classes that name failures without a Python exception.
"""

from ._compat import (
    FRAMEWORK,
    InvalidTask,
    InvalidTaskBackend,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
)
from .backend import BACKEND_OPTIONS, TASK_OPTIONS, FqBackend, FqTask
from .errors import LeaseExpired, TaskAttemptError, TaskCancelled, TaskFailed, TaskTimedOut
from .runner import run_task
from .workflow import TaskCall, call, chain, enqueue_after, upstream

__all__ = [
    "BACKEND_OPTIONS",
    "FRAMEWORK",
    "TASK_OPTIONS",
    "FqBackend",
    "FqTask",
    "InvalidTask",
    "InvalidTaskBackend",
    "LeaseExpired",
    "TaskAttemptError",
    "TaskCall",
    "TaskCancelled",
    "TaskContext",
    "TaskError",
    "TaskFailed",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "TaskTimedOut",
    "call",
    "chain",
    "enqueue_after",
    "run_task",
    "task",
    "task_backends",
    "upstream",
]
