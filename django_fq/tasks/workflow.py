"""Dependencies for Django Tasks: run a task after others, chain tasks, read what they returned.

The Tasks API has no dependency option of its own, so django-fq adds three
helpers around it (docs/tasks.md "Dependencies and chains"):

- :func:`enqueue_after` enqueues one task that waits for other tasks (their
  ``TaskResult`` or job ids) as ``depends_on`` does;
- :func:`chain` enqueues tasks that run one after the other, in one
  transaction (all of them or none);
- :func:`upstream`, called inside a running task, gives the results of the
  tasks it waited for (``job.upstream`` of the fq job).

Usage::

    from django_fq.tasks import call, chain, enqueue_after, upstream

    first, second = chain(call(fetch, url), summarize)     # summarize after fetch
    enqueue_after([first, second], notify, user_id)         # notify after both

    @task
    def summarize():
        page = upstream()["fetch"]                          # fetch's return value
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db import transaction

from .. import conf, routing
from ..exceptions import InvalidDependency
from . import _compat as tasks

# django_fq.services (and the models) are imported by the calls, never here: see backend.py.
#: The default policy of an edge (``django_fq.services.dependencies.DEFAULT_ON_FAILURE``).
DEFAULT_ON_FAILURE = "cancel"


class TaskCall(NamedTuple):
    """A task and the arguments of one call of it: a step of :func:`chain` (made by :func:`call`)."""

    task: Any
    args: tuple
    kwargs: dict


def call(task, *args, **kwargs) -> TaskCall:
    """``task`` called with ``args`` and ``kwargs``, for :func:`chain` (a bare task is called with none)."""
    return TaskCall(task, args, kwargs)


def _edges(after, on_failure: str) -> list[dict]:
    """``depends_on`` items for ``after``: ``TaskResult`` objects or job ids (one, or an iterable of them).

    An edge to a ``TaskResult`` is named after its task's function (``upstream()["fetch"]``)
    unless two dependencies share that name; an edge given as an id is keyed by the id.
    """
    items = [after] if isinstance(after, str) or hasattr(after, "task") else list(after)
    names = [getattr(getattr(r, "task", None), "name", None) for r in items]
    out = []
    for i, (item, name) in enumerate(zip(items, names, strict=True)):
        uid = item if isinstance(item, str) else getattr(item, "id", None)
        if not isinstance(uid, str):
            raise InvalidDependency(f"depends_on[{i}] is neither a TaskResult nor a job id", field=f"depends_on[{i}]")
        edge: dict = {"id": uid, "on_failure": on_failure}
        if name is not None and names.count(name) == 1:
            edge["name"] = name
        out.append(edge)
    return out


def enqueue_after(after, task, *args, on_failure: str = DEFAULT_ON_FAILURE, **kwargs):
    """Enqueue ``task(*args, **kwargs)`` to run once every task of ``after`` succeeded; return its ``TaskResult``.

    ``after``: a ``TaskResult``, a job id, or an iterable of them (at most
    1,000; tasks of any backend queue, or plain fq jobs). ``on_failure``
    (``cancel``, ``run`` or ``wait``; reserved here, so not passed to the
    task) says what a dependency that fails does (docs/reference/semantics.md
    §9 "Dependencies"). Until then the task's status is ``READY`` (its job
    ``waiting``). The task's backend must be an ``FqBackend`` without
    ``enqueue_on_commit``. Raises ``InvalidTask``, ``InvalidTaskBackend``,
    :class:`~django_fq.exceptions.InvalidDependency` (a dependency that is
    not a job of this database; nothing is written).
    """
    backend = _fq_backend(task)
    return backend.enqueue_with(task, args, kwargs, depends_on=_edges(after, on_failure))


def chain(*steps, on_failure: str = DEFAULT_ON_FAILURE) -> list:
    """Enqueue ``steps`` to run one after the other; return their ``TaskResult`` objects in order.

    Each step is a task (called without arguments) or :func:`call` of one
    (``call(task, *args, **kwargs)``), possibly ``task.using(...)``. All are
    written in one transaction (the caller's when one is open): all of them
    or none. Each step waits for the one before (``on_failure`` as in
    :func:`enqueue_after`) and reads its result as ``upstream()[name]``, the
    previous task's function name. Raises as :func:`enqueue_after`.
    """
    calls = [s if isinstance(s, TaskCall) else TaskCall(s, (), {}) for s in steps]
    if not calls:
        return []
    out: list = []
    # The database of the first step's queue (FQ_QUEUE_DATABASES): a step on another one is refused
    # by its enqueue (WrongDatabase), as the chain is one transaction.
    first = calls[0].task
    alias = (
        routing.alias_for(_fq_backend(first).fq_queues.get(first.queue_name)) if routing.enabled() else conf.database()
    )
    with transaction.atomic(using=alias):
        for c in calls:
            backend = _fq_backend(c.task)
            deps = _edges(out[-1], on_failure) if out else None
            out.append(backend.enqueue_with(c.task, c.args, c.kwargs, depends_on=deps))
    return out


def upstream():
    """In a running task: the results of the tasks (jobs) it waited for, as :class:`~django_fq.services.upstream.Upstream`.

    A mapping ``key → return value``: the key is the upstream task's
    function name (see :func:`enqueue_after`) or its job id. Raises
    ``RuntimeError`` outside a task run by the worker, and
    :class:`~django_fq.exceptions.ResultsTooLarge` past 32 MiB together.
    """
    from ..worker.context import current_job

    job = current_job()
    if job is None:
        raise RuntimeError("django_fq.tasks.upstream() is called from a task the worker runs")
    return job.upstream


def _fq_backend(task):
    from .backend import FqBackend

    backend = task.get_backend()
    if not isinstance(backend, FqBackend):
        raise tasks.InvalidTaskBackend(
            f"{task.module_path}: backend {task.backend!r} is not django_fq.tasks.FqBackend: no dependencies there"
        )
    return backend
