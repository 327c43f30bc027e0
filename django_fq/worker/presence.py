"""The worker's row in the worker registry: registered at start, one heartbeat per interval, deleted at shutdown.

What an operator sees in ``manage.py fq workers``, ``GET workers/``, the
admin's Workers page and ``fq_workers{state}`` (docs/admin.md "Workers").
:class:`Presence` writes, on each database alias the worker serves
(``FQ_QUEUE_DATABASES``; the one database otherwise):

* at start (:meth:`Presence.register`, before the ``worker.start`` log line):
  one upsert of the row: worker id, host, pid, the queues served on that
  alias, concurrency, pool kind, version, ``started_at`` and a first heartbeat;
* every ``FQ_WORKER_HEARTBEAT_MS`` (default 10 s), from a thread of its own
  (``fq-presence``, with its own connection, so a slow beat never delays a
  lease extend): one ``UPDATE`` of ``heartbeat_at`` and ``running``. Never per
  job: the claim and ack paths do not touch the table;
* at a clean shutdown (:meth:`Presence.stop`, after the jobs were settled or
  released): one ``DELETE``.

A worker killed with SIGKILL, or cut off from its database, leaves its row
behind: it is shown as gone once its heartbeat is older than
:data:`~django_fq.services.workers.STALE_BEATS` intervals and pruned an hour
after that. A database error never stops the worker: it is logged once
(``worker.db_error step=presence``), and the next beat tries again
(registering again when the row is missing). ``FQ_WORKER_HEARTBEAT_MS = 0``
writes no row at all.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from .. import __version__, conf, db, routing, storage
from .dbconn import is_db_error
from .logs import emit, summary

if TYPE_CHECKING:
    from .core import Worker

#: The ``pool`` value recorded for each of django-fq's runner pools (another pool: its class name).
POOL_KINDS = {
    "ThreadPool": "threads",
    "AsyncioPool": "asyncio",
    "SplitPool": "threads+asyncio",
    "ProcessPool": "processes",
}


def pool_kind(worker: Worker) -> str:
    """What runs ``worker``'s handlers, as the registry records it (at most 40 characters)."""
    name = type(worker.pool).__name__
    return POOL_KINDS.get(name, name)[:40]


class Presence:
    """The registry rows of one worker: one per database alias it serves."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.interval_ms = conf.worker_heartbeat_ms()
        self.host = socket.gethostname()[:255]
        self.pid = os.getpid()
        #: ``{alias: comma-separated queues}``; alias ``None``: the current one (no FQ_QUEUE_DATABASES).
        groups = routing.group_by_alias(worker.queues) if worker.aliases else {None: worker.queues}
        self.queues: dict[str | None, str] = {alias: ",".join(names) for alias, names in groups.items()}
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._failing = False
        self.thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_ms > 0

    # --- the rows ----------------------------------------------------------------------------

    def _each_alias(self, step: str, fn) -> None:
        """Run ``fn(conn)`` on every alias served; a database error is logged (once while it lasts), never raised."""
        failed = False
        for alias, queues in self.queues.items():
            try:
                if alias is None:
                    fn(db.connection(), queues)
                else:
                    with routing.using(alias):
                        fn(db.connection(), queues)
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                failed = True
                if not self._failing:
                    emit(
                        logging.WARNING, "worker.db_error", worker=self.worker.worker_id, step=step, error=summary(exc)
                    )
                try:
                    db.connection().close()  # reconnects on the next beat
                except Exception:  # noqa: BLE001 - closing a broken connection may fail too
                    pass
        if self._failing and not failed:
            emit(logging.WARNING, "worker.reconnected", worker=self.worker.worker_id, step=step)
        self._failing = failed

    def _register(self, conn, queues: str) -> None:
        w = self.worker
        row = (
            w.worker_id,
            self.host,
            self.pid,
            queues,
            w.concurrency,
            self.running(),
            pool_kind(w),
            __version__[:40],
            self.interval_ms,
        )
        started_ago = int((time.monotonic() - self._started) * 1000)
        storage.for_connection(conn).register_worker(conn, now=db.now_sql(conn), row=row, started_ago_ms=started_ago)

    def _beat(self, conn, queues: str) -> None:
        store = storage.for_connection(conn)
        beat = store.beat_worker(
            conn, now=db.now_sql(conn), worker_id=self.worker.worker_id, host=self.host, pid=self.pid, running=self.running()
        )
        if not beat:
            self._register(conn, queues)  # pruned, or deleted by hand: the worker is alive, so say so

    def _unregister(self, conn, queues: str) -> None:
        storage.for_connection(conn).unregister_worker(
            conn, worker_id=self.worker.worker_id, host=self.host, pid=self.pid
        )

    def running(self) -> int:
        """Jobs a runner has started and not yet finished settling (jobs claimed ahead not counted)."""
        hand = self.worker.hand
        with hand.lock:
            return sum(1 for r in hand.jobs.values() if r.begun)

    # --- the life of the worker -------------------------------------------------------------

    def register(self) -> None:
        """Write the rows now (on the calling thread: the claim loop's, before the worker claims)."""
        self._started = time.monotonic()
        if self.enabled:
            self._each_alias("presence", self._register)

    def start(self) -> None:
        """Start the heartbeat thread (after :meth:`register`)."""
        if self.enabled:
            self.thread = threading.Thread(target=self._loop, name="fq-presence", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_ms / 1000):
                try:
                    self._each_alias("presence", self._beat)
                except Exception:  # a bug here must not end the beats (nor the worker)
                    logging.getLogger("django_fq.worker").exception("presence heartbeat failed")
        finally:
            connections.close_all()

    def stop(self) -> None:
        """End the heartbeat thread and delete the rows (a clean shutdown: the jobs were settled or released)."""
        if not self.enabled:
            return
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        self._each_alias("presence", self._unregister)
