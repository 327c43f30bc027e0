"""The worker loop behind ``manage.py fq_worker``: claim a job, run its handler, settle it.

The worker is a client of :mod:`django_fq.services` like any other: it never
touches the models or SQL itself. One pass of the loop goes over the served
queues in turn, claims one job from each (so a busy queue cannot keep a
small one waiting for more than one job), runs the queue's handler and
settles the lease:

* the handler returns            -> ``ack`` with the return value as result
  (a value that cannot be stored as JSON becomes a ``nack`` with a clear error);
* it raises :class:`~django_fq.exceptions.PermanentFailure` -> ``nack(permanent=True)``:
  the job is dead at once;
* it raises anything else        -> ``nack`` with the exception text and traceback.

Between passes a reaper step (``services.reap``) turns leases whose holder
vanished into failed attempts, so their jobs run again even when nobody
claims from their queue. When a pass finds no work the worker sleeps for the
poll interval.

Handlers receive a :class:`JobContext`, never the receipt: the receipt stays
inside the worker, is left out of every ``repr`` and log line, and any
receipt-shaped text that still reaches the worker's logger is masked.

This first version runs one job at a time in the calling thread. The pieces
are kept separate (:meth:`Worker.claim_next`, :meth:`Worker.execute`,
:meth:`Worker.settle`, :meth:`Worker.reap_if_due`, :meth:`Worker.idle_wait`,
:meth:`Worker.stop`) so that parallel execution, heartbeats, wakeups and
signal handling can be layered on without changing what each step means.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from . import handlers as registry
from . import services
from .exceptions import FqError, InvalidArgument, InvalidReceipt, PermanentFailure, QueueNotFound
from .types import ClaimedJob, SettleResult

log = logging.getLogger("django_fq.worker")

#: Anything shaped like a receipt (``fq1.<job>.<generation>.<secret>``), masked in log lines.
_RECEIPT_TEXT = re.compile(r"fq1\.[0-9A-Za-z_.\-]+")
#: Longest exception message repeated in a log line (the full text goes into the job's error).
_LOG_MESSAGE_CHARS = 200
#: Pause after an unexpected error of the loop itself (claim or reap failed), growing to the cap.
_ERROR_BACKOFF_S, _ERROR_BACKOFF_MAX_S = 0.5, 10.0


class WorkerConfigError(ValueError):
    """The worker cannot start as configured (no handler for a queue, nothing to serve)."""


def make_worker_id() -> str:
    """A worker id for leases and logs: ``hostname:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class ReceiptMaskingFilter(logging.Filter):
    """Mask receipt-shaped text in a log record (defence in depth: the worker never logs one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "fq1." in message:
            record.msg = _RECEIPT_TEXT.sub("fq1.[masked]", message)
            record.args = None
        return True


if not any(isinstance(f, ReceiptMaskingFilter) for f in log.filters):
    log.addFilter(ReceiptMaskingFilter())


class JobContext:
    """What a handler gets about the job it runs.

    Attributes: ``id``, ``queue``, ``payload``, ``attempts`` (this run
    included), ``max_attempts``, ``deadline`` (lease end, epoch ms, database
    clock) and ``enqueued_at`` (epoch ms). The receipt is deliberately not
    here: only the worker settles the job.
    """

    __slots__ = ("id", "queue", "payload", "attempts", "max_attempts", "deadline", "enqueued_at")

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
    ):
        self.id = id
        self.queue = queue
        self.payload = payload
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.deadline = deadline
        self.enqueued_at = enqueued_at

    @classmethod
    def from_claim(cls, claimed: ClaimedJob) -> JobContext:
        """The context of a freshly claimed job (everything but its receipt)."""
        return cls(
            id=claimed.id,
            queue=claimed.queue,
            payload=claimed.payload,
            attempts=claimed.attempts,
            max_attempts=claimed.max_attempts,
            deadline=claimed.deadline,
            enqueued_at=claimed.enqueued_at,
        )

    def __repr__(self) -> str:
        return f"JobContext(id={self.id!r}, queue={self.queue!r}, attempt={self.attempts}/{self.max_attempts})"


@dataclass(frozen=True)
class Outcome:
    """How one run of a handler ended, before settling.

    ``kind`` is ``ok`` (``result`` holds the return value), ``failed`` or
    ``permanent`` (``error`` holds the text to store: message + traceback,
    ``summary`` a one-line version for the log).
    """

    kind: str
    result: Any = None
    error: str = ""
    summary: str = ""
    elapsed_ms: int = 0


@dataclass
class WorkerStats:
    """Counts of what a worker did: jobs acked, jobs failed (nacked), settles that were refused."""

    ok: int = 0
    failed: int = 0
    settle_errors: int = 0

    @property
    def jobs(self) -> int:
        """Jobs run to the end of their handler (whatever the outcome)."""
        return self.ok + self.failed + self.settle_errors


class Worker:
    """Serve ``queues`` with their registered handlers until stopped.

    Args:
        queues: queue names to serve; ``None`` or empty serves every queue with
            a registered handler. A queue without a handler is a
            :class:`WorkerConfigError`.
        visibility_ms: lease length of each claim; ``None`` uses each queue's policy.
        poll_interval_ms: sleep when a pass found no work.
        reaper_interval_ms: run ``services.reap()`` at most this often.
        reaper: ``False`` disables the reaper step.
        burst: return as soon as one whole pass finds nothing eligible.
        max_jobs: return after this many jobs (``None``: no limit).
        worker_id: id recorded on leases; default ``hostname:pid:random``.
        handlers: ``{queue: callable}`` to use instead of the registry (tests, embedding).
    """

    def __init__(
        self,
        queues: Iterable[str] | None = None,
        *,
        visibility_ms: int | None = None,
        poll_interval_ms: int = 200,
        reaper_interval_ms: int = 1000,
        reaper: bool = True,
        burst: bool = False,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        handlers: dict[str, Callable] | None = None,
    ):
        known = registry.registered() if handlers is None else dict(handlers)
        wanted = list(dict.fromkeys(queues or ()))
        if not wanted:
            wanted = sorted(known)
            if not wanted:
                raise WorkerConfigError("no handlers are registered, so there is no queue to serve")
        missing = [q for q in wanted if q not in known]
        if missing:
            raise WorkerConfigError(f"no handler is registered for queue(s): {', '.join(missing)}")
        self.queues: list[str] = wanted
        self.handlers: dict[str, Callable] = {q: known[q] for q in wanted}
        self.visibility_ms = visibility_ms
        self.poll_interval_s = max(0, poll_interval_ms) / 1000
        self.reaper_interval_s = max(0, reaper_interval_ms) / 1000
        self.reaper = reaper
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or make_worker_id()
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._next_reap = 0.0  # monotonic time; 0 makes the first pass reap
        self._error_backoff_s = 0.0

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Run passes until stopped, out of work (``burst``) or at ``max_jobs``; return the counts."""
        log.info(
            "worker %s starting: queues=%s burst=%s reaper=%s",
            self.worker_id,
            ",".join(self.queues),
            self.burst,
            self.reaper,
        )
        reason = "stopped"
        try:
            while not self._stop.is_set():
                if self._limit_reached():
                    reason = "max jobs reached"
                    break
                try:
                    self.reap_if_due()
                    ran = self.run_pass()
                except DatabaseError as exc:
                    if self.burst:
                        raise
                    self._after_loop_error(exc)
                    continue
                self._error_backoff_s = 0.0
                if ran:
                    continue
                if self.burst:
                    reason = "nothing left to do"
                    break
                self.idle_wait(self.poll_interval_s)
        finally:
            log.info(
                "worker %s stopping (%s): %d ok, %d failed, %d settle errors",
                self.worker_id,
                reason,
                self.stats.ok,
                self.stats.failed,
                self.stats.settle_errors,
            )
        return self.stats

    def run_pass(self) -> int:
        """Claim and run at most one job of each served queue; return how many jobs ran."""
        ran = 0
        for queue in self.queues:
            if self._stop.is_set() or self._limit_reached():
                break
            claimed = self.claim_next(queue)
            if claimed is None:
                continue
            outcome = self.execute(claimed)
            self.settle(claimed, outcome)
            ran += 1
        return ran

    def stop(self) -> None:
        """Ask the loop to end after the job in hand (safe from another thread or a signal handler)."""
        self._stop.set()

    def idle_wait(self, seconds: float) -> None:
        """Sleep while there is no work; returns early when :meth:`stop` is called."""
        self._stop.wait(seconds)

    def reap_if_due(self) -> None:
        """Run a reaper step when the reaper is on and its interval has passed."""
        if not self.reaper or time.monotonic() < self._next_reap:
            return
        self._next_reap = time.monotonic() + self.reaper_interval_s
        reaped = services.reap()
        services.fold_counters()
        if reaped.expired or reaped.timed_out:
            log.info(
                "reaper: %d lease(s) expired, %d timed out, %d job(s) dead",
                reaped.expired,
                reaped.timed_out,
                reaped.dead,
            )

    # --- one job --------------------------------------------------------------------------

    def claim_next(self, queue: str) -> ClaimedJob | None:
        """Claim one eligible job of ``queue``, or ``None`` (also when the queue does not exist yet)."""
        try:
            jobs = services.claim(queue, count=1, visibility_ms=self.visibility_ms, worker=self.worker_id)
        except QueueNotFound:
            log.debug("queue %s does not exist yet", queue)
            return None
        return jobs[0] if jobs else None

    def execute(self, claimed: ClaimedJob) -> Outcome:
        """Run the handler of ``claimed.queue`` on the job's context; never raises an ``Exception``."""
        handler = self.handlers[claimed.queue]
        context = JobContext.from_claim(claimed)
        started = time.monotonic()
        try:
            result = handler(context)
        except PermanentFailure as exc:
            return Outcome("permanent", error=_error_text(exc), summary=_summary(exc), elapsed_ms=_since(started))
        except Exception as exc:
            return Outcome("failed", error=_error_text(exc), summary=_summary(exc), elapsed_ms=_since(started))
        return Outcome("ok", result=result, elapsed_ms=_since(started))

    def settle(self, claimed: ClaimedJob, outcome: Outcome) -> SettleResult | None:
        """Ack or nack ``claimed`` according to ``outcome``; log it; count it.

        A refused settle (the lease expired, the job was cancelled meanwhile,
        …) is logged and counted, never raised: the job's fate is then decided
        elsewhere (reaper, cancel).
        """
        where = f"job {claimed.id} queue={claimed.queue} attempt={claimed.attempts}/{claimed.max_attempts}"
        try:
            if outcome.kind == "ok":
                try:
                    settled = services.ack(claimed.queue, claimed.receipt, result=outcome.result)
                except InvalidArgument as exc:
                    if exc.field != "result":
                        raise
                    # The handler succeeded but its return value cannot be stored.
                    error = f"the handler's return value cannot be stored as the job's result: {exc.message}"
                    outcome = Outcome("failed", error=error, summary=error, elapsed_ms=outcome.elapsed_ms)
                else:
                    self.stats.ok += 1
                    log.info("%s done in %d ms", where, outcome.elapsed_ms)
                    return settled
            settled = services.nack(
                claimed.queue, claimed.receipt, error=outcome.error, permanent=outcome.kind == "permanent"
            )
        except InvalidReceipt as exc:
            self.stats.settle_errors += 1
            log.warning(
                "%s finished in %d ms but could not be settled (%s): %s",
                where,
                outcome.elapsed_ms,
                exc.code,
                exc.message,
            )
            return None
        except FqError as exc:
            self.stats.settle_errors += 1
            log.error("%s could not be settled (%s): %s", where, exc.code, exc.message)
            return None
        self.stats.failed += 1
        after = settled.state if settled.run_at is None else f"{settled.state}, next run at {settled.run_at}"
        log.warning(
            "%s failed in %d ms%s -> %s: %s",
            where,
            outcome.elapsed_ms,
            " (permanent)" if outcome.kind == "permanent" else "",
            after,
            outcome.summary,
        )
        return settled

    # --- helpers ----------------------------------------------------------------------------

    def _limit_reached(self) -> bool:
        return self.max_jobs is not None and self.stats.jobs >= self.max_jobs

    def _after_loop_error(self, exc: Exception) -> None:
        """Log a failed claim/reap, drop a broken connection, and back off before the next pass."""
        from django.db import connections

        from . import conf

        self._error_backoff_s = min(_ERROR_BACKOFF_MAX_S, max(_ERROR_BACKOFF_S, self._error_backoff_s * 2))
        log.error(
            "worker %s: database error, retrying in %.1f s: %s",
            self.worker_id,
            self._error_backoff_s,
            _first_line(str(exc)),
        )
        try:
            connections[conf.database()].close_if_unusable_or_obsolete()
        except Exception:  # pragma: no cover - closing a dead connection may fail too
            pass
        self.idle_wait(self._error_backoff_s)


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= _LOG_MESSAGE_CHARS else line[: _LOG_MESSAGE_CHARS - 1] + "…"


def _summary(exc: BaseException) -> str:
    """``Type: first line of the message`` for a log line."""
    message = _first_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _error_text(exc: BaseException) -> str:
    """What a failed run stores: ``Type: message``, then the full traceback."""
    message = str(exc)
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return head + "\n\n" + "".join(traceback.format_exception(exc))
