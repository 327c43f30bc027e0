"""The database clock, write transactions, retries and wakeups, for the services.

What differs between PostgreSQL and SQLite is in :mod:`django_fq.storage`;
these functions ask the connection's store (docs/explanation/storage.md).
The services ask this module for the clock expression, for a write
transaction that is safe on the backend, and for a wakeup notification after
an enqueue.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time

from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.models import BigIntegerField, Func

from . import conf, storage
from .storage.postgres import PREPARE_THRESHOLD
from .storage.sqlite import atomic as sqlite_atomic

__all__ = ["PREPARE_THRESHOLD", "sqlite_atomic"]  # re-exported for existing callers

#: PostgreSQL channel notified (on commit) after every enqueue that created jobs.
NOTIFY_CHANNEL = "django_fq"


def connection():
    """The connection django-fq uses (alias ``FQ_DATABASE``)."""
    return connections[conf.database()]


def now_sql(conn=None) -> str:
    """SQL for the database's current time in epoch milliseconds.

    PostgreSQL uses ``clock_timestamp()`` (time at execution, not transaction
    start); SQLite uses ``'now'``, which is fixed for one statement. The test
    setting ``FQ_TEST_CLOCK_OFFSET_MS`` is added inside the expression.
    """
    base = storage.for_connection(conn or connection()).clock_sql
    offset = conf.clock_offset_ms()
    return f"({base} + {offset:d})" if offset else base


class DbNow(Func):
    """ORM expression for :func:`now_sql`: the database clock in epoch ms."""

    output_field = BigIntegerField()

    def as_sql(self, compiler, connection, *args, **extra):
        return now_sql(connection), []


class ByteLength(Func):
    """ORM expression: the size of a text column in bytes of UTF-8 (``NULL`` stays ``NULL``).

    ``OCTET_LENGTH`` on PostgreSQL and MariaDB/MySQL (utf8mb4 columns);
    SQLite's ``LENGTH`` counts characters, so there the text is measured as a BLOB.
    """

    function = "OCTET_LENGTH"
    output_field = BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)


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
    with storage.for_connection(conn).write_atomic(conn):
        yield conn


#: Messages of the errors :func:`retrying` retries on PostgreSQL and SQLite (what backup.py still reads);
#: :func:`retrying` itself asks the store (``Store.is_retryable``), which knows each backend's codes.
_RETRYABLE = ("deadlock detected", "could not serialize", "database is locked", "database table is locked")


def retrying(fn, *args, attempts: int = 8, atomic: bool = True, **kwargs):
    """Run ``fn`` in :func:`write_atomic`, retrying deadlocks and lock timeouts.

    Retryable is what the connection's store says
    (:meth:`~django_fq.storage.base.Store.is_retryable`: PostgreSQL deadlocks and
    serialization failures, SQLite "database is locked", MariaDB/MySQL errors
    1213 and 1205). Retries happen only when django-fq owns the transaction; inside a caller's
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
            if not owned or attempt == attempts - 1 or not storage.for_connection(conn).is_retryable(exc):
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
    storage.for_connection(conn).take_write_lock(conn, queue_name)


def relaxed_commit(conn) -> bool:
    """True when a lease change django-fq commits itself may skip the WAL flush.

    PostgreSQL only, unless ``FQ_SYNCHRONOUS_SETTLE`` is set, and never inside
    the caller's transaction (its durability is the caller's). A database
    crash may then forget the last fraction of a second of claims and acks;
    each forgotten one only makes a job run again, which at-least-once
    delivery allows. Enqueues always wait for the flush.
    """
    return (
        storage.for_connection(conn).supports_relaxed_commit
        and not conn.in_atomic_block
        and not conf.get("FQ_SYNCHRONOUS_SETTLE")
    )


def relax_commit(conn) -> None:
    """Inside a transaction django-fq owns: commit it without waiting for the WAL flush."""
    storage.for_connection(conn).relax_commit(conn)


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
    return storage.for_connection(conn).hot_cursor(conn)


def notify(conn, queue_name: str) -> None:
    """Wake idle workers of ``queue_name`` at commit (nothing on rollback).

    Where the database can notify (PostgreSQL's NOTIFY), every process's
    listener hears it. Elsewhere only this process's waiters can be woken at
    once (other processes poll): :func:`django_fq.wakeup.notify_in_process`
    runs when the transaction commits, or now outside one.
    """
    store = storage.for_connection(conn)
    store.notify(conn, NOTIFY_CHANNEL, queue_name)
    if not store.supports_listen_notify:
        from . import wakeup  # wakeup imports this module

        transaction.on_commit(
            functools.partial(wakeup.notify_in_process, conn.alias, queue_name), using=conn.alias, robust=True
        )
