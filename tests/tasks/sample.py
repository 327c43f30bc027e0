"""``@task`` functions the Tasks backend tests enqueue (run in the test process or in worker children).

Tasks that must leave a trace write ``Done`` rows (job id unique: a second
run of one job fails loudly) — the worker may be another process.
"""

from __future__ import annotations

import asyncio
import inspect
import os

from django_fq import PermanentFailure
from django_fq.tasks import TASK_OPTIONS, task
from tests.testapp.models import Done

# Django 6.1 and the backport pass extra ``@task`` keywords to the backend's task class;
# Django 6.0's ``@task`` takes none, and the docs send its users to ``using()`` instead.
_TASK_TAKES_OPTIONS = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(task).parameters.values())


def fq_task(**keywords):
    """``@task(**keywords)``, with django-fq's options through ``using()`` where ``@task`` refuses them."""
    options = {k: keywords.pop(k) for k in list(keywords) if k in TASK_OPTIONS}

    def wrap(function):
        if _TASK_TAKES_OPTIONS or not options:
            return task(**keywords, **options)(function)
        return task(**keywords)(function).using(**options)

    return wrap


class Boom(Exception):
    """The exception ``explode`` raises (its class path is checked in the results)."""


@task
def add(a, b):
    return a + b


@task(queue_name="low")
def add_low(a, b):
    return a + b


@task(takes_context=True)
def record(context, label):
    """Write a ``Done`` row for this job; return what the task saw of itself."""
    Done.objects.create(job_id=context.task_result.id, pid=os.getpid())
    return {"label": label, "attempt": context.attempt, "pid": os.getpid()}


@fq_task(max_attempts=3)
def explode(message):
    raise Boom(message)


@fq_task(takes_context=True, max_attempts=5)
def flaky(context, succeed_on):
    """Fail until attempt ``succeed_on``, then return the attempt number."""
    if context.attempt < succeed_on:
        raise ValueError(f"not yet (attempt {context.attempt})")
    return {"attempt": context.attempt, "worker_ids": list(context.task_result.worker_ids)}


@task(takes_context=True)
def look_at_self(context):
    """Read this task's own result through the backend while it runs."""
    seen = context.task_result.task.get_backend().get_result(context.task_result.id)
    return {"status": str(seen.status), "attempt": context.attempt, "id": context.task_result.id}


@task
async def async_mul(a, b):
    await asyncio.sleep(0)
    return a * b


@task(takes_context=True)
async def where_am_i(context, label):
    """Say which thread awaits this task and whether an event loop runs there; write a ``Done`` row (async ORM)."""
    import threading

    from django_fq.worker import current_job

    await Done.objects.acreate(job_id=context.task_result.id, pid=os.getpid())
    job = current_job()
    return {
        "label": label,
        "thread": threading.current_thread().name,
        "loop": asyncio.get_running_loop() is not None,
        "job": job.id if job is not None else None,
        "attempt": context.attempt,
    }


@task
def give_up():
    raise PermanentFailure("no point retrying")


@task
def unstorable():
    return object()


@fq_task(max_attempts=3, timeout_ms=5_000, unique_key="uk-{0}", idempotency_retention_ms=60_000)
def optioned(n):
    return n


@task
def configured(n):
    """Options from ``TASKS["default"]["OPTIONS"]["tasks"]`` (max_attempts 2, unique key ``cfg-{n}``)."""
    return n


@fq_task(max_attempts=7)
def overrides_configured(n):
    return n


@fq_task(unique_key=lambda user_id, **kwargs: f"user-{user_id}")
def per_user(user_id, note=""):
    return user_id


def not_a_task():
    return None


def _renamed_function(n):
    return n * 2


#: A ``Task`` kept under another name than its function: its path is ``tests.tasks.sample._renamed_function``.
renamed = task(_renamed_function)


@task
def fetch_page(n):
    """The first step of a chain (tests/tasks/test_workflow.py): its return value flows forward."""
    return {"page": n}


@task
def summarize(extra=0):
    """After ``fetch_page``: reads its result through ``django_fq.tasks.upstream()``."""
    from django_fq.tasks import upstream

    return {"summary": upstream()["fetch_page"]["page"] + extra}


@task
def gather():
    """After several tasks: every upstream key and result, sorted by key."""
    from django_fq.tasks import upstream

    return sorted([key, value] for key, value in upstream().items())
