"""SQLite: the store of a file (or in-memory) database opened in this process.

One writer at a time holds the whole database, so django-fq's own write
transactions begin ``IMMEDIATE`` (the lock is taken up front and a
read-then-write can never fail half-way). No LISTEN/NOTIFY: workers poll.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from .base import (
    ACKED_JSON,
    CLEAR_PROGRESS_SQL,
    JOB_TABLE,
    LEASE_TABLE,
    QUEUE_TABLE,
    TAKEN_COLUMNS,
    Finding,
    RateGate,
    Store,
    fetch_dicts,
)

# SQLite keeps 'now' as whole milliseconds of the Julian day; julianday() returns
# that over 86400000.0, so rounding recovers the exact millisecond. (No '%' in the
# text: Django rewrites '%s' into a placeholder in statements with parameters.)
NOW_SQL = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)"


def json_contains(target: Any, needle: Any) -> bool:
    """Whether JSON value ``target`` contains ``needle``, by PostgreSQL's ``jsonb @>`` rules.

    An object contains an object whose every key it has with a containing
    value; an array contains an array whose every element some element of it
    contains; scalars match when equal and of the same JSON type (``1`` and
    ``1.0`` are one number; ``true`` is not ``1``).
    """
    if isinstance(needle, dict):
        return isinstance(target, dict) and all(k in target and json_contains(target[k], v) for k, v in needle.items())
    if isinstance(needle, list):
        return isinstance(target, list) and all(any(json_contains(t, n) for t in target) for n in needle)
    if isinstance(needle, bool) or isinstance(target, bool):
        return type(needle) is type(target) and needle == target
    if isinstance(needle, (int, float)):
        return isinstance(target, (int, float)) and target == needle
    return type(needle) is type(target) and needle == target


def _json_contains_sql_function(target: Any, needle: Any) -> int | None:
    if not isinstance(target, str) or not isinstance(needle, str):
        return None
    try:
        return int(json_contains(json.loads(target), json.loads(needle)))
    except (ValueError, RecursionError):
        return None


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function("fq_json_contains", 2, _json_contains_sql_function, deterministic=True)


def _register_json_contains(alias: str) -> None:
    """Make ``fq_json_contains(target, needle)`` known to alias ``alias``'s connections, this one and the next ones."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection, weak=False, dispatch_uid="django_fq_json_contains")
    conn = connections[alias]
    conn.ensure_connection()
    _on_connection(None, conn)


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


#: SQLite primary result codes that say the file cannot serve now: BUSY, LOCKED, IOERR, CANTOPEN.
UNAVAILABLE_CODES = frozenset({5, 6, 10, 14})


class SqliteStore(Store):
    """SQLite 3.35+ through Django's ``sqlite3`` backend."""

    vendor = "sqlite"
    supports_skip_locked = False
    supports_row_locks = False
    supports_listen_notify = False
    supports_partial_indexes = True
    supports_relaxed_commit = False
    supports_server_prepare = False
    supports_one_statement_claim = False
    supports_one_statement_ack = False
    embedded = True
    export_name = vendor
    key_share_sql = ""
    share_lock_sql = ""
    skip_locked_sql = ""
    update_lock_sql = ""
    lease_lock_sql = ""
    clock_sql = NOW_SQL


    def json_contains_sql(self, target: str, needle: str) -> str:
        _register_json_contains(self.alias)
        return f"(fq_json_contains({target}, {needle}) = 1)"

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

    def schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        # Partial indexes as the models write them; text compares BINARY (byte for byte) by default.
        return []

    def prepare_connection(self, conn: Any) -> None:
        return None  # julianday('now') is UTC whatever the process's time zone

    def check_server(self, conn: Any, *, tables: Sequence[str], max_payload_bytes: int) -> list[Finding]:
        return []  # the journal mode has its own check (journal_mode, E004)

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

    def is_retryable(self, exc: BaseException) -> bool:
        # SQLITE_BUSY / SQLITE_LOCKED past the busy timeout; sqlite3 gives only the message.
        text = str(exc).lower()
        return "database is locked" in text or "database table is locked" in text

    # --- leases (claim, settle, expiry) ---

    def filter_tag(self, qs: Any, tag: str) -> Any:
        # SQLite's LIKE ignores ASCII case: the escaped LIKE narrows, instr() (case-sensitive) decides.
        from django.db.models import Value
        from django.db.models.functions import StrIndex

        needle = f"|{tag}|"
        return qs.filter(tags__contains=needle).alias(fq_tag_at=StrIndex("tags", Value(needle))).filter(fq_tag_at__gt=0)

    def take_jobs(
        self,
        conn: Any,
        *,
        queue_id: int,
        count: int,
        concurrency: int,
        worker: str,
        cap: int,
        rate: RateGate | None = None,
    ) -> list[dict]:
        """One ``UPDATE … RETURNING`` that picks, caps and takes (the write transaction holds the database).

        A rate limit (``rate.limit`` as the caller read it in this write
        transaction) adds its gate before and after it (:meth:`Store.open_rate_gate`).
        """
        from .. import db

        job, lease = JOB_TABLE, LEASE_TABLE
        now = db.now_sql(conn)
        returning = ", ".join(TAKEN_COLUMNS)
        if rate is not None and rate.limit > 0:
            # The write transaction holds the database: the log read here is the newest.
            count = self.open_rate_gate(conn, rate, queue_id=queue_id, want=count)
            if count <= 0:
                return []
        with conn.cursor() as cur:
            # One statement takes the write lock and the jobs at once, whatever
            # the transaction mode, so two processes can never take one job; it
            # reads the pause flag under that lock, so a pause() waits for it.
            limit, params = "%s", [count]
            if concurrency > 0:
                limit = f"MAX(0, MIN(%s, %s - (SELECT COUNT(*) FROM {lease} WHERE queue_id = %s)))"
                params = [count, concurrency, queue_id]
            cur.execute(
                f"UPDATE {job} SET state = 'running', attempts = attempts + 1, generation = generation + 1, "
                f"claimed_at = {now}, changed_at = {now}, worker = %s, {CLEAR_PROGRESS_SQL} WHERE seq IN ("
                f"SELECT seq FROM (SELECT seq, SUM(payload_size) OVER (ORDER BY priority DESC, seq "
                f"ROWS UNBOUNDED PRECEDING) AS cum FROM (SELECT seq, priority, payload_size FROM {job} "
                f"WHERE queue_id = %s AND state = 'queued' AND run_at <= {now} "
                f"AND NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} WHERE id = %s AND paused) ORDER BY priority DESC, seq "
                f"LIMIT {limit})) WHERE cum <= %s) RETURNING {returning}",
                [worker, queue_id, queue_id, *params, cap],
            )
            taken = fetch_dicts(cur)
        if rate is not None and rate.limit > 0:
            self.close_rate_gate(conn, rate, queue_id=queue_id, rows=taken)
        return taken

    def lock_leases(
        self,
        conn: Any,
        queue_id: int | None,
        uids: Sequence[str],
        *,
        judge: bool = True,
        lock_jobs: bool = False,
        relax: bool = False,
        queue_name: str | None = None,
    ) -> list[dict]:
        """One round trip: the write transaction holds the database, so the read is the lock (jobs' too)."""
        from .. import db

        if queue_id is None:
            raise ValueError("lock_leases: queue_id (queue_name only with the one-statement ack)")
        if relax:
            self.relax_commit(conn)
        job, lease = JOB_TABLE, LEASE_TABLE
        now = db.now_sql(conn)
        columns = "l.job_id, l.generation, l.receipt_hash, l.claimed_at, l.deadline, l.timeout_at, l.worker, j.uid, j.concurrency_key"
        if lock_jobs:
            columns += ", j.has_dependents"
        marks = ", ".join(["%s"] * len(uids))
        with self.hot_cursor(conn) as cur:
            cur.execute(
                f"SELECT {columns}, CASE WHEN l.deadline > {now} THEN 1 ELSE 0 END AS live, {now} AS now "
                f"FROM {lease} l JOIN {job} j ON j.seq = l.job_id WHERE l.queue_id = %s AND j.uid IN ({marks})",
                [queue_id, *uids],
            )
            return fetch_dicts(cur)

    def mark_acked(self, conn: Any, *, now: int, acks: Sequence[tuple[int, str | None, str, str]]) -> None:
        """One ``UPDATE … FROM (VALUES …)``."""
        job = JOB_TABLE
        rows = ", ".join(["(%s, %s, %s, %s)"] * len(acks))
        values: list = []
        for ack in acks:
            values += list(ack)
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {job} SET state = 'succeeded', result = v.column2, settled_hash = v.column3, "
                f"settled_args = v.column4, settled_op = 'ack', settled_outcome = '{ACKED_JSON}', "
                f"finished_at = %s, changed_at = %s FROM (VALUES {rows}) AS v WHERE {job}.seq = v.column1",
                [now, now, *values],
            )

    # --- enqueue, queues, counters, maintenance ---------------------------------------------
    # The shared statements of Store serve SQLite as written: its writer holds the whole
    # database, so the unique keys need no lock of their own (lock_unique_keys: no-op).


    # --- edges: driver errors, backup rows, listening -------------------------------------------

    driver_modules = ("sqlite3", "_sqlite3")

    @classmethod
    def is_unavailable(cls, cause: BaseException) -> bool:
        code = getattr(cause, "sqlite_errorcode", None) if cls.is_driver_error(cause) else None
        return code is not None and (code & 0xFF) in UNAVAILABLE_CODES
