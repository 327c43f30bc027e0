"""Backend-specific pieces: the database clock, write transactions, wakeups.

Only this module knows how PostgreSQL and SQLite differ. The services ask it
for the clock expression, for a write transaction that is safe on the backend,
and for a wakeup notification after an enqueue.
"""

from __future__ import annotations

import contextlib
import random
import time

from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.models import BigIntegerField, Func

from . import conf

#: PostgreSQL channel notified (on commit) after every enqueue that created jobs.
NOTIFY_CHANNEL = "django_fq"

_PG_NOW = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"
# SQLite keeps 'now' as whole milliseconds of the Julian day; julianday() returns
# that over 86400000.0, so rounding recovers the exact millisecond. (No '%' in the
# text: Django rewrites '%s' into a placeholder in statements with parameters.)
_SQLITE_NOW = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)"


def connection():
    """The connection django-fq uses (alias ``FQ_DATABASE``)."""
    return connections[conf.database()]


def is_postgres(conn=None) -> bool:
    """True when ``conn`` (default: django-fq's connection) is PostgreSQL."""
    return (conn or connection()).vendor == "postgresql"


def now_sql(conn=None) -> str:
    """SQL for the database's current time in epoch milliseconds.

    PostgreSQL uses ``clock_timestamp()`` (time at execution, not transaction
    start); SQLite uses ``'now'``, which is fixed for one statement. The test
    setting ``FQ_TEST_CLOCK_OFFSET_MS`` is added inside the expression.
    """
    base = _PG_NOW if is_postgres(conn) else _SQLITE_NOW
    offset = conf.clock_offset_ms()
    return f"({base} + {offset:d})" if offset else base


class DbNow(Func):
    """ORM expression for :func:`now_sql`: the database clock in epoch ms."""

    output_field = BigIntegerField()

    def as_sql(self, compiler, connection, *args, **extra):
        return now_sql(connection), []


def db_now_ms() -> int:
    """Read the database clock (epoch ms). For reporting only; never compare against it in Python."""
    with connection().cursor() as cur:
        cur.execute(f"SELECT {now_sql()}")
        return int(cur.fetchone()[0])


@contextlib.contextmanager
def write_atomic():
    """A transaction (or savepoint, inside the caller's) for a write path.

    On SQLite an outermost block begins with ``BEGIN IMMEDIATE`` whatever the
    site's ``transaction_mode``, so the write lock is taken up front and a
    read-then-write sequence can never fail half-way with "database is locked".
    Inside a caller's transaction the caller's mode applies; every SQLite write
    path therefore starts with a write statement.
    """
    conn = connection()
    if conn.vendor == "sqlite" and not conn.in_atomic_block:
        with sqlite_atomic(conn, "IMMEDIATE"):
            yield conn
    else:
        with transaction.atomic(using=conn.alias):
            yield conn


@contextlib.contextmanager
def sqlite_atomic(conn, mode: str):
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


_RETRYABLE = ("deadlock detected", "could not serialize", "database is locked", "database table is locked")


def retrying(fn, *args, attempts: int = 8, atomic: bool = True, **kwargs):
    """Run ``fn`` in :func:`write_atomic`, retrying deadlocks and lock timeouts.

    Retries happen only when django-fq owns the transaction; inside a caller's
    ``atomic`` block the error propagates unchanged (docs/reference/semantics.md §9). Backs off
    5 ms · 2^n with jitter, at most ``attempts`` tries. With ``atomic=False``
    ``fn`` must issue a single statement, which autocommit makes atomic (two
    round trips fewer than BEGIN … COMMIT).
    """
    conn = connection()
    owned = not conn.in_atomic_block
    for attempt in range(attempts):
        try:
            if not atomic:
                return fn(*args, **kwargs)
            with write_atomic():
                return fn(*args, **kwargs)
        except (OperationalError, DatabaseError) as exc:
            text = str(exc).lower()
            if not owned or attempt == attempts - 1 or not any(t in text for t in _RETRYABLE):
                raise
            time.sleep(0.005 * (2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")  # pragma: no cover


def take_write_lock(conn, queue_name: str) -> None:
    """SQLite inside a transaction begun elsewhere: start with a write, so the lock is taken now.

    A DEFERRED transaction that reads first and writes later fails at once with
    "database is locked" if another connection committed in between; a write
    as the first statement waits for the lock (busy timeout) instead. Our own
    transactions begin IMMEDIATE and need nothing.
    """
    if conn.vendor == "sqlite" and conn.in_atomic_block:
        with conn.cursor() as cur:
            cur.execute("UPDATE django_fq_queue SET name = name WHERE name = %s", [queue_name])


def relaxed_commit(conn) -> bool:
    """True when a lease change django-fq commits itself may skip the WAL flush.

    PostgreSQL only, unless ``FQ_SYNCHRONOUS_SETTLE`` is set, and never inside
    the caller's transaction (its durability is the caller's). A database
    crash may then forget the last fraction of a second of claims and acks;
    each forgotten one only makes a job run again, which at-least-once
    delivery allows. Enqueues always wait for the flush.
    """
    return conn.vendor == "postgresql" and not conn.in_atomic_block and not conf.get("FQ_SYNCHRONOUS_SETTLE")


def relax_commit(conn) -> None:
    """Inside a transaction django-fq owns: commit it without waiting for the WAL flush."""
    with conn.cursor() as cur:
        cur.execute("SET LOCAL synchronous_commit = off")


#: Runs of a hot statement on one connection before psycopg prepares it (psycopg's own default).
PREPARE_THRESHOLD = 5


def hot_cursor(conn):
    """A cursor for the statements run on every job (enqueue, claim, ack), as a context manager.

    On PostgreSQL it binds parameters on the server, so psycopg prepares a
    statement after it has run :data:`PREPARE_THRESHOLD` (5) times on the
    connection and PostgreSQL stops planning it on every call (planning these
    CTE statements costs about as much as running them). Django turns
    psycopg's preparing off unless the database's ``OPTIONS`` name a
    ``prepare_threshold``; when they do not, this turns it on for the
    connection, which reaches only these statements (Django's own cursors bind
    on the client and never prepare). ``OPTIONS = {"prepare_threshold": None}``
    keeps prepared statements off, as PgBouncer in transaction mode before
    1.21 needs. Django's cursor wrappers still apply (error translation, query
    logging with ``DEBUG``, ``execute_wrapper``). Elsewhere: ``conn.cursor()``.
    """
    if conn.vendor != "postgresql":
        return conn.cursor()
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


def notify(conn, queue_name: str) -> None:
    """Wake idle workers of ``queue_name``; PostgreSQL only, delivered at commit, dropped on rollback."""
    if conn.vendor == "postgresql":
        with conn.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue_name])
