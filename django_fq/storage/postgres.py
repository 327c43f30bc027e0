"""PostgreSQL: the store of a server database reached through psycopg 3.

Claims skip locked rows, an enqueue notifies idle workers (LISTEN/NOTIFY),
lease changes django-fq commits itself may skip the WAL flush, and the hot
statements are prepared on the server.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.db import transaction

from .base import Store

#: ``clock_timestamp()`` is the time at execution, not at transaction start.
NOW_SQL = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"

#: Runs of a hot statement on one connection before psycopg prepares it (psycopg's own default).
PREPARE_THRESHOLD = 5


class PostgresStore(Store):
    """PostgreSQL 14+ through Django's ``postgresql`` backend and psycopg 3."""

    vendor = "postgresql"
    supports_skip_locked = True
    supports_row_locks = True
    supports_listen_notify = True
    supports_partial_indexes = True
    supports_relaxed_commit = True
    supports_server_prepare = True
    embedded = False
    export_name = vendor
    key_share_sql = " FOR KEY SHARE"
    skip_locked_sql = " FOR UPDATE SKIP LOCKED"
    clock_sql = NOW_SQL

    def greatest_sql(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    @contextlib.contextmanager
    def write_atomic(self, conn: Any):
        with transaction.atomic(using=conn.alias):
            yield conn

    def take_write_lock(self, conn: Any, queue_name: str) -> None:
        return None  # row locks are taken by the statements themselves

    def relax_commit(self, conn: Any) -> None:
        with conn.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = off")

    def hot_cursor(self, conn: Any) -> Any:
        # Binds parameters on the server, so psycopg prepares a statement after
        # PREPARE_THRESHOLD runs on the connection (see django_fq.db.hot_cursor).
        from django.db.backends.postgresql.base import ServerBindingCursor

        conn.ensure_connection()
        pg = conn.connection
        if pg.prepare_threshold is None and "prepare_threshold" not in conn.settings_dict.get("OPTIONS", {}):
            # Django turns preparing off unless OPTIONS names a prepare_threshold. Its own
            # cursors bind on the client and never prepare, so this reaches only these
            # statements; an explicit OPTIONS["prepare_threshold"] (None: never) wins.
            pg.prepare_threshold = PREPARE_THRESHOLD
        with conn.wrap_database_errors:
            raw = ServerBindingCursor(pg)  # type: ignore[call-arg]  # psycopg's Cursor(connection)
        return conn._prepare_cursor(raw)

    def notify(self, conn: Any, channel: str, queue_name: str) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", [channel, queue_name])

    def release_connection(self, conn: Any) -> bool:
        # A connection is a server process (and maybe a pooler slot) held while idle.
        if conn.in_atomic_block or conn.connection is None:
            return False
        conn.close()
        return True

    @contextlib.contextmanager
    def read_snapshot(self, conn: Any):
        with transaction.atomic(using=conn.alias):
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn

    def lock_queue_row(self, conn: Any, queue_table: str, queue_id: int, *, exclusive: bool = False) -> bool:
        # FOR KEY SHARE, as enqueues take it: a concurrent delete of the queue waits.
        # FOR UPDATE (a delete) waits for those and stops new ones.
        mode = "UPDATE" if exclusive else "KEY SHARE"
        with conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {queue_table} WHERE id = %s FOR {mode}", [queue_id])
            return cur.fetchone() is not None

    def lock_queue_creation(self, conn: Any, key: int) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [key])

    def journal_mode(self, conn: Any) -> str | None:
        return None  # the server's write-ahead log serves every process

    def startup_probe(self, conn: Any) -> None:
        return None  # no database-wide lock to meet; a worker may start before its server is up

    errors_filter_sql = "jsonb_typeof(errors) = 'array' AND errors <> '[]'::jsonb"

    def failure_entries_sql(self, newest: str, marks: str) -> str:
        # CASE keeps the cast away from entries whose "at" is not a whole number.
        return (
            "SELECT CASE WHEN jsonb_typeof(e.value -> 'at') = 'number' AND (e.value ->> 'at') ~ '^[0-9]{1,18}$' "
            "THEN CAST(e.value ->> 'at' AS bigint) END AS at "
            f"FROM ({newest}) AS j CROSS JOIN LATERAL jsonb_array_elements(j.errors) AS e(value) "
            f"WHERE jsonb_typeof(e.value) = 'object' AND e.value ->> 'kind' IN ({marks})"
        )
