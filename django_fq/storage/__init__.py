"""The storage layer: the one package that knows which database django-fq is on.

``for_connection(conn)`` (or ``get(alias)``) gives the :class:`~django_fq.storage.base.Store`
of a connection's backend, one object per alias and backend, kept for the
life of the process. Everything else asks the store, or reads its
``supports_*`` flags, instead of ``connection.vendor``
(docs/explanation/storage.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

from .base import Store
from .mysql import MysqlStore
from .postgres import PostgresStore
from .sqlite import SqliteStore

__all__ = [
    "MysqlStore", "PostgresStore", "SqliteStore", "Store", "find", "for_connection", "get", "is_driver_error",
    "migration_ddl", "unavailable",
]  # fmt: skip

#: The store class of each Django ``connection.vendor`` django-fq supports.
BACKENDS: dict[str, type[Store]] = {
    PostgresStore.vendor: PostgresStore,
    SqliteStore.vendor: SqliteStore,
    MysqlStore.vendor: MysqlStore,
}

_stores: dict[tuple[str, str], Store] = {}
_lock = threading.Lock()


def for_connection(conn: Any) -> Store:
    """The :class:`Store` for Django connection ``conn`` (any thread's connection of the alias).

    Keyed by alias and vendor, so a test that points an alias at another
    backend gets the right store. A vendor django-fq has no store for is
    served by the SQLite store, as every branch did before the storage layer
    (django-fq supports PostgreSQL, SQLite and MariaDB/MySQL only).
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


def _prepare_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: let the store set up each new connection of django-fq's alias.

    Only the aliases that hold queues (``FQ_DATABASE``, ``FQ_QUEUE_DATABASES``): the other databases of a site keep their sessions as
    the site set them (docs/explanation/storage.md).
    """
    from .. import routing

    if connection.alias not in routing.aliases():
        return
    store = find(connection)
    if store is not None:
        store.prepare_connection(connection)


connection_created.connect(_prepare_connection, dispatch_uid="django_fq.storage.prepare_connection")


def is_driver_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by the DB-API driver of any backend django-fq has a store for."""
    return any(cls.is_driver_error(exc) for cls in BACKENDS.values())


def unavailable(cause: BaseException) -> bool:
    """Whether driver exception ``cause`` says its database cannot serve now (see ``Store.is_unavailable``).

    Asks every backend's store class, so an error of any of a site's
    databases is judged by its own backend's rules.
    """
    return any(cls.is_unavailable(cause) for cls in BACKENDS.values())


def migration_ddl(method: str) -> tuple[Callable[[Any, Any], None], Callable[[Any, Any], None]]:
    """``(forwards, backwards)`` for ``migrations.RunPython``: run the DDL store method ``method`` gives.

    ``method`` names a :class:`Store` method ``(conn, *, reverse) -> list[str]``
    (``schema_sql`` for migration 0003, ``keys_schema_sql`` for 0008,
    ``dependency_schema_sql`` for 0011); a
    database without a store (a site's other backend) gets nothing.
    """

    def run(apps: Any, schema_editor: Any, *, reverse: bool) -> None:
        conn = schema_editor.connection
        store = find(conn)
        for sql in [] if store is None else getattr(store, method)(conn, reverse=reverse):
            schema_editor.execute(sql, params=None)

    def forwards(apps: Any, schema_editor: Any) -> None:
        run(apps, schema_editor, reverse=False)

    def backwards(apps: Any, schema_editor: Any) -> None:
        run(apps, schema_editor, reverse=True)

    return forwards, backwards
