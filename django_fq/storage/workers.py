"""The SQL of the worker registry (:class:`~django_fq.models.WorkerProcess`, issue 19), for every backend.

A mixin of :class:`~django_fq.storage.base.Store`: one statement per method,
run in autocommit by the worker's presence thread
(:mod:`django_fq.worker.presence`) and by the readers
(:func:`django_fq.services.workers`). The upsert is ``INSERT … ON CONFLICT``
on PostgreSQL and SQLite; :class:`~django_fq.storage.mysql.MysqlStore`
overrides it with ``ON DUPLICATE KEY UPDATE``. Every instant is the database
clock (``now``: :func:`django_fq.db.now_sql`), and whether a worker is *live*
is decided in the SQL against that clock, never in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The registry's table (``WorkerProcess._meta.db_table``).
WORKER_TABLE = "django_fq_worker"

#: The columns a registration writes, in the order of :meth:`WorkerSql.register_worker`'s ``row``
#: (``started_at`` and ``heartbeat_at`` come from the clock, not the row).
REGISTER_COLUMNS = ("worker_id", "host", "pid", "queues", "concurrency", "running", "pool", "version", "heartbeat_ms")

#: What :meth:`WorkerSql.list_workers` returns per row, in this order.
LISTED_COLUMNS = (
    "worker_id", "host", "pid", "queues", "concurrency", "running", "pool", "version", "started_at",
    "heartbeat_at", "heartbeat_ms", "live", "age_ms",
)  # fmt: skip


class WorkerSql:
    """Register, beat, list, unregister and prune worker rows (one round trip each)."""

    def _register_values(self, now: str) -> str:
        # started_at: the clock less how long ago the worker started (a re-registration after the
        # row was pruned keeps the true start); heartbeat_at: the clock.
        marks = ", ".join(["%s"] * (len(REGISTER_COLUMNS)))
        return f"({marks}, {now} - %s, {now})"

    def register_worker(self, conn: Any, *, now: str, row: Sequence[Any], started_ago_ms: int) -> None:
        """Insert or replace the row of worker ``row[0]``: its facts, ``started_at``, and a first heartbeat.

        ``row`` holds the values of :data:`REGISTER_COLUMNS`; ``started_ago_ms``
        how long ago the worker started (its own monotonic clock), so
        ``started_at`` is the database clock less that. A row of the same
        worker id (a worker restarted with the same ``--worker-id``) is
        overwritten whole.
        """
        columns = ", ".join((*REGISTER_COLUMNS, "started_at", "heartbeat_at"))
        updates = ", ".join(f"{c} = excluded.{c}" for c in (*REGISTER_COLUMNS[1:], "started_at", "heartbeat_at"))
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {WORKER_TABLE} ({columns}) VALUES {self._register_values(now)} "
                f"ON CONFLICT (worker_id) DO UPDATE SET {updates}",
                [*row, started_ago_ms],
            )

    def beat_worker(self, conn: Any, *, now: str, worker_id: str, host: str, pid: int, running: int) -> bool:
        """Move the heartbeat of this process's row of ``worker_id`` to the clock and store ``running``; False: no such row.

        The one statement a worker issues per heartbeat interval (not per
        job). Host and pid must match, as for :meth:`unregister_worker`: a
        process never keeps alive the row of another that took over its
        worker id (which would show that one live after it died). A False
        answer (the row was pruned while the worker could not reach the
        database, deleted by hand, or taken over) makes the worker register again.
        """
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {WORKER_TABLE} SET heartbeat_at = {now}, running = %s "
                "WHERE worker_id = %s AND host = %s AND pid = %s",
                [running, worker_id, host, pid],
            )
            return cur.rowcount > 0

    def unregister_worker(self, conn: Any, *, worker_id: str, host: str, pid: int) -> int:
        """Delete the row of ``worker_id`` written by this process (``host``, ``pid``); the rows deleted.

        Host and pid must match, so a worker shutting down never deletes the row
        of a newer process that took over its worker id.
        """
        with conn.cursor() as cur:
            cur.execute(
                f"DELETE FROM {WORKER_TABLE} WHERE worker_id = %s AND host = %s AND pid = %s", [worker_id, host, pid]
            )
            return cur.rowcount

    def list_workers(self, conn: Any, *, now: str, stale_beats: int) -> list[tuple]:
        """Every worker row as :data:`LISTED_COLUMNS`, by host, pid and worker id.

        ``live`` is 1 while the heartbeat is at most ``stale_beats`` of the
        row's own intervals old, else 0 (gone); ``age_ms`` is the
        heartbeat's age. Both against one reading of the database clock.
        """
        columns = ", ".join(f"w.{c}" for c in LISTED_COLUMNS[:-2])
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT {columns}, CASE WHEN w.heartbeat_at >= c.t - %s * w.heartbeat_ms THEN 1 ELSE 0 END, "
                f"c.t - w.heartbeat_at FROM {WORKER_TABLE} w CROSS JOIN (SELECT {now} AS t) c "
                f"ORDER BY w.host, w.pid, w.worker_id",
                [stale_beats],
            )
            return cur.fetchall()

    def prune_workers(self, conn: Any, *, now: str, stale_beats: int, keep_ms: int) -> int:
        """Delete the rows of workers gone for ``keep_ms`` or more (heartbeat older than ``stale_beats`` intervals + ``keep_ms``).

        Returns the rows deleted. One statement; the table holds a row per
        worker process, so it is read whole.
        """
        with conn.cursor() as cur:
            cur.execute(
                f"DELETE FROM {WORKER_TABLE} WHERE heartbeat_at < {now} - %s - %s * heartbeat_ms",
                [keep_ms, stale_beats],
            )
            return cur.rowcount
