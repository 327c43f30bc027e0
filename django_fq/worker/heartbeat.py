"""The heartbeat: one thread that extends the lease of every job in hand, and notices when one is lost.

Each running job's lease is extended every ``heartbeat_fraction`` (1/3) of
its visibility, so a job may run far longer than its lease while its worker
is alive and connected. When an extend is refused (the lease expired, was
taken by a newer claim, or the job was cancelled), or the lease's deadline
passed without a successful extend, or the job's own ``timeout_ms`` was
reached, the job's context is marked lost at once (:meth:`Heartbeat.lost`):
``current_job().lease_lost`` turns true and ``check()`` raises
:class:`~django_fq.exceptions.LeaseLost`. The worker then never settles that
run: the reaper, the canceller or the newer claim decides. A job that hit its
timeout is reaped on its queue promptly, so its failure is recorded without
waiting for the reaper's next round.

The thread also writes the handlers' progress reports
(:meth:`JobContext.progress <django_fq.worker.JobContext.progress>`): the
latest report of a job, at most once a second per job, and only while its
lease is held (docs/how-to/progress.md).

The thread sleeps until the next beat, deadline or due progress write of the
jobs in hand; the claim loop wakes it early (:meth:`Heartbeat.wake_before`)
only when newly claimed jobs need it sooner, a handler only when its report
is due sooner.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from .. import services
from ..exceptions import FqError, InvalidReceipt, QueueNotFound, ReceiptCancelled
from .dbconn import drop_connection, is_db_error
from .events import LeaseLostEvent
from .logs import emit, summary
from .state import Running

if TYPE_CHECKING:
    from .core import Worker

#: The worker's logger (the receipt mask is installed on it by :mod:`.logs`).
log = logging.getLogger("django_fq.worker")


class Heartbeat:
    """Extends the leases of one worker's jobs in hand from a thread of its own."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.hand = worker.hand
        self.fraction = worker.heartbeat_fraction
        self._cv = threading.Condition()  # wakes the thread: new jobs that need it sooner, stop
        self._dirty = False
        #: When the thread wakes next by itself (monotonic seconds; guarded by _cv);
        #: infinity while it is awake, as it may have looked at the jobs in hand already.
        self._next = math.inf
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="fq-heartbeat", daemon=True)
        self.thread.start()

    def poke(self) -> None:
        """Wake the thread now (a stop: it looks at ``worker.done``)."""
        with self._cv:
            self._dirty = True
            self._cv.notify_all()

    def wake_before(self, soonest: float) -> None:
        """New jobs need a beat (or their lease ends) at monotonic time ``soonest``: wake the thread if it sleeps past it.

        With leases of seconds it rarely does, and a needless wake-up competes
        with the runner threads that are starting the jobs just claimed.
        """
        with self._cv:
            if soonest < self._next:
                self._dirty = True
                self._cv.notify_all()

    def _loop(self) -> None:
        pending_reaps: list[tuple[float, str]] = []
        failing = False
        try:
            while not self.worker.done.is_set():
                with self._cv:
                    self._dirty = False
                now = time.monotonic()
                held = self.hand.held()
                wake = now + 1.0
                for running in held:
                    state = running.state
                    if now >= state.expires_mono:
                        reason = "timeout" if running.capped else "expired"
                        if self.lost(running, reason) and reason == "timeout":
                            slack = running.claim_end - running.claim_start
                            pending_reaps.append((state.expires_mono + slack + 0.05, running.claimed.queue))
                        continue
                    if not running.capped:
                        if now >= running.next_beat:
                            failing = self.beat(running, failing)
                        wake = min(wake, running.next_beat)
                    wake = min(wake, state.expires_mono)
                    reports = running.context._reports
                    if reports is not None and reports.pending is not None:
                        report = reports.take(time.monotonic())  # now, not the loop's start: writes >= 1 s apart
                        if report is not None:
                            self.write_progress(running, report)
                            reports.written()
                        if reports.pending is not None:
                            wake = min(wake, reports.due)
                for due, queue in list(pending_reaps):
                    if now >= due:
                        pending_reaps.remove((due, queue))
                        self.reap_queue(queue)
                    else:
                        wake = min(wake, due)
                with self._cv:
                    if not self.worker.done.is_set() and not self._dirty:
                        pause = max(0.005, wake - time.monotonic())
                        self._next = time.monotonic() + pause
                        self._cv.wait(pause)
                    self._next = math.inf
        finally:
            connections.close_all()

    def beat(self, running: Running, failing: bool) -> bool:
        """Extend one lease; return whether the database is failing."""
        claimed = running.claimed
        started = time.monotonic()
        try:
            deadline = services.extend(claimed.queue, claimed.receipt, visibility_ms=running.visibility_ms)
        except ReceiptCancelled:
            self.lost(running, "cancelled")
            return failing
        except InvalidReceipt:
            self.lost(running, "invalid_receipt")
            return failing
        except QueueNotFound:
            self.lost(running, "queue_deleted")
            return failing
        except Exception as exc:
            if not is_db_error(exc):
                log.exception("heartbeat failed")
            elif not failing:
                emit(logging.ERROR, "worker.db_error", worker=self.worker.worker_id, step="extend", error=summary(exc))
            drop_connection()
            # Try again soon; the lease counts as lost once its deadline may have passed.
            running.next_beat = time.monotonic() + min(1.0, max(0.02, running.visibility_ms / 10_000))
            return True
        if failing:
            emit(logging.WARNING, "worker.reconnected", worker=self.worker.worker_id, step="extend")
        # An uncapped extend reads the database clock no earlier than this bound; a deadline
        # below ``bound + visibility`` was cut at the job's timeout.
        bound = claimed.claimed_at + (started - running.claim_end) * 1000
        with self.hand.lock:
            if deadline < bound + running.visibility_ms - 2:
                running.capped = running.state.at_timeout = True
            if deadline > running.state.deadline:
                running.state.deadline = deadline
                running.state.expires_mono = running.local_time_of(deadline)
        running.next_beat = started + running.visibility_ms / 1000 * self.fraction
        return False

    def write_progress(self, running: Running, report: tuple[float, str]) -> bool:
        """Store one progress report of ``running`` on the calling thread (one ``UPDATE``); True if stored.

        ``report`` is ``(progress, message)``, validated by the handler's
        call. A refusal (the lease was lost, the job cancelled, the queue
        deleted) or a database error drops the report: the lease's own fate is
        the extend's to find out. Called by the heartbeat thread, and by the
        runner for the report still pending when the handler returned.
        """
        claimed = running.claimed
        try:
            services.report_progress(claimed.queue, claimed.receipt, report[0], report[1])
        except FqError:
            return False
        except Exception as exc:
            if not is_db_error(exc):
                log.exception("progress write failed")
            else:
                emit(logging.WARNING, "worker.db_error", worker=self.worker.worker_id, step="progress", error=summary(exc))
            drop_connection()
            return False
        return True

    def lost(self, running: Running, reason: str) -> bool:
        """Tell the handler its lease is gone (unless the job is being settled already)."""
        with self.hand.lock:
            if running.settling:
                return False
            first = running.state.mark_lost(reason)
        if first:
            level = logging.INFO if reason == "shutdown" else logging.WARNING
            event = "job.timeout" if reason == "timeout" else "job.lease_lost"
            emit(level, event, **running.where(), reason=reason, deadline=running.state.deadline)
            events = self.worker.events
            if events.wants(LeaseLostEvent):
                events.publish(LeaseLostEvent(self.worker, running.context, reason))
        return first

    def reap_queue(self, queue: str) -> None:
        """Record a timed-out job's failure promptly (the same as the reaper would)."""
        try:
            services.reap(queue)
        except QueueNotFound:
            pass
        except Exception as exc:
            if not is_db_error(exc):
                raise
            drop_connection()
