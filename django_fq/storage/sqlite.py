"""SQLite: the store of a file (or in-memory) database opened in this process.

One writer at a time holds the whole database, so django-fq's own write
transactions begin ``IMMEDIATE`` (the lock is taken up front and a
read-then-write can never fail half-way). No LISTEN/NOTIFY: workers poll.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.db import transaction

from .base import Store

# SQLite keeps 'now' as whole milliseconds of the Julian day; julianday() returns
# that over 86400000.0, so rounding recovers the exact millisecond. (No '%' in the
# text: Django rewrites '%s' into a placeholder in statements with parameters.)
NOW_SQL = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)"


@contextlib.contextmanager
def atomic(conn: Any, mode: str):
    """``transaction.atomic()`` on SQLite connection ``conn`` whose BEGIN uses ``mode``.

    ``mode``: ``"IMMEDIATE"`` (take the write lock now) or ``"DEFERRED"`` (a
    read snapshot, no lock until a write), whatever ``transaction_mode`` the
    site's settings give; the setting applies again to the next transaction.
    """
    # Connect first: connecting re-reads transaction_mode from the settings.
    conn.ensure_connection()
    saved = getattr(conn, "transaction_mode", None)
    conn.transaction_mode = mode
    try:
        with transaction.atomic(using=conn.alias):
            conn.transaction_mode = saved
            yield conn
    finally:
        conn.transaction_mode = saved


class SqliteStore(Store):
    """SQLite 3.35+ through Django's ``sqlite3`` backend."""

    vendor = "sqlite"
    supports_skip_locked = False
    supports_row_locks = False
    supports_listen_notify = False
    supports_partial_indexes = True
    supports_relaxed_commit = False
    supports_server_prepare = False
    embedded = True
    export_name = vendor
    key_share_sql = ""
    skip_locked_sql = ""
    clock_sql = NOW_SQL

    def greatest_sql(self, a: str, b: str) -> str:
        # Two-argument MAX() is SQLite's scalar maximum.
        return f"MAX({a}, {b})"

    @contextlib.contextmanager
    def write_atomic(self, conn: Any):
        # Outermost: BEGIN IMMEDIATE whatever the site's transaction_mode. Inside the
        # caller's transaction the caller's mode applies (see take_write_lock).
        if conn.in_atomic_block:
            with transaction.atomic(using=conn.alias):
                yield conn
        else:
            with atomic(conn, "IMMEDIATE"):
                yield conn

    def take_write_lock(self, conn: Any, queue_name: str) -> None:
        # A DEFERRED transaction that reads first and writes later fails at once with
        # "database is locked" if another connection committed in between; a write as
        # the first statement waits for the lock (busy timeout) instead.
        if conn.in_atomic_block:
            with conn.cursor() as cur:
                cur.execute("UPDATE django_fq_queue SET name = name WHERE name = %s", [queue_name])

    def relax_commit(self, conn: Any) -> None:
        return None  # every commit waits for the disk

    def hot_cursor(self, conn: Any) -> Any:
        return conn.cursor()

    def notify(self, conn: Any, channel: str, queue_name: str) -> None:
        return None  # no LISTEN/NOTIFY: workers poll

    def release_connection(self, conn: Any) -> bool:
        return False  # a connection is an open file: nothing to give back to a server

    @contextlib.contextmanager
    def read_snapshot(self, conn: Any):
        # A deferred BEGIN: the first SELECT fixes the snapshot (WAL) and no write lock is taken,
        # whatever transaction_mode the site uses for its own transactions.
        with atomic(conn, "DEFERRED"):
            yield conn

    def lock_queue_row(self, conn: Any, queue_table: str, queue_id: int, *, exclusive: bool = False) -> bool:
        return True  # the write transaction holds the whole database: no delete can run meanwhile

    def lock_queue_creation(self, conn: Any, key: int) -> None:
        return None  # writers are serialised by the database lock

    def journal_mode(self, conn: Any) -> str | None:
        if conn.is_in_memory_db():
            return None  # one process only: the journal mode does not matter
        with conn.cursor() as cur:
            cur.execute("PRAGMA journal_mode")
            return str(cur.fetchone()[0])

    def startup_probe(self, conn: Any) -> None:
        # Django's JSONField check runs this first; in a transaction it needs the lock.
        with conn.cursor() as cursor, transaction.atomic(using=conn.alias):
            cursor.execute("SELECT JSON('{\"a\": \"b\"}')")

    errors_filter_sql = "json_type(errors) = 'array' AND errors <> '[]'"

    def failure_entries_sql(self, newest: str, marks: str) -> str:
        return (
            "SELECT CASE WHEN json_type(e.value, '$.at') = 'integer' THEN json_extract(e.value, '$.at') END AS at "
            f"FROM ({newest}) AS j, json_each(j.errors) AS e "
            f"WHERE e.type = 'object' AND json_extract(e.value, '$.kind') IN ({marks})"
        )
