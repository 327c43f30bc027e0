"""What a handler sees: :class:`JobContext` (also from :func:`current_job`) and its lease's state.

A job's context is written by the heartbeat thread (deadline moved, lease
lost) and read by the handler on its runner thread, through thread-safe
primitives only (a :class:`LostFlag`, an event made on first wait, and plain attribute writes).
Progress reports go the other way (:meth:`JobContext.progress`): the handler
leaves them in the run's :class:`ProgressReports`, and the heartbeat thread
writes the latest at most once a second. :class:`LeaseLost` is
:class:`django_fq.exceptions.LeaseLost`, re-exported.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import validation
from ..exceptions import LeaseLost
from ..types import ClaimedJob

__all__ = ["JobContext", "LeaseLost", "LeaseState", "LostFlag", "ProgressReports", "current_job"]

#: Least time between two progress writes of one run (seconds): the issue's "at most one write
#: per second per job" (docs/how-to/progress.md).
PROGRESS_INTERVAL_S = 1.0


_flag_lock = threading.Lock()


class LostFlag:
    """The "lease lost" flag of one run: :class:`threading.Event`'s ``is_set``, ``set`` and ``wait``.

    A worker makes one per claimed job and most are never waited on, so the
    :class:`threading.Event` (a condition and its lock, the larger part of what a
    claimed job cost to set up in Python) is made only by the first :meth:`wait`.
    One module lock orders ``set`` against that creation, so a waiter either sees
    the flag set or gets its event set.
    """

    __slots__ = ("_flag", "_event")

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with _flag_lock:
            self._flag = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds passed; return the flag."""
        if self._flag:
            return True
        with _flag_lock:
            if self._flag:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


class LeaseState:
    """The part of a lease a handler may observe: deadline and loss. Holds no receipt."""

    __slots__ = ("deadline", "expires_mono", "lost", "reason", "at_timeout", "on_lost")

    def __init__(self, deadline: int, expires_mono: float = math.inf):
        self.deadline = deadline
        #: Earliest local (monotonic) time at which the deadline may have passed.
        self.expires_mono = expires_mono
        self.lost = LostFlag()
        self.reason: str | None = None
        #: The deadline is the job's timeout: it cannot be extended, and passing it is a timeout.
        self.at_timeout = False
        #: Called (once, on the thread that records the loss) when the lease is lost: the
        #: asyncio pool cancels the job's task from it. Must not block.
        self.on_lost: Callable[[], None] | None = None

    def mark_lost(self, reason: str) -> bool:
        """Record the loss (the first reason wins); False if it was already lost."""
        if self.lost.is_set():
            return False
        self.reason = reason
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost()
        return True

    def is_lost(self) -> bool:
        return self.lost.is_set() or time.monotonic() >= self.expires_mono

    def lost_reason(self) -> str | None:
        if self.lost.is_set():
            return self.reason
        if time.monotonic() >= self.expires_mono:
            return "timeout" if self.at_timeout else "expired"
        return None

    def __repr__(self) -> str:
        return f"<lease deadline={self.deadline} lost={self.lost_reason()}>"


class ProgressReports:
    """One run's progress reports: the latest not yet written, and when the next write may start.

    Made at a run's first :meth:`JobContext.progress`, so a handler that
    reports nothing costs nothing. One writer at a time (:meth:`take` …
    :meth:`written`): the heartbeat thread while the handler runs, the runner
    once it returned (:meth:`take_last`), so writes never overtake each other.
    Times are local monotonic seconds.
    """

    __slots__ = ("_cv", "pending", "due", "writing", "last")

    def __init__(self) -> None:
        self._cv = threading.Condition()
        #: ``(progress, message)`` reported and not yet taken by a writer, or ``None``.
        self.pending: tuple[float, str] | None = None
        #: When the next write may start: :data:`PROGRESS_INTERVAL_S` after the last one started.
        self.due = -math.inf
        self.writing = False
        #: The latest report, written or not (what the handler last said).
        self.last: tuple[float, str] | None = None

    def put(self, report: tuple[float, str]) -> float | None:
        """Keep ``report`` as the latest; return ``due`` when a writer must be woken for it, else ``None``.

        Only the first report after a take needs the wake-up: later ones ride on it.
        """
        with self._cv:
            first = self.pending is None
            self.pending = self.last = report
            return self.due if first else None

    def take(self, now: float) -> tuple[float, str] | None:
        """The report to write now (becoming its writer), or ``None``: nothing pending, not due, or a write in flight."""
        with self._cv:
            if self.pending is None or self.writing or now < self.due:
                return None
            report, self.pending = self.pending, None
            self.writing = True
            self.due = now + PROGRESS_INTERVAL_S
            return report

    def take_last(self, timeout_s: float) -> tuple[float, str] | None:
        """Once the handler returned: the report still pending (written at once, unthrottled), or ``None``.

        Waits up to ``timeout_s`` for a write in flight, so the last report is written last.
        """
        with self._cv:
            if not self._cv.wait_for(lambda: not self.writing, timeout_s) or self.pending is None:
                return None
            report, self.pending = self.pending, None
            self.writing = True
            return report

    def written(self) -> None:
        """The write of the report taken last ended (stored or refused)."""
        with self._cv:
            self.writing = False
            self._cv.notify_all()


_reports_lock = threading.Lock()


class JobContext:
    """What a handler gets about the job it runs (also from :func:`current_job`).

    Attributes: ``id``, ``queue``, ``payload``, ``attempts`` (also
    ``attempt``: this run included), ``max_attempts``, ``enqueued_at`` and
    ``claimed_at`` (epoch ms, database clock) and ``deadline`` (the current
    end of the lease, moved by each heartbeat). ``lease_lost``,
    ``lost_reason`` and ``timed_out`` say whether this run still holds its
    lease; :meth:`check` and :meth:`sleep` raise :class:`LeaseLost` once it
    does not. ``metadata`` is the job's metadata (a dict set at enqueue, ``{}``
    when none; its ``"tags"`` list included). :meth:`progress` reports how far
    the run got. The receipt is deliberately not here: only the worker settles
    the job.
    """

    __slots__ = (
        "id", "queue", "payload", "attempts", "max_attempts", "enqueued_at", "claimed_at", "metadata", "_lease",
        "_reports", "_writer", "_upstream",
    )  # fmt: skip

    def __init__(
        self,
        *,
        id: str,
        queue: str,
        payload: Any,
        attempts: int,
        max_attempts: int,
        deadline: int,
        enqueued_at: int,
        claimed_at: int | None = None,
        lease: LeaseState | None = None,
        metadata: dict | None = None,
    ):
        self.id = id
        self.queue = queue
        self.payload = payload
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.enqueued_at = enqueued_at
        self.claimed_at = claimed_at
        self.metadata = {} if metadata is None else metadata
        self._lease = lease if lease is not None else LeaseState(deadline)
        #: The run's :class:`ProgressReports`, made by the first :meth:`progress` call.
        self._reports: ProgressReports | None = None
        #: Woken with the monotonic time a pending report may be written (the worker's heartbeat),
        #: or ``None`` outside a worker: reports are then only kept (:attr:`reported`).
        self._writer: Any = None
        #: The results of the job's dependencies, read by the first :attr:`upstream` / :meth:`aupstream`.
        self._upstream: Any = None

    @classmethod
    def from_claim(cls, claimed: ClaimedJob, lease: LeaseState | None = None) -> JobContext:
        """The context of a freshly claimed job (everything but its receipt)."""
        if cls is JobContext and lease is not None:
            # A worker makes one per claimed job: the slots are filled here as __init__ fills
            # them, without its keyword call.
            context = _new_context(cls)
            context.id = claimed.id
            context.queue = claimed.queue
            context.payload = claimed.payload
            context.attempts = claimed.attempts
            context.max_attempts = claimed.max_attempts
            context.enqueued_at = claimed.enqueued_at
            context.claimed_at = claimed.claimed_at
            metadata = claimed.metadata
            context.metadata = {} if metadata is None else metadata
            context._lease = lease
            context._reports = None
            context._writer = None
            context._upstream = None
            return context
        return cls(
            id=claimed.id,
            queue=claimed.queue,
            payload=claimed.payload,
            attempts=claimed.attempts,
            max_attempts=claimed.max_attempts,
            deadline=claimed.deadline,
            enqueued_at=claimed.enqueued_at,
            claimed_at=claimed.claimed_at,
            lease=lease,
            metadata=claimed.metadata,
        )

    @property
    def attempt(self) -> int:
        """The number of this run (1 for the first claim)."""
        return self.attempts

    @property
    def deadline(self) -> int:
        """The lease's current deadline (epoch ms, database clock); valid strictly before it."""
        return self._lease.deadline

    @property
    def lease_lost(self) -> bool:
        """True once this run no longer holds the job's lease (its result will not be stored)."""
        return self._lease.is_lost()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (see :class:`LeaseLost`), or ``None`` while it is held."""
        return self._lease.lost_reason()

    @property
    def timed_out(self) -> bool:
        """True once the job ran past its ``timeout_ms``."""
        return self._lease.lost_reason() == "timeout"

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease was lost; call it between the steps of a long job."""
        reason = self._lease.lost_reason()
        if reason is not None:
            raise LeaseLost(reason)

    def progress(self, value: float, message: str = "") -> None:
        """Report how far this run got: ``value`` a percentage (0–100), ``message`` a short text.

        ``value`` is a finite number from 0 to 100 (``int`` or ``float``);
        ``message`` a string of at most 200 characters without NUL. The
        worker stores the report with the running job (``get``'s
        ``progress``, ``progress_message`` and ``progress_at``): the first
        report at once, then at most one write per second per job, the
        latest report of each second (written by the heartbeat thread, so the
        handler never waits for the database). A report still unwritten when
        the handler returns is written before the job is settled. Nothing is
        written once the lease is lost. Cheap to call often: a report
        between writes costs a lock, not a round trip.

        Raises :class:`~django_fq.exceptions.InvalidArgument` (field
        ``progress`` or ``message``) for a bad value; nothing is kept then.
        """
        report = validation.progress(value, message)
        reports = self._reports
        if reports is None:
            with _reports_lock:  # a handler's own threads may report too: one ProgressReports per run
                if self._reports is None:
                    self._reports = ProgressReports()
                reports = self._reports
        due = reports.put(report)
        writer = self._writer
        if due is not None and writer is not None:
            writer.wake_before(due)

    @property
    def reported(self) -> tuple[float, str] | None:
        """The latest ``(progress, message)`` this run reported (written or not yet), or ``None``."""
        reports = self._reports
        return reports.last if reports is not None else None

    @property
    def upstream(self):
        """The results of the jobs this job depends on: a :class:`~django_fq.services.results.Upstream`.

        A read-only mapping ``key → result``: the key is the edge's name (a
        workflow step's name, ``Workflow.step(name=…)``) or, for an edge
        without one, the dependency's job id (``upstream[job_id]`` finds a
        named one too). A dependency that did not succeed (dead or cancelled
        under an ``on_failure="run"`` edge) has the result ``None``;
        ``upstream.entry(key).state`` says which. Read from the database on
        first access, in one query, then kept for this run; empty for a job
        without dependencies. In an ``async def`` handler use
        :meth:`aupstream` (a query on the event loop is refused by Django).

        Raises :class:`~django_fq.exceptions.ResultsTooLarge` when the
        results together pass 32 MiB (the claim limit, docs/reference/semantics.md §5).
        """
        if self._upstream is None:
            from ..services.upstream import load

            self._upstream = load(self.id)
        return self._upstream

    async def aupstream(self):
        """:attr:`upstream` for an ``async def`` handler: the query runs on a thread (``sync_to_async``)."""
        if self._upstream is None:
            from asgiref.sync import sync_to_async

            from ..services.upstream import load

            self._upstream = await sync_to_async(load)(self.id)
        return self._upstream

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking at once (with :class:`LeaseLost`) if the lease is lost."""
        give_up = time.monotonic() + max(0.0, seconds)
        while True:
            self.check()
            now = time.monotonic()
            if now >= give_up:
                return
            self._lease.lost.wait(min(give_up, self._lease.expires_mono) - now)

    async def asleep(self, seconds: float) -> None:
        """:meth:`sleep` for an ``async def`` handler: await up to ``seconds`` on the event loop.

        Raises :class:`LeaseLost` if the lease is lost before or when the time is up. A lost
        lease also cancels an async handler's task (``asyncio.CancelledError`` at its current
        ``await``, this one included): see docs/how-to/async-handlers.md.
        """
        give_up = time.monotonic() + max(0.0, seconds)
        while True:
            self.check()
            now = time.monotonic()
            if now >= give_up:
                return
            await asyncio.sleep(min(give_up, self._lease.expires_mono) - now)

    def __repr__(self) -> str:
        return f"JobContext(id={self.id!r}, queue={self.queue!r}, attempt={self.attempts}/{self.max_attempts})"


_new_context = object.__new__

_local = threading.local()
#: The job of an async handler: one per asyncio task (a thread-local would be shared by every
#: task of the event loop's thread); ``sync_to_async`` carries it into the ORM's thread.
_task_job: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("fq_job", default=None)


def current_job() -> JobContext | None:
    """The context of the job the calling thread (or asyncio task) runs for the worker, or ``None`` outside a handler."""
    job = _task_job.get()
    if job is not None:
        return job
    return getattr(_local, "job", None)


def set_current(context: JobContext | None) -> None:
    """Make ``context`` what :func:`current_job` returns on the calling thread (``None`` clears it)."""
    _local.job = context


def set_current_task(context: JobContext | None) -> contextvars.Token:
    """Make ``context`` what :func:`current_job` returns in the calling asyncio task; return the reset token."""
    return _task_job.set(context)
