"""The handler registry: which function runs the jobs of which queue.

Register with the decorator (in a module named ``fq_handlers`` of any
installed app, found by :func:`autodiscover`)::

    from django_fq import handler

    @handler("emails")
    def send(job):
        ...  # job.payload, job.id, job.attempts, job.queue

or with the setting ``FQ_HANDLERS = {"emails": "myapp.jobs.send"}``.
A handler returning normally acks the job with its return value as result;
raising nacks it (text and traceback stored); raising
:class:`~django_fq.exceptions.PermanentFailure` makes it dead at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import traceback
from collections.abc import Callable

from django.conf import settings
from django.utils.module_loading import import_string, module_has_submodule

from . import validation
from .exceptions import HandlerImportError

_registry: dict[str, Callable] = {}


def handler(queue: str) -> Callable[[Callable], Callable]:
    """Decorator registering the decorated function as the handler of ``queue``.

    Raises :class:`InvalidQueueName` for a bad name, ``ValueError`` when the
    queue already has a different handler.
    """
    validation.queue_name(queue)

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
    for queue, path in getattr(settings, "FQ_HANDLERS", {}).items():
        try:
            fn = import_string(path)
        except Exception as exc:
            module = str(path).rpartition(".")[0]
            where = f"FQ_HANDLERS[{queue!r}] = {path!r}"
            located, inside = _location(module, exc) if module else ("", False)
            if inside:  # the error is inside that module: say where
                where = f"{where} ({located})"
            raise HandlerImportError(where, exc, module) from exc
        handler(queue)(fn)


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


def registered() -> dict[str, Callable]:
    """A copy of the registry: ``{queue: handler}``."""
    return dict(_registry)


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
