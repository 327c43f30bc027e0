"""The worker's database connections: which errors are the database's, and keeping each thread's connection sane.

Every worker thread (runner, completer, heartbeat, reaper, the claim loop)
uses its own Django connection. After a database error a thread drops its
connection (:func:`drop_connection`; it reconnects on next use); between two
jobs a runner thread tidies its connections (:func:`tidy_connections`) and
rolls back a transaction a handler left open
(:func:`abandon_open_transactions`).
"""

from __future__ import annotations

import time

from django.db import Error as DjangoDbError
from django.db import connections

from .. import routing, storage


def is_db_error(exc: BaseException) -> bool:
    """True for errors of the database layer (connection lost, server restarting, locked, ...)."""
    if isinstance(exc, DjangoDbError):
        return True
    return storage.is_driver_error(exc)  # raised by a driver outside Django's wrapper


def drop_connection() -> None:
    """Close this thread's django-fq connections after a database error (they reconnect on next use).

    Every alias that holds queues (``routing.aliases()``): the error may have
    come from any of them (queues over several databases).
    """
    for alias in routing.aliases():
        try:
            connections[alias].close()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail too
            pass


def abandon_open_transactions() -> bool:
    """Roll back and drop this thread's connections still inside an ``atomic()`` block; True if any.

    Called after a handler returns: nothing the worker does is inside a
    transaction at that point, so an open block is one the handler entered and
    never left. Keeping it would make the next job on this thread write into it.
    """
    found = False
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            continue
        found = True
        _abandon(conn)
    return found


def _abandon(conn) -> None:
    conn.in_atomic_block = False
    conn.atomic_blocks.clear()
    conn.savepoint_ids.clear()
    conn.needs_rollback = False
    conn.commit_on_exit = True
    try:
        conn.close()  # ends the server-side transaction without committing it
    except Exception:  # noqa: BLE001
        conn.connection = None


def _opened() -> list:
    """This thread's connections that were made (``connections.all(initialized_only=True)``), looked up once each.

    ``all()`` asks the thread-local store twice per alias (whether it is there, then for
    it); a runner asks after every job, so each alias is fetched once here. Falls back to
    ``all()`` where the handler keeps no such store.
    """
    store = getattr(connections, "_connections", None)
    if store is None:
        return list(connections.all(initialized_only=True))
    found = []
    for alias in connections.settings:
        conn = getattr(store, alias, None)
        if conn is not None:
            found.append(conn)
    return found


def abandon_or_tidy() -> bool:
    """:func:`abandon_open_transactions` and :func:`tidy_connections` in one pass over this thread's connections.

    For a runner whose handler returned and that will not use the database before the next
    job (a success handed to the completer): True if a transaction was left open (rolled
    back and dropped, as :func:`abandon_open_transactions` does), the other connections
    tidied. One walk over the connections instead of two, per job.
    """
    found = False
    for conn in _opened():
        if conn.in_atomic_block:
            found = True
            _abandon(conn)
        elif conn.connection is not None:
            _tidy(conn)
    return found


def tidy_connections() -> None:
    """Between two jobs: close this thread's connections that are broken, left in a bad state, or too old.

    Like Django's ``close_old_connections`` but a ``CONN_MAX_AGE`` of 0 does
    not close after every job (a runner thread's connection is reused);
    a positive ``CONN_MAX_AGE`` still recycles it.
    """
    for conn in _opened():
        if conn.connection is not None:
            _tidy(conn)


def _tidy(conn) -> None:
    try:
        if conn.in_atomic_block:
            return  # never close under a transaction the handler left open (it would be a bug there)
        if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
            conn.close()
        elif conn.errors_occurred and not conn.is_usable():
            conn.close()
        elif conn.errors_occurred:
            conn.errors_occurred = False
        elif conn.settings_dict.get("CONN_MAX_AGE") and conn.close_at is not None and time.monotonic() >= conn.close_at:
            conn.close()
    except Exception:  # noqa: BLE001
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
