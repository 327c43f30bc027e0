"""The storage interface: what django-fq asks of a database, and what the database can do.

A :class:`Store` is the only code that knows which database it is on
(docs/explanation/storage.md). Callers ask it a question (one method per
database round trip) or read one of its capability flags, in the manner of
Django's ``connection.features.supports_*``; they never compare vendor names.
One :class:`Store` exists per database alias and backend
(:func:`django_fq.storage.for_connection`). It holds no connection itself:
Django's connections are per thread, so every method takes the connection
the caller is using.

Issue 13 moves the rest of the vendor branches here step by step; the claim
and ack statements (services/leases.py) come last, whole.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar


class Store(abc.ABC):
    """One backend's SQL and capabilities. Subclasses set every flag and implement every method."""

    #: Django's ``connection.vendor`` this store serves.
    vendor: ClassVar[str]

    #: ``SELECT … FOR UPDATE SKIP LOCKED``: concurrent claimers pass over each other's locked rows.
    supports_skip_locked: ClassVar[bool]
    #: ``SELECT … FOR UPDATE`` / ``FOR KEY SHARE`` lock single rows; without them (SQLite) the write
    #: transaction holds the whole database, which serialises writers as the row locks would.
    supports_row_locks: ClassVar[bool]
    #: ``LISTEN`` / ``NOTIFY``: an enqueue wakes idle workers at once instead of on their next poll.
    supports_listen_notify: ClassVar[bool]
    #: Indexes (and unique constraints) with a ``WHERE`` clause.
    supports_partial_indexes: ClassVar[bool]
    #: A transaction's commit may skip waiting for the log flush (``synchronous_commit = off``).
    supports_relaxed_commit: ClassVar[bool]
    #: Parameters bound on the server, so hot statements can be prepared once per connection.
    supports_server_prepare: ClassVar[bool]
    #: The database is a file opened in this process (no server to wait for), and one writer
    #: locks all of it: a first statement may meet "database is locked".
    embedded: ClassVar[bool]

    #: The backend's name a backup records in its header (``"database"``): Django's vendor string.
    export_name: ClassVar[str]

    #: SQL appended to a one-row ``SELECT`` to hold the row against deletes until commit (or ``""``).
    key_share_sql: ClassVar[str]
    #: SQL appended to a ``SELECT`` to lock its rows, passing over rows others hold (or ``""``).
    skip_locked_sql: ClassVar[str]

    #: SQL for the database clock in whole epoch milliseconds (a bigint), without the test offset
    #: :func:`django_fq.db.now_sql` adds. Code-written text only.
    clock_sql: ClassVar[str]

    def __init__(self, alias: str):
        self.alias = alias

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias!r}>"

    # --- SQL fragments (no round trip) -----------------------------------------------------

    @abc.abstractmethod
    def greatest_sql(self, a: str, b: str) -> str:
        """SQL for the larger of the two SQL expressions ``a`` and ``b`` (code-written text)."""

    # --- transactions and cursors ------------------------------------------------------------

    @abc.abstractmethod
    def write_atomic(self, conn: Any) -> contextlib.AbstractContextManager:
        """A transaction (or a savepoint inside the caller's) for a write path on ``conn``."""

    @abc.abstractmethod
    def take_write_lock(self, conn: Any, queue_name: str) -> None:
        """Inside a transaction begun elsewhere, take the write lock now if the backend locks late.

        ``queue_name`` is a queue's name (a parameter); its row is written as the first statement.
        """

    @abc.abstractmethod
    def relax_commit(self, conn: Any) -> None:
        """Inside a transaction django-fq owns: let its commit skip the log flush (a no-op where unsupported)."""

    @abc.abstractmethod
    def hot_cursor(self, conn: Any) -> Any:
        """A cursor (a context manager) for the statements run on every job."""

    @abc.abstractmethod
    def notify(self, conn: Any, channel: str, queue_name: str) -> None:
        """Wake listeners of ``channel`` with ``queue_name``, at commit (a no-op without LISTEN/NOTIFY)."""

    @abc.abstractmethod
    def release_connection(self, conn: Any) -> bool:
        """Close ``conn`` if holding it while idle costs the server something and it is safe; True if closed.

        Never inside an atomic block.
        """

    @abc.abstractmethod
    def read_snapshot(self, conn: Any) -> contextlib.AbstractContextManager:
        """A read-only transaction on ``conn`` (not in an atomic block) whose every read sees one snapshot.

        Takes no write lock (an export must not stop the workers).
        """

    @abc.abstractmethod
    def lock_queue_row(self, conn: Any, queue_table: str, queue_id: int, *, exclusive: bool = False) -> bool:
        """Inside a write transaction: hold queue ``queue_id`` until commit; False if it is gone.

        Shared (``exclusive=False``): a concurrent delete of the queue waits,
        enqueues do not. Exclusive: waits for the enqueues holding it shared
        and stops new ones (a delete). ``queue_table`` is the queue model's
        table. Where the transaction already holds the whole database
        (SQLite), no round trip: True.
        """

    @abc.abstractmethod
    def lock_queue_creation(self, conn: Any, key: int) -> None:
        """Inside a write transaction: wait for other transactions creating queues (held until commit).

        ``key`` is django-fq's 64-bit lock key. A no-op where writers are serialised already (SQLite).
        """

    # --- checks and start-up ---------------------------------------------------------------------

    @abc.abstractmethod
    def journal_mode(self, conn: Any) -> str | None:
        """The journal mode of a file database whose mode matters to workers (one round trip), else ``None``."""

    @abc.abstractmethod
    def startup_probe(self, conn: Any) -> None:
        """Run, in a transaction of its own, the first statement Django's database checks run.

        Raises the database's error (e.g. ``OperationalError`` "database is
        locked"); a no-op where that statement cannot meet a lock.
        """

    # --- the admin dashboard ---------------------------------------------------------------------

    def failure_buckets(
        self,
        conn: Any,
        *,
        job_table: str,
        start: int,
        end: int,
        queue_id: int | None,
        kinds: Sequence[str],
        bucket_ms: int,
        scan_limit: int,
    ) -> tuple[list[tuple[int, int]], bool]:
        """Failed attempts per bucket in ``[start, end)`` (epoch ms), counted by the database; two round trips.

        Looks at the error histories (a JSON array of ``{"at", "kind", …}``
        objects) of the ``scan_limit`` jobs of ``job_table`` changed last since
        ``start`` (only queue ``queue_id`` unless ``None``), and counts the
        entries whose ``kind`` is one of ``kinds`` and whose ``at`` is a whole
        number in the window, by ``(at - start) // bucket_ms``. Returns
        ``([(bucket, count), …], partial)``; ``partial`` is True when more
        than ``scan_limit`` jobs had a history then. No error text leaves the
        database.
        """
        where = "changed_at >= %s"
        params: list = [start]
        if queue_id is not None:
            where += " AND queue_id = %s"
            params.append(queue_id)
        marks = ", ".join(["%s"] * len(kinds))
        newest = f"SELECT errors FROM {job_table} WHERE {where} AND {self.errors_filter_sql} ORDER BY changed_at DESC LIMIT %s"
        entries = self.failure_entries_sql(newest, marks)
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT (f.at - %s) / {bucket_ms:d} AS bucket, COUNT(*) AS n FROM ({entries}) AS f "
                "WHERE f.at >= %s AND f.at < %s GROUP BY 1",
                [start, *params, scan_limit, *kinds, start, end],
            )
            buckets = [(int(b), int(n)) for b, n in cur.fetchall()]
            # Cut when more jobs than the limit have a history changed within the window.
            cur.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM {job_table} WHERE {where} AND {self.errors_filter_sql} LIMIT %s) AS c",
                [*params, scan_limit + 1],
            )
            partial = int(cur.fetchone()[0]) > scan_limit
        return buckets, partial

    #: SQL condition on the ``errors`` column: a non-empty JSON array (this backend's JSON functions).
    errors_filter_sql: str = ""

    @abc.abstractmethod
    def failure_entries_sql(self, newest: str, marks: str) -> str:
        """SQL of one row ``(at)`` per failure entry of the histories selected by ``newest``.

        ``newest`` is a subquery with an ``errors`` column; ``marks`` the
        placeholders of the failure kinds. ``at`` is NULL when an entry's
        ``at`` is not a whole number. Code-written text only (the SQL audit).
        """

