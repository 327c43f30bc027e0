"""MariaDB 10.6+ and MySQL 8.0+: the store of an InnoDB database reached through mysqlclient.

Claims lock rows with ``FOR UPDATE SKIP LOCKED``. There is no LISTEN/NOTIFY:
workers poll with their adaptive interval, and an enqueue in the worker's own
process wakes it at once (docs/explanation/storage.md). There are no partial
indexes either: the migrations add, on this backend only, a generated column
that holds a job's unique key only while the job is active, under a unique
index, and compare queue names, tokens and keys byte for byte (``utf8mb4_bin``).

Every transaction django-fq owns runs at READ COMMITTED, whatever the site's
isolation level: a read then sees what committed before it, not a snapshot
taken at the transaction's first read (InnoDB's REPEATABLE READ).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from .base import (
    ACKED_JSON,
    CLEAR_PROGRESS_SQL,
    COUNTER_TABLE,
    JOB_TABLE,
    KEY_CLAIM_TABLE,
    KEY_TABLE,
    LEASE_COLUMNS,
    LEASE_TABLE,
    MINUTE_TABLE,
    OFFLOADED,
    QUEUE_TABLE,
    RATE_LOG_TABLE,
    RATE_TABLE,
    TAKEN_COLUMNS,
    TOKEN_TABLE,
    Finding,
    RateGate,
    Store,
    fetch_dicts,
    full_row,
    within_cap,
)
from .dependencies import DEPENDENCY_TABLE
from .workers import REGISTER_COLUMNS, WORKER_TABLE

#: Epoch milliseconds at execution. ``SYSDATE(3)`` is the time the function runs
#: (``NOW()`` is fixed at statement start, so a claim that waited for a row lock
#: would stamp the time it began); ``UNIX_TIMESTAMP`` reads it in the session time
#: zone, which :meth:`MysqlStore.prepare_connection` sets to UTC.
NOW_SQL = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)"

#: Run on every new connection of django-fq's alias (:meth:`MysqlStore.prepare_connection`).
SESSION_UTC_SQL = "SET time_zone = '+00:00'"


#: The text columns compared as keys (queue names, ids, unique keys, tokens, receipt hashes), per
#: table: migration 0003 gives them a binary collation, so "a", "A" and "a " are three keys.
BINARY_COLUMNS: dict[str, tuple[str, ...]] = {
    "django_fq_queue": ("name",),
    "django_fq_job": ("uid", "unique_key", "idempotency", "settled_hash"),
    "django_fq_token": ("token", "job_uid"),
    "django_fq_lease": ("receipt_hash",),
}

#: Binary collations without trailing-space padding, preferred first (MariaDB's, MySQL 8's).
NOPAD_BINARY = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")

#: The job's unique key while the job is waiting, queued, running or held (migrations 0008, 0011), else NULL (a generated column), and
#: the unique index over it that stands in for the models' partial constraint of the same name.
ACTIVE_KEY_COLUMN = "active_unique_key"
ACTIVE_KEY_INDEX = "fq_job_active_unique_key"


#: Error numbers that say the server cannot serve now: too many connections (1040, and 1203 for one
#: user), server shutdown (1053), connection killed (MariaDB 1927) or closed for inactivity (MySQL
#: 4031); the client's own: cannot connect (2002, 2003), unknown host (2005), server gone away
#: (2006), lost connection (2013), SSL handshake (2026), lost in reading (2055).
UNAVAILABLE_CODES = frozenset({1040, 1053, 1203, 1927, 4031, 2002, 2003, 2005, 2006, 2013, 2026, 2055})

#: The oldest servers with ``SELECT … FOR UPDATE SKIP LOCKED`` (and window functions, JSON_TABLE).
MIN_MARIADB = (10, 6)
MIN_MYSQL = (8, 0)

#: Room a statement needs besides one payload (or result), whose text may double when escaped.
PACKET_HEADROOM_BYTES = 64 * 1024

#: MariaDB's default ``max_allowed_packet`` (10.2.4+; MySQL 8.0's is 64 MiB), bytes.
DEFAULT_PACKET_BYTES = 16 * 1024 * 1024


@dataclass
class ServerFacts:
    """What :meth:`MysqlStore.check_server` reads from the server, for :func:`server_findings`.

    ``engines``: storage engine of each django-fq table that exists;
    ``charset``: the connection's character set;
    ``collations``: ``{(table, column): collation}`` of :data:`BINARY_COLUMNS`
    once migration 0003 has run (empty before); ``binary``: the collation it uses.
    """

    mariadb: bool
    version: tuple[int, ...]
    log_bin: bool
    binlog_format: str
    max_allowed_packet: int
    default_engine: str
    charset: str = "utf8mb4"
    engines: dict[str, str] = field(default_factory=dict)
    collations: dict[tuple[str, str], str] = field(default_factory=dict)
    binary: str = NOPAD_BINARY[0]


def server_findings(facts: ServerFacts, *, tables: Sequence[str], max_payload_bytes: int) -> list[Finding]:
    """The system check findings (ids ``django_fq.E030``–``E032``, ``W030``–``W032``) for ``facts``.

    ``tables`` are django-fq's table names, ``max_payload_bytes`` the largest
    payload accepted (bytes). See docs/reference/checks.md.
    """
    found: list[Finding] = []
    name, minimum = ("MariaDB", MIN_MARIADB) if facts.mariadb else ("MySQL", MIN_MYSQL)
    if tuple(facts.version[:2]) < minimum:
        found.append(
            Finding(
                "django_fq.E030",
                True,
                f"{name} {'.'.join(map(str, facts.version))} is too old for django-fq "
                f"({name} {'.'.join(map(str, minimum))} or later).",
                "Claims need SELECT ... FOR UPDATE SKIP LOCKED, which older servers do not have. Upgrade the server.",
            )
        )
    missing = [t for t in tables if t not in facts.engines]
    wrong = sorted(t for t, engine in facts.engines.items() if engine.lower() != "innodb")
    if missing and facts.default_engine.lower() != "innodb":
        wrong.append(f"new tables (default_storage_engine={facts.default_engine})")
    if wrong:
        found.append(
            Finding(
                "django_fq.E031",
                True,
                f"django-fq's tables must be InnoDB: {', '.join(wrong)}.",
                "Without InnoDB there are no transactions or row locks: jobs would be lost or run twice. "
                "Use ALTER TABLE ... ENGINE=InnoDB, and OPTIONS['init_command'] = "
                "\"SET default_storage_engine=INNODB\" before migrate.",
            )
        )
    if facts.log_bin and facts.binlog_format.upper() == "STATEMENT":
        found.append(
            Finding(
                "django_fq.E032",
                True,
                "The binary log is on with binlog_format=STATEMENT.",
                "django-fq's transactions run at READ COMMITTED, which InnoDB refuses to log as statements "
                "(every enqueue and claim would fail). Set binlog_format=ROW (or MIXED) on the server.",
            )
        )
    need = 2 * max_payload_bytes + PACKET_HEADROOM_BYTES
    if facts.max_allowed_packet < need:
        found.append(
            Finding(
                "django_fq.W030",
                False,
                f"max_allowed_packet is {facts.max_allowed_packet} bytes; a payload of FQ_MAX_PAYLOAD_BYTES="
                f"{max_payload_bytes} needs up to {need}.",
                "The server drops the connection on a longer statement, so an accepted payload or result could "
                f"not be stored. Raise max_allowed_packet to at least {need} or lower FQ_MAX_PAYLOAD_BYTES.",
            )
        )
    folded = sorted(f"{t}.{c} ({coll})" for (t, c), coll in facts.collations.items() if coll != facts.binary)
    if folded:
        found.append(
            Finding(
                "django_fq.W031",
                False,
                f"These columns no longer compare byte for byte: {', '.join(folded)}.",
                "Tokens, unique keys and queue names differing only in case or trailing spaces would be "
                "taken for one (after ALTER TABLE ... CONVERT TO CHARACTER SET, say). Run "
                "'manage.py migrate django_fq 0002' then 'manage.py migrate django_fq' to redo migration 0003.",
            )
        )
    if facts.charset.lower() != "utf8mb4":
        found.append(
            Finding(
                "django_fq.W032",
                False,
                f"The connection's character set is {facts.charset}, not utf8mb4.",
                "Characters outside the 3-byte range (emoji, some CJK) in payloads, tokens, unique keys or "
                "queue names fail to store, or become '?' without strict mode. "
                "Set DATABASES[...]['OPTIONS']['charset'] = 'utf8mb4'.",
            )
        )
    return found


def _seq_list_sql(n: int) -> str:
    """A derived table ``v`` of ``n`` job seqs (parameters), one column ``seq``, for unique lookups joined from it."""
    return "(SELECT %s AS seq" + " UNION ALL SELECT %s" * (n - 1) + ") AS v"


class MysqlStore(Store):
    """MariaDB 10.6+ / MySQL 8.0+ (InnoDB) through Django's ``mysql`` backend and mysqlclient."""

    vendor = "mysql"
    supports_skip_locked = True
    supports_row_locks = True
    supports_listen_notify = False
    supports_partial_indexes = False
    supports_relaxed_commit = False
    supports_server_prepare = False
    supports_one_statement_claim = False  # no UPDATE … RETURNING (MySQL: no RETURNING at all)
    supports_one_statement_ack = False
    embedded = False
    export_name = vendor
    key_share_sql = " LOCK IN SHARE MODE"
    share_lock_sql = " LOCK IN SHARE MODE"
    json_object_sql = "JSON_OBJECT"
    skip_locked_sql = " FOR UPDATE SKIP LOCKED"
    clock_sql = NOW_SQL


    def add_minutes_conflict_sql(self) -> str:
        """``ON DUPLICATE KEY UPDATE`` (the row's key is the unique ``queue_id, minute, kind, bin``)."""
        return "ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = {c} + VALUES({c})" for c in self.MINUTE_SUMS)

    def json_contains_sql(self, target: str, needle: str) -> str:
        # JSON_CONTAINS' rules differ from PostgreSQL's in one place: a scalar is also
        # contained in an array holding it (docs/admin.md "Searching jobs").
        return f"(JSON_CONTAINS({target}, {needle}) = 1)"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    @contextlib.contextmanager
    def write_atomic(self, conn: Any):
        if conn.in_atomic_block:
            with transaction.atomic(using=conn.alias):
                yield conn
            return
        self.read_committed_next(conn)
        # Marks the transaction as ours (READ COMMITTED) for may_read_stale.
        conn._django_fq_read_committed = True
        try:
            with transaction.atomic(using=conn.alias):
                yield conn
        finally:
            conn._django_fq_read_committed = False

    def may_read_stale(self, conn: Any) -> bool:
        # In autocommit every statement reads the newest commit; in django-fq's own transactions
        # (READ COMMITTED) every statement does too. A caller's transaction may be REPEATABLE READ.
        return bool(conn.in_atomic_block and not getattr(conn, "_django_fq_read_committed", False))

    def read_committed_next(self, conn: Any) -> None:
        """Outside a transaction: make the next one READ COMMITTED (it applies to one transaction only).

        Nothing to do (no round trip) when the session's own level is READ
        COMMITTED, as Django's ``mysql`` backend sets it unless
        ``OPTIONS["isolation_level"]`` says otherwise: see :meth:`session_read_committed`.
        """
        if self.session_read_committed(conn):
            return
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def session_read_committed(self, conn: Any) -> bool:
        """True when the connection's session isolation level is READ COMMITTED.

        Read from the server once per connection (one round trip, the first
        call on a new one) and kept on it, like :meth:`statement_budget`. The
        session level is what Django's ``init_command`` set when it connected;
        a ``SET SESSION TRANSACTION ISOLATION LEVEL`` run on the connection
        later, or a ``SET TRANSACTION`` left pending for the next transaction
        outside any block, is not seen (docs/explanation/storage.md, "Isolation").
        The variable is ``tx_isolation`` on MariaDB before 11.1,
        ``transaction_isolation`` on MySQL 8 and later MariaDB.
        """
        conn.ensure_connection()
        raw = conn.connection
        cached = getattr(conn, "_fq_isolation", None)
        if cached is None or cached[0] is not raw:
            old_name = conn.mysql_is_mariadb and tuple(conn.mysql_version[:2]) < (11, 1)
            with conn.cursor() as cur:
                cur.execute(f"SELECT @@{'tx_isolation' if old_name else 'transaction_isolation'}")
                level = str(cur.fetchone()[0])
            cached = (raw, level.upper().replace(" ", "-") == "READ-COMMITTED")
            conn._fq_isolation = cached
        return cached[1]

    def take_write_lock(self, conn: Any, queue_name: str) -> None:
        return None  # row locks are taken by the statements themselves

    def relax_commit(self, conn: Any) -> None:
        return None  # innodb_flush_log_at_trx_commit is the server's, not a transaction's

    def hot_cursor(self, conn: Any) -> Any:
        return conn.cursor()

    def notify(self, conn: Any, channel: str, queue_name: str) -> None:
        return None  # no LISTEN/NOTIFY: workers poll

    def release_connection(self, conn: Any) -> bool:
        # A connection is a server thread held while idle.
        if conn.in_atomic_block or conn.connection is None:
            return False
        conn.close()
        return True

    @contextlib.contextmanager
    def read_snapshot(self, conn: Any):
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        with transaction.atomic(using=conn.alias):
            with conn.cursor() as cur:
                # The snapshot is taken by the first read, not by BEGIN: take it now.
                cur.execute("SELECT 1 FROM django_fq_queue LIMIT 1")
            yield conn

    def lock_queue_row(self, conn: Any, queue_table: str, queue_id: int, *, exclusive: bool = False) -> bool:
        with conn.cursor() as cur:
            if not exclusive:
                cur.execute(f"SELECT id FROM {queue_table} WHERE id = %s{self.key_share_sql}", [queue_id])
                return cur.fetchone() is not None
            # Enqueues look the queue up by name, locking: InnoDB locks the name index entry,
            # then the row. A DELETE of the row needs both, so locking the row by id alone (row
            # first, name entry at the DELETE) deadlocks with an enqueue in between, and the
            # enqueue, maybe in a caller's transaction that cannot be retried, is the victim.
            # Lock in the enqueues' order: the name (a plain read: names never change), then
            # the row through the name index. Two round trips.
            cur.execute(f"SELECT name FROM {queue_table} WHERE id = %s", [queue_id])
            row = cur.fetchone()
            if row is None:
                return False
            cur.execute(f"SELECT id FROM {queue_table} WHERE name = %s FOR UPDATE", [row[0]])
            return cur.fetchone() is not None

    def lock_queue_creation(self, conn: Any, key: int) -> None:
        # GET_LOCK belongs to the session, not the transaction, and would outlive a rollback.
        # A row lock ends with the transaction: write a lock row of the job table (a uid no
        # job can have: uids are hex) and delete it again at once. Nobody ever sees the row,
        # but its index record stays locked by this transaction until it ends, so a second
        # creator's write of the same row waits for our commit or rollback. ON DUPLICATE KEY
        # UPDATE makes the waiters ask for the exclusive lock directly (a plain INSERT asks for
        # a shared one first, and two waiters upgrading it would deadlock each other).
        with conn.cursor() as cur:
            self._lock_row(cur, f"fq-queue-creation-{key:x}")

    def _lock_row(self, cur: Any, uid: str) -> None:
        """Hold the lock named ``uid`` (not hex: no job's uid) to the end of the transaction (two round trips).

        See :meth:`lock_queue_creation`: a job row written and deleted at once, its index record locked.
        """
        cur.execute(
            f"INSERT INTO {JOB_TABLE} (uid, queue_id, state, priority, run_at, enqueued_at, changed_at, "
            "attempts, max_attempts, generation, timeout_ms, payload, payload_size, last_error, errors, worker) "
            "VALUES (%s, 0, 'cancelled', 0, 0, 0, 0, 0, 1, 0, 0, 'null', 4, '', '[]', '') "
            "ON DUPLICATE KEY UPDATE generation = generation + 1",
            [uid],
        )
        cur.execute(f"DELETE FROM {JOB_TABLE} WHERE uid = %s", [uid])

    def statement_budget(self, conn: Any) -> int:
        """The smaller of the server's and MariaDB's default ``max_allowed_packet``, less :data:`PACKET_HEADROOM_BYTES`.

        A longer statement is refused and the connection dropped. The server's
        value is read once per connection (the first call on a new one). Not
        beyond the 16 MiB default even where the server allows more: a replica
        applying the binary log has its own limit (``slave_max_allowed_packet``).
        """
        raw = conn.connection
        cached = getattr(conn, "_fq_packet", None)
        if cached is None or cached[0] is not raw:
            with conn.cursor() as cur:
                cur.execute("SELECT @@max_allowed_packet")
                cached = (conn.connection, int(cur.fetchone()[0]))
            conn._fq_packet = cached
        return min(cached[1], DEFAULT_PACKET_BYTES) - PACKET_HEADROOM_BYTES

    def history_append_sql(self, column: str, keep: int) -> str:
        # JSON_EXTRACT(text, '$') makes the parameter a JSON value, appended as an object (not
        # a quoted string) on both servers (MariaDB has no CAST AS JSON). Removing a path that
        # does not exist changes nothing: the oldest entry goes only when the array was full.
        return (
            f"JSON_REMOVE(JSON_ARRAY_APPEND(COALESCE({column}, '[]'), '$', JSON_EXTRACT(%s, '$')), "
            f"IF(JSON_LENGTH(COALESCE({column}, '[]')) >= {int(keep)}, '$[0]', '$[{int(keep)}]'))"
        )

    def binary_collation(self, conn: Any) -> str:
        """The ``utf8mb4`` collation that compares byte for byte, trailing spaces included (one round trip).

        ``utf8mb4_bin`` is PAD SPACE on both servers (``'a' = 'a '``); the NO PAD
        binary collations are MariaDB's ``utf8mb4_nopad_bin`` (10.2+) and MySQL's
        ``utf8mb4_0900_bin`` (8.0.17+). Falls back to ``utf8mb4_bin`` on a server with neither.
        """
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN (%s, %s)",
                list(NOPAD_BINARY),
            )
            found = {row[0] for row in cur.fetchall()}
        return next((c for c in NOPAD_BINARY if c in found), "utf8mb4_bin")

    def schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        # One ALTER per table, so each table is rebuilt once.
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS "
                f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({', '.join(['%s'] * len(BINARY_COLUMNS))})",
                list(BINARY_COLUMNS),
            )
            types = {(t, c): (ctype, nullable == "YES") for t, c, ctype, nullable in cur.fetchall()}
        collate = "" if reverse else f" CHARACTER SET utf8mb4 COLLATE {self.binary_collation(conn)}"
        changes: dict[str, list[str]] = {}
        for table, columns in BINARY_COLUMNS.items():
            for column in columns:
                ctype, nullable = types[(table, column)]
                # Without CHARACTER SET / COLLATE a column takes its table's defaults again (reverse).
                changes.setdefault(table, []).append(
                    f"MODIFY {column} {ctype}{collate} {'NULL' if nullable else 'NOT NULL'}"
                )
        job = changes["django_fq_job"]
        if reverse:
            job[:0] = [
                f"DROP INDEX {ACTIVE_KEY_INDEX}",
                f"DROP COLUMN {ACTIVE_KEY_COLUMN}",
                # The indexes Django creates from the models here, their conditions left out.
                "DROP INDEX fq_job_claim",
                "ADD INDEX fq_job_claim (queue_id, priority DESC, seq)",
                "DROP INDEX fq_job_finished",
                "ADD INDEX fq_job_finished (finished_at)",
            ]
        else:
            key_type = types[("django_fq_job", "unique_key")][0]
            job += [
                # STORED, not VIRTUAL: the unique index then reads a plain column, and InnoDB never
                # recomputes it (purge, rollback), where MariaDB's indexed virtual columns had bugs.
                f"ADD COLUMN {ACTIVE_KEY_COLUMN} {key_type}{collate} "
                "AS (CASE WHEN state IN ('queued', 'running') THEN unique_key END) STORED",
                f"ADD UNIQUE INDEX {ACTIVE_KEY_INDEX} (queue_id, {ACTIVE_KEY_COLUMN})",
                # The partial indexes of the models, as plain indexes whose leading state
                # column does what the condition does: claim order among queued jobs, and
                # prune's range over finished ones.
                "DROP INDEX fq_job_claim",
                "ADD INDEX fq_job_claim (queue_id, state, priority DESC, seq)",
                "DROP INDEX fq_job_finished",
                "ADD INDEX fq_job_finished (state, finished_at)",
            ]
        return [f"ALTER TABLE {table} {', '.join(parts)}" for table, parts in changes.items()]

    def keys_schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        """Migration 0008 here: binary key columns, the active-unique-key column with ``held``, the held index.

        As migration 0003 did for the older columns (:meth:`schema_sql`): the
        concurrency keys compare byte for byte; a held job keeps its unique key
        (the generated column is recomputed, so the job table is rebuilt once);
        and the held jobs' index leads with ``state``, which does what the
        models' condition does elsewhere. Reverse: the active-key column of 0003
        again (Django drops the rest with the columns and the index).
        """
        job = self._active_key_parts(conn, "'queued', 'running'" if reverse else "'queued', 'running', 'held'")
        if reverse:
            return [f"ALTER TABLE {JOB_TABLE} {', '.join(job)}"]
        collate = f" CHARACTER SET utf8mb4 COLLATE {self.binary_collation(conn)}"
        job += [
            f"MODIFY concurrency_key varchar(200){collate} NULL",
            "DROP INDEX fq_job_key_held",
            "ADD INDEX fq_job_key_held (queue_id, state, concurrency_key, priority DESC, seq)",
        ]
        return [
            f"ALTER TABLE {JOB_TABLE} {', '.join(job)}",
            f"ALTER TABLE {KEY_TABLE} MODIFY concurrency_key varchar(200){collate} NOT NULL",
        ]

    def key_rate_schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        """Migration 0012 here: the claim log's key column binary (keys compare byte for byte), and no
        ``fq_job_key_queued``: ``fq_job_key_held`` (queue, state, key, …) serves its reads. Reverse: the index
        back, plain, for Django's reverse of it to drop."""
        if reverse:
            return [f"ALTER TABLE {JOB_TABLE} ADD INDEX fq_job_key_queued (queue_id, concurrency_key)"]
        collate = f" CHARACTER SET utf8mb4 COLLATE {self.binary_collation(conn)}"
        return [
            f"ALTER TABLE {JOB_TABLE} DROP INDEX fq_job_key_queued",
            f"ALTER TABLE {KEY_CLAIM_TABLE} MODIFY concurrency_key varchar(200){collate} NOT NULL",
        ]

    def _active_key_parts(self, conn: Any, states: str) -> list[str]:
        """``ALTER TABLE`` parts that rebuild the active-unique-key column for ``states`` (SQL text), and its index.

        Dropped and added, with its unique index, in one ALTER (one rebuild):
        both servers then agree, whatever they allow MODIFY to change. One round trip (the key's type).
        """
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME = %s AND COLUMN_NAME = 'unique_key'",
                [JOB_TABLE],
            )
            key_type = cur.fetchone()[0]
        collate = f" CHARACTER SET utf8mb4 COLLATE {self.binary_collation(conn)}"
        return [
            f"DROP INDEX {ACTIVE_KEY_INDEX}",
            f"DROP COLUMN {ACTIVE_KEY_COLUMN}",
            f"ADD COLUMN {ACTIVE_KEY_COLUMN} {key_type}{collate} "
            f"AS (CASE WHEN state IN ({states}) THEN unique_key END) STORED",
            f"ADD UNIQUE INDEX {ACTIVE_KEY_INDEX} (queue_id, {ACTIVE_KEY_COLUMN})",
        ]

    def _insert_keys(self, cur: Any, queue_id: int, keys: Sequence[str]) -> None:
        # INSERT IGNORE: no ON CONFLICT here; the only index a new key row can meet is (queue, key).
        cur.execute(
            f"INSERT IGNORE INTO {KEY_TABLE} (queue_id, concurrency_key, admitted) "
            f"VALUES {', '.join(['(%s, %s, 0)'] * len(keys))}",
            [v for k in keys for v in (queue_id, k)],
        )

    def dependency_schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        # The column again, with the states that hold a key: forward ``waiting`` too (migration
        # 0011), backward the three of migration 0008 (keys_schema_sql).
        states = "'queued', 'running', 'held'" if reverse else "'waiting', 'queued', 'running', 'held'"
        return [f"ALTER TABLE {JOB_TABLE} {', '.join(self._active_key_parts(conn, states))}"]

    def prepare_connection(self, conn: Any) -> None:
        # UNIX_TIMESTAMP() reads SYSDATE()'s local time back in the session time zone: in a
        # zone with daylight saving time the hour that repeats in autumn maps to two instants.
        # UTC has no such hour, and a fixed offset is the only zone a server without time zone
        # tables knows. Also makes NOW() and TIMESTAMP columns UTC for this session
        # (docs/explanation/storage.md "Time zone").
        with conn.cursor() as cur:
            cur.execute(SESSION_UTC_SQL)

    def check_server(self, conn: Any, *, tables: Sequence[str], max_payload_bytes: int) -> list[Finding]:
        return server_findings(self.server_facts(conn, tables), tables=tables, max_payload_bytes=max_payload_bytes)

    def server_facts(self, conn: Any, tables: Sequence[str]) -> ServerFacts:
        """Read :class:`ServerFacts` for django-fq's ``tables`` (four round trips)."""
        marks = ", ".join(["%s"] * len(tables))
        with conn.cursor() as cur:
            cur.execute(
                "SELECT @@log_bin, @@binlog_format, @@max_allowed_packet, @@default_storage_engine, "
                "@@character_set_connection"
            )
            log_bin, binlog_format, packet, engine, charset = cur.fetchone()
            cur.execute(
                f"SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                f"AND TABLE_NAME IN ({marks})",
                list(tables),
            )
            engines = {t: str(e or "") for t, e in cur.fetchall()}
            keyed = list(BINARY_COLUMNS)
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({', '.join(['%s'] * len(keyed))})",
                keyed,
            )
            columns = {(t, c): coll for t, c, coll in cur.fetchall()}
        collations: dict[tuple[str, str], str] = {}
        if ("django_fq_job", ACTIVE_KEY_COLUMN) in columns:  # migration 0003 has run
            collations = {(t, c): columns[(t, c)] for t, cs in BINARY_COLUMNS.items() for c in cs}
            collations[("django_fq_job", ACTIVE_KEY_COLUMN)] = columns[("django_fq_job", ACTIVE_KEY_COLUMN)]
        return ServerFacts(
            mariadb=conn.mysql_is_mariadb,
            version=tuple(conn.mysql_version),
            log_bin=bool(int(log_bin)),
            binlog_format=str(binlog_format),
            max_allowed_packet=int(packet),
            default_engine=str(engine),
            charset=str(charset),
            engines=engines,
            collations=collations,
            binary=self.binary_collation(conn),
        )

    def journal_mode(self, conn: Any) -> str | None:
        return None  # the server's redo log serves every process

    def startup_probe(self, conn: Any) -> None:
        return None  # no database-wide lock to meet

    def int_div_sql(self, a: str, b: str) -> str:
        # ``/`` gives a decimal (rounded to div_precision_increment places): DIV is the integer quotient.
        return f"({a}) DIV ({b})"

    errors_filter_sql = "JSON_TYPE(errors) = 'ARRAY' AND JSON_LENGTH(errors) > 0"

    def failure_entries_sql(self, newest: str, marks: str) -> str:
        return (
            "SELECT CASE WHEN JSON_TYPE(JSON_EXTRACT(e.value, '$.at')) IN ('INTEGER', 'UNSIGNED INTEGER') "
            "THEN CAST(JSON_EXTRACT(e.value, '$.at') AS SIGNED) END AS at "
            f"FROM ({newest}) AS j, JSON_TABLE(j.errors, '$[*]' COLUMNS (value JSON PATH '$')) AS e "
            f"WHERE JSON_TYPE(e.value) = 'OBJECT' AND JSON_UNQUOTE(JSON_EXTRACT(e.value, '$.kind')) IN ({marks})"
        )

    # --- leases (claim, settle, expiry) ---

    #: Server error numbers meaning "another transaction got in the way": ER_LOCK_DEADLOCK,
    #: ER_LOCK_WAIT_TIMEOUT, and ER_CHECKREAD (MariaDB's snapshot isolation, 1020).
    RETRYABLE_ERRNOS = frozenset({1213, 1205, 1020})

    def is_retryable(self, exc: BaseException) -> bool:
        # mysqlclient raises with (errno, message); Django's wrapper keeps those args.
        for err in (exc, getattr(exc, "__cause__", None)):
            args = getattr(err, "args", ())
            if args and isinstance(args[0], int):
                return args[0] in self.RETRYABLE_ERRNOS
        text = str(exc).lower()
        return "deadlock found" in text or "lock wait timeout exceeded" in text

    def claim_facts(self, conn: Any, queue_name: str) -> tuple | None:
        """One round trip, in autocommit only: the queue, and whether it has an eligible job or an expired lease
        (or, with ``key_concurrency``, a key whose held job has become due: that counts as expired).

        The claim's transaction costs seven round trips even when it finds
        nothing (autocommit off, expiry read, limit read, job read, commit,
        autocommit on), and an idle worker polls every ``--poll-interval``:
        most claims are empty, and end after this read. In autocommit every
        statement reads the newest commit (READ COMMITTED and REPEATABLE READ
        alike), so a job committed just after it is one committed just after
        the claim, and a lease expiring just after it is handled by the next
        claim (as on PostgreSQL, whose claim statement reports expiry the same
        way). Inside a caller's transaction, whose snapshot may be old (an
        ``atomic`` block, or autocommit turned off): ``None``.
        """
        if conn.in_atomic_block or not conn.get_autocommit():
            return None
        from .. import db

        now = db.now_sql(conn)
        with conn.cursor() as cur:
            # The claim index, named: with many finished rows the optimizer may take the
            # (state, finished_at) index and walk the queued rows of every queue. The soonest
            # deadline is one index dive (min/max); "deadline <= clock" would scan the queue's
            # leases, SYSDATE being no constant the range could start from.
            cur.execute(
                f"SELECT q.id, q.visibility_ms, NOT q.paused AND EXISTS (SELECT 1 FROM {JOB_TABLE} j "
                f"FORCE INDEX (fq_job_claim) WHERE j.queue_id = q.id AND j.state = 'queued' AND j.run_at <= {now}), "
                f"COALESCE((SELECT MIN(l.deadline) FROM {LEASE_TABLE} l WHERE l.queue_id = q.id) <= {now}, 0) "
                f"OR ((q.key_concurrency > 0 OR q.key_rate_limit > 0) AND EXISTS (SELECT 1 FROM {KEY_TABLE} k WHERE k.queue_id = q.id "
                f"AND k.wake_at <= {now})) "
                f"FROM {QUEUE_TABLE} q WHERE q.name = %s",
                [queue_name],
            )
            row = cur.fetchone()
        return () if row is None else (row[0], row[1], bool(row[2]), bool(row[3]))

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
        """Three round trips (seven with a concurrency limit): no ``UPDATE … RETURNING`` here.

        With a limit: the queue's claim lock (claims of the queue serialise
        on it, :meth:`_lock_row`), the limit re-read with a share lock on the
        queue row (configure() and claims wait for each other), then the live leases counted in a
        locking read (a caller's REPEATABLE READ snapshot may be older). Then
        the eligible jobs locked ``FOR UPDATE SKIP LOCKED`` (their sizes only,
        and the clock, whose latest reading is ``claimed_at`` of every job);
        one ``UPDATE``; the taken rows read back (the transaction sees its own
        writes). The pause flag: with a limit, read with the limit under the
        share lock (a pause()'s ``UPDATE`` waits for those claims); without
        one, in the ``UPDATE`` that takes the jobs, which reads it after the
        locking read of the jobs (no round trip of its own; in a caller's
        transaction, whose snapshot may be old, one locking read first). A
        rate limit takes the path of a concurrency limit, with its gate
        (:meth:`Store.open_rate_gate`, :meth:`Store.close_rate_gate`) under the same claim lock.
        """
        from .. import db

        queue, job, lease = QUEUE_TABLE, JOB_TABLE, LEASE_TABLE
        rate_limited = rate is not None and rate.limit > 0
        with conn.cursor() as cur:
            if concurrency > 0 or rate_limited:
                # Limited claims of the queue serialise on a lock of their own, not on the queue
                # row: producers share-lock that row to their commit (delete_queue waits for
                # them), and a claim taking it FOR UPDATE would wait for every open enqueue
                # transaction (docs/reference/semantics.md §9). Then the limit is re-read with
                # a share lock, which producers' share locks let through and configure()'s
                # UPDATE waits for (and it for configure): a configure() that committed wins.
                self._lock_row(cur, f"fq-queue-claims-{queue_id:x}")
                cur.execute(
                    f"SELECT concurrency, paused, rate_limit, rate_window_ms FROM {queue} WHERE id = %s "
                    "LOCK IN SHARE MODE",
                    [queue_id],
                )
                row = cur.fetchone()
                if row is None or row[1]:
                    return []
                concurrency = row[0]
                if concurrency > 0:  # 0 now means unlimited
                    cur.execute(f"SELECT COUNT(*) FROM {lease} WHERE queue_id = %s LOCK IN SHARE MODE", [queue_id])
                    count = min(count, concurrency - cur.fetchone()[0])
                    if count <= 0:
                        return []
                if rate is not None:
                    rate.limit, rate.window_ms = row[2], row[3]
                    rate_limited = rate.limit > 0
                    if rate_limited:
                        count = self.open_rate_gate(conn, rate, queue_id=queue_id, want=count)
                        if count <= 0:
                            return []
            elif self.may_read_stale(conn):
                # A caller's snapshot may predate a pause(): read the flag from the newest commit.
                cur.execute(f"SELECT paused FROM {queue} WHERE id = %s LOCK IN SHARE MODE", [queue_id])
                row = cur.fetchone()
                if row is None or row[0]:
                    return []
            # The clock is read by the locking read itself, with each row it takes (SYSDATE: at
            # execution), and the latest of those readings stamps every job: no row was taken
            # before its run_at, and no round trip of its own for the clock. The claim index is
            # named: with 1M finished rows the optimizer was seen taking fq_job_finished (state,
            # finished_at), reading the queued rows of every queue and sorting them.
            clock = db.now_sql(conn)
            cur.execute(
                f"SELECT seq, payload_size, {clock} FROM {job} FORCE INDEX (fq_job_claim) WHERE queue_id = %s "
                f"AND state = 'queued' AND run_at <= {clock} ORDER BY priority DESC, seq LIMIT %s FOR UPDATE SKIP LOCKED",
                [queue_id, count],
            )
            taken = cur.fetchall()
            seqs = within_cap([row[:2] for row in taken], cap)
            if not seqs:
                return []
            now = max(int(row[2]) for row in taken)
            marks = ", ".join(["%s"] * len(seqs))
            # The pause flag in the statement that takes the jobs (READ COMMITTED: read as this
            # statement starts, after the locking read above): a pause() that committed before
            # those rows were read is seen, so no job enqueued after pause() returned is taken.
            cur.execute(
                f"UPDATE {job} SET state = 'running', attempts = attempts + 1, generation = generation + 1, "
                f"claimed_at = %s, changed_at = %s, worker = %s, {CLEAR_PROGRESS_SQL} WHERE seq IN ({marks}) "
                f"AND NOT EXISTS (SELECT 1 FROM {queue} WHERE id = %s AND paused)",
                [now, now, worker, *seqs, queue_id],
            )
            if cur.rowcount == 0:
                return []  # paused meanwhile: the rows stay queued (locked until this transaction ends)
            cur.execute(f"SELECT {', '.join(TAKEN_COLUMNS)} FROM {job} WHERE seq IN ({marks})", seqs)
            taken = fetch_dicts(cur)
        if rate is not None and rate_limited:
            self.close_rate_gate(conn, rate, queue_id=queue_id, rows=taken)
        return taken

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
        """Two round trips in one transaction: the lease locked ``FOR UPDATE``, then the job's ``UPDATE``.

        As :meth:`Store.write_progress`, with the lease row locked first: at
        READ COMMITTED InnoDB reads the base statement's lease subquery without
        a lock, so a report could land between an ack's lease lock and its job
        update, stamped after the ack's finish. Locked in the settles' order
        (lease, then job), a report either waits for the settle and then finds
        no lease, or goes first and the settle's clock, read once its locks are
        granted, comes after it.
        """
        job, lease = JOB_TABLE, LEASE_TABLE
        with transaction.atomic(using=conn.alias, savepoint=False), conn.cursor() as cur:
            cur.execute(
                f"SELECT l.job_id FROM {lease} l JOIN {job} j ON j.seq = l.job_id "
                f"JOIN {QUEUE_TABLE} q ON q.id = l.queue_id "
                f"WHERE j.uid = %s AND q.name = %s AND l.generation = %s AND l.receipt_hash = %s "
                f"AND l.deadline > {now} FOR UPDATE",
                [uid, queue_name, generation, receipt_hash],
            )
            row = cur.fetchone()
            if row is None:
                return False
            cur.execute(
                f"UPDATE {job} SET progress = %s, progress_message = %s, progress_at = {now} "
                f"WHERE seq = %s AND generation = %s AND state = 'running'",
                [progress, message, row[0], generation],
            )
            return cur.rowcount == 1

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
        """Three round trips: the jobs' seqs, the leases locked ``FOR UPDATE`` in job order, then the verdict.

        The verdict is a second locking read of rows already held: it waits
        for nothing, so its clock is read after every lock was granted, and a
        locking read sees the newest committed rows whatever the isolation
        level. ``judge=False`` is not offered (no one-statement ack here).
        ``lock_jobs``: the second read locks the job rows too (after their
        leases, in the same job order) and reads their ``has_dependents``.
        """
        from .. import db

        if queue_id is None:
            raise ValueError("lock_leases: queue_id (queue_name only with the one-statement ack)")
        if relax:
            self.relax_commit(conn)
        if not judge:
            raise NotImplementedError("MysqlStore.lock_leases: judge=False needs the one-statement ack")
        job, lease = JOB_TABLE, LEASE_TABLE
        marks = ", ".join(["%s"] * len(uids))
        with conn.cursor() as cur:
            # A job's uid, queue and seq never change: a plain read is enough.
            cur.execute(
                f"SELECT seq, uid, concurrency_key FROM {job} WHERE queue_id = %s AND uid IN ({marks})", [queue_id, *uids]
            )
            found = cur.fetchall()
            uid_of = {seq: uid for seq, uid, _ in found}
            key_of = {seq: key for seq, _, key in found}
            if not uid_of:
                return []
            seqs = sorted(uid_of)
            # Each lease found by a unique lookup joined from the list (eq_ref), in job order: a
            # range scan (``job_id IN (…)``) locks the row after each point too, which is another
            # worker's lease when claims handed out neighbouring seqs, and two acks then wait on
            # each other (error 1213, seen in the MariaDB kill storm; the (queue_id, deadline)
            # index the optimizer picks for a small table locks every lease of the queue).
            listed = _seq_list_sql(len(seqs))
            match = (
                f"FROM {listed} STRAIGHT_JOIN {lease} l FORCE INDEX (PRIMARY) ON l.job_id = v.seq "
                "WHERE l.queue_id = %s ORDER BY l.job_id FOR UPDATE"
            )
            if lock_jobs:
                cur.execute(
                    f"SELECT l.job_id, j.has_dependents FROM {listed} "
                    f"STRAIGHT_JOIN {lease} l FORCE INDEX (PRIMARY) ON l.job_id = v.seq "
                    f"STRAIGHT_JOIN {job} j FORCE INDEX (PRIMARY) ON j.seq = l.job_id "
                    "WHERE l.queue_id = %s ORDER BY l.job_id FOR UPDATE",
                    [*seqs, queue_id],
                )
            else:
                cur.execute(f"SELECT l.job_id, 0 {match}", [*seqs, queue_id])
            flags = {int(seq): bool(flag) for seq, flag in cur.fetchall()}
            if not flags:
                return []
            now = db.now_sql(conn)
            cur.execute(
                f"SELECT {', '.join('l.' + c for c in LEASE_COLUMNS)}, "
                f"CASE WHEN l.deadline > {now} THEN 1 ELSE 0 END AS live, "
                f"{now} AS now {match}",
                [*seqs, queue_id],
            )
            rows = fetch_dicts(cur)
        for row in rows:
            row["uid"] = uid_of[row["job_id"]]
            row["concurrency_key"] = key_of[row["job_id"]]
            if lock_jobs:
                row["has_dependents"] = flags.get(row["job_id"], False)
        return rows

    def history_append_row_sql(self, column: str, entry_sql: str, keep: int) -> str:
        """As :meth:`history_append_sql`, the entry an expression of the row (``JSON_OBJECT``: a JSON value)."""
        base = f"COALESCE({column}, '[]')"
        return (
            f"JSON_REMOVE(JSON_ARRAY_APPEND({base}, '$', {entry_sql}), "
            f"IF(JSON_LENGTH({base}) >= {int(keep)}, '$[0]', '$[{int(keep)}]'))"
        )

    def component_sql(self, limit: int) -> str:
        """:meth:`Store.component <django_fq.storage.dependencies.DependencySql.component>` on MariaDB.

        Two recursive selects, one per index of the edges; ``UNION`` keeps each
        job once. MariaDB takes no ``LIMIT`` inside a recursive CTE, so the walk
        is bounded by levels instead (``max_recursive_iterations`` for this
        statement only: ``limit`` levels, which a component of at most
        ``limit`` jobs never needs) and its answer by the outer ``LIMIT``.
        """
        dep = DEPENDENCY_TABLE
        return f"""SET STATEMENT max_recursive_iterations = {int(limit)} FOR
WITH RECURSIVE reach(seq) AS (
    SELECT CAST(%s AS SIGNED)
    UNION SELECT e.upstream_id FROM reach r JOIN {dep} e ON e.job_id = r.seq
    UNION SELECT e.job_id FROM reach r JOIN {dep} e ON e.upstream_id = r.seq),
found AS (SELECT seq FROM reach LIMIT %s)
SELECT 'n', seq, NULL FROM found
UNION ALL
SELECT 'e', e.job_id, e.upstream_id FROM found a JOIN {dep} e ON e.job_id = a.seq"""

    def component(self, conn: Any, seq: int, *, limit: int) -> tuple[list[int], list[tuple[int, int]]]:
        """MariaDB: the recursive statement. MySQL proper (whose recursion depth is an error past
        ``cte_max_recursion_depth``, not a stop): level by level, one query per level per 500 jobs."""
        if conn.mysql_is_mariadb:
            return super().component(conn, seq, limit=limit)
        seen, order, frontier = {seq}, [seq], [seq]
        edges: set[tuple[int, int]] = set()
        with conn.cursor() as cur:
            while frontier and len(order) < limit:
                found: list[int] = []
                for part in self._parts(frontier):
                    marks = ", ".join(["%s"] * len(part))
                    cur.execute(
                        f"SELECT job_id, upstream_id FROM {DEPENDENCY_TABLE} "
                        f"WHERE job_id IN ({marks}) OR upstream_id IN ({marks})",
                        [*part, *part],
                    )
                    for job, up in cur.fetchall():
                        edges.add((int(job), int(up)))
                        for s in (int(job), int(up)):
                            if s not in seen and len(order) < limit:
                                seen.add(s)
                                order.append(s)
                                found.append(s)
                frontier = found
        return order, [(j, u) for j, u in sorted(edges) if j in seen and u in seen]

    def mark_acked(self, conn: Any, *, now: int, acks: Sequence[tuple[int, str | None, str, str]]) -> None:
        """One multi-table ``UPDATE`` joined with the values as a derived table (no ``VALUES`` rows: MySQL 8 spells them apart)."""
        job = JOB_TABLE
        first = "SELECT %s AS seq, %s AS result, %s AS hash, %s AS args"
        rest = " UNION ALL SELECT %s, %s, %s, %s" * (len(acks) - 1)
        values: list = []
        for ack in acks:
            values += list(ack)
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {job} j JOIN ({first}{rest}) AS v ON j.seq = v.seq SET j.state = 'succeeded', "
                f"j.result = v.result, j.settled_hash = v.hash, j.settled_args = v.args, j.settled_op = 'ack', "
                f"j.settled_outcome = %s, j.finished_at = %s, j.changed_at = %s",
                [*values, ACKED_JSON, now, now],
            )

    def end_expired_leases(self, conn: Any, *, queue_id: int | None, limit: int) -> list[dict]:
        """Two round trips: the expired leases locked ``FOR UPDATE SKIP LOCKED``, then one ``DELETE``.

        The deadline is compared in the locking read itself: it never waits
        (SKIP LOCKED), and it judges the newest committed version of each row
        it locks, so a lease extended or settled meanwhile is not taken.
        """
        from .. import db

        lease = LEASE_TABLE
        now = db.now_sql(conn)
        where = "queue_id = %s AND " if queue_id is not None else ""
        params = [queue_id] if queue_id is not None else []
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT {', '.join(LEASE_COLUMNS)}, queue_id, {now} AS now FROM {lease} "
                f"WHERE {where}deadline <= {now} ORDER BY deadline LIMIT %s FOR UPDATE SKIP LOCKED",
                [*params, limit],
            )
            rows = fetch_dicts(cur)
            if rows:
                self.delete_leases(cur, [r["job_id"] for r in rows])
        return rows

    def delete_leases(self, cur: Any, seqs: Sequence[int]) -> None:
        """Each lease by a unique lookup joined from the list, as :meth:`lock_leases` locks them.

        ``DELETE … WHERE job_id IN (…)`` is a range scan, which locks the row
        after each point (another worker's lease) and deadlocks two settles.
        """
        cur.execute(
            f"DELETE l FROM {_seq_list_sql(len(seqs))} STRAIGHT_JOIN {LEASE_TABLE} l FORCE INDEX (PRIMARY) "
            "ON l.job_id = v.seq",
            list(seqs),
        )

    # --- enqueue, queues, counters, maintenance ---------------------------------------------
    # No RETURNING (MySQL 8 has none, MariaDB none on UPDATE), no WITH before INSERT, and
    # no subquery on the table a DELETE or UPDATE writes: a locking SELECT, then the write.
    # Inside a caller's REPEATABLE READ transaction a plain SELECT reads its old snapshot,
    # so the reads the writes depend on lock (they read the latest commit).

    def active_jobs_by_key(
        self, conn: Any, queue_id: int, keys: Sequence[str], *, refused: bool = False
    ) -> dict[str, str]:
        """One round trip: the holders read without a lock (``refused``: with one).

        The generated column is the unique key while the job is active: its
        unique index answers (named: on a small table the optimizer prefers
        the (queue_id, state, …) index, and a locking read through it locks
        every job of the queue). No lock on a holder: a share lock would stay
        to the producer's commit, and until then claims skip the job (SKIP
        LOCKED) and its ack waits (docs/reference/semantics.md §9: an enqueue
        inside a long transaction must not block the queue). No locking read
        of a key no job holds either: under REPEATABLE READ it locks the
        index gap, and every other producer's insert into it waits for the
        caller's commit. A key committed after a caller's REPEATABLE READ
        snapshot is refused by the unique index at insert time (error 1062);
        the services then ask again with ``refused=True``, and the holder
        exists: a locking read (the latest commit). A holder that a caller's
        old snapshot still shows active is taken as it is, as PostgreSQL's
        plain read there does.
        """
        if not keys:
            return {}
        pick = (
            f"SELECT {ACTIVE_KEY_COLUMN}, uid FROM {JOB_TABLE} FORCE INDEX ({ACTIVE_KEY_INDEX}) "
            f"WHERE queue_id = %s AND {ACTIVE_KEY_COLUMN} IN ({', '.join(['%s'] * len(keys))})"
        )
        with conn.cursor() as cur:
            cur.execute(f"{pick} LOCK IN SHARE MODE" if refused else pick, [queue_id, *keys])
            return dict(cur.fetchall())

    #: Bytes of payload per INSERT statement, well under the server's max_allowed_packet (16 MiB by default).
    _STATEMENT_BYTES = 4 * 1024 * 1024

    def count_queues(self, conn: Any) -> int:
        # A locking read counts the latest commit, not a caller's older REPEATABLE READ snapshot.
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {QUEUE_TABLE} LOCK IN SHARE MODE")
            return int(cur.fetchone()[0])

    def _clock(self, cur: Any, now: str) -> int:
        """The database clock (epoch ms), read once for a write that stamps many rows with one instant."""
        cur.execute(f"SELECT {now}")
        return int(cur.fetchone()[0])

    def take_tokens(
        self, conn: Any, *, now: str, queue_id: int, rows: Sequence[tuple[str, str, int]]
    ) -> tuple[dict[str, str], int]:
        # INSERT … VALUES with the clock read first, not INSERT … SELECT: with
        # innodb_autoinc_lock_mode 1 (MariaDB's default) an INSERT … SELECT holds the table's
        # AUTO-INC lock to its end, and racing producers waiting on each other's token rows then
        # fail with errors 1213/1467. Four round trips.
        table = TOKEN_TABLE
        tokens = [r[0] for r in rows]
        marks = ", ".join(["%s"] * len(tokens))
        # Replace a row only when it has expired: every column is assigned IF(expired, new, old),
        # expires_at last, since each assignment sees the ones before it.
        expired = "expires_at <= VALUES(created_at)"
        with conn.cursor() as cur:
            # Which rows exist already (only to count the added ones). Not a locking read: under
            # REPEATABLE READ one that finds no row locks the index gap, and other producers'
            # new tokens wait for the caller's commit. The INSERT below waits for (and locks)
            # every row it meets; a row committed after a caller's older snapshot is then
            # missing here, which miscounts only a token that both committed after that
            # snapshot and expired before this call.
            cur.execute(f"SELECT token FROM {table} WHERE queue_id = %s AND token IN ({marks})", [queue_id, *tokens])
            existing = {r[0] for r in cur.fetchall()}
            t = self._clock(cur, now)
            params: list = []
            for token, uid, retention in rows:
                params += [queue_id, token, uid, t, t + retention]
            cur.execute(
                f"INSERT INTO {table} (queue_id, token, job_uid, created_at, expires_at) VALUES "
                f"{', '.join(['(%s, %s, %s, %s, %s)'] * len(rows))} "
                f"ON DUPLICATE KEY UPDATE job_uid = IF({expired}, VALUES(job_uid), job_uid), "
                f"created_at = IF({expired}, VALUES(created_at), created_at), "
                f"expires_at = IF({expired}, VALUES(expires_at), expires_at)",
                params,
            )
            # Which job each token names now: ours where we wrote it (uids are unique). Not a
            # locking read: ON DUPLICATE KEY UPDATE that leaves a live row as it is lets go of
            # the row at READ COMMITTED, and locking it again here, while holding the rows we
            # inserted, deadlocks with a producer racing us through the same tokens. It waited
            # for their writers to commit, so READ COMMITTED reads them. A caller's REPEATABLE
            # READ snapshot may predate them: a row missing, or one expired without our uid,
            # is such a stale read; only those are read again, locking (the latest commit).
            cur.execute(
                f"SELECT token, job_uid, expires_at FROM {table} WHERE queue_id = %s AND token IN ({marks})",
                [queue_id, *tokens],
            )
            mine = {token: uid for token, uid, _ in rows}
            named = {tok: uid for tok, uid, exp in cur.fetchall() if uid == mine[tok] or exp > t}
            stale = [tok for tok in tokens if tok not in named]
            if stale:
                cur.execute(
                    f"SELECT token, job_uid FROM {table} WHERE queue_id = %s "
                    f"AND token IN ({', '.join(['%s'] * len(stale))}) LOCK IN SHARE MODE",
                    [queue_id, *stale],
                )
                named.update(cur.fetchall())
        ours = {token for token, uid, _ in rows if named.get(token) == uid}
        return named, len(ours - existing)

    def insert_jobs(self, conn: Any, *, now: str, queue_id: int, rows: Sequence[tuple]) -> dict[str, int]:
        # The clock is read first and the rows go as INSERT … VALUES (see take_tokens), in
        # input order, which AUTO_INCREMENT follows within a statement. A unique key held by
        # an active job fails the statement with error 1062 (the unique index on the
        # generated active-key column): then row by row, each in a savepoint, skipping
        # those. A statement that did not fail wrote every row, so nothing is read back.
        if not rows:
            return {}
        with conn.cursor() as cur:
            t = self._clock(cur, now)
        keyed = sum(1 for r in rows if r[8] is not None)
        if keyed > 1:
            return self._insert_keys_sorted(conn, t, queue_id, rows)
        if not keyed:
            # No unique key, no 1062 to step around (the active-key index is the only one a
            # new job can meet; uids are random): no savepoint, two round trips fewer.
            for batch in self._batches(rows):
                self._insert_job_rows(conn, t, queue_id, batch)
            return {r[0]: t for r in rows}
        created: dict[str, int] = {}
        for batch in self._batches(rows):
            try:
                with transaction.atomic(using=conn.alias):
                    self._insert_job_rows(conn, t, queue_id, batch)
                created.update((r[0], t) for r in batch)
                continue
            except IntegrityError as exc:
                if not _duplicate(exc):
                    raise
            for row in batch if len(batch) > 1 else ():
                try:
                    with transaction.atomic(using=conn.alias):
                        self._insert_job_rows(conn, t, queue_id, [row])
                    created[row[0]] = t
                except IntegrityError as exc:
                    if not _duplicate(exc):
                        raise
        return created

    def _batches(self, rows: Sequence[tuple]) -> list[list[tuple]]:
        """``rows`` cut in input order into INSERT statements of at most :attr:`_STATEMENT_BYTES` of payload."""
        batches: list[list[tuple]] = [[]]
        size = 0
        for row in rows:
            if batches[-1] and size + len(row[6]) > self._STATEMENT_BYTES:
                batches.append([])
                size = 0
            batches[-1].append(row)
            size += len(row[6])
        return batches

    def _insert_keys_sorted(self, conn: Any, t: int, queue_id: int, rows: Sequence[tuple]) -> dict[str, int]:
        """Insert ``rows`` (several with a unique key), taking the keys' index entries in key order.

        Inserted in input order, two batches holding the same keys in opposite
        orders would each wait for the other's uncommitted index entry: InnoDB
        then kills one (error 1213) and, inside a caller's transaction, the
        whole transaction is gone and cannot be retried. So the jobs go in input
        order (their seq, the FIFO order) without their keys, and one UPDATE
        then sets the keys in key order (the sorted order of Python strings, the
        same in every producer): the batches queue up on the first key they
        share. A key an active job holds fails that UPDATE with error 1062; the
        keys are then set one by one, in the same order, each in a savepoint,
        and a job whose key is taken is deleted again (no one else saw it).
        Three round trips (plus one per key after a 1062).
        """
        for batch in self._batches([(*r[:8], None, *r[9:]) for r in rows]):
            self._insert_job_rows(conn, t, queue_id, batch)
        created = {r[0]: t for r in rows}
        keyed = sorted((r[8], r[0]) for r in rows if r[8] is not None)
        cases = " ".join(["WHEN %s THEN %s"] * len(keyed))
        marks = ", ".join(["%s"] * len(keyed))
        uids = [uid for _, uid in keyed]
        try:
            with transaction.atomic(using=conn.alias), conn.cursor() as cur:
                cur.execute(
                    f"UPDATE {JOB_TABLE} SET unique_key = CASE uid {cases} END "
                    f"WHERE queue_id = %s AND uid IN ({marks}) ORDER BY FIELD(uid, {marks})",
                    [*(v for key, uid in keyed for v in (uid, key)), queue_id, *uids, *uids],
                )
            return created
        except IntegrityError as exc:
            if not _duplicate(exc):
                raise
        for key, uid in keyed:
            try:
                with transaction.atomic(using=conn.alias), conn.cursor() as cur:
                    cur.execute(f"UPDATE {JOB_TABLE} SET unique_key = %s WHERE uid = %s", [key, uid])
            except IntegrityError as exc:
                if not _duplicate(exc):
                    raise
                with conn.cursor() as cur:
                    cur.execute(f"DELETE FROM {JOB_TABLE} WHERE uid = %s", [uid])
                del created[uid]
        return created

    def _insert_job_rows(self, conn: Any, t: int, queue_id: int, rows: Sequence[tuple]) -> None:
        params: list = []
        for row in rows:
            (uid, priority, at, delay_ms, max_attempts, timeout_ms, payload, size, unique_key, token, meta, tags,
             ckey, state) = full_row(row)  # fmt: skip
            run_at = at if at is not None else t + delay_ms
            params += [
                uid, queue_id, state, priority, run_at, t, t, max_attempts, timeout_ms, payload, size, unique_key,
                token, meta, tags, ckey,
            ]  # fmt: skip
        one = "(%s, %s, %s, %s, %s, %s, %s, 0, %s, 0, %s, %s, %s, '', '[]', %s, %s, '', %s, %s, %s)"
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {JOB_TABLE} (uid, queue_id, state, priority, run_at, enqueued_at, changed_at, "
                "attempts, max_attempts, generation, timeout_ms, payload, payload_size, last_error, errors, "
                f"unique_key, idempotency, worker, metadata, tags, concurrency_key) VALUES {', '.join([one] * len(rows))}",
                params,
            )

    def add_counters(self, conn: Any, queue_id: int, deltas: dict[str, int]) -> None:
        # MySQL refuses a subquery on the table an UPDATE writes: pick the shard first.
        table = COUNTER_TABLE
        with conn.cursor() as cur:
            # The queue's shards are listed by a subquery, which does not lock (only the outer
            # rows, by primary key, are locked). Scanning the queue_id index with the locking
            # read itself would, under a caller's REPEATABLE READ, lock the gap after the queue's
            # last shard until the caller commits, and every other transaction's new shard for
            # the queue (all shards busy) would wait for it.
            cur.execute(
                f"SELECT id FROM {table} WHERE id IN (SELECT id FROM {table} WHERE queue_id = %s) "
                "LIMIT 1 FOR UPDATE SKIP LOCKED",
                [queue_id],
            )
            row = cur.fetchone()
            if row is None:
                self._insert_shard(cur, queue_id, deltas)
                return
            sets = ", ".join(f"{k} = {k} + %s" for k in deltas)
            cur.execute(f"UPDATE {table} SET {sets} WHERE id = %s", [*deltas.values(), row[0]])

    def delete_queue_rows(self, conn: Any, queue_id: int) -> None:
        # InnoDB checks the lease → job foreign key at once (PostgreSQL and SQLite at commit), so
        # leases go before their jobs. Locking the jobs first waits for a claim in flight, as the
        # other backends' jobs-first DELETE does, so the leases it wrote are seen and go too; no
        # claim takes a job this holds, and no enqueue adds one (the queue row is held). Nine round trips.
        with conn.cursor() as cur:
            cur.execute(f"SELECT seq FROM {JOB_TABLE} WHERE queue_id = %s FOR UPDATE", [queue_id])
            cur.fetchall()
            self._delete_queue_bodies(cur, queue_id)
            self.delete_queue_dependencies(conn, queue_id)
            for table in (
                LEASE_TABLE, JOB_TABLE, TOKEN_TABLE, COUNTER_TABLE, KEY_TABLE, RATE_TABLE, RATE_LOG_TABLE, KEY_CLAIM_TABLE,
                MINUTE_TABLE,
            ):  # fmt: skip
                cur.execute(f"DELETE FROM {table} WHERE queue_id = %s", [queue_id])
            cur.execute(f"DELETE FROM {QUEUE_TABLE} WHERE id = %s", [queue_id])

    def prune_jobs(self, conn: Any, *, now: str, retention_ms: int, limit: int) -> int:
        table = JOB_TABLE
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT j.seq, j.uid, j.payload = %s FROM {table} j WHERE j.state IN ('succeeded', 'cancelled') "
                f"AND j.finished_at <= {now} - %s AND {self.prunable_sql('j')} LIMIT %s FOR UPDATE SKIP LOCKED",
                [OFFLOADED, retention_ms, limit],
            )
            rows = cur.fetchall()
            if not rows:
                return 0
            seqs = [r[0] for r in rows]
            self.delete_bodies(conn, [r[1] for r in rows if r[2]])
            self.delete_dependencies(conn, seqs)
            cur.execute(f"DELETE FROM {table} WHERE seq IN ({', '.join(['%s'] * len(seqs))})", seqs)
            return cur.rowcount

    def prune_tokens(self, conn: Any, *, now: str, limit: int) -> list[int]:
        table = TOKEN_TABLE
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT id, queue_id FROM {table} WHERE expires_at <= {now} LIMIT %s FOR UPDATE SKIP LOCKED", [limit]
            )
            rows = cur.fetchall()
            if not rows:
                return []
            cur.execute(f"DELETE FROM {table} WHERE id IN ({', '.join(['%s'] * len(rows))})", [r[0] for r in rows])
        return [r[1] for r in rows]


    # --- the worker registry (django_fq.storage.workers) ----------------------------------------

    def register_worker(self, conn: Any, *, now: str, row: Sequence[Any], started_ago_ms: int) -> None:
        """As :meth:`Store.register_worker <django_fq.storage.workers.WorkerSql.register_worker>`, with ``ON DUPLICATE KEY UPDATE``."""
        columns = ", ".join((*REGISTER_COLUMNS, "started_at", "heartbeat_at"))
        updates = ", ".join(f"{c} = VALUES({c})" for c in (*REGISTER_COLUMNS[1:], "started_at", "heartbeat_at"))
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {WORKER_TABLE} ({columns}) VALUES {self._register_values(now)} ON DUPLICATE KEY UPDATE {updates}",
                [*row, started_ago_ms],
            )

    # --- edges: driver errors, backup rows, listening -------------------------------------------

    driver_modules = ("MySQLdb", "pymysql")

    @classmethod
    def is_unavailable(cls, cause: BaseException) -> bool:
        if not cls.is_driver_error(cause):
            return False
        code = cause.args[0] if cause.args and isinstance(cause.args[0], int) else None
        return code in UNAVAILABLE_CODES


def _duplicate(exc: IntegrityError) -> bool:
    """True for error 1062, a duplicate entry in a unique index."""
    cause = exc.__cause__
    return bool(cause is not None and getattr(cause, "args", None) and cause.args[0] == 1062)
