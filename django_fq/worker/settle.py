"""Settling one job: ack or nack a finished run, give a job back at shutdown; retry what the database dropped.

:meth:`Settler.settle` is the single place where a finished job's lease is
settled one by one (the completer settles plain successes in batches, see
:mod:`.completer`, through the same :meth:`Settler.call`). A settle whose
outcome is unknown (the connection dropped during ``ack``) is repeated with
the same receipt and arguments: the services answer an exact repeat with the
recorded outcome flagged as a replay, so retrying is safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .. import services
from ..exceptions import FqError, InvalidJson, InvalidReceipt, PayloadTooLarge, ReceiptCancelled, SnoozeLimit
from ..types import SettleResult
from .dbconn import drop_connection, is_db_error
from .events import JobSettled
from .logs import emit, summary
from .state import Outcome, Running

if TYPE_CHECKING:
    from .core import Worker

_T = TypeVar("_T")

#: How long a settle whose outcome is unknown is retried before the lease is left to expire (seconds).
SETTLE_RETRY_S = 120.0


class SettleAbandoned(Exception):
    """The database stayed unreachable for a whole settle retry window."""


class Settler:
    """Acks, nacks and releases the jobs of one worker, counting and logging each."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.hand = worker.hand

    def settle(self, running: Running, outcome: Outcome) -> SettleResult | None:
        """Settle one finished job: ack or nack it according to ``outcome``; log and count it.

        This is the single place where a finished job's lease is settled. A
        run whose lease is known to be lost is not settled at all. A refused
        settle (expired, cancelled, ...) is logged and counted, never raised.
        A database error is retried with the same arguments (a repeat is
        answered as a replay) until the outcome is known.
        """
        expired = running.state.lost_reason()
        if expired is not None and not running.state.lost.is_set():
            # The handler saw the deadline pass before the heartbeat thread did:
            # record the loss now, so it is logged like any other.
            self.worker.heartbeat.lost(running, expired)
        if not self.hand.take(running):
            return None  # released at shutdown meanwhile
        where = running.where()
        claimed = running.claimed
        reason = running.state.lost_reason() or (outcome.summary if outcome.kind == "lost" else None)
        if reason is not None:
            self.hand.count_lost(reason)
            emit(logging.WARNING, "job.not_settled", **where, ms=outcome.elapsed_ms, reason=f"lease_lost:{reason}")
            self.published(running, "not_settled", reason=f"lease_lost:{reason}")
            return None
        started = time.monotonic()
        try:
            if outcome.kind == "snooze":
                delay = outcome.delay_ms
                try:
                    settled = self.call(
                        running,
                        "release",
                        lambda: services.release(claimed.queue, claimed.receipt, error="snoozed", delay_ms=delay),
                    )
                except SnoozeLimit as exc:
                    # Snoozed as often as a job may be: this attempt fails (backoff, then dead).
                    outcome = Outcome("failed", error=exc.message, summary=exc.message, elapsed_ms=outcome.elapsed_ms)
                else:
                    self.hand.count("snoozed")
                    emit(logging.INFO, "job.snoozed", **where, ms=outcome.elapsed_ms, delay_ms=delay, run_at=settled.run_at)
                    self.published(running, "released", settled.state, started, reason="snoozed")
                    return settled
            if outcome.kind == "ok":
                try:
                    settled = self.call(running, "ack", lambda: services.ack(claimed.queue, claimed.receipt, result=outcome.result))
                except (InvalidJson, PayloadTooLarge) as exc:
                    # The handler succeeded but its return value cannot be stored.
                    error = f"the handler's return value cannot be stored as the job's result: {exc.message}"
                    outcome = Outcome("failed", error=error, summary=error, elapsed_ms=outcome.elapsed_ms)
                else:
                    self.hand.count("ok")
                    emit(logging.INFO, "job.acked", **where, ms=outcome.elapsed_ms, replay=settled.replay or None)
                    self.published(running, "acked", settled.state, started)
                    return settled
            permanent = outcome.kind == "permanent"
            delay = outcome.delay_ms if outcome.kind == "retry" else None  # RetryAfter: its delay, not the backoff
            settled = self.call(
                running,
                "nack",
                lambda: services.nack(
                    claimed.queue, claimed.receipt, delay_ms=delay, error=outcome.error, permanent=permanent
                ),
            )
        except ReceiptCancelled as exc:
            self.hand.count("settle_errors")
            emit(logging.WARNING, "job.cancelled", **where, ms=outcome.elapsed_ms, code=exc.code, detail="cancelled while it ran; not settled")
            self.published(running, "not_settled", started=started, reason=exc.code)
            return None
        except InvalidReceipt as exc:
            self.hand.count("settle_errors")
            emit(logging.WARNING, "job.not_settled", **where, ms=outcome.elapsed_ms, code=exc.code, reason=exc.message)
            self.published(running, "not_settled", started=started, reason=exc.code)
            return None
        except FqError as exc:
            self.hand.count("settle_errors")
            emit(logging.ERROR, "job.not_settled", **where, ms=outcome.elapsed_ms, code=exc.code, reason=exc.message)
            self.published(running, "not_settled", started=started, reason=exc.code)
            return None
        except SettleAbandoned as exc:
            self.hand.count("settle_errors")
            emit(logging.ERROR, "job.not_settled", **where, ms=outcome.elapsed_ms, reason=f"database unavailable: {exc}")
            self.published(running, "not_settled", started=started, reason="database unavailable")
            return None
        self.hand.count("failed")
        emit(
            logging.WARNING,
            "job.nacked",
            **where,
            ms=outcome.elapsed_ms,
            permanent=permanent or None,
            state=settled.state,
            run_at=settled.run_at,
            replay=settled.replay or None,
            error=outcome.summary,
        )
        self.published(running, "nacked", settled.state, started)
        return settled

    def published(
        self, running: Running, result: str, state: str = "", started: float | None = None, reason: str = "", ms: float | None = None
    ) -> None:
        """Publish the :class:`~django_fq.worker.events.JobSettled` of ``running`` (only when someone subscribed).

        ``started`` is the monotonic time (s) the settle call began; ``None`` when none was made (0 ms).
        ``ms``, when given, is the call's time (ms) itself (the completer's, once per ack batch).
        """
        events = self.worker.events
        if events.wants(JobSettled):
            if ms is None:
                ms = (time.monotonic() - started) * 1000 if started is not None else 0.0
            events.publish(JobSettled(self.worker, running.context, result, state, ms, reason))

    def call(self, running: Running, op: str, request: Callable[[], _T]) -> _T:
        """Run ``request`` (a settle named ``op``); on a database error close the connection and repeat it until the answer is known."""
        give_up = time.monotonic() + SETTLE_RETRY_S
        pause = 0.05
        tries = 0
        while True:
            tries += 1
            try:
                result = request()
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                drop_connection()
                if time.monotonic() + pause > give_up:
                    raise SettleAbandoned(summary(exc)) from exc
                emit(logging.WARNING, "job.settle_retry", **running.where(), op=op, tries=tries, retry_in_s=pause, error=summary(exc))
                time.sleep(pause)
                pause = min(2.0, pause * 2)
                continue
            if tries > 1:
                outcomes = result if isinstance(result, list) else [result]
                replay = any(getattr(r, "replay", False) for r in outcomes)
                emit(logging.WARNING, "worker.reconnected", worker=self.worker.worker_id, step=op, tries=tries, replay=replay)
            return result

    def release(self, running: Running, reason: str) -> None:
        """Give a job back: ready now, attempt not counted (``services.release``); tell its handler."""
        running.state.mark_lost(reason)
        claimed = running.claimed
        started = time.monotonic()
        for attempt in range(5):
            try:
                released = services.release(claimed.queue, claimed.receipt, error=reason)
            except InvalidReceipt as exc:
                emit(logging.WARNING, "job.not_released", **running.where(), code=exc.code, reason=exc.message)
                self.published(running, "not_settled", started=started, reason=exc.code)
                return
            except FqError as exc:
                emit(logging.ERROR, "job.not_released", **running.where(), code=exc.code, reason=exc.message)
                self.published(running, "not_settled", started=started, reason=exc.code)
                return
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                drop_connection()
                if attempt == 4:
                    emit(logging.ERROR, "job.not_released", **running.where(), reason=f"database unavailable: {summary(exc)}")
                    self.published(running, "not_settled", started=started, reason="database unavailable")
                    return
                time.sleep(0.2 * 2**attempt)
                continue
            self.hand.count("released")
            emit(logging.INFO, "job.released", **running.where(), reason=reason)
            self.published(running, "released", released.state, started, reason=reason)
            return
