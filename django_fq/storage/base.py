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
and ack statements of services/leases.py are here (the PostgreSQL ones whole).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from .dependencies import DependencySql
from .workers import WorkerSql

#: django-fq's tables (its models' ``Meta.db_table``, written out: the stores run before apps load;
#: tests/storage/test_conformance_leases.py checks that they agree).
QUEUE_TABLE = "django_fq_queue"
JOB_TABLE = "django_fq_job"
LEASE_TABLE = "django_fq_lease"
COUNTER_TABLE = "django_fq_counter"
TOKEN_TABLE = "django_fq_token"
#: Bodies of large payloads, kept out of the job row (``JobPayload``; docs/explanation/storage.md#large-payloads).
PAYLOAD_TABLE = "django_fq_payload"
#: The claim floor (:class:`~django_fq.models.ClaimFloor`), written only where :attr:`Store.supports_claim_floor`.
FLOOR_TABLE = "django_fq_claim_floor"
#: Per-key slots (:class:`~django_fq.models.ConcurrencyKey`; docs/explanation/storage.md#per-key-limits).
KEY_TABLE = "django_fq_key"
#: A rate-limited queue's claim counter and claim log (:class:`~django_fq.models.QueueRate`,
#: :class:`~django_fq.models.RateLog`; docs/reference/semantics.md §9 "Rate limits").
RATE_TABLE = "django_fq_rate"
RATE_LOG_TABLE = "django_fq_rate_log"
#: The per-key claim log of a queue with ``key_rate_limit`` (:class:`~django_fq.models.KeyClaim`).
KEY_CLAIM_TABLE = "django_fq_key_claim"
#: Per-minute history of each queue (:class:`~django_fq.models.QueueMinute`; docs/reference/history.md).
MINUTE_TABLE = "django_fq_minute"
#: What a job row's ``payload`` column holds when its body is in :data:`PAYLOAD_TABLE`: no JSON
#: text is empty, so the marker cannot be mistaken for a payload (``payload_size`` keeps the body's size).
OFFLOADED = ""
#: ``(queue, job, lease, counter)``.
TABLES = (QUEUE_TABLE, JOB_TABLE, LEASE_TABLE, COUNTER_TABLE)

#: The columns :meth:`Store.take_jobs` returns per claimed job.
TAKEN_COLUMNS = (
    "seq", "uid", "payload", "generation", "attempts", "max_attempts", "priority", "enqueued_at", "run_at",
    "timeout_ms", "claimed_at", "metadata", "has_dependents",
)


class KeyPolicy(NamedTuple):
    """A queue's per-key limits as a writer read them under its key locks (docs/reference/semantics.md §9).

    ``concurrency``: ``key_concurrency`` (0 = none); ``rate``: ``key_rate_limit``
    (claims of one key in any window of ``window_ms``, the queue's
    ``rate_window_ms``; 0 = none). All 0 for a queue gone.
    """

    concurrency: int = 0
    rate: int = 0
    window_ms: int = 1000

    @property
    def on(self) -> bool:
        """True when the queue admits its keyed jobs (either limit set): they then wait ``held`` for room."""
        return self.concurrency > 0 or self.rate > 0


@dataclass
class RateGate:
    """The rate limit of one claim (docs/reference/semantics.md §9 "Rate limits").

    The caller fills ``limit`` and ``window_ms`` (the queue's ``rate_limit``
    and ``rate_window_ms`` as it read them); :meth:`Store.take_jobs` reads
    them again under the claim's lock, and :meth:`Store.open_rate_gate` sets
    the rest. ``next_n``: the number of the first job this claim takes.
    ``wanted``: how many it asked the gate for; ``allowed``: how many jobs the
    window admits now (never more than ``limit``). ``free_at`` (epoch ms,
    database clock) and ``now`` (that clock when the log was read): when the
    claim after the admitted ones may be taken, set only when the window
    admitted fewer jobs than asked for (``None`` otherwise; the caller reports
    a wait only when it took every admitted job).
    """

    limit: int = 0
    window_ms: int = 1000
    next_n: int = 0
    wanted: int = 0
    allowed: int = 0
    free_at: int | None = None
    now: int | None = None


def full_row(row: Sequence[Any]) -> tuple:
    """A row of :attr:`Store.JOB_ROW`; a shorter one (no ``metadata``, ``tags``, ``concurrency_key``,
    ``state``) gets ``None`` for the missing columns and ``queued`` for the state."""
    if len(row) == 14:
        return tuple(row)
    full = (*row, *(None,) * (13 - len(row)))
    return (*full, "queued")
#: The assignments a claim's job ``UPDATE`` adds: a new attempt starts without progress
#: (docs/how-to/progress.md). Folded into that statement, it costs the claim no round trip.
CLEAR_PROGRESS_SQL = "progress = NULL, progress_message = '', progress_at = NULL"


def fetch_dicts(cur: Any) -> list[dict]:
    """All rows of ``cur`` as dicts keyed by column name."""
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def within_cap(picked: Sequence[tuple[int, int]], cap: int) -> list[int]:
    """The seqs of ``(seq, payload_size)`` pairs (claim order) whose summed sizes stay within ``cap`` bytes.

    The first job is always taken, so one payload larger than the cap is still delivered.
    """
    seqs: list[int] = []
    total = 0
    for seq, size in picked:
        if seqs and total + size > cap:
            break
        seqs.append(seq)
        total += size
    return seqs


def body_statement_bytes(body: str) -> int:
    """Bytes one offloaded payload ``body`` may take in :meth:`Store.insert_bodies`' statement.

    Escaping at most doubles the UTF-8 text; 80 bytes for the job id and the
    row's share of the statement around it.
    """
    return 2 * len(body.encode()) + 80


def split_by_bytes(items: Sequence[Any], sizes: Sequence[int], budget: int | None) -> list[list[Any]]:
    """``items`` cut, in order, into runs whose ``sizes`` (bytes each) add up to at most ``budget``.

    ``budget`` ``None`` means no limit (one run). A run holds at least one
    item, so an item larger than the budget goes alone. No run for no items.
    """
    if budget is None:
        return [list(items)] if items else []
    runs: list[list[Any]] = []
    total = 0
    for item, size in zip(items, sizes, strict=True):
        if not runs or (runs[-1] and total + size > budget):
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += size
    return runs


#: The outcome a job's settle record holds after an ack (JSON text).
ACKED_JSON = '{"state":"succeeded","run_at":null}'

#: The lease columns :meth:`Store.lock_leases` and :meth:`Store.end_expired_leases` return.
LEASE_COLUMNS = ("job_id", "generation", "receipt_hash", "claimed_at", "deadline", "timeout_at", "worker")


@dataclass(frozen=True)
class Finding:
    """A problem of the database server's configuration for django-fq (:meth:`Store.check_server`).

    ``id`` is the system check id (``"django_fq.E030"``); ``error`` False
    means a warning. ``msg`` and ``hint`` are the check message's text.
    """

    id: str
    error: bool
    msg: str
    hint: str


class Store(DependencySql, WorkerSql, abc.ABC):
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

    #: The claim of a queue without a concurrency or rate limit is one statement (:meth:`Store.claim_statement`),
    #: and the common ack one statement per batch (:meth:`Store.ack_matching`, :meth:`Store.ack_locked`).
    #: Without them the services take the general path: :meth:`Store.take_jobs`, :meth:`Store.lock_leases`.
    supports_one_statement_claim: ClassVar[bool]
    supports_one_statement_ack: ClassVar[bool]

    #: A per-queue claim floor (:class:`~django_fq.models.ClaimFloor`) bounds the claim's job scan and
    #: expired-lease check from below, so they skip the index entries of row versions a long-running
    #: snapshot keeps (docs/explanation/storage.md#the-claim-floor). Where False, no floor row is ever
    #: written and every scan reads the queue whole; the floor methods below are then never called.
    supports_claim_floor: ClassVar[bool] = False

    #: The backend's name a backup records in its header (``"database"``): Django's vendor string.
    export_name: ClassVar[str]

    #: SQL appended to a one-row ``SELECT`` to hold the row against deletes until commit (or ``""``).
    key_share_sql: ClassVar[str]
    #: SQL appended to a ``SELECT`` to lock its rows, passing over rows others hold (or ``""``).
    skip_locked_sql: ClassVar[str]
    #: SQL appended to a one-row ``SELECT`` of a row this transaction updates next (or ``""``
    #: where a write transaction already holds the database's one write lock).
    update_lock_sql: ClassVar[str] = " FOR UPDATE"

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

    # --- schema ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        """DDL that gives this backend what the models' schema cannot say on it (migration 0003).

        Forward (``reverse=False``) or undoing it (``reverse=True``), for the
        migrated tables of django-fq on ``conn``; ``[]`` where the models'
        indexes and constraints already hold as written (partial indexes,
        byte-wise text comparison). Building the list may read the catalog
        (one round trip); running it is the migration's.
        """

    def dependency_schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        """DDL of migration 0011 beyond the models' (a waiting job holds its unique key); ``[]`` here.

        Only MariaDB/MySQL needs any: there the generated column that stands for
        the partial unique constraint names the states that hold a key.
        """
        return []

    # --- checks and start-up ---------------------------------------------------------------------

    @abc.abstractmethod
    def prepare_connection(self, conn: Any) -> None:
        """Set up a new connection of django-fq's alias (``FQ_DATABASE``) for this store's SQL.

        Called from Django's ``connection_created`` signal, once per physical
        connection (each thread's, each reconnect); a no-op where nothing needs
        setting. Raises the database's error if the session cannot be set.
        """

    @abc.abstractmethod
    def check_server(self, conn: Any, *, tables: Sequence[str], max_payload_bytes: int) -> list[Finding]:
        """What in the server's configuration breaks a rule of django-fq on ``conn`` (a few round trips).

        ``tables``: the db_table of each django-fq model (they may not exist
        yet: the checks run before ``migrate``); ``max_payload_bytes``: the
        largest payload the site accepts (bytes). ``[]`` when nothing is
        wrong or the backend has nothing to check. Raises the database's error
        when it cannot be reached.
        """

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
        queue_ids: Sequence[int] | None = None,
        states: Sequence[str] = (),
    ) -> tuple[list[tuple[int, int]], bool]:
        """Failed attempts per bucket in ``[start, end)`` (epoch ms), counted by the database; two round trips.

        Looks at the error histories (a JSON array of ``{"at", "kind", …}``
        objects) of the ``scan_limit`` jobs of ``job_table`` changed last since
        ``start`` (only queue ``queue_id`` unless ``None``), and counts the
        entries whose ``kind`` is one of ``kinds`` and whose ``at`` is a whole
        number in the window, by ``(at - start) // bucket_ms``. Returns
        ``([(bucket, count), …], partial)``; ``partial`` is True when more
        than ``scan_limit`` jobs had a history then. No error text leaves the
        database. ``queue_ids`` and ``states`` (every queue and stored state,
        without ``queue_id``) turn the scan into index ranges of the job
        table's ``queue, state, changed_at`` index: without them the last
        change alone is no index range, and the whole index is read.
        """
        where = "changed_at >= %s"
        params: list = [start]
        if queue_id is not None:
            where += " AND queue_id = %s"
            params.append(queue_id)
        elif queue_ids:
            where += f" AND queue_id IN ({', '.join(['%s'] * len(queue_ids))})"
            params.extend(queue_ids)
        if states:
            where += f" AND state IN ({', '.join(['%s'] * len(states))})"
            params.extend(states)
        marks = ", ".join(["%s"] * len(kinds))
        newest = f"SELECT errors FROM {job_table} WHERE {where} AND {self.errors_filter_sql} ORDER BY changed_at DESC LIMIT %s"
        entries = self.failure_entries_sql(newest, marks)
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT {self.int_div_sql('f.at - %s', f'{bucket_ms:d}')} AS bucket, COUNT(*) AS n FROM ({entries}) AS f "
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

    def int_div_sql(self, a: str, b: str) -> str:
        """SQL for the whole-number quotient of the integer SQL expressions ``a`` and ``b`` (code-written text).

        Truncated towards zero; callers divide non-negative numbers. Integer
        ``/`` where integers divide so (PostgreSQL, SQLite).
        """
        return f"({a}) / ({b})"

    #: SQL condition on the ``errors`` column: a non-empty JSON array (this backend's JSON functions).
    errors_filter_sql: str = ""

    @abc.abstractmethod
    def failure_entries_sql(self, newest: str, marks: str) -> str:
        """SQL of one row ``(at)`` per failure entry of the histories selected by ``newest``.

        ``newest`` is a subquery with an ``errors`` column; ``marks`` the
        placeholders of the failure kinds. ``at`` is NULL when an entry's
        ``at`` is not a whole number. Code-written text only (the SQL audit).
        """

    def page_reads(self, conn: Any) -> contextlib.AbstractContextManager:
        """The context an admin page's reads (a GET) run in; nothing by default.

        PostgreSQL: a transaction with JIT compilation off (``SET LOCAL jit =
        off``, gone at its end, so safe through a transaction pooler). A page's
        count queries are short but have a high estimated cost, and a stock
        server (``jit_above_cost`` 100,000, optimisation past 500,000) spent
        seconds compiling them (docs/performance.md "Admin pages at 1,000,000 jobs").
        """
        return contextlib.nullcontext()

    # --- statement sizes and error history -------------------------------------------------------

    def statement_budget(self, conn: Any) -> int | None:
        """Bytes of parameter values one statement on ``conn`` may carry, counted escaped, or ``None`` (no limit).

        A value's escaped text is at most twice its UTF-8 bytes. Services cut
        batches that carry whole payloads or results to stay within it
        (:func:`split_by_bytes`). Where it is not ``None`` it may read the
        server once per connection.
        """
        return None

    def history_append_sql(self, column: str, keep: int) -> str | None:
        """SQL for the JSON array ``column`` with one entry appended and only its newest ``keep`` entries kept.

        The entry's JSON text is the expression's one ``%s`` parameter, so a
        failure sends one entry, not the whole history. ``column`` holds at
        most ``keep`` entries (django-fq's writes and imports never store more). ``None`` where the
        history is written whole (the service appends in Python and writes the list).
        """
        return None

    # --- reads that must see the newest commit ---------------------------------------------------

    def may_read_stale(self, conn: Any) -> bool:
        """True when a plain ``SELECT`` on ``conn`` now may return rows older than the newest commit.

        That is a caller's transaction whose snapshot was taken at its first
        read (InnoDB's REPEATABLE READ). PostgreSQL's snapshot isolation fails
        the later write of a row changed since (a serialization error), and
        SQLite has one writer at a time: False there.
        """
        return False

    def fresh_read_sql(self, conn: Any, *, update: bool = False) -> str:
        """SQL appended to a ``SELECT`` whose rows must be the newest committed ones (or ``""``).

        ``""`` unless :meth:`may_read_stale`; then a locking read, which reads the
        newest commit: ``FOR UPDATE`` with ``update`` (the rows are written next
        in this transaction, and locking them exclusively at once cannot
        deadlock on a shared lock's upgrade), else a shared lock. Code-written text only.
        """
        if not self.may_read_stale(conn):
            return ""
        return " FOR UPDATE" if update else self.key_share_sql

    # --- errors ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def is_retryable(self, exc: BaseException) -> bool:
        """True when ``exc`` (a ``DatabaseError``) is a deadlock, a serialization failure or a lock wait that ran out.

        Such an error means only "another transaction got in the way": a
        transaction django-fq owns may run again from the start
        (:func:`django_fq.db.retrying`). Anything else (a constraint, a syntax
        error, a lost connection) is False.
        """

    def filter_tag(self, qs: Any, tag: str) -> Any:
        """``qs`` (jobs) narrowed to those whose tags column holds ``tag`` (a valid tag), case-sensitively.

        The column is ``"|a|b|"``, so the condition is an escaped LIKE on
        ``"%|tag|%"`` (Django's ``contains``: ``LIKE`` on PostgreSQL, ``LIKE
        BINARY`` on MariaDB/MySQL, both case-sensitive).
        """
        return qs.filter(tags__contains=f"|{tag}|")

    def filter_json_contains(self, qs: Any, column: str, needle: str) -> Any:
        """``qs`` (jobs) narrowed to those whose JSON column ``column`` contains the JSON object ``needle``.

        ``column`` is ``"payload"`` or ``"metadata"`` (code-written, never user
        input); ``needle`` is compact JSON text of an object (a bound parameter).
        An offloaded payload (:data:`OFFLOADED`) is read from :data:`PAYLOAD_TABLE`
        by a probe of its primary key. Containment is the database's own
        (PostgreSQL ``jsonb @>``, MariaDB/MySQL ``JSON_CONTAINS``; SQLite has no
        such function: a Python one with PostgreSQL's rules). No index serves it:
        callers bound the rows it is tried on (docs/admin.md "Searching jobs").
        """
        from django.db.models import BooleanField
        from django.db.models.expressions import RawSQL

        if column not in ("payload", "metadata"):
            raise ValueError(f"not a JSON column of jobs: {column}")
        sql = self.json_contains_sql(self.json_column_sql(column), "%s")
        return qs.alias(**{f"fq_has_{column}": RawSQL(sql, [needle], output_field=BooleanField())}).filter(
            **{f"fq_has_{column}": True}
        )

    def json_column_sql(self, column: str) -> str:
        """SQL of job column ``column`` (``"payload"`` or ``"metadata"``) as JSON text, an offloaded payload's body included (no round trip)."""
        # Plain names: the job table and its columns are lower-case identifiers on every backend.
        if column == "metadata":
            return f"{JOB_TABLE}.metadata"
        return (
            f"COALESCE(NULLIF({JOB_TABLE}.payload, ''), (SELECT fq_body.body FROM {PAYLOAD_TABLE} fq_body "
            f"WHERE fq_body.job_uid = {JOB_TABLE}.uid))"
        )

    def json_contains_sql(self, target: str, needle: str) -> str:
        """SQL condition: JSON text ``target`` contains JSON text ``needle`` (both SQL expressions)."""
        raise NotImplementedError

    def delete_finished_jobs(self, conn: Any, queue_id: int, seqs: Sequence[int]) -> list[int]:
        """Inside a write transaction: delete those of jobs ``seqs`` of queue ``queue_id`` that prune could delete now.

        That is, succeeded or cancelled jobs that no unfinished job and no open
        batch waits on (:meth:`prunable_sql`), whatever their age; their bodies,
        edges and batch memberships go with them. Returns the sequence numbers
        deleted. Rows are locked before they are judged (where rows lock).
        Four round trips (five with offloaded bodies); at most 500 ``seqs``.
        """
        if not seqs:
            return []
        if len(seqs) > 500:
            raise ValueError("at most 500 jobs per call")
        marks = ", ".join(["%s"] * len(seqs))
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT j.seq, j.uid, j.payload = %s FROM {JOB_TABLE} j WHERE j.queue_id = %s AND j.seq IN ({marks}) "
                f"AND j.state IN ('succeeded', 'cancelled') AND {self.prunable_sql('j')}{self.update_lock_sql}",
                [OFFLOADED, queue_id, *seqs],
            )
            rows = cur.fetchall()
            if not rows:
                return []
            gone = [r[0] for r in rows]
            self.delete_bodies(conn, [r[1] for r in rows if r[2]])
            self.delete_dependencies(conn, gone)
            cur.execute(f"DELETE FROM {JOB_TABLE} WHERE seq IN ({', '.join(['%s'] * len(gone))})", gone)
        return gone

    # --- leases (claim, settle, expiry) -----------------------------------------------------------

    def claim_statement(
        self,
        conn: Any,
        *,
        queue_name: str,
        count: int,
        visibility_ms: int | None,
        worker: str,
        after_reap: bool,
        cap: int,
        hashes: Sequence[str],
        relaxed: bool,
    ) -> list[tuple]:
        """The one-statement claim (only where :attr:`supports_one_statement_claim`); one round trip, autocommit.

        Looks queue ``queue_name`` up; unless it has a limit (a concurrency or
        a rate limit: those claims take :meth:`take_jobs`), or expired leases
        and not ``after_reap``, and unless it is paused (no job then, as from
        an empty queue), takes up to ``count`` (1–1000)
        eligible jobs in claim order whose summed payload sizes stay within
        ``cap`` bytes, under leases of ``visibility_ms`` (``None``: the queue's
        default; capped by each job's timeout), writes the leases (receipt
        hash ``hashes[i]`` for the i-th job in claim order), and adds to the
        counters. ``relaxed``: the commit skips the log flush.

        ``expired`` includes a key with room whose held job became due (:meth:`due_keys`).
        Returns rows ``(queue_id, limited, visibility_ms, expired, vis, seq,
        uid, payload, generation, attempts, max_attempts, priority, enqueued_at,
        timeout_ms, claimed_at, rn, metadata, has_dependents, wait)``, ``wait``
        the job's wait (ms: the claim − the later of its enqueue and its
        ``run_at``, at least 0): no row, no such queue; ``vis`` NULL, nothing
        was claimed (the caller takes the general path); ``seq`` NULL on the one
        row of a claim that found no job. ``rn`` is the job's place (from 1).
        """
        raise NotImplementedError(f"{type(self).__name__}: no one-statement claim")

    def paused_past_snapshot(self, conn: Any, queue_name: str) -> bool:
        """True when queue ``queue_name`` is paused by a commit the claim's own SQL would not see.

        That is a caller's transaction reading an older snapshot than the
        newest commit, where the claim's statements read the queue row as of
        that snapshot (docs/reference/semantics.md §9 "Pause": no claim that
        starts after ``pause()`` returned hands out a job). Here: False, no
        round trip, because the claim's own SQL reads the flag as of the
        newest commit (SQLite: one writer, whose write lock a pause waits for;
        MariaDB/MySQL: :meth:`take_jobs` reads it with a locking read in a
        caller's transaction). Raises what the database raises for a locking
        read of a row changed since the snapshot (PostgreSQL: a serialization
        failure).
        """
        return False

    def claim_facts(self, conn: Any, queue_name: str) -> tuple | None:
        """What a claim of queue ``queue_name`` would meet, read in one statement before its transaction.

        Returns ``(queue_id, visibility_ms, ready, expired)``: the queue's id and
        default lease length (ms), whether it has an eligible job (``queued``,
        ``run_at`` at or before the database clock; one held by another claim
        counts; never while the queue is paused) and whether it has an expired lease (or a key
        with room whose held job became due, :meth:`due_keys`); ``()`` when there is no
        such queue. ``None`` where this is not offered (the claim then looks
        the queue up and handles expiry in its transaction, whatever it finds),
        and wherever a read could be older than the newest commit (a caller's
        transaction). Here: ``None``, no round trip.
        """
        return None

    @abc.abstractmethod
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
        """Inside a write transaction: mark up to ``count`` eligible jobs of queue ``queue_id`` running.

        Eligible: ``queued`` with ``run_at`` at or before now (database
        clock), taken in claim order (priority descending, then ``seq``),
        passing over jobs other transactions hold. Nothing while the queue is
        paused: the flag is read by the statement that takes the jobs (or under
        a lock a pause waits for), never from a copy. With ``concurrency`` > 0
        (the limit read before) the limit is read again under a lock that
        serialises the queue's claims, and no more jobs are taken than it
        leaves free beside the queue's live leases. The summed payload sizes
        stay within ``cap`` bytes (one payload is never larger: the enqueue limit is lower). Each
        job's attempts and generation go up by one; ``claimed_at`` and
        ``changed_at`` are one database instant; ``worker`` is recorded.

        With ``rate`` (a :class:`RateGate`) whose ``limit`` is above 0, the
        queue's claims are serialised by that same lock, and no more jobs are
        taken than the queue's claim log admits (:meth:`open_rate_gate`); the
        jobs taken are logged (:meth:`close_rate_gate`).

        Returns dicts of :data:`TAKEN_COLUMNS` (in any order; ``[]`` when none).
        Writes no lease and no counter (the caller does). Several round trips
        where the backend needs them (see each store).
        """

    # --- rate limits (docs/reference/semantics.md §9 "Rate limits") ------------------------------

    def open_rate_gate(self, conn: Any, gate: RateGate, *, queue_id: int, want: int) -> int:
        """Under the lock that serialises the queue's claims: how many of ``want`` jobs the window admits now.

        Job number ``m`` of the queue (numbered from 0 in claim order, by
        :class:`~django_fq.models.QueueRate`) may be claimed only when job
        ``m - limit`` was claimed at least ``window_ms`` ago (database clock):
        its :data:`RATE_LOG_TABLE` row has ``at <= now - window_ms``, or it has
        no row (never claimed, or older than the last ``limit`` jobs). The
        admitted jobs are the first ones of this claim up to the first that
        may not be claimed yet, whose instant + ``window_ms`` is ``gate.free_at``;
        at most ``limit`` (the next would wait for this claim's own first job:
        :meth:`close_rate_gate` then sets ``free_at``).
        Two round trips (three for a queue's first rate-limited claim): the
        counter row, locked for update (a caller's REPEATABLE READ snapshot
        older than the last claim fails there with a serialization error on
        PostgreSQL, and reads the newest commit on MariaDB/MySQL), then one
        index range of at most ``want`` log rows. Sets ``gate.next_n``,
        ``gate.allowed``, ``gate.free_at`` and ``gate.now``; returns ``gate.allowed``.
        """
        from .. import db

        lock = " FOR UPDATE" if self.supports_row_locks else ""
        with conn.cursor() as cur:
            cur.execute(f"SELECT next_n FROM {RATE_TABLE} WHERE queue_id = %s{lock}", [queue_id])
            row = cur.fetchone()
            if row is None:
                cur.execute(f"INSERT INTO {RATE_TABLE} (queue_id, next_n) VALUES (%s, 0)", [queue_id])
            gate.next_n = 0 if row is None else int(row[0])
            low = gate.next_n - gate.limit
            # Jobs past the first ``limit`` of this claim would wait for this claim's own instant.
            looked = min(want, gate.limit)
            now = db.now_sql(conn)
            cur.execute(
                f"SELECT n, at, {now} FROM {RATE_LOG_TABLE} WHERE queue_id = %s AND n >= %s AND n < %s "
                f"AND at > {now} - %s ORDER BY n LIMIT 1{self.fresh_read_sql(conn)}",
                [queue_id, low, low + looked, gate.window_ms],
            )
            blocked = cur.fetchone()
        gate.wanted = want
        if blocked is None:
            gate.allowed, gate.free_at, gate.now = looked, None, None  # close_rate_gate sets them if looked < want
        else:
            gate.allowed = int(blocked[0]) - low
            gate.free_at, gate.now = int(blocked[1]) + gate.window_ms, int(blocked[2])
        return gate.allowed

    def close_rate_gate(self, conn: Any, gate: RateGate, *, queue_id: int, rows: Sequence[dict]) -> None:
        """Log the jobs ``rows`` (as :meth:`take_jobs` returns them) that passed ``gate``; nothing for none.

        Each gets the next number and the claim's instant (the latest
        ``claimed_at`` of the claim, so no logged instant is earlier than a
        job's); the counter moves on; rows older than the last ``limit`` jobs
        go. Three round trips.
        """
        if not rows:
            return
        at = max(int(r["claimed_at"]) for r in rows)
        if gate.free_at is None and gate.allowed < gate.wanted:
            # Stopped by its own first job, claimed now: the next job may go one window later.
            gate.free_at, gate.now = at + gate.window_ms, at
        first, after = gate.next_n, gate.next_n + len(rows)
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {RATE_TABLE} SET next_n = %s WHERE queue_id = %s", [after, queue_id])
            values: list[int] = []
            for n in range(first, after):
                values += [queue_id, n, at]
            marks = ", ".join(["(%s, %s, %s)"] * len(rows))
            cur.execute(f"INSERT INTO {RATE_LOG_TABLE} (queue_id, n, at) VALUES {marks}", values)
            cur.execute(f"DELETE FROM {RATE_LOG_TABLE} WHERE queue_id = %s AND n < %s", [queue_id, after - gate.limit])

    @abc.abstractmethod
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
        """Inside a write transaction: lock the leases of queue ``queue_id`` held by jobs ``uids`` (public ids).

        ``lock_jobs`` (the ack): lock the job rows too, after their leases, and
        add each job's ``has_dependents`` as of that lock, so an enqueue that
        made the job a dependency and committed while this waited is seen.

        Locks in job order (concurrent settles cannot deadlock) and waits for
        locks others hold. Returns one dict per lease found: ``uid``, the job's ``concurrency_key`` and
        :data:`LEASE_COLUMNS`, and with ``judge`` (the deadline checked under
        the locks, after they are granted) ``live`` (1 while the database clock
        is strictly before ``deadline``, else 0) and ``now`` (that clock, epoch
        ms). ``judge=False`` only where :attr:`supports_one_statement_ack`: the
        caller's next statement judges the deadline (:meth:`ack_locked`).
        ``relax``: also what :meth:`relax_commit` does, in the same round trip
        where the store can (only when :func:`django_fq.db.relaxed_commit` said so).
        Stores with :attr:`supports_one_statement_ack` also take ``queue_id``
        None with ``queue_name=``: the queue found by name in the same round
        trip, each row carrying its ``queue_id``.
        """

    def ack_matching(
        self, conn: Any, *, queue_name: str, requests_json: str, relaxed: bool
    ) -> dict[str, tuple[int, int, int]]:
        """The one-statement ack (only where :attr:`supports_one_statement_ack`); one round trip, autocommit.

        ``requests_json``: a JSON array of ``{"uid", "gen", "hash", "result",
        "args"}`` (result: JSON text or null; args: the settle digest). Ends
        every lease of queue ``queue_name`` whose job, generation and receipt
        hash match and whose deadline is after the clock read once all locks
        are held; marks those jobs succeeded; adds to the counters. Returns
        ``{uid: (run ms, now, queue id)}`` of the jobs acked (run time: now −
        the lease's claim; now: that clock, epoch ms). ``relaxed``: the commit skips the log flush.
        """
        raise NotImplementedError(f"{type(self).__name__}: no one-statement ack")

    def ack_locked(
        self, conn: Any, *, queue_id: int, seqs: Sequence[int], results: Sequence[str | None], args: Sequence[str]
    ) -> dict[int, tuple[int, int]]:
        """Ack the leases of jobs ``seqs`` the transaction locked (:meth:`lock_leases` with ``judge=False``).

        Only where :attr:`supports_one_statement_ack`; one round trip. Ends
        those still live now, marks their jobs succeeded (``results[i]``:
        JSON text or ``None``, ``args[i]`` the settle digest), adds to the
        counters of queue ``queue_id``. Returns ``{seq: (run ms, now)}`` of the
        jobs acked, as :meth:`ack_matching` does.
        """
        raise NotImplementedError(f"{type(self).__name__}: no one-statement ack")

    def ack_locked_releasing(
        self,
        conn: Any,
        *,
        queue_id: int,
        seqs: Sequence[int],
        results: Sequence[str | None],
        args: Sequence[str],
        channel: str,
    ) -> tuple[dict[int, tuple[int, int]], list[dict], dict[int, int]]:
        """:meth:`ack_locked` for jobs others depend on, releasing their dependents; one round trip.

        Only where :attr:`supports_one_statement_ack`, as the statement after
        :meth:`lock_leases` with ``lock_jobs`` (its snapshot must follow the
        locks). Besides the ack: closes the pending edges out of the jobs acked
        (by the ``(upstream, job)`` index), counts each waiting dependent down
        by its edges closed, queues the ones left with none (``run_at`` the
        later of their own and now), lowers the claim floors of those without
        a key limit and notifies ``channel`` with their queues' names at commit.
        Returns ``(jobs acked, keyed jobs released, batches)``: the jobs acked
        as :meth:`ack_locked` returns them; the keyed
        jobs as dicts of ``seq``, ``queue_id``, ``queue`` (name), ``priority``
        and ``concurrency_key``, for :func:`django_fq.services.keys.admit_released`;
        ``batches`` as :meth:`batches_of` answers for the jobs acked
        (``{batch id: members acked}``), for :func:`django_fq.batches.settle`.
        """
        raise NotImplementedError(f"{type(self).__name__}: no one-statement ack")

    @abc.abstractmethod
    def mark_acked(self, conn: Any, *, now: int, acks: Sequence[tuple[int, str | None, str, str]]) -> None:
        """Inside a write transaction, after their leases were ended: mark jobs succeeded at ``now`` (epoch ms).

        ``acks``: ``(seq, result JSON text or None, receipt_hash, args digest)``
        per job. Records the settle (op ``ack``) for replays. One round trip.
        """

    def end_expired_leases(self, conn: Any, *, queue_id: int | None, limit: int) -> list[dict]:
        """Inside a write transaction: end up to ``limit`` leases whose deadline is at or before now.

        Only queue ``queue_id``'s unless ``None``; soonest deadline first;
        leases another transaction holds are passed over (that settle
        decides) where rows can be locked. Deletes the lease rows and returns
        them as dicts of :data:`LEASE_COLUMNS` plus ``queue_id`` and ``now``
        (the database clock, epoch ms). A lease exactly at its deadline is
        expired (docs/reference/semantics.md §5).

        Here one ``DELETE … RETURNING`` over the expired leases, locked with
        :attr:`skip_locked_sql` (PostgreSQL; empty on SQLite, whose write
        transaction holds the database: nothing to pass over).
        """
        from .. import db

        now = db.now_sql(conn)
        where = "queue_id = %s AND " if queue_id is not None else ""
        params: list[Any] = [queue_id] if queue_id is not None else []
        if queue_id is not None and self.supports_claim_floor:
            # No lease of the queue has a deadline below its floor's lease_from (the claim floor).
            where += f"deadline >= COALESCE((SELECT lease_from FROM {FLOOR_TABLE} WHERE queue_id = %s), 0) AND "
            params.append(queue_id)
        with conn.cursor() as cur:
            cur.execute(
                f"DELETE FROM {LEASE_TABLE} WHERE job_id IN (SELECT job_id FROM {LEASE_TABLE} WHERE {where}"
                f"deadline <= {now} ORDER BY deadline LIMIT %s{self.skip_locked_sql}) RETURNING job_id, queue_id, "
                f"generation, receipt_hash, claimed_at, deadline, timeout_at, worker, {now} AS now",
                [*params, limit],
            )
            return fetch_dicts(cur)

    # --- per-key limits (docs/explanation/storage.md#per-key-limits) ---------------------------

    def keys_schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        """The DDL migration 0008 adds on this backend besides the models' own (empty here: the models' hold)."""
        return []

    def key_rate_schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        """The DDL migration 0012 adds on this backend besides the models' own (empty here: the models' hold)."""
        return []

    def lock_keys(
        self, conn: Any, queue_id: int, keys: Sequence[str], *, create: bool, skip_locked: bool = False
    ) -> tuple[KeyPolicy, dict[str, dict]]:
        """Inside a write transaction: lock the key rows ``keys`` of queue ``queue_id``, in key order.

        With ``create``, rows missing are inserted first (``admitted`` 0).
        ``skip_locked`` (a claim's wake): rows another transaction holds are
        left out (it is admitting that key now), so the claim never waits on them.
        Returns ``(policy, rows)``: the queue's :class:`KeyPolicy` read after
        the locks are granted (so a ``configure()`` that held them is seen;
        all 0 for a queue gone), and ``{key: {"id", "admitted", "wake_at"}}``.
        Two round trips (three with ``create``).
        """
        with conn.cursor() as cur:
            if create and keys:
                self._insert_keys(cur, queue_id, keys)
            rows: dict[str, dict] = {}
            skip = " SKIP LOCKED" if skip_locked and self.update_lock_sql else ""
            if keys:
                marks = ", ".join(["%s"] * len(keys))
                cur.execute(
                    f"SELECT id, concurrency_key, admitted, wake_at FROM {KEY_TABLE} WHERE queue_id = %s "
                    f"AND concurrency_key IN ({marks}) ORDER BY concurrency_key{self.update_lock_sql}{skip}",
                    [queue_id, *keys],
                )
                rows = {k: {"id": i, "admitted": a, "wake_at": w} for i, k, a, w in cur.fetchall()}
            cur.execute(
                f"SELECT key_concurrency, key_rate_limit, rate_window_ms FROM {QUEUE_TABLE} "
                f"WHERE id = %s{self.fresh_read_sql(conn)}",
                [queue_id],
            )
            found = cur.fetchone()
        return (KeyPolicy(int(found[0]), int(found[1]), int(found[2])) if found else KeyPolicy()), rows

    def _insert_keys(self, cur: Any, queue_id: int, keys: Sequence[str]) -> None:
        cur.execute(
            f"INSERT INTO {KEY_TABLE} (queue_id, concurrency_key, admitted) VALUES {', '.join(['(%s, %s, 0)'] * len(keys))} "
            f"ON CONFLICT DO NOTHING",
            [v for k in keys for v in (queue_id, k)],
        )

    def key_rate_use(
        self, conn: Any, *, now: str, queue_id: int, keys: Sequence[str], window_ms: int
    ) -> dict[str, tuple[int, list[int], int]]:
        """Under the key rows' locks: the rate tokens each key of ``keys`` holds now (per-key rate limit).

        Returns ``{key: (queued, instants, now_ms)}``: ``queued``, the key's
        admitted jobs not claimed yet (each holds a token until its claim);
        ``instants``, ascending, the key's claims of the last ``window_ms``
        (strictly after now − window, database clock: a claim exactly one
        window old no longer counts), each holding a token until it is one
        window old; ``now_ms`` that clock. The job rows are read first and the
        log after, both as of the newest commit (a locking read where a
        transaction may see an older snapshot), so a claim committing in
        between (which makes its job running and logs it) is counted once or,
        seen by both reads, twice: never missed, so the limit is never passed.
        Claims older than the window are deleted. Three round trips.
        """
        if not keys:
            return {}
        marks = ", ".join(["%s"] * len(keys))
        fresh = self.fresh_read_sql(conn)
        with conn.cursor() as cur:
            # Rows, not COUNT(*): a locking read cannot aggregate. At most the limit per key.
            cur.execute(
                f"SELECT concurrency_key FROM {JOB_TABLE} WHERE queue_id = %s AND state = 'queued' "
                f"AND concurrency_key IN ({marks}){fresh}",
                [queue_id, *keys],
            )
            queued: dict[str, int] = {}
            for (k,) in cur.fetchall():
                queued[k] = queued.get(k, 0) + 1
            cur.execute(
                f"SELECT concurrency_key, at, {now} FROM {KEY_CLAIM_TABLE} WHERE queue_id = %s "
                f"AND concurrency_key IN ({marks}) AND at > {now} - %s ORDER BY concurrency_key, at{fresh}",
                [queue_id, *keys, window_ms],
            )
            found = cur.fetchall()
            clock = int(found[0][2]) if found else None
            cur.execute(
                f"DELETE FROM {KEY_CLAIM_TABLE} WHERE queue_id = %s AND concurrency_key IN ({marks}) "
                f"AND at <= {now} - %s",
                [queue_id, *keys, window_ms],
            )
            if clock is None:
                cur.execute(f"SELECT {now}")
                clock = int(cur.fetchone()[0])
        instants: dict[str, list[int]] = {}
        for key, at, _ in found:
            instants.setdefault(key, []).append(int(at))
        return {k: (queued.get(k, 0), instants.get(k, []), clock) for k in keys}

    def log_key_claims(self, conn: Any, *, queue_id: int, seqs: Sequence[int]) -> None:
        """In the claim's transaction: log the claim of each keyed job of ``seqs`` (just taken) at its ``claimed_at``.

        Only for a queue with a per-key rate limit; unkeyed jobs write nothing. One round trip.
        """
        if not seqs:
            return
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {KEY_CLAIM_TABLE} (queue_id, concurrency_key, at) SELECT queue_id, concurrency_key, "
                f"claimed_at FROM {JOB_TABLE} WHERE seq IN ({', '.join(['%s'] * len(seqs))}) "
                f"AND concurrency_key IS NOT NULL",
                list(seqs),
            )

    def seed_key_claims(self, conn: Any, *, now: str, queue_id: int, window_ms: int) -> int:
        """When a per-key rate limit is switched on: log the claims of the queue's running keyed jobs of the last window.

        Inside the configure's transaction, after :meth:`key_census` locked
        them, so a claim that committed before it (reading the limit as 0,
        hence logging nothing) is counted. Returns the rows written. One round trip.
        """
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {KEY_CLAIM_TABLE} (queue_id, concurrency_key, at) SELECT queue_id, concurrency_key, "
                f"claimed_at FROM {JOB_TABLE} WHERE queue_id = %s AND state = 'running' "
                f"AND concurrency_key IS NOT NULL AND claimed_at > {now} - %s",
                [queue_id, window_ms],
            )
            return max(0, cur.rowcount)

    def delete_key_claims(self, conn: Any, *, queue_id: int, older_than_ms: int | None = None, now: str = "") -> int:
        """Delete queue ``queue_id``'s per-key claim log: all of it, or only claims at or before now − ``older_than_ms``.

        One round trip; returns the rows deleted.
        """
        with conn.cursor() as cur:
            if older_than_ms is None:
                cur.execute(f"DELETE FROM {KEY_CLAIM_TABLE} WHERE queue_id = %s", [queue_id])
            else:
                cur.execute(
                    f"DELETE FROM {KEY_CLAIM_TABLE} WHERE queue_id = %s AND at <= {now} - %s", [queue_id, older_than_ms]
                )
            return max(0, cur.rowcount)

    def admit_held(self, conn: Any, *, now: str, queue_id: int, rooms: dict[str, int]) -> list[tuple[str, int, int]]:
        """Make up to ``rooms[key]`` due held jobs of each key of queue ``queue_id`` queued, in claim order.

        Due: ``run_at`` at or before now (database clock). Rows another
        transaction holds are passed over where rows lock (a cancel, a
        requeue). Returns ``(key, priority, seq)`` per job admitted. Here one
        locking read per key and one ``UPDATE``.
        """
        picked: list[tuple[str, int, int]] = []
        with conn.cursor() as cur:
            for key, room in sorted(rooms.items()):
                cur.execute(
                    f"SELECT priority, seq FROM {JOB_TABLE} WHERE queue_id = %s AND state = 'held' "
                    f"AND concurrency_key = %s AND run_at <= {now} ORDER BY priority DESC, seq LIMIT %s"
                    f"{self.skip_locked_sql}",
                    [queue_id, key, room],
                )
                picked += [(key, p, s) for p, s in cur.fetchall()]
            if picked:
                marks = ", ".join(["%s"] * len(picked))
                cur.execute(
                    f"UPDATE {JOB_TABLE} SET state = 'queued', changed_at = {now} WHERE seq IN ({marks})",
                    [s for _, _, s in picked],
                )
        return picked

    def held_wake(self, conn: Any, queue_id: int, keys: Sequence[str]) -> dict[str, int]:
        """The earliest ``run_at`` of the held jobs of each key (keys without held jobs left out). One round trip."""
        if not keys:
            return {}
        marks = ", ".join(["%s"] * len(keys))
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT concurrency_key, MIN(run_at) FROM {JOB_TABLE} WHERE queue_id = %s AND state = 'held' "
                f"AND concurrency_key IN ({marks}) GROUP BY concurrency_key",
                [queue_id, *keys],
            )
            return {k: int(w) for k, w in cur.fetchall()}

    def write_keys(self, conn: Any, rows: Sequence[tuple[int, int, int | None]]) -> None:
        """Set ``admitted`` and ``wake_at`` of key rows ``(id, admitted, wake_at)`` (locked by this transaction). One round trip."""
        if not rows:
            return
        ids = [r[0] for r in rows]
        cases = " ".join(["WHEN %s THEN %s"] * len(rows))
        # -1 stands for NULL: a typed integer parameter (PostgreSQL cannot type a bare NULL in a CASE).
        wakes = " ".join(["WHEN %s THEN NULLIF(%s, -1)"] * len(rows))
        params: list[Any] = [v for r in rows for v in (r[0], r[1])]
        params += [v for r in rows for v in (r[0], -1 if r[2] is None else r[2])]
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {KEY_TABLE} SET admitted = CASE id {cases} END, wake_at = CASE id {wakes} END "
                f"WHERE id IN ({', '.join(['%s'] * len(ids))})",
                [*params, *ids],
            )

    def hold_jobs(self, conn: Any, seqs: Sequence[int], *, now: str) -> None:
        """Make queued jobs ``seqs`` (locked by this transaction) ``held``. One round trip."""
        if seqs:
            with conn.cursor() as cur:
                cur.execute(
                    f"UPDATE {JOB_TABLE} SET state = 'held', changed_at = {now} "
                    f"WHERE state = 'queued' AND seq IN ({', '.join(['%s'] * len(seqs))})",
                    list(seqs),
                )

    def due_keys(self, conn: Any, *, now: str, queue_id: int | None, limit: int) -> list[tuple[int, str]]:
        """``(queue_id, key)`` of up to ``limit`` key rows whose ``wake_at`` has come (only queue ``queue_id``'s unless None).

        A plain read, soonest first (the caller locks the rows and decides). One round trip.
        """
        where, params = ("AND queue_id = %s ", [queue_id]) if queue_id is not None else ("", [])
        with conn.cursor() as cur:
            cur.execute(
                # The clock as a subquery: one value, so the (queue, wake_at) index range can start from it
                # (PostgreSQL's clock_timestamp() is volatile: compared per row, it made this a scan of every key).
                f"SELECT queue_id, concurrency_key FROM {KEY_TABLE} WHERE wake_at <= (SELECT {now}) {where}"
                f"ORDER BY wake_at LIMIT %s",
                [*params, limit],
            )
            return [(q, k) for q, k in cur.fetchall()]

    def key_census(self, conn: Any, queue_id: int) -> list[tuple[int, str, str, int, int]]:
        """Inside a write transaction holding the queue row exclusively: lock and list the queue's keyed active jobs.

        The leases of its keyed running jobs are locked first (the settles'
        order: lease, then job), then its keyed ``queued``, ``running``,
        ``waiting`` and ``held`` jobs; so a settle, a claim, a cancel, an
        admission of a held job (a wake) or the release of a waiting job
        (which reads the limit after its lock: it then admits by the new one)
        in flight is waited for, and the states returned are the newest.
        Returns ``(seq, key, state, priority, run_at)`` of each keyed
        ``queued``, ``running`` or ``held`` job. Three round trips.
        """
        lock = self.update_lock_sql
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT job_id FROM {LEASE_TABLE} WHERE queue_id = %s AND job_id IN (SELECT seq FROM {JOB_TABLE} "
                f"WHERE queue_id = %s AND state = 'running' AND concurrency_key IS NOT NULL) ORDER BY job_id{lock}",
                [queue_id, queue_id],
            )
            cur.fetchall()
            cur.execute(
                f"SELECT seq FROM {JOB_TABLE} WHERE queue_id = %s "
                f"AND state IN ('queued', 'running', 'waiting', 'held') AND concurrency_key IS NOT NULL ORDER BY seq{lock}",
                [queue_id],
            )
            cur.fetchall()
            cur.execute(
                f"SELECT seq, concurrency_key, state, priority, run_at FROM {JOB_TABLE} WHERE queue_id = %s "
                f"AND state IN ('queued', 'running', 'held') AND concurrency_key IS NOT NULL",
                [queue_id],
            )
            return [(s, k, st, p, r) for s, k, st, p, r in cur.fetchall()]

    def release_held(self, conn: Any, *, now: str, queue_id: int) -> list[tuple[int, int, int]]:
        """Make every held job of queue ``queue_id`` queued (its limit is gone).

        Returns ``(queue_id, priority, smallest seq)`` per priority made queued, for
        :meth:`lower_claim_floors`. Two round trips.
        """
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT priority, MIN(seq) FROM {JOB_TABLE} WHERE queue_id = %s AND state = 'held' GROUP BY priority",
                [queue_id],
            )
            lowest = [(queue_id, p, s) for p, s in cur.fetchall()]
            cur.execute(
                f"UPDATE {JOB_TABLE} SET state = 'queued', changed_at = {now} WHERE queue_id = %s AND state = 'held'",
                [queue_id],
            )
        return lowest

    def delete_keys(self, conn: Any, queue_id: int) -> None:
        """Delete the key rows of queue ``queue_id`` (waiting for a holder of one). One round trip."""
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {KEY_TABLE} WHERE queue_id = %s", [queue_id])

    # --- the claim floor (only where supports_claim_floor) ----------------------------------

    def create_claim_floor(self, conn: Any, queue_id: int) -> None:
        """Insert queue ``queue_id``'s floor row at the start of everything (priority 0, seq 0, lease_from 0).

        Such a floor skips nothing, so it is exact whatever is in progress; a
        queue deleted meanwhile, or a row that exists already, is left as it is. One round trip.
        """
        raise NotImplementedError

    def claim_floor_ripe(self, conn: Any, queue_id: int) -> tuple[int | None, bool] | None:
        """The floor row's ``pend_xmax`` and whether its pending value is ripe: every transaction of this
        database whose id is at or below ``pend_xmax`` has ended (False without a pending value).

        The first statement of a raise, read before :meth:`claim_floor_facts`
        takes its snapshot, so what those transactions wrote is visible there.
        None: no floor row. One round trip.
        """
        raise NotImplementedError

    def claim_floor_facts(self, conn: Any, queue_id: int) -> dict | None:
        """The floor row as one snapshot sees it, and what a raise needs from that snapshot (one round trip).

        In the raise's transaction, before anything gives it a transaction id.
        None: no floor row. Otherwise ``row`` (the row's columns), ``first_seq`` (the first queued job of
        the queue at the floor's priority from its seq on, due or not; None:
        none), ``max_seq`` (the largest seq of any job the snapshot sees),
        ``lease_min`` (the earliest lease deadline of the queue from
        ``lease_from`` on; None: none) and ``started_ms`` (the statement's
        start, database clock in epoch ms, taken before its snapshot).
        """
        raise NotImplementedError

    def write_claim_floor(self, conn: Any, *, queue_id: int, seen: dict, new: dict) -> bool:
        """Write ``new`` over queue ``queue_id``'s floor row if it is still as ``seen`` and no one holds it.

        ``seen``: the row as :meth:`claim_floor_facts` read it. ``new``: ``seq``,
        ``lease_from``, ``pend_seq``, ``pend_lease_from`` and ``pending``; with
        ``pending``, ``pend_xmax`` becomes this transaction's id, assigned by this
        write, so after the facts' snapshot: every transaction in progress then
        has a smaller one. A row another transaction holds (a writer lowering it,
        or another raise) or that changed is left as it is: False. One round trip.
        """
        raise NotImplementedError

    def lower_claim_floors(self, conn: Any, jobs: Sequence[tuple[int, int, int]]) -> None:
        """Lower the floors below jobs just made queued in this transaction: ``(queue_id, priority, seq)`` each.

        Every writer that makes a job queued with the sequence number it had
        (nack, expiry, release, retry) calls this in its own transaction, after the
        job's update; a floor (or its pending value) above such a job at its
        priority comes down to it. One round trip; nothing where the store keeps no floor.
        """
        return None

    def write_progress(
        self,
        conn: Any,
        *,
        now: str,
        queue_name: str,
        uid: str,
        generation: int,
        receipt_hash: str,
        progress: float,
        message: str,
    ) -> bool:
        """Store a running job's progress report while the lease of this run is live; True if written.

        Job ``uid`` of queue ``queue_name`` gets ``progress`` (a percentage,
        already validated), ``message`` and ``progress_at`` = now (epoch ms,
        database clock) only while it is ``running`` in lease ``generation``,
        whose lease row still matches ``receipt_hash`` and whose deadline is
        after now: a run whose lease expired or was taken by a newer claim
        writes nothing. One ``UPDATE`` (one round trip, autocommit or the
        caller's transaction); nothing is locked but the job row.
        """
        job = JOB_TABLE
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {job} SET progress = %s, progress_message = %s, progress_at = {now} "
                f"WHERE uid = %s AND generation = %s AND state = 'running' "
                f"AND queue_id = (SELECT id FROM {QUEUE_TABLE} WHERE name = %s) "
                f"AND EXISTS (SELECT 1 FROM {LEASE_TABLE} l WHERE l.job_id = {job}.seq AND l.generation = %s "
                f"AND l.receipt_hash = %s AND l.deadline > {now})",
                [progress, message, uid, generation, queue_name, generation, receipt_hash],
            )
            return cur.rowcount == 1

    # --- enqueue, queues, counters, maintenance ---------------------------------------------
    #
    # Tables are django-fq's own (the *_TABLE names above). ``now`` arguments are the SQL of the database clock
    # in epoch ms (django_fq.db.now_sql: code-written text, with the test offset). The
    # statements the backends share are written here once; a backend overrides what it
    # must write otherwise.

    #: The whole plain enqueue (no token, unique key or ``at``) is one statement: :meth:`enqueue_plain`.
    supports_one_statement_enqueue: ClassVar[bool] = False

    def enqueue_plain(
        self, conn: Any, queue: str, items: Sequence[Any], *, now: str, max_jobs: int, channel: str
    ) -> tuple[list[Any] | None, bool]:
        """Enqueue ``items`` into queue ``queue`` (a name) in one statement (one round trip).

        Only where :attr:`supports_one_statement_enqueue`. ``items`` have the
        attributes of ``services.enqueue._Item`` and no token, unique key or
        ``at``. Returns ``(results, True)`` (one ``EnqueueResult`` per item,
        in order); or, with nothing written, ``(None, False)`` when the queue
        does not exist, ``(None, True)`` when the batch does not fit under
        ``max_jobs`` active jobs (the caller then raises with the numbers).
        """
        raise NotImplementedError(f"{type(self).__name__} has no one-statement enqueue")

    def count_queues(self, conn: Any) -> int:
        """The number of queues (one round trip); after :meth:`lock_queue_creation`, exact until commit."""
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {QUEUE_TABLE}")
            return int(cur.fetchone()[0])

    def lock_pause_state(self, conn: Any, queue_id: int) -> tuple[bool, int | None] | None:
        """Inside a write transaction: ``(paused, paused_at)`` of queue ``queue_id``, the row locked until commit.

        One round trip. The values are the newest commit's, and no other
        pause, resume or configure can change them before this transaction
        ends, so what :func:`~django_fq.services.pause` answers is what holds
        when it returns. ``None``: the queue is gone.
        """
        with conn.cursor() as cur:
            cur.execute(f"SELECT paused, paused_at FROM {QUEUE_TABLE} WHERE id = %s{self.update_lock_sql}", [queue_id])
            row = cur.fetchone()
        return None if row is None else (bool(row[0]), row[1])

    def set_paused(self, conn: Any, *, now: str, queue_id: int, paused: bool) -> bool:
        """Pause (``paused`` True) or resume queue ``queue_id``; one round trip. False: it already was so.

        Pausing stamps ``paused_at`` with the database clock ``now`` (epoch ms);
        resuming clears it. Nothing is written when the flag already has that
        value. The claims read the flag in their own SQL (:meth:`claim_statement`,
        :meth:`take_jobs`, :meth:`claim_facts`; docs/reference/semantics.md §9 "Pause").
        """
        stamp = now if paused else "NULL"
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {QUEUE_TABLE} SET paused = %s, paused_at = {stamp} WHERE id = %s AND paused <> %s",
                [paused, queue_id, paused],
            )
            return cur.rowcount == 1

    def clock_plus(self, conn: Any, now: str, delta_ms: int) -> int:
        """The database clock plus ``delta_ms`` (epoch ms), read in one round trip."""
        with conn.cursor() as cur:
            cur.execute(f"SELECT {now} + %s", [delta_ms])
            return int(cur.fetchone()[0])

    def take_tokens(
        self, conn: Any, *, now: str, queue_id: int, rows: Sequence[tuple[str, str, int]]
    ) -> tuple[dict[str, str], int]:
        """Inside a write transaction: insert idempotency tokens, taking over the expired ones.

        ``rows`` are ``(token, job_uid, retention_ms)``, distinct tokens in a
        fixed (sorted) order. A token row is written (``created_at`` = now,
        ``expires_at`` = now + retention) unless a live one exists (one whose
        ``expires_at`` is after now), which is left unchanged. Returns
        ``({token: job_uid the token names now}, added)``: a token names the
        caller's ``job_uid`` exactly when the caller wrote it; ``added`` counts
        rows that did not exist before (not takeovers). Two or three round trips.
        """
        tokens = [r[0] for r in rows]
        marks = ", ".join(["%s"] * len(tokens))
        table = TOKEN_TABLE
        with conn.cursor() as cur:
            cur.execute(f"SELECT token FROM {table} WHERE queue_id = %s AND token IN ({marks})", [queue_id, *tokens])
            existing = {r[0] for r in cur.fetchall()}
            values, params = [], []
            for token, uid, retention in rows:
                values.append("(%s, %s, %s, (SELECT t FROM c), (SELECT t FROM c) + %s)")
                params += [queue_id, token, uid, retention]
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) "
                f"INSERT INTO {table} (queue_id, token, job_uid, created_at, expires_at) VALUES {', '.join(values)} "
                f"ON CONFLICT (queue_id, token) DO UPDATE SET job_uid = excluded.job_uid, "
                f"created_at = excluded.created_at, expires_at = excluded.expires_at "
                f"WHERE {table}.expires_at <= excluded.created_at RETURNING token",
                params,
            )
            owned = {r[0] for r in cur.fetchall()}
            named = {token: uid for token, uid, _ in rows if token in owned}
            others = [t for t in tokens if t not in owned]
            if others:
                marks = ", ".join(["%s"] * len(others))
                cur.execute(
                    f"SELECT token, job_uid FROM {table} WHERE queue_id = %s AND token IN ({marks})", [queue_id, *others]
                )
                named.update(cur.fetchall())
        return named, len(owned - existing)

    def point_token(self, conn: Any, queue_id: int, token: str, job_uid: str) -> None:
        """Make the caller's token ``token`` of queue ``queue_id`` name job ``job_uid`` (one round trip)."""
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {TOKEN_TABLE} SET job_uid = %s WHERE queue_id = %s AND token = %s", [job_uid, queue_id, token]
            )

    def active_jobs_by_key(
        self, conn: Any, queue_id: int, keys: Sequence[str], *, refused: bool = False
    ) -> dict[str, str]:
        """``{unique_key: job uid}`` of queue ``queue_id``'s queued/running jobs holding one of ``keys`` (one round trip).

        ``refused=True``: an insert with these keys was just refused because an
        active job holds them, so their holders exist in the newest commit (a
        store that reads a caller's older snapshot must then read that commit).
        """
        if not keys:
            return {}
        marks = ", ".join(["%s"] * len(keys))
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT unique_key, uid FROM {JOB_TABLE} WHERE queue_id = %s "
                f"AND state IN ('waiting', 'queued', 'running', 'held') AND unique_key IN ({marks})",
                [queue_id, *keys],
            )
            return dict(cur.fetchall())

    def lock_unique_keys(self, conn: Any, queue_id: int, keys: Sequence[str]) -> None:
        """Inside a write transaction: take the unique keys' locks, ``keys`` sorted, before inserting jobs.

        Two batches inserting the same keys in opposite orders then queue up
        instead of deadlocking. A no-op where the backend has no such lock
        (the deadlock is then retried, or cannot happen).
        """
        return None

    #: Columns of one row for :meth:`insert_jobs`, in order.
    JOB_ROW = (
        "uid", "priority", "at", "delay_ms", "max_attempts", "timeout_ms", "payload", "size", "unique_key", "token",
        "metadata", "tags", "concurrency_key", "state",
    )  # fmt: skip

    def insert_jobs(self, conn: Any, *, now: str, queue_id: int, rows: Sequence[tuple]) -> dict[str, int]:
        """Inside a write transaction: insert queued jobs in the order of ``rows`` (their FIFO order).

        Each row is a tuple of :attr:`JOB_ROW` (``state``: ``queued``, or ``held`` for a job
        waiting for its concurrency key's slot): ``run_at`` is ``at`` (epoch ms)
        when not ``None``, else now + ``delay_ms``; ``enqueued_at`` and
        ``changed_at`` are now, one instant for the statement. A row whose
        unique key an active job of the queue holds already is skipped.
        Returns ``{uid: enqueued_at}`` of the rows inserted. At most 500 rows
        per call; one round trip.
        """
        values, params = [], []
        for row in rows:
            (uid, priority, at, delay_ms, max_attempts, timeout_ms, payload, size, unique_key, token, meta, tags,
             ckey, state) = full_row(row)  # fmt: skip
            run_at = "%s" if at is not None else "(SELECT t FROM c) + %s"
            values.append(
                f"(%s, %s, %s, %s, {run_at}, (SELECT t FROM c), (SELECT t FROM c), 0, %s, 0, %s, %s, %s, "
                f"'', '[]', %s, %s, '', %s, %s, %s)"
            )
            params += [
                uid, queue_id, state, priority, at if at is not None else delay_ms, max_attempts, timeout_ms, payload,
                size, unique_key, token, meta, tags, ckey,
            ]  # fmt: skip
        with conn.cursor() as cur:
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) INSERT INTO {JOB_TABLE} (uid, queue_id, state, priority, run_at, "
                f"enqueued_at, changed_at, attempts, max_attempts, generation, timeout_ms, payload, payload_size, "
                f"last_error, errors, unique_key, idempotency, worker, metadata, tags, concurrency_key) "
                f"VALUES {', '.join(values)} ON CONFLICT DO NOTHING RETURNING uid, enqueued_at",
                params,
            )
            return {r[0]: int(r[1]) for r in cur.fetchall()}

    def add_counters(self, conn: Any, queue_id: int, deltas: dict[str, int]) -> None:
        """Add ``deltas`` (counter column → non-zero increment) to one of queue ``queue_id``'s counter shards.

        Takes a shard no other transaction holds (``SKIP LOCKED`` where rows
        lock; SQLite's writer holds them all), or inserts a new shard when
        every shard is busy, so it never waits for another transaction. One
        round trip, two when a shard is inserted.
        """
        table = COUNTER_TABLE
        sets = ", ".join(f"{k} = {k} + %s" for k in deltas)
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {table} SET {sets} WHERE id = (SELECT id FROM {table} WHERE queue_id = %s LIMIT 1{self.skip_locked_sql})",
                [*deltas.values(), queue_id],
            )
            if cur.rowcount == 0:
                self._insert_shard(cur, queue_id, deltas)

    def _insert_shard(self, cur: Any, queue_id: int, deltas: dict[str, int]) -> None:
        cols = ", ".join(deltas)
        marks = ", ".join(["%s"] * len(deltas))
        cur.execute(f"INSERT INTO {COUNTER_TABLE} (queue_id, {cols}) VALUES (%s, {marks})", [queue_id, *deltas.values()])

    def counter_sums(self, conn: Any, queue_id: int, names: Sequence[str]) -> dict[str, int]:
        """Queue ``queue_id``'s counters ``names`` (column names): sums over its shards, one statement."""
        cols = ", ".join(f"COALESCE(SUM({n}), 0)" for n in names)
        with conn.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM {COUNTER_TABLE} WHERE queue_id = %s", [queue_id])
            row = cur.fetchone()
        return {n: int(v) for n, v in zip(names, row, strict=True)}

    #: The columns :meth:`add_minutes` adds to (the unique key is ``queue_id, minute, kind, bin``).
    MINUTE_SUMS = ("enqueued", "succeeded", "failed", "dead", "n")

    def add_minutes(self, conn: Any, rows: Sequence[tuple[int, int, int, int, int, int, int, int, int]]) -> None:
        """Add ``rows`` to the per-minute history (:data:`MINUTE_TABLE`) in one upsert.

        Each row is ``(queue_id, minute, kind, bin, enqueued, succeeded,
        failed, dead, n)``; an existing row with the same key gets the numbers
        added. The caller sorts the rows by key, so two writers lock the rows
        they share in one order. One round trip.
        """
        marks = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {MINUTE_TABLE} (queue_id, minute, kind, bin, {', '.join(self.MINUTE_SUMS)}) "
                f"VALUES {marks} {self.add_minutes_conflict_sql()}",
                [v for row in rows for v in row],
            )

    def add_minutes_conflict_sql(self) -> str:
        """The upsert clause of :meth:`add_minutes` (PostgreSQL and SQLite: ``ON CONFLICT … DO UPDATE``)."""
        sets = ", ".join(f"{c} = {MINUTE_TABLE}.{c} + excluded.{c}" for c in self.MINUTE_SUMS)
        return f"ON CONFLICT (queue_id, minute, kind, bin) DO UPDATE SET {sets}"

    def queues_with_shards(self, conn: Any) -> list[int]:
        """Ids of the queues with more than one counter shard (one round trip)."""
        with conn.cursor() as cur:
            cur.execute(f"SELECT queue_id FROM {COUNTER_TABLE} GROUP BY queue_id HAVING COUNT(*) > 1")
            return [r[0] for r in cur.fetchall()]

    def fold_shards(self, conn: Any, queue_id: int, names: Sequence[str]) -> int:
        """Inside a write transaction: merge queue ``queue_id``'s free counter shards into its first; the number removed.

        Shards another transaction holds are passed over (``SKIP LOCKED``);
        sums are unchanged. Three round trips (read, write the sums, delete).
        """
        table = COUNTER_TABLE
        cols = ", ".join(names)
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, {cols} FROM {table} WHERE queue_id = %s ORDER BY id{self.skip_locked_sql}", [queue_id])
            rows = cur.fetchall()
            if len(rows) < 2:
                return 0
            keep, rest = rows[0], rows[1:]
            sums = [sum(r[i] for r in rows) for i in range(1, len(names) + 1)]
            sets = ", ".join(f"{n} = %s" for n in names)
            cur.execute(f"UPDATE {table} SET {sets} WHERE id = %s", [*sums, keep[0]])
            marks = ", ".join(["%s"] * len(rest))
            cur.execute(f"DELETE FROM {table} WHERE id IN ({marks})", [r[0] for r in rest])
            return len(rest)

    def delete_queue_rows(self, conn: Any, queue_id: int) -> None:
        """Inside a write transaction holding the queue row exclusively: delete queue ``queue_id`` and all its rows.

        Jobs first: a claim in flight holds some job rows, so this waits for
        it to commit, and the leases it wrote are then seen (and deleted) by
        the next statement. Eleven round trips (twelve with a claim floor).
        """
        tables: tuple[str, ...] = (
            JOB_TABLE, LEASE_TABLE, TOKEN_TABLE, COUNTER_TABLE, KEY_TABLE, RATE_TABLE, RATE_LOG_TABLE,
            KEY_CLAIM_TABLE, MINUTE_TABLE,
        )  # fmt: skip
        if self.supports_claim_floor:
            tables += (FLOOR_TABLE,)
        with conn.cursor() as cur:
            for table in tables:
                if table == JOB_TABLE:  # a body goes with its job (the rows are held: no claim reads it now)
                    self._delete_queue_bodies(cur, queue_id)
                    self.delete_queue_dependencies(conn, queue_id)
                cur.execute(f"DELETE FROM {table} WHERE queue_id = %s", [queue_id])
            cur.execute(f"DELETE FROM {QUEUE_TABLE} WHERE id = %s", [queue_id])

    def _delete_queue_bodies(self, cur: Any, queue_id: int) -> None:
        # One more round trip; the anti-join reads only the queue's offloaded jobs' uids.
        cur.execute(
            f"DELETE FROM {PAYLOAD_TABLE} WHERE job_uid IN (SELECT uid FROM {JOB_TABLE} WHERE queue_id = %s "
            f"AND payload = %s)",
            [queue_id, OFFLOADED],
        )

    def prune_jobs(self, conn: Any, *, now: str, retention_ms: int, limit: int) -> int:
        """Delete at most ``limit`` succeeded/cancelled jobs finished ``retention_ms`` or more ago; the number deleted.

        A job an unfinished job depends on is kept (:meth:`prunable_sql`); the
        edges into and out of the jobs deleted go with them. Rows other
        transactions hold are passed over where rows lock. Three round trips
        (four with offloaded bodies).
        """
        table = JOB_TABLE
        with conn.cursor() as cur:
            # RETURNING says which of the deleted jobs had their body offloaded: a second
            # statement (same transaction) deletes only those bodies, and only when there are any.
            # A finished job that an unfinished one depends on stays (prunable_sql).
            cur.execute(
                f"DELETE FROM {table} WHERE seq IN (SELECT j.seq FROM {table} j WHERE j.state IN ('succeeded', "
                f"'cancelled') AND j.finished_at <= {now} - %s AND {self.prunable_sql('j')} "
                f"LIMIT %s{self.skip_locked_sql}) RETURNING uid, payload = %s, seq",
                [retention_ms, limit, OFFLOADED],
            )
            rows = cur.fetchall()
            self.delete_bodies(conn, [r[0] for r in rows if r[1]])
            self.delete_dependencies(conn, [r[2] for r in rows])
            return len(rows)

    def prune_tokens(self, conn: Any, *, now: str, limit: int) -> list[int]:
        """Delete at most ``limit`` idempotency tokens whose ``expires_at`` has passed.

        Returns the queue id of each row deleted (repeated), so the caller
        can take them off the queues' ``token_rows`` counters. Rows other
        transactions hold are passed over where rows lock. One round trip.
        """
        table = TOKEN_TABLE
        with conn.cursor() as cur:
            cur.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE expires_at <= {now} LIMIT %s{self.skip_locked_sql}) "
                f"RETURNING queue_id",
                [limit],
            )
            return [r[0] for r in cur.fetchall()]


    # --- large payloads: bodies kept out of the job row -----------------------------------------

    def insert_bodies(self, conn: Any, rows: Sequence[tuple[str, str]]) -> None:
        """Inside the write transaction that inserted their jobs: store offloaded payload bodies.

        ``rows`` are ``(job uid, payload JSON text)``; the job rows hold
        :data:`OFFLOADED` in ``payload``. Written in the jobs' transaction, so a
        job never exists without its body (docs/explanation/storage.md#large-payloads).
        One round trip per run of bodies within :meth:`statement_budget`
        (escaped bytes); raises ``IntegrityError`` if a uid has a body already.
        """
        if not rows:
            return
        budget = self.statement_budget(conn)
        sizes = [body_statement_bytes(body) for _, body in rows]
        with conn.cursor() as cur:
            for run in split_by_bytes(rows, sizes, budget):
                cur.execute(
                    f"INSERT INTO {PAYLOAD_TABLE} (job_uid, body) VALUES {', '.join(['(%s, %s)'] * len(run))}",
                    [v for row in run for v in row],
                )

    def fetch_bodies(self, conn: Any, uids: Sequence[str], *, latest: bool = False) -> dict[str, str]:
        """``{job uid: payload JSON text}`` of the offloaded bodies of jobs ``uids`` (one round trip; ``{}`` for none).

        A uid without a body (its job was deleted meanwhile) is left out.
        One statement per 1,000 uids (a claim's largest count: a claim makes one).
        ``latest``: the caller took these jobs with a locking read (a claim), so
        the bodies are read from the newest commit too (:meth:`fresh_read_sql`,
        a locking read only where a caller's older snapshot may be stale): a
        plain read there misses the body of a job committed after the snapshot.
        """
        found: dict[str, str] = {}
        tail = self.fresh_read_sql(conn) if latest else ""
        with conn.cursor() as cur:
            for start in range(0, len(uids), 1000):
                chunk = list(uids[start : start + 1000])
                marks = ", ".join(["%s"] * len(chunk))
                cur.execute(f"SELECT job_uid, body FROM {PAYLOAD_TABLE} WHERE job_uid IN ({marks}){tail}", chunk)
                found.update(cur.fetchall())
        return found

    def delete_bodies(self, conn: Any, uids: Sequence[str]) -> None:
        """Inside the write transaction that deletes their jobs: delete the bodies of jobs ``uids``.

        One round trip per 500 uids; none for no uids.
        """
        with conn.cursor() as cur:
            for start in range(0, len(uids), 500):
                chunk = list(uids[start : start + 500])
                cur.execute(f"DELETE FROM {PAYLOAD_TABLE} WHERE job_uid IN ({', '.join(['%s'] * len(chunk))})", chunk)

    # --- edges: driver errors, backup rows, listening -------------------------------------------

    #: Name prefixes of the modules whose exceptions this backend's DB-API driver (and its pool) raises.
    driver_modules: ClassVar[tuple[str, ...]]

    @classmethod
    def is_driver_error(cls, exc: BaseException) -> bool:
        """Whether ``exc`` was raised by this backend's driver (not wrapped by Django); no round trip.

        By the exception's module: one of :attr:`driver_modules` or a module whose name starts
        with one (``psycopg_pool`` for ``psycopg``).
        """
        return (type(exc).__module__ or "").startswith(cls.driver_modules)

    @classmethod
    @abc.abstractmethod
    def is_unavailable(cls, cause: BaseException) -> bool:
        """Whether driver exception ``cause`` says the database cannot serve now (try later).

        ``cause`` is the driver's exception behind a Django ``OperationalError``
        (its ``__cause__``). True for a refused, lost or timed-out connection, a
        server at its connection limit or shutting down, a file database that is
        locked or cannot be opened; False for anything else, including another
        driver's exceptions (a bug or a deployment error: a 500, not a 503).
        """

    def insert_rows(self, conn: Any, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Inside a write transaction: insert ``rows`` into ``table`` in one statement (the backup's import).

        ``table`` and ``columns`` are django-fq's own names (code-written
        text); each row holds one value per column, already adapted for the
        driver (JSON as text). The caller keeps ``len(rows) * len(columns)``
        under the backend's parameter limit (SQLite: 32766). Raises
        ``IntegrityError`` on a duplicate key (the whole statement fails).
        """
        if not rows:
            return
        row_sql = f"({', '.join(['%s'] * len(columns))})"
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([row_sql] * len(rows))}",
                [v for values in rows for v in values],
            )

    def listen(self, channel: str, *, stop: Any, on_listening: Any, on_note: Any, timeout_s: float = 1.0) -> None:
        """Listen on ``channel`` on a connection of its own until ``stop`` (a ``threading.Event``) is set.

        Only where :attr:`supports_listen_notify`. Calls ``on_listening()``
        once listening, then ``on_note(payload)`` (a queue name) per
        notification; looks at ``stop`` at least every ``timeout_s`` seconds.
        Returns when stopped; raises the driver's error when the connection
        fails (the caller reconnects).
        """
        raise NotImplementedError(f"{type(self).__name__}: the database cannot LISTEN")

