"""The storage layer: the one package that knows which database django-fq is on.

``for_connection(conn)`` (or ``get(alias)``) gives the :class:`~django_fq.storage.base.Store`
of a connection's backend, one object per alias and backend, kept for the
life of the process. Everything else asks the store, or reads its
``supports_*`` flags, instead of ``connection.vendor``
(docs/explanation/storage.md).
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections

from .base import Store
from .postgres import PostgresStore
from .sqlite import SqliteStore

__all__ = ["PostgresStore", "SqliteStore", "Store", "find", "for_connection", "get", "is_postgres"]

#: The store class of each Django ``connection.vendor`` django-fq supports.
BACKENDS: dict[str, type[Store]] = {PostgresStore.vendor: PostgresStore, SqliteStore.vendor: SqliteStore}

_stores: dict[tuple[str, str], Store] = {}
_lock = threading.Lock()


def for_connection(conn: Any) -> Store:
    """The :class:`Store` for Django connection ``conn`` (any thread's connection of the alias).

    Keyed by alias and vendor, so a test that points an alias at another
    backend gets the right store. A vendor django-fq has no store for is
    served by the SQLite store, as every branch did before the storage layer
    (django-fq supports PostgreSQL and SQLite only).
    """
    # The claim and ack paths ask several times per job: the wrapper (one per thread and
    # alias) keeps its store, so that costs one attribute read.
    store = getattr(conn, "_django_fq_store", None)
    if store is not None:
        return store
    key = (conn.alias, conn.vendor)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = BACKENDS.get(conn.vendor, SqliteStore)(conn.alias)
            _stores[key] = store
    conn._django_fq_store = store
    return store


def find(conn: Any) -> Store | None:
    """The :class:`Store` of ``conn``, or ``None`` when django-fq has none for its backend.

    For code that looks at every alias of ``DATABASES`` (a site may have
    databases django-fq never uses), and for the system checks.
    """
    return for_connection(conn) if conn.vendor in BACKENDS else None


def get(alias: str) -> Store:
    """The :class:`Store` of database alias ``alias`` (a key of ``DATABASES``; ``ConnectionDoesNotExist`` if not)."""
    return for_connection(connections[alias])


def is_postgres(conn: Any) -> bool:
    """True when ``conn`` is PostgreSQL. For code not yet moved into this package (issue 13); new code reads a flag."""
    return conn.vendor == PostgresStore.vendor
