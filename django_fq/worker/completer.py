"""The completer: one thread that acks finished jobs in batches (one ``ack_many`` per queue and batch).

A runner hands a plain success over (:meth:`Completer.hand_over`) instead of
acking it itself; the completer acks everything that finished while its
previous batch was in flight. No job waits for a timer: a lone job is acked
at once, and under load a batch forms by itself while the database answers
the previous one. A failure, a lost lease or a result that cannot be stored
is settled by the runner (:meth:`Settler.settle <django_fq.worker.settle.Settler.settle>`).
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from .. import conf, routing, services, storage, validation
from ..exceptions import FqError, InvalidJson, PayloadTooLarge, QueueNotFound, ReceiptCancelled
from .dbconn import tidy_connections
from .events import JobSettled
from .logs import emit, emit_jobs, summary
from .settle import SettleAbandoned
from .state import Outcome, Running

if TYPE_CHECKING:
    from .core import Worker

#: The worker's logger (the receipt mask is installed on it by :mod:`.logs`).
log = logging.getLogger("django_fq.worker")

#: Most jobs one ``ack_many`` call of the completer settles.
ACK_BATCH = 500
#: On a database with concurrent writers, an ack batch holds at most this fraction of the worker's
#: capacity (``--concurrency`` + ``--prefetch``): its slots free while the rest of the hand is still
#: being acked, so the claim loop's next claim (at a quarter of the slots free) goes out while the
#: completer's next ack is in flight, instead of after the whole previous claim was acked.
ACK_SHARE = 0.5


def ack_limit(worker: Worker, alias: str | None) -> int:
    """Most jobs one ``ack_many`` of a completer on database ``alias`` settles (``None``: ``FQ_DATABASE``).

    :data:`ACK_BATCH`, cut to :data:`ACK_SHARE` of ``worker.capacity`` (at least 1) unless the
    database is embedded (SQLite: one writer locks the whole file, so an ack overlapping a claim
    would only wait for its lock, and smaller acks would mean more write transactions per job).
    Never more jobs are leased than before: a slot frees only once its job's ack committed.
    """
    conn = connections[alias or (worker.aliases[0] if worker.aliases else conf.database())]
    if storage.for_connection(conn).embedded:
        return ACK_BATCH
    return max(1, min(ACK_BATCH, int(worker.capacity * ACK_SHARE)))


class Completer:
    """Acks the successes of one worker's runners in batches, from a thread of its own."""

    def __init__(self, worker: Worker, alias: str | None = None):
        self.worker = worker
        self.hand = worker.hand
        # Finished jobs waiting for the next ack_many batch.
        self._acks: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.thread: threading.Thread | None = None
        #: Most jobs one ack_many settles (see ack_limit).
        self.limit = ack_limit(worker, alias)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="fq-completer", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Ack what was handed over, then end the thread."""
        self._acks.put(None)

    def hand_over(self, seq: int, running: Running, outcome: Outcome) -> bool:
        """Hand a successful run to the completer thread, which acks in batches; False: settle it here.

        Only a plain success whose result can be stored goes to the batch; a
        failure, a lost lease or an unstorable result takes :meth:`settle`.
        """
        if not self._acceptable(running, outcome):
            return False
        self._acks.put([(seq, running, outcome)])
        return True

    def hand_over_many(self, entries: list[tuple[int, Running, Outcome]]) -> list[bool]:
        """:meth:`hand_over` for the successes of one batch handler call, queued as one unit.

        The completer acks a unit in one ``ack_many`` (docs/how-to/batch-handlers.md).
        Returns, per entry, whether the completer took it (False: settle it here).
        """
        taken = [self._acceptable(running, outcome) for _seq, running, outcome in entries]
        unit = [entry for entry, ok in zip(entries, taken, strict=True) if ok]
        if unit:
            self._acks.put(unit)
        return taken

    def _acceptable(self, running: Running, outcome: Outcome) -> bool:
        """Whether ``outcome`` may be acked in a batch; if so, the right to settle ``running`` is taken."""
        if outcome.kind != "ok" or running.state.lost_reason() is not None:
            return False
        if outcome.result is not None:
            try:
                validation.json_text(outcome.result, "result")
            except (InvalidJson, PayloadTooLarge):
                return False  # settle() turns it into a failed attempt with a clear error
        return self.hand.take(running)  # False: released at shutdown meanwhile; settle() sees that too

    def _loop(self) -> None:
        """Ack finished jobs in batches: everything that finished while the previous batch was in flight.

        No job waits for a timer: a lone job is acked at once, and under load a
        batch forms by itself while the database answers the previous one.
        """
        try:
            while True:
                item = self._acks.get()
                if item is None:
                    return
                # Each item is a unit: one job, or the successes of one batch handler call (kept whole).
                batch = list(item)
                limit = self.limit
                while len(batch) < limit:
                    try:
                        more = self._acks.get_nowait()
                    except queue_module.Empty:
                        break
                    if more is None:
                        self._acks.put(None)  # finish this batch, then stop
                        break
                    batch.extend(more)
                by_queue: dict[str, list] = {}
                for entry in batch:
                    by_queue.setdefault(entry[1].claimed.queue, []).append(entry)
                for queue_name, entries in by_queue.items():
                    try:
                        self._ack_batch(queue_name, entries)
                    except Exception as exc:  # the completer must survive anything
                        log.exception("worker internal error")
                        emit(logging.ERROR, "worker.internal_error", worker=self.worker.worker_id, step="ack", error=summary(exc))
                    finally:
                        self.hand.free([seq for seq, _, _ in entries])
                        tidy_connections()
        finally:
            connections.close_all()

    def _ack_batch(self, queue_name: str, entries: list) -> None:
        """Ack ``entries`` of one queue with one ``ack_many``; log and count each like :meth:`settle`."""
        pending = []
        for _seq, running, outcome in entries:
            reason = running.state.lost_reason()
            if reason is not None:  # the lease went away after the handler returned
                self.hand.count_lost(reason)
                emit(logging.WARNING, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, reason=f"lease_lost:{reason}")
                self.worker.settler.published(running, "not_settled", reason=f"lease_lost:{reason}")
            else:
                pending.append((running, outcome))
        if not pending:
            return
        pairs = [(r.claimed.receipt, o.result) for r, o in pending]
        # Jobs others depend on go straight to the ack that releases them (services.ack_many).
        flagged = [r.claimed.id for r, _ in pending if r.claimed.has_dependents]
        settler = self.worker.settler
        started = time.monotonic()
        try:
            results = self.worker.settler.call(pending[0][0], "ack", lambda: services.ack_many(queue_name, pairs, has_dependents=flagged))
        except SettleAbandoned as exc:
            self.hand.count("settle_errors", len(pending))
            for running, outcome in pending:
                emit(logging.ERROR, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, reason=f"database unavailable: {exc}")
                settler.published(running, "not_settled", started=started, reason="database unavailable")
            return
        except QueueNotFound as exc:
            self.hand.count("settle_errors", len(pending))
            for running, outcome in pending:
                emit(logging.ERROR, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, code=exc.code, reason=exc.message)
                settler.published(running, "not_settled", started=started, reason=exc.code)
            return
        # One figure for the whole call (docs/explanation/worker.md: an ack batch's call for each of its jobs).
        ms = (time.monotonic() - started) * 1000
        # Counted before the events, so a subscriber reading the worker's stats sees its job counted.
        self.hand.count("ok", sum(1 for settled in results if not isinstance(settled, FqError)))
        wants_settled = self.worker.events.wants(JobSettled)
        acked = []
        for (running, outcome), settled in zip(pending, results, strict=True):
            if isinstance(settled, ReceiptCancelled):
                self.hand.count("settle_errors")
                emit(logging.WARNING, "job.cancelled", **running.where(), ms=outcome.elapsed_ms, code=settled.code, detail="cancelled while it ran; not settled")
                settler.published(running, "not_settled", ms=ms, reason=settled.code)
            elif isinstance(settled, FqError):
                self.hand.count("settle_errors")
                emit(logging.WARNING, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, code=settled.code, reason=settled.message)
                settler.published(running, "not_settled", ms=ms, reason=settled.code)
            else:
                acked.append((running, {"ms": outcome.elapsed_ms, "replay": settled.replay or None}))
                if wants_settled:
                    settler.published(running, "acked", settled.state, ms=ms)
        # The batch's job.acked lines, written at once (django_fq.worker.logs.emit_jobs).
        emit_jobs(logging.INFO, "job.acked", acked)


class Completers:
    """One :class:`Completer` per database alias of the worker's queues (``FQ_QUEUE_DATABASES``), behind one face.

    A success goes to the completer of its queue's alias, so the acks of one
    database never wait behind a batch in flight on another (nor behind one
    that is down). Offers what the worker and the runners use of a
    :class:`Completer`: ``start``, ``stop``, ``hand_over``,
    ``hand_over_many``, ``thread`` (the first one's) and ``threads``.
    """

    def __init__(self, worker: Worker, aliases: list[str]):
        self.by_alias = {alias: Completer(worker, alias) for alias in aliases}
        self._first = next(iter(self.by_alias.values()))

    @property
    def thread(self) -> threading.Thread | None:
        return self._first.thread

    @property
    def threads(self) -> list[threading.Thread]:
        return [c.thread for c in self.by_alias.values() if c.thread is not None]

    def start(self) -> None:
        for alias, one in self.by_alias.items():
            one.start()
            if one.thread is not None:
                one.thread.name = f"fq-completer-{alias}"

    def stop(self) -> None:
        for one in self.by_alias.values():
            one.stop()

    def _of(self, running: Running) -> Completer:
        return self.by_alias.get(routing.alias_for(running.claimed.queue), self._first)

    def hand_over(self, seq: int, running: Running, outcome: Outcome) -> bool:
        """:meth:`Completer.hand_over` on the completer of the job's alias."""
        return self._of(running).hand_over(seq, running, outcome)

    def hand_over_many(self, entries: list[tuple[int, Running, Outcome]]) -> list[bool]:
        """:meth:`Completer.hand_over_many` on the completer of the entries' alias (one batch: one queue)."""
        if not entries:
            return []
        return self._of(entries[0][1]).hand_over_many(entries)
