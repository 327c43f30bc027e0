"""``FqBackend``: Django Tasks on django-fq queues, and ``FqTask``, its task class with fq options.

A task enqueued through this backend is one fq job on the fq queue named
after the task's ``queue_name`` (with the optional ``queue_prefix``). Its
payload records what the worker needs to run it again in another process::

    {"v": 1, "task": "myapp.tasks.send", "backend": "default", "queue_name": "default",
     "priority": 0, "run_after": null, "takes_context": false, "args": [...], "kwargs": {...}}

The ``TaskResult`` id is the fq job id. Results are read back from the job
(state, timestamps, error history, worker, result) by :meth:`FqBackend.get_result`,
so any process with database access can follow a task.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, transaction

from .. import conf, routing, validation
from ..exceptions import InvalidArgument, JobNotFound, QueueNotFound
from ..validation import POLICY_BOUNDS
from . import _compat as tasks
from . import paths
from .history import attempt_history

# django_fq.services (and with it the models) is imported on first use, never when this module
# or a backend is built: without "django_fq" in INSTALLED_APPS, importing the models raises a
# RuntimeError that would hide the system check django_fq.E007 (see FqBackend.check).

#: Per-task options, accepted by ``@task(...)`` (``FqTask`` fields), ``FqTask.using()``,
#: backend ``OPTIONS`` (defaults for every task) and ``OPTIONS["tasks"][path]``.
TASK_OPTIONS = ("max_attempts", "timeout_ms", "idempotency_retention_ms", "unique_key", "idempotency", "concurrency_key")
_INT_OPTIONS = ("max_attempts", "timeout_ms", "idempotency_retention_ms")
#: Keys the backend's ``OPTIONS`` may hold.
BACKEND_OPTIONS = frozenset({"enqueue_on_commit", "queue_prefix", "tasks", *TASK_OPTIONS})
#: Version of the job payload layout written by :meth:`FqBackend.enqueue`.
PAYLOAD_VERSION = 1

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_STATUS = {
    # Waiting for dependencies (enqueue_after, chain, or depends_on outside this backend): not started yet.
    "waiting": tasks.TaskResultStatus.READY,
    "scheduled": tasks.TaskResultStatus.READY,
    "ready": tasks.TaskResultStatus.READY,
    "running": tasks.TaskResultStatus.RUNNING,
    "succeeded": tasks.TaskResultStatus.SUCCESSFUL,
    "dead": tasks.TaskResultStatus.FAILED,
    "cancelled": tasks.TaskResultStatus.FAILED,
}
_FINAL = frozenset({"succeeded", "dead", "cancelled"})
#: Attributes of a ``TaskResult`` that reading the job again can change.
_RESULT_STATE = (
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "errors",
    "worker_ids",
    "_return_value",
)


def to_datetime(ms: int | None) -> dt.datetime | None:
    """An aware UTC datetime from epoch milliseconds (exact: no float rounding)."""
    return None if ms is None else _EPOCH + dt.timedelta(milliseconds=ms)


def fq_installed() -> bool:
    """Whether ``django_fq`` is an installed app (read from the settings while the app registry loads)."""
    from django.apps import apps

    if apps.apps_ready:
        return apps.is_installed("django_fq")
    return any(str(app) == "django_fq" or str(app).startswith("django_fq.") for app in settings.INSTALLED_APPS)


def is_task_payload(payload: object) -> bool:
    """Whether a job payload was written by :meth:`FqBackend.enqueue`."""
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("task"), str)
        and isinstance(payload.get("backend"), str)
        and isinstance(payload.get("args"), list)
        and isinstance(payload.get("kwargs"), dict)
    )


def option_error(name: str, value: object) -> str | None:
    """Why ``value`` is not acceptable for per-task option ``name``, or ``None`` when it is."""
    if name not in TASK_OPTIONS:
        return f"unknown option {name!r} (known: {', '.join(TASK_OPTIONS)})"
    if value is None:
        return None
    if name in _INT_OPTIONS:
        try:
            validation.integer(value, name, *POLICY_BOUNDS[name])
        except InvalidArgument as exc:
            lo, hi = POLICY_BOUNDS[name]
            # "must be an integer" gains the range; "must be between 1 and 1000" says it already.
            return exc.message if f"{lo} and {hi}" in exc.message else f"{exc.message} ({lo}–{hi})"
        return None
    if callable(value):
        return None
    if not isinstance(value, str) or not value:
        return f"{name} must be a non-empty string (a str.format template) or a callable"
    return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FqTask(tasks.Task):
    """The backend's task class: a Django ``Task`` plus django-fq job options.

    With Django 6.1+ (and the ``django_tasks`` backport), ``@task`` passes extra
    keywords to the backend's task class, so::

        @task(max_attempts=3, timeout_ms=60_000, unique_key="report-{0}")
        def build_report(report_id): ...

    ``using()`` accepts the same options for one call site::

        build_report.using(idempotency=f"report-{rid}-{day}").enqueue(rid)

    ``max_attempts``, ``timeout_ms`` and ``idempotency_retention_ms`` are
    integers with the bounds of the queue policy; ``unique_key``,
    ``idempotency`` and ``concurrency_key`` (at most the queue's
    ``key_concurrency`` jobs of one key run at once, and at most its
    ``key_rate_limit`` of them are claimed in any ``rate_window_ms``; those
    two are queue policy, set with ``configure()``, not task options; e.g.
    ``concurrency_key="customer-{customer_id}"``) are a ``str.format`` template over the call's arguments
    (``{0}``, ``{user_id}``, ``{task}`` for the task's path) or a callable
    taking the task's ``*args, **kwargs`` and returning a string (or ``None``
    for no key). ``None`` leaves an option to the backend's ``OPTIONS``.
    """

    max_attempts: int | None = None
    timeout_ms: int | None = None
    idempotency_retention_ms: int | None = None
    unique_key: str | Callable[..., str | None] | None = None
    idempotency: str | Callable[..., str | None] | None = None
    concurrency_key: str | Callable[..., str | None] | None = None

    def using(self, *, priority=None, queue_name=None, run_after=None, backend=None, **options):
        """A copy with other defaults; besides Django's four, any of :data:`TASK_OPTIONS`."""
        unknown = sorted(set(options) - set(TASK_OPTIONS))
        if unknown:
            raise TypeError(f"using() got an unexpected keyword argument {unknown[0]!r}")
        changed: Any = tasks.Task.using(self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend)
        return dataclasses.replace(changed, **options) if options else changed


class FqBackend(tasks.BaseTaskBackend):
    """Django Tasks backend storing each task as a django-fq job; ``manage.py fq_worker`` runs them.

    Settings::

        TASKS = {
            "default": {
                "BACKEND": "django_fq.tasks.FqBackend",
                "QUEUES": ["default", "emails"],          # fq queues (required, non-empty)
                "OPTIONS": {
                    "enqueue_on_commit": False,            # True, or a database alias
                    "queue_prefix": "",                    # fq queue = prefix + queue_name
                    "max_attempts": 5,                     # defaults for every task …
                    "tasks": {                             # … and per task path
                        "myapp.tasks.send": {"max_attempts": 3, "unique_key": "send-{0}"},
                    },
                },
            }
        }

    Retry backoff, lease length and concurrency come from the fq queue's
    policy (``fq configure``).
    """

    task_class = FqTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    #: Marker read by ``django_fq.fq_handlers`` to find the aliases to serve.
    is_fq_backend = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]"
        if not self.queues:
            raise tasks.InvalidTaskBackend(f"{where}: QUEUES must name at least one queue (fq_worker serves those)")
        options = dict(self.options or {})
        unknown = sorted(set(options) - BACKEND_OPTIONS)
        if unknown:
            raise tasks.InvalidTaskBackend(
                f"{where}: unknown OPTIONS key {unknown[0]!r} (known: {', '.join(sorted(BACKEND_OPTIONS))})"
            )
        prefix = options.get("queue_prefix", "")
        if not isinstance(prefix, str):
            raise tasks.InvalidTaskBackend(f"{where}: OPTIONS['queue_prefix'] must be a string")
        self.queue_prefix = prefix
        on_commit = options.get("enqueue_on_commit", False)
        if on_commit is True:
            on_commit = DEFAULT_DB_ALIAS
        elif on_commit in (False, None):
            on_commit = None
        elif not isinstance(on_commit, str):
            raise tasks.InvalidTaskBackend(f"{where}: OPTIONS['enqueue_on_commit'] must be a bool or a database alias")
        #: Database alias whose commit triggers the enqueue, or ``None`` (enqueue at once).
        self.enqueue_on_commit: str | None = on_commit
        self.default_options = self._checked(options, f"{where} OPTIONS")
        per_task = options.get("tasks", {})
        if not isinstance(per_task, Mapping):
            raise tasks.InvalidTaskBackend(f"{where}: OPTIONS['tasks'] must map task paths to option dicts")
        self.task_options: dict[str, dict] = {}
        for path, opts in per_task.items():
            if not isinstance(path, str) or not isinstance(opts, Mapping):
                raise tasks.InvalidTaskBackend(f"{where}: OPTIONS['tasks'] must map task paths to option dicts")
            self.task_options[path] = self._checked(opts, f"{where} OPTIONS['tasks'][{path!r}]", strict=True)
        #: Django queue name → fq queue name.
        self.fq_queues: dict[str, str] = {}
        for name in sorted(self.queues):
            fq_name = f"{prefix}{name}"
            try:
                validation.queue_name(fq_name)
            except InvalidArgument:
                raise tasks.InvalidTaskBackend(
                    f"{where}: queue {fq_name!r} is not a valid fq queue name (1–200 of [A-Za-z0-9:._-])"
                ) from None
            self.fq_queues[name] = fq_name
        from .runner import register_backend

        register_backend(self, strict=False)
        if not fq_installed():
            # FqBackend.check() reports it (django_fq.E007); the backport registers its backend
            # checks only when its app is installed, so make sure they run.
            import importlib

            importlib.import_module(f"{tasks.FRAMEWORK}.checks")

    def check(self, **kwargs):
        """System check of the backend, run by the Tasks framework: ``django_fq.E007`` without the app."""
        if fq_installed():
            return []
        return [
            checks.Error(
                f"TASKS[{self.alias!r}] uses django_fq.tasks.FqBackend, but 'django_fq' is not in INSTALLED_APPS.",
                hint="add 'django_fq' to INSTALLED_APPS (its models hold the jobs), then run migrate.",
                id="django_fq.E007",
            )
        ]

    def _fq(self):
        """:mod:`django_fq.services`; ``InvalidTaskBackend`` (the E007 text) when the app is not installed."""
        if not fq_installed():
            raise tasks.InvalidTaskBackend(
                f"TASKS[{self.alias!r}]: 'django_fq' is not in INSTALLED_APPS; add 'django_fq' to INSTALLED_APPS"
            )
        from .. import services

        return services

    @staticmethod
    def _checked(options: Mapping, where: str, *, strict: bool = False) -> dict:
        out = {}
        for name, value in options.items():
            if name not in TASK_OPTIONS:
                if strict:
                    raise tasks.InvalidTaskBackend(f"{where}: {option_error(name, value)}")
                continue
            problem = option_error(name, value)
            if problem:
                raise tasks.InvalidTaskBackend(f"{where}: {problem}")
            if value is not None:
                out[name] = value
        return out

    # --- validation --------------------------------------------------------------------------

    def validate_task(self, task):
        """Django's checks, plus the fq options of an :class:`FqTask` (raises ``InvalidTask``)."""
        super().validate_task(task)
        for name in TASK_OPTIONS:
            problem = option_error(name, getattr(task, name, None))
            if problem:
                raise tasks.InvalidTask(f"{task.module_path}: {problem}")

    def options_for(self, task) -> dict:
        """The task's effective fq options: backend OPTIONS < ``OPTIONS["tasks"][path]`` < the task's own."""
        merged = dict(self.default_options)
        merged.update(self.task_options.get(task.module_path, {}))
        for name in TASK_OPTIONS:
            value = getattr(task, name, None)
            if value is not None:
                merged[name] = value
        return merged

    # --- enqueue -----------------------------------------------------------------------------

    def enqueue(self, task, args, kwargs):
        """Store the task as an fq job (in the caller's transaction) and return its ``TaskResult``.

        ``args``/``kwargs`` must be JSON (Django's normalisation applies:
        tuples become lists). A new job's result is built from what the
        enqueue wrote, without reading the job back (a worker may claim it at
        once): status ``READY``, the job id, ``enqueued_at`` from the database
        clock. A job coalesced onto an existing one by an idempotency token
        or unique key returns that job's result (read from the database) and
        does not send ``task_enqueued``. With ``enqueue_on_commit`` the job
        is written when the transaction commits, see
        :meth:`_enqueue_on_commit`.

        Raises ``InvalidTask`` for a task a worker would refuse to run: one
        whose module is neither inside an installed app nor listed in
        ``FQ_TASK_MODULES`` (see docs/tasks.md).
        """
        return self.enqueue_with(task, args, kwargs)

    def enqueue_with(self, task, args, kwargs, *, depends_on: list | None = None):
        """:meth:`enqueue` with django-fq's ``depends_on`` (job ids, or ``{"id", "on_failure", "name"}`` items).

        What :func:`django_fq.tasks.enqueue_after` and :func:`django_fq.tasks.chain`
        call. A job with dependencies is written at once, in the caller's
        transaction: its dependencies' ids must exist, so a backend with
        ``enqueue_on_commit`` refuses it (``InvalidTaskBackend``; wrap the
        call in ``transaction.on_commit`` instead). Raises ``InvalidTask``
        as :meth:`enqueue`, and :class:`~django_fq.exceptions.InvalidDependency`.
        """
        if depends_on and self.enqueue_on_commit is not None:
            raise tasks.InvalidTaskBackend(
                f"TASKS[{self.alias!r}] enqueues on commit: a task with dependencies needs their job ids now; "
                "call enqueue_after / chain from transaction.on_commit instead"
            )
        self.validate_task(task)
        try:
            paths.split(task.module_path)
        except paths.TaskRefused as exc:
            raise tasks.InvalidTask(
                f"{task.module_path}: {exc.reason}: no worker would run it; put the task in an installed app "
                f"or add its module to {paths.SETTING} (see docs/tasks.md)"
            ) from None
        args = tasks.normalize_json(list(args))
        kwargs = tasks.normalize_json(dict(kwargs))
        queue = self.fq_queues[task.queue_name]
        payload = {
            "v": PAYLOAD_VERSION,
            "task": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": None if task.run_after is None else task.run_after.isoformat(),
            "takes_context": bool(task.takes_context),
            "args": args,
            "kwargs": kwargs,
        }
        options = self._job_options(task, args, kwargs)
        if self.enqueue_on_commit is not None:
            return self._enqueue_on_commit(task, queue, payload, options)
        fq = self._fq()
        if depends_on:
            options["depends_on"] = depends_on
        created = fq.enqueue(queue, payload, priority=task.priority, at=task.run_after, **options)
        if not created.created:
            return self.result_from_job(fq.get(queue, created.id))
        result = self._new_result(task, created, payload)
        tasks.task_enqueued.send(type(self), task_result=result)
        return result

    def _new_result(self, task, created, payload: dict):
        """The ``TaskResult`` of a job this backend has just created (``READY``), from the enqueue's own answer."""
        return self._ready_result(task, created.id, to_datetime(created.enqueued_at), payload)

    def _ready_result(self, task, result_id: str, enqueued_at, payload: dict):
        """A ``READY`` ``TaskResult`` with id ``result_id`` (a job id, or a provisional token) and no attempt yet."""
        result: tasks.TaskResult[Any, Any] = tasks.TaskResult(
            task=task,
            id=result_id,
            status=tasks.TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        return result

    def _job_options(self, task, args: list, kwargs: dict) -> dict:
        """The keyword options of ``services.enqueue`` for this call (keys resolved from the arguments)."""
        out = {}
        for name, value in self.options_for(task).items():
            if name in _INT_OPTIONS:
                out[name] = value
                continue
            key = _resolve_key(name, value, task, args, kwargs)
            if key is not None:
                out[name] = key
        return out

    def _enqueue_on_commit(self, task, queue: str, payload: dict, options: dict):
        """Write the job when the ``enqueue_on_commit`` database's transaction commits.

        The returned result has a provisional id: the job's idempotency token
        (the task's own, or a fresh random one). :meth:`get_result` resolves
        it while the token lives (the queue's ``idempotency_retention_ms``).
        At commit the same object is updated in place: its ``id`` becomes the
        job id, which stays valid for the job's life, and ``enqueued_at`` is
        set; its status stays ``READY`` (a coalesced enqueue takes the
        existing job's state). A rollback discards the enqueue; nothing is
        written.
        """
        token = options.get("idempotency") or secrets.token_hex(16)
        options = {**options, "idempotency": token}
        result = self._ready_result(task, token, None, payload)

        def write():
            fq = self._fq()
            created = fq.enqueue(queue, payload, priority=task.priority, at=task.run_after, **options)
            if created.created:
                fresh = self._new_result(task, created, payload)
            else:
                fresh = self.result_from_job(fq.get(queue, created.id), task=task)
            for name in _RESULT_STATE:
                object.__setattr__(result, name, getattr(fresh, name))
            if created.created:
                tasks.task_enqueued.send(type(self), task_result=result)

        transaction.on_commit(write, using=self.enqueue_on_commit)
        return result

    # --- results -----------------------------------------------------------------------------

    def get_result(self, result_id):
        """The ``TaskResult`` of job ``result_id`` (or of a provisional on-commit id), from any process.

        Raises ``TaskResultDoesNotExist`` when no queue of this backend holds
        a task job with that id (also once a finished job was pruned), and for
        an id no job or token can have (not a string, empty, a NUL or a lone
        surrogate, over 255 characters): such an id often comes from a URL.
        """
        if not isinstance(result_id, str) or not result_id:
            raise tasks.TaskResultDoesNotExist(result_id)
        fq = self._fq()
        for queue in self.fq_queues.values():
            try:
                return self.result_from_job(fq.get(queue, result_id))
            except (QueueNotFound, JobNotFound):
                continue
        found = self._job_by_token(result_id)
        if found is not None:
            return self.result_from_job(found)
        raise tasks.TaskResultDoesNotExist(result_id)

    def _job_by_token(self, token: str):
        """The job an idempotency token of one of our queues points to (provisional on-commit ids)."""
        try:
            # No stored token is longer than 255 characters or holds a NUL or a lone surrogate, and
            # the database could not even compare one that does (DataError, UnicodeEncodeError).
            validation.key(token, "result_id")
        except InvalidArgument:
            return None
        from ..models import IdempotencyToken

        row = None
        # Each database of the backend's queues (FQ_QUEUE_DATABASES; one without the setting).
        for alias, names in routing.group_by_alias(self.fq_queues.values()).items():
            if not routing.enabled():
                alias = conf.database()
            row = (
                IdempotencyToken.objects.using(alias)
                .filter(queue__name__in=names, token=token)
                .values_list("queue__name", "job_uid")
                .first()
            )
            if row is not None:
                break
        if row is None:
            return None
        try:
            return self._fq().get(row[0], row[1])
        except (QueueNotFound, JobNotFound):
            return None

    def load_task(self, payload: dict, fq_queue: str | None = None):
        """The ``Task`` a job payload names, as it was enqueued (priority, run_after).

        The payload only *names* a task: :func:`django_fq.tasks.paths.resolve`
        imports only modules of installed apps and ``FQ_TASK_MODULES``, and
        accepts only ``Task`` objects, so no payload picks other code. The
        task's backend is this one, and its ``queue_name`` the one of
        ``fq_queue`` (the job's real queue) when given; ``takes_context``
        and the function always come from the ``Task`` itself.

        Raises :class:`~django_fq.tasks.paths.TaskRefused` for a path that is
        not a task a worker may run, ``ImportError`` when its module or
        attribute is missing.
        """
        base = paths.resolve(payload["task"])
        by_fq_queue = {fq_name: name for name, fq_name in self.fq_queues.items()}
        queue_name = by_fq_queue.get(fq_queue or "")
        if queue_name is None:
            named = payload.get("queue_name")
            queue_name = named if isinstance(named, str) and named in self.queues else base.queue_name
        try:
            run_after = payload.get("run_after")
            changes = {
                "priority": payload.get("priority", base.priority),
                "queue_name": queue_name,
                "backend": self.alias,
                "run_after": None if run_after is None else dt.datetime.fromisoformat(run_after),
            }
            if all(getattr(base, k) == v for k, v in changes.items()):
                return base
            return dataclasses.replace(base, **changes)
        except (tasks.InvalidTask, tasks.InvalidTaskBackend, TypeError, ValueError):
            return base  # the configuration changed since, or a field was edited: still report the task

    def result_from_job(self, info, *, task=None):
        """A ``TaskResult`` built from a job's :class:`~django_fq.types.JobInfo` (fetched with payload).

        Status: waiting/scheduled/ready → READY, running → RUNNING, succeeded →
        SUCCESSFUL, dead/cancelled → FAILED. ``errors`` has one entry per
        failed attempt (and one for a cancel); ``worker_ids`` one per attempt.
        """
        payload = info.payload
        if not is_task_payload(payload):
            raise tasks.TaskResultDoesNotExist(info.id)
        if task is None:
            try:
                task = self.load_task(payload, info.queue)
            except paths.TaskRefused as exc:  # not a task this project defines: no result of ours
                raise tasks.TaskResultDoesNotExist(f"{info.id}: {exc}") from None
        errors, worker_ids = attempt_history(info)
        claimed = to_datetime(info.claimed_at)
        finished = None
        if info.state in _FINAL:
            finished = to_datetime(info.finished_at if info.finished_at is not None else info.changed_at)
        result: tasks.TaskResult[Any, Any] = tasks.TaskResult(
            task=task,
            id=info.id,
            status=_STATUS[info.state],
            enqueued_at=to_datetime(info.enqueued_at),
            started_at=claimed,
            finished_at=finished,
            last_attempted_at=claimed,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
        )
        if info.state == "succeeded":
            object.__setattr__(result, "_return_value", info.result)
        return result


def _resolve_key(name: str, value: Any, task, args: list, kwargs: dict) -> str | None:
    """A ``unique_key`` / ``idempotency`` / ``concurrency_key`` value for one call: a template filled in, or a callable's answer."""
    if callable(value):
        key = value(*args, **kwargs)
    else:
        fields = dict(kwargs)
        fields.setdefault("task", task.module_path)
        try:
            key = value.format(*args, **fields)
        except (IndexError, KeyError, AttributeError, ValueError) as exc:
            raise tasks.InvalidTask(f"{task.module_path}: cannot fill {name} template {value!r}: {exc!r}") from None
    if key is None:
        return None
    if not isinstance(key, str):
        raise tasks.InvalidTask(f"{task.module_path}: {name} must be a string, got {type(key).__name__}")
    try:
        return validation.concurrency_key(key, name) if name == "concurrency_key" else validation.key(key, name)
    except InvalidArgument as exc:
        raise tasks.InvalidTask(f"{task.module_path}: {exc.message}") from None
