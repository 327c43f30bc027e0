"""The fq handler that runs Django Tasks jobs, and its registration for the backends' queues.

``manage.py fq_worker`` needs no change to run tasks: ``django_fq.fq_handlers``
(found by the worker's handler autodiscovery) registers :func:`run_task` as
the handler of every queue of every :class:`~django_fq.tasks.FqBackend`
alias in ``TASKS``. Creating a backend registers it too.

One run of :func:`run_task`:

0. checks what the payload names before anything runs: the ``backend``
   must be a django-fq alias of ``TASKS`` that serves the job's queue, and
   the ``task`` a ``Task`` in a module of an installed app or of
   ``FQ_TASK_MODULES`` (:mod:`django_fq.tasks.paths`); anything else raises
   :class:`django_fq.PermanentFailure`, so the job is dead at once and
   nothing the payload named was imported or called;
1. reads the job (for the worker id and the history of earlier attempts) and
   builds the ``TaskResult`` (status RUNNING);
2. sends ``task_started``;
3. calls the task function with a ``TaskContext`` first when the task ``takes_context``
   (``context.attempt`` is the job's attempt number, 1 for the first run); an
   ``async def`` task is awaited on the worker's event loop by :func:`arun_task`,
   which the worker picks per job through :func:`is_async_task`;
4. on success sends ``task_finished`` (SUCCESSFUL) and returns the return
   value, which the worker stores as the job's result (ack);
5. on an exception adds a note with the exception's class path (so the
   stored error names it, see :mod:`django_fq.tasks.history`), sends
   ``task_finished`` — status FAILED when no attempt is left, READY when the
   job will be retried — and re-raises: the worker nacks, and the queue's
   backoff and ``max_attempts`` apply. Raising
   :class:`django_fq.PermanentFailure` from a task ends it at once (FAILED).
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import traceback
from typing import cast

from django.utils.module_loading import import_string

from .. import handlers, validation
from ..exceptions import PermanentFailure
from . import _compat as tasks
from . import paths
from .backend import FqBackend, is_task_payload
from .errors import class_path
from .history import NOTE_PREFIX, exception_note

log = logging.getLogger("django_fq.tasks")


def run_task(job):
    """Handler of the Tasks queues: run the task a job's payload names (see the module docstring).

    An ``async def`` task reaching it (a worker given this handler without the asyncio
    pool) runs through ``async_to_sync``; the worker's own pools run those with
    :func:`arun_task` on the event loop instead (:func:`is_async_task`).
    """
    backend, task, result, attempts, max_attempts = _prepare(job)
    try:
        if task.takes_context:
            value = task.call(tasks.TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = tasks.normalize_json(value)
        validation.json_text(value, "result")
    except BaseException as exc:
        _failed(backend, result, exc, attempts, max_attempts)
        raise
    return _succeeded(backend, result, value)


async def arun_task(job):
    """:func:`run_task` for an ``async def`` task, awaited on the worker's event loop (no thread per job).

    The steps around the call (checking the payload, reading the job, the signals) use
    the database, so they run through ``sync_to_async``; the task function itself is
    awaited here.
    """
    from asgiref.sync import sync_to_async

    backend, task, result, attempts, max_attempts = await sync_to_async(_prepare)(job)
    try:
        if task.takes_context:
            value = await task.acall(tasks.TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = await task.acall(*result.args, **result.kwargs)
        value = tasks.normalize_json(value)
        validation.json_text(value, "result")
    except BaseException as exc:
        await sync_to_async(_failed)(backend, result, exc, attempts, max_attempts)
        raise
    return await sync_to_async(_succeeded)(backend, result, value)


#: Per task path (``module.name`` of a payload): whether its function is ``async def``.
_IS_ASYNC: dict[str, bool] = {}
_IS_ASYNC_MAX = 1024


def is_async_task(payload) -> bool:
    """Whether ``payload`` names an ``async def`` task: the worker then awaits :func:`arun_task` on its loop.

    Read by the worker (``run_task.fq_async_for``) as it hands each Tasks job to a pool.
    Imports only what :func:`django_fq.tasks.paths.resolve` allows, once per task path; a
    payload it cannot resolve goes to :func:`run_task`, which refuses it with its clear error.
    """
    if not is_task_payload(payload):
        return False
    path = payload["task"]
    known = _IS_ASYNC.get(path)
    if known is None:
        try:
            known = _is_coroutine_function(paths.resolve(path).func)
        except Exception:  # noqa: BLE001 - run_task reports a task it cannot run
            return False
        if len(_IS_ASYNC) >= _IS_ASYNC_MAX:
            _IS_ASYNC.clear()
        _IS_ASYNC[path] = known
    return known


# The worker's per-job choice (django_fq.worker.aio.async_twin): async tasks on the event loop.
run_task.fq_async = arun_task  # type: ignore[attr-defined]
run_task.fq_async_for = is_async_task  # type: ignore[attr-defined]


def _is_coroutine_function(fn) -> bool:
    from asgiref.sync import iscoroutinefunction

    return inspect.iscoroutinefunction(fn) or iscoroutinefunction(fn)


def _prepare(job):
    """Steps 0-2 of a run: check the payload, load the task, build its ``TaskResult``, send ``task_started``.

    Returns ``(backend, task, result, attempts, max_attempts)``; raises
    :class:`~django_fq.PermanentFailure` for a payload that names no task this worker may run.
    """
    from .. import services as fq  # not at import: see django_fq.tasks.backend

    payload = job.payload
    if not is_task_payload(payload):
        raise PermanentFailure(f"job {job.id} on queue {job.queue} is not a Django Tasks job (no task payload)")
    backend = _backend_of(job.queue, payload["backend"])
    try:
        task = backend.load_task(payload, job.queue)
    except paths.TaskRefused as exc:
        raise PermanentFailure(str(exc)) from None
    info = fq.get(job.queue, job.id)
    result = backend.result_from_job(info, task=task)
    attempts = int(getattr(job, "attempts", info.attempts) or info.attempts)
    max_attempts = int(getattr(job, "max_attempts", info.max_attempts) or info.max_attempts)
    _fit_attempts(result, attempts)
    tasks.task_started.send(sender=type(backend), task_result=result)
    return backend, task, result, attempts, max_attempts


def _failed(backend, result, exc: BaseException, attempts: int, max_attempts: int) -> None:
    """Step 5: record the failed attempt on ``result`` and send ``task_finished`` (the caller re-raises)."""
    path = class_path(type(exc))
    _add_note(exc, path)
    final = isinstance(exc, PermanentFailure) or attempts >= max_attempts
    result.errors.append(tasks.TaskError(exception_class_path=path, traceback=_traceback(exc)))
    object.__setattr__(result, "status", tasks.TaskResultStatus.FAILED if final else tasks.TaskResultStatus.READY)
    if final:
        object.__setattr__(result, "finished_at", _now())
    _finished(backend, result)


def _succeeded(backend, result, value):
    """Step 4: mark ``result`` successful, send ``task_finished``, return ``value`` (the job's result)."""
    object.__setattr__(result, "status", tasks.TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", _now())
    object.__setattr__(result, "_return_value", value)
    _finished(backend, result)
    return value


def _backend_of(fq_queue: str, alias: str) -> FqBackend:
    """The django-fq backend ``alias`` of ``TASKS`` when it serves ``fq_queue``; else ``PermanentFailure``.

    The alias comes from the payload, so it is looked up only among the
    aliases the settings give a django-fq backend: a payload never makes the
    worker build some other backend.
    """
    from django.conf import settings

    if alias not in fq_backend_aliases(getattr(settings, "TASKS", None)):
        raise PermanentFailure(
            f"the job names the Tasks backend {alias[:200]!r}, which is not a django-fq alias of TASKS"
        )
    backend = cast(FqBackend, tasks.task_backends[alias])
    if fq_queue not in backend.fq_queues.values():
        raise PermanentFailure(
            f"the job names the Tasks backend {alias!r}, which does not serve the queue {fq_queue!r}"
        )
    return backend


def _fit_attempts(result, attempts: int) -> None:
    """Make ``len(worker_ids)`` — Django's attempt count — equal the job's attempt number.

    The history may hold attempts from before a manual ``retry`` (which
    restarts the count) or may have dropped very old ones (it keeps 100).
    """
    ids = list(result.worker_ids)
    if attempts <= 0:
        return
    if len(ids) > attempts:
        ids = ids[len(ids) - attempts :]
    elif len(ids) < attempts:
        ids = [""] * (attempts - len(ids)) + ids
    object.__setattr__(result, "worker_ids", ids)


def _add_note(exc: BaseException, path: str) -> None:
    note = exception_note(path)
    notes = getattr(exc, "__notes__", None) or []
    if note not in notes:
        try:
            exc.add_note(note)
        except Exception:  # noqa: BLE001 - a read-only exception object keeps its text as is
            pass


def _traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(NOTE_PREFIX))


def _finished(backend, result) -> None:
    """Send ``task_finished``; a failing receiver is logged and never changes the task's outcome."""
    for receiver, response in tasks.task_finished.send_robust(type(backend), task_result=result):
        if isinstance(response, Exception):
            log.error("task_finished receiver %r failed for task %s", receiver, result.id, exc_info=response)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def register_backend(backend, *, strict: bool = True) -> None:
    """Register :func:`run_task` as the handler of each of ``backend``'s fq queues.

    With ``strict``, a queue that already has another handler raises
    ``InvalidTaskBackend``; otherwise that queue is skipped (the system check
    and the worker's autodiscovery report it).
    """
    for fq_queue in backend.fq_queues.values():
        current = handlers.get(fq_queue)
        if current is run_task:
            continue
        if current is not None:
            if strict:
                raise tasks.InvalidTaskBackend(
                    f"TASKS[{backend.alias!r}]: queue {fq_queue!r} already has the handler "
                    f"{current.__module__}.{current.__qualname__}; a Tasks queue needs its own fq queue "
                    f"(move the @handler to another queue, or give this backend a different OPTIONS['queue_prefix'])"
                )
            continue
        handlers.handler(fq_queue)(run_task)


def fq_backend_aliases(task_settings: dict | None) -> list[str]:
    """Aliases of ``TASKS`` whose ``BACKEND`` is a django-fq backend (a class with ``is_fq_backend``)."""
    aliases = []
    for alias, params in (task_settings or {}).items():
        path = (params or {}).get("BACKEND", "")
        try:
            cls = import_string(path)
        except ImportError:
            if str(path).startswith("django_fq."):
                raise
            continue
        if getattr(cls, "is_fq_backend", False):
            aliases.append(alias)
    return aliases


def register_configured() -> list[str]:
    """Register the handlers of every django-fq alias of ``settings.TASKS``; return the fq queues."""
    from django.conf import settings

    queues: list[str] = []
    for alias in fq_backend_aliases(getattr(settings, "TASKS", None)):
        backend = cast(FqBackend, tasks.task_backends[alias])  # fq_backend_aliases() checked its class
        register_backend(backend, strict=True)
        queues.extend(backend.fq_queues.values())
    return queues
