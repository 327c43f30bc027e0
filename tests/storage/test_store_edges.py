"""Conformance of the store methods the edges use: driver errors, availability, LISTEN.

The same assertions on every database leg (``FQ_TEST_DB``), through
``storage.for_connection(connection)``; only the store's own flags
(``embedded``, ``supports_listen_notify``) decide what to expect.
"""

from __future__ import annotations

import copy
import socket
import threading

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from django_fq import db, storage
from tests.listening import listen_alias


def _driver_error(sql: str) -> BaseException:
    """The driver's own exception behind the Django error that ``sql`` raises on the test connection."""
    with pytest.raises(DatabaseError) as caught, connection.cursor() as cur:
        cur.execute(sql)
    cause = caught.value.__cause__
    assert cause is not None
    return cause


def _refused_cause() -> BaseException:
    """The driver's exception of a connection the database really refuses (a closed port, a file it cannot open)."""
    store = storage.for_connection(connection)
    settings_dict = copy.deepcopy(connection.settings_dict)
    if store.embedded:
        settings_dict["NAME"] = "/nonexistent-fq-dir/sub/db.sqlite3"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens there once the socket is closed
        settings_dict.update(HOST="127.0.0.1", PORT=str(port))
    refused = type(connections[connection.alias])(settings_dict, alias=connection.alias)  # a wrapper of its own, never registered
    try:
        with pytest.raises(OperationalError) as caught:
            refused.ensure_connection()
    finally:
        refused.close()
    assert caught.value.__cause__ is not None
    return caught.value.__cause__


@pytest.mark.django_db
def test_the_store_knows_its_drivers_errors_and_no_other():
    store = storage.for_connection(connection)
    cause = _driver_error("SELECT * FROM fq_no_such_table")
    assert store.is_driver_error(cause)
    assert storage.is_driver_error(cause)
    assert not store.is_driver_error(ValueError("not a database error"))
    assert not storage.is_driver_error(ValueError("not a database error"))
    others = [cls for cls in storage.BACKENDS.values() if cls is not type(store)]
    assert others and not any(cls.is_driver_error(cause) for cls in others)


@pytest.mark.django_db
def test_a_refused_connection_is_unavailable_and_a_bad_statement_is_not():
    store = storage.for_connection(connection)
    refused = _refused_cause()
    assert store.is_unavailable(refused)
    assert storage.unavailable(refused)
    for sql in ("SELEC 1", "SELECT * FROM fq_no_such_table"):
        cause = _driver_error(sql)
        assert not store.is_unavailable(cause), cause
        assert not storage.unavailable(cause), cause
    # Another backend's store never judges this driver's errors.
    others = [cls for cls in storage.BACKENDS.values() if cls is not type(store)]
    assert not any(cls.is_unavailable(refused) for cls in others)
    assert not store.is_unavailable(ValueError("no driver"))


@pytest.mark.django_db(transaction=True)
def test_listen_hears_a_committed_notify_where_the_database_can_notify():
    store = storage.for_connection(connection)
    # It listens where the wakeup listener would (FQ_LISTEN_DATABASE: a direct alias behind a pooler).
    listener_store = storage.get(listen_alias())
    stop = threading.Event()
    if not store.supports_listen_notify:
        with pytest.raises(NotImplementedError):
            store.listen(db.NOTIFY_CHANNEL, stop=stop, on_listening=lambda: None, on_note=lambda payload: None)
        return
    listening, heard, failed = threading.Event(), [], []
    got = threading.Event()

    def on_note(payload: str) -> None:
        heard.append(payload)
        got.set()

    def run() -> None:
        try:
            listener_store.listen(
                db.NOTIFY_CHANNEL, stop=stop, on_listening=listening.set, on_note=on_note, timeout_s=0.1
            )
        except Exception as exc:  # pragma: no cover - reported below
            failed.append(exc)
            listening.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert listening.wait(10) and not failed
        with pytest.raises(RuntimeError), transaction.atomic():
            store.notify(connection, db.NOTIFY_CHANNEL, "edge:rolled-back")
            raise RuntimeError
        with transaction.atomic():
            store.notify(connection, db.NOTIFY_CHANNEL, "edge:committed")
        assert got.wait(10)
        assert heard == ["edge:committed"]
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and not failed


@pytest.mark.django_db(transaction=True)
def test_insert_rows_writes_every_row_in_one_statement_or_none():
    from django.db import IntegrityError

    from django_fq import services as fq
    from django_fq.models import IdempotencyToken, Queue
    from django_fq.storage.base import TOKEN_TABLE

    store = storage.for_connection(connection)
    fq.configure("edge:rows")
    queue_id = Queue.objects.get(name="edge:rows").id
    columns = ("queue_id", "token", "job_uid", "created_at", "expires_at")
    rows = [(queue_id, f"tok-{n}", f"{n:032x}", 1_000 + n, 2_000 + n) for n in range(3)]
    with store.write_atomic(connection):
        store.insert_rows(connection, TOKEN_TABLE, columns, rows)
        store.insert_rows(connection, TOKEN_TABLE, columns, [])  # nothing to do: no statement
    got = sorted(IdempotencyToken.objects.filter(queue_id=queue_id).values_list("token", "job_uid", "created_at", "expires_at"))
    assert got == [(t, u, c, e) for _, t, u, c, e in rows]
    # A duplicate key fails the whole statement: the new row beside it is not written either.
    with pytest.raises(IntegrityError), store.write_atomic(connection):
        store.insert_rows(connection, TOKEN_TABLE, columns, [(queue_id, "tok-new", "f" * 32, 1, 2), rows[0]])
    assert IdempotencyToken.objects.filter(queue_id=queue_id).count() == 3
