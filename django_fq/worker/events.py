"""What a worker tells its subscribers: started, claimed, job started/finished/settled, lease lost, stopping, stopped.

Extending the worker means subscribing to these events, not subclassing it::

    def on_finished(event: JobFinished) -> None:
        print(event.job.queue, event.outcome, event.run_ms)

    worker = Worker(["emails"], subscribers=[(on_finished, JobFinished)])
    # or: worker.events.subscribe(on_finished, JobFinished)

A subscriber is a callable taking one event. It runs on the thread that
emits the event (a runner thread for the job events, the claim loop for
``JobsClaimed``, the heartbeat thread for most ``LeaseLostEvent``), so it
must be quick and thread-safe; an exception it raises is logged
(``worker.subscriber_error``) and swallowed: it never reaches the worker.
Events carry no receipt. When nobody subscribed to an event type, the worker
does not even build the event (:meth:`Events.wants`), so unsubscribed events
cost nothing on the hot path.

:mod:`django_fq.metrics.worker` (``fq_worker --metrics-port``) is one such
subscriber; :mod:`django_fq.tracing` (``FQ_TRACING = True``) is another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .context import JobContext
from .logs import emit, summary

if TYPE_CHECKING:
    from .core import Worker


@dataclass(frozen=True)
class WorkerStarted:
    """The worker begins serving: its threads are about to start (emitted by :meth:`Worker.run`)."""

    worker: Worker


@dataclass(frozen=True)
class JobsClaimed:
    """One claim call on ``queue`` was answered: ``asked`` jobs wanted, ``got`` handed to the runners (may be 0).

    ``ms`` is how long the call took (monotonic clock of this process, ms).
    """

    worker: Worker
    queue: str
    asked: int
    got: int
    ms: float = 0.0


@dataclass(frozen=True)
class JobStarted:
    """A runner is about to call the handler of ``job``.

    ``wait_ms`` is the time from enqueue to this claim (database clock, ms;
    includes any ``delay_ms``/``at`` the job was enqueued with).
    """

    worker: Worker
    job: JobContext
    wait_ms: int


@dataclass(frozen=True)
class JobFinished:
    """The handler of ``job`` ended (always follows its :class:`JobStarted`, before the job is settled).

    ``outcome`` is ``ok`` (returned), ``failed`` (raised), ``permanent``
    (raised :class:`~django_fq.exceptions.PermanentFailure`) or ``lost``
    (raised :class:`~django_fq.exceptions.LeaseLost`); ``run_ms`` the
    handler's run time, ``wait_ms`` as in :class:`JobStarted`, ``error`` a
    one-line summary of what it raised (empty when it returned).
    """

    worker: Worker
    job: JobContext
    outcome: str
    run_ms: int
    wait_ms: int
    error: str = ""


@dataclass(frozen=True)
class JobSettled:
    """The worker settled ``job`` (or found it could not): the last event of a run, after its :class:`JobFinished`.

    ``result`` is ``acked``, ``nacked``, ``released`` (given back, the
    attempt not counted: at shutdown — also a job claimed ahead that never
    started, with no :class:`JobStarted` before it — or by a
    :class:`~django_fq.Snooze`) or
    ``not_settled`` (the lease was lost, the job cancelled, the database
    refused or stayed unreachable). ``state`` is the job's state right after
    the settle as the database answered it (``succeeded``; ``ready`` or
    ``scheduled`` when a nack retries it or a release gives it back,
    ``dead`` when a nack does not retry it; empty for ``not_settled``); ``ms`` how long the settle call took (ms; an ack
    batch's whole call for each of its jobs, 0 when no call was made);
    ``reason`` a one-line why for ``not_settled`` and ``released``
    (``shutdown``, ``snoozed``).
    """

    worker: Worker
    job: JobContext
    result: str
    state: str = ""
    ms: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class LeaseLostEvent:
    """The worker no longer holds the lease of a job it ran or held (the handler is told through its context).

    The handler learns of the loss first, so this event may come after the
    run's :class:`JobFinished` (a handler that raised ``LeaseLost`` at once).

    ``reason`` is ``expired``, ``timeout``, ``cancelled``, ``invalid_receipt``
    or ``queue_deleted`` (as :class:`~django_fq.exceptions.LeaseLost`).
    """

    worker: Worker
    job: JobContext
    reason: str


@dataclass(frozen=True)
class WorkerStopping:
    """The worker claims nothing more (a stop request, a signal, burst done, max jobs); running jobs drain."""

    worker: Worker
    reason: str


@dataclass(frozen=True)
class WorkerStopped:
    """:meth:`Worker.run` is about to return; every job was settled or released, the threads are stopped."""

    worker: Worker
    reason: str


#: Every event type a worker emits.
EVENT_TYPES: tuple[type, ...] = (
    WorkerStarted,
    JobsClaimed,
    JobStarted,
    JobFinished,
    JobSettled,
    LeaseLostEvent,
    WorkerStopping,
    WorkerStopped,
)

Subscriber = Callable[[Any], None]


class Events:
    """The subscribers of one worker, by event type."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Read without the lock on the hot path: replaced whole (copy on write), never mutated.
        self._by_type: dict[type, tuple[Subscriber, ...]] = {}

    def subscribe(self, subscriber: Subscriber, *types: type) -> None:
        """Call ``subscriber(event)`` for each event of ``types`` (default: every type in :data:`EVENT_TYPES`).

        Raises:
            TypeError: a type that is not one of :data:`EVENT_TYPES`.
        """
        wanted = types or EVENT_TYPES
        unknown = [t for t in wanted if t not in EVENT_TYPES]
        if unknown:
            raise TypeError(f"not a worker event type: {', '.join(getattr(t, '__name__', repr(t)) for t in unknown)}")
        with self._lock:
            by_type = dict(self._by_type)
            for event_type in wanted:
                by_type[event_type] = (*by_type.get(event_type, ()), subscriber)
            self._by_type = by_type

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop calling ``subscriber`` (for every type it subscribed to)."""
        with self._lock:
            self._by_type = {t: tuple(s for s in subs if s is not subscriber) for t, subs in self._by_type.items()}

    def wants(self, event_type: type) -> bool:
        """True when some subscriber takes ``event_type`` (build the event only then)."""
        return event_type in self._by_type and bool(self._by_type[event_type])

    def publish(self, event: Any) -> None:
        """Hand ``event`` to its subscribers in subscription order; their exceptions are logged, never raised."""
        for subscriber in self._by_type.get(type(event), ()):
            try:
                subscriber(event)
            except Exception as exc:  # noqa: BLE001 - a subscriber's bug must not break the worker
                emit(logging.ERROR, "worker.subscriber_error", event_type=type(event).__name__, error=summary(exc))


def subscribe_all(events: Events, subscribers: Iterable[Any]) -> None:
    """Subscribe each entry of ``subscribers``: a callable (every event) or ``(callable, type, ...)``."""
    for entry in subscribers:
        if isinstance(entry, tuple):
            events.subscribe(entry[0], *entry[1:])
        else:
            events.subscribe(entry)
