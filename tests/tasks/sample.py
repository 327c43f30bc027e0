"""``@task`` functions the Tasks backend tests enqueue (run in the test process or in worker children).

Tasks that must leave a trace write ``Done`` rows (job id unique: a second
run of one job fails loudly) — the worker may be another process.
"""

from __future__ import annotations

import asyncio
import os

from django_fq import PermanentFailure
from django_fq.tasks import task
from tests.testapp.models import Done


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


@task(max_attempts=3)
def explode(message):
    raise Boom(message)


@task(takes_context=True, max_attempts=5)
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


@task
def give_up():
    raise PermanentFailure("no point retrying")


@task
def unstorable():
    return object()


@task(max_attempts=3, timeout_ms=5_000, unique_key="uk-{0}", idempotency_retention_ms=60_000)
def optioned(n):
    return n


@task
def configured(n):
    """Options from ``TASKS["default"]["OPTIONS"]["tasks"]`` (max_attempts 2, unique key ``cfg-{n}``)."""
    return n


@task(max_attempts=7)
def overrides_configured(n):
    return n


@task(unique_key=lambda user_id, **kwargs: f"user-{user_id}")
def per_user(user_id, note=""):
    return user_id


def not_a_task():
    return None
