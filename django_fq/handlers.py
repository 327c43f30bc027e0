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

from collections.abc import Callable

from django.conf import settings
from django.utils.module_loading import autodiscover_modules, import_string

from . import validation

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
    """Import ``fq_handlers`` of every installed app and the ``FQ_HANDLERS`` setting's paths."""
    autodiscover_modules("fq_handlers")
    for queue, path in getattr(settings, "FQ_HANDLERS", {}).items():
        handler(queue)(import_string(path))


def get(queue: str) -> Callable | None:
    """The handler of ``queue``, or ``None``."""
    return _registry.get(queue)


def registered() -> dict[str, Callable]:
    """A copy of the registry: ``{queue: handler}``."""
    return dict(_registry)


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
