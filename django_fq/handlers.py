"""The handler registry: which function runs the jobs of which queue.

Register with the decorator (in a module named ``fq_handlers`` of any
installed app, found by :func:`autodiscover`)::

    from django_fq import handler

    @handler("emails")
    def send(job):
        ...  # job.payload, job.id, job.attempts, job.queue

or with the setting ``FQ_HANDLERS = {"emails": "myapp.jobs.send"}``.
``@handler("emails", batch=500)`` (or ``{"handler": path, "batch": 500}``)
makes a batch handler: it receives up to 500 jobs per call
(docs/how-to/batch-handlers.md, :mod:`django_fq.worker.batch`).
A handler returning normally acks the job with its return value as result;
raising nacks it (text and traceback stored); raising
:class:`~django_fq.exceptions.PermanentFailure` makes it dead at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import traceback
from collections.abc import Callable, Iterable

from django.conf import settings
from django.utils.module_loading import import_string, module_has_submodule

from . import validation
from .exceptions import HandlerImportError, HandlerLoadError

_registry: dict[str, Callable] = {}
#: The handler's own middleware per queue (``@handler(q, middleware=...)``, ``FQ_HANDLERS`` entries).
_middleware: dict[str, tuple] = {}
#: The batch size of each queue whose handler takes a list of jobs (``@handler(q, batch=N)``).
_batch: dict[str, int] = {}

#: Most jobs one batch may hold: one claim takes at most this many (docs/reference/semantics.md#s5).
MAX_BATCH = 1000


def check_batch(value: object, where: str) -> int | None:
    """``value`` as a batch size (``None``: not a batch handler); raises ``ValueError`` naming ``where``.

    A batch size is an ``int`` of 1 - :data:`MAX_BATCH` (1,000): a batch is
    one claim, and a claim takes at most 1,000 jobs (and at most 32 MiB of
    payloads, so a batch may come smaller than asked).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise ValueError(f"{where}: batch must be an integer from 1 to {MAX_BATCH} (jobs per call), not {value!r}")
    return value


def handler(
    queue: str, *, middleware: Iterable[object] | None = None, batch: int | None = None
) -> Callable[[Callable], Callable]:
    """Decorator registering the decorated function as the handler of ``queue``.

    ``middleware``: this handler's own handler middleware (callables or
    dotted paths, outermost first), run inside ``FQ_HANDLER_MIDDLEWARE``
    (see :mod:`django_fq.middleware`); checked when a worker starts.

    ``batch``: make it a batch handler, called with a list of up to ``batch``
    jobs (1 - 1,000) instead of one job (docs/how-to/batch-handlers.md).

    Raises :class:`InvalidQueueName` for a bad name, ``ValueError`` when the
    queue already has a different handler or ``batch`` is not 1 - 1,000,
    ``TypeError`` when ``middleware`` is not a list or tuple.
    """
    validation.queue_name(queue)
    size = check_batch(batch, f"@handler({queue!r})")
    if middleware is not None and (isinstance(middleware, (str, bytes)) or not isinstance(middleware, (list, tuple))):
        raise TypeError("handler middleware must be a list of callables or dotted paths")

    def register(fn: Callable) -> Callable:
        current = _registry.get(queue)
        if current is not None and current is not fn and _qualname(current) != _qualname(fn):
            hint = ""
            if "django_fq.tasks.runner.run_task" in (_qualname(current), _qualname(fn)):
                hint = (
                    "; a Django Tasks queue belongs to the tasks runner: move the @handler to another "
                    "queue, or give the TASKS backend a different OPTIONS['queue_prefix'] (e.g. 'tasks:')"
                )
            raise ValueError(
                f"queue {queue!r} already has handler {_qualname(current)}; cannot also register "
                f"{_qualname(fn)} (one handler per queue){hint}"
            )
        _registry[queue] = fn
        if size is not None:
            _batch[queue] = size
        elif current is None or current is not fn:
            _batch.pop(queue, None)
        if middleware:
            _middleware[queue] = tuple(middleware)
        elif middleware is not None or current is None:
            _middleware.pop(queue, None)
        return fn

    return register


def autodiscover() -> None:
    """Import ``fq_handlers`` of every installed app and the ``FQ_HANDLERS`` setting's paths.

    Raises :class:`HandlerImportError` when a module raises at import (the
    message names the module, its file and the line), ``ValueError`` when a
    queue gets two handlers.
    """
    from django.apps import apps

    for app in apps.get_app_configs():
        name = f"{app.name}.fq_handlers"
        try:
            importlib.import_module(name)
        except Exception as exc:
            if not module_has_submodule(app.module, "fq_handlers"):
                continue  # the app has no handler module
            raise HandlerImportError(_location(name, exc)[0], exc, name) from exc
    for queue, entry in getattr(settings, "FQ_HANDLERS", {}).items():
        own = None
        size = None
        path = entry
        if isinstance(entry, dict):
            # {"handler": "dotted.path", "middleware": [...], "batch": N} (docs/how-to/middleware.md,
            # docs/how-to/batch-handlers.md)
            path, own = entry.get("handler"), entry.get("middleware")
            try:
                size = check_batch(entry.get("batch"), f"FQ_HANDLERS[{queue!r}]")
            except ValueError as exc:
                raise HandlerLoadError(f"{exc}") from None
            if not isinstance(path, str):
                raise HandlerLoadError(f"FQ_HANDLERS[{queue!r}]: the entry's 'handler' must be a dotted path")
            if own is not None and not isinstance(own, (list, tuple)):
                raise HandlerLoadError(f"FQ_HANDLERS[{queue!r}]: the entry's 'middleware' must be a list")
        try:
            fn = import_string(path)
        except Exception as exc:
            module = str(path).rpartition(".")[0]
            where = f"FQ_HANDLERS[{queue!r}] = {path!r}"
            located, inside = _location(module, exc) if module else ("", False)
            if inside:  # the error is inside that module: say where
                where = f"{where} ({located})"
            raise HandlerImportError(where, exc, module) from exc
        handler(queue, middleware=list(own) if own else None, batch=size)(fn)


def _location(module: str, exc: BaseException) -> tuple[str, bool]:
    """``("module M, file F, line N", True)``: the last line of ``module`` in ``exc``'s traceback (or its ``SyntaxError``).

    ``False`` with less text when the traceback never passes through that module's file.
    """
    try:
        spec = importlib.util.find_spec(module)
    except Exception:  # noqa: BLE001 - a parent package that does not import: no file to name
        spec = None
    origin = getattr(spec, "origin", None)
    if not origin:
        return f"module {module}", False
    line = None
    if isinstance(exc, SyntaxError) and exc.filename == origin:
        line = exc.lineno
    else:
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename == origin:
                line = frame.lineno
    if line is None:
        return f"module {module} (file {origin})", False
    return f"module {module}, file {origin}, line {line}", True


def get(queue: str) -> Callable | None:
    """The handler of ``queue``, or ``None``."""
    return _registry.get(queue)


def middleware_of(queue: str) -> tuple:
    """The registered handler of ``queue``'s own middleware (``()`` when none)."""
    return _middleware.get(queue, ())


def batch_of(queue: str) -> int | None:
    """The batch size registered with the handler of ``queue`` (``None``: it takes one job per call)."""
    return _batch.get(queue)


def registered() -> dict[str, Callable]:
    """A copy of the registry: ``{queue: handler}``."""
    return dict(_registry)


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
