"""The Store of the test database (docs/explanation/storage.md): the same assertions on every backend.

Runs on whichever database the leg uses (``FQ_TEST_DB``); nothing here
branches on the backend except through the store's own flags.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_fq import db, storage
from django_fq import services as fq
from django_fq.models import Job, Queue
from django_fq.storage.base import Store

FLAGS = (
    "supports_skip_locked",
    "supports_row_locks",
    "supports_listen_notify",
    "supports_partial_indexes",
    "supports_relaxed_commit",
    "supports_server_prepare",
    "embedded",
)


def _one(sql: str, params=()) -> tuple:
    with connection.cursor() as cur:
        cur.execute(sql, list(params))
        return cur.fetchone()


def test_one_store_per_alias_and_backend():
    store = storage.for_connection(connection)
    assert isinstance(store, Store)
    assert store.vendor == connection.vendor
    assert store.alias == connection.alias
    assert storage.for_connection(connection) is store
    assert storage.get(connection.alias) is store
    assert storage.find(connection) is store
    assert storage.BACKENDS[store.vendor] is type(store)


def test_flags_and_constants_are_declared():
    store = storage.for_connection(connection)
    for flag in FLAGS:
        assert isinstance(getattr(store, flag), bool), flag
    for text in (store.clock_sql, store.key_share_sql, store.skip_locked_sql):
        assert isinstance(text, str) and "%" not in text
    # A lock clause exactly where rows can be locked.
    assert bool(store.key_share_sql) is bool(store.skip_locked_sql) is store.supports_row_locks
    # Only a server database locks rows and skips locked ones.
    for flag in ("supports_skip_locked", "supports_row_locks"):
        assert getattr(store, flag) is not store.embedded, flag
    # What only PostgreSQL has, an embedded database never has.
    for flag in ("supports_listen_notify", "supports_relaxed_commit", "supports_server_prepare"):
        assert not (getattr(store, flag) and store.embedded), flag


@pytest.mark.django_db
def test_clock_is_whole_epoch_milliseconds_and_does_not_go_back():
    store = storage.for_connection(connection)
    first, second = _one(f"SELECT {store.clock_sql}, {store.clock_sql}")
    later = _one(f"SELECT {store.clock_sql}")[0]
    assert all(isinstance(v, int) for v in (first, second, later))
    assert 1_700_000_000_000 < first <= later  # epoch ms, not seconds or microseconds
    # db.now_sql is the store's clock plus the test offset only.
    assert db.now_sql(connection) == store.clock_sql


@pytest.mark.django_db
def test_clock_moves_inside_one_transaction():
    # docs/reference/semantics.md §9 (Time): the time a statement runs, not the time its transaction began.
    store = storage.for_connection(connection)
    with transaction.atomic():
        first = _one(f"SELECT {store.clock_sql}")[0]
        start = time.monotonic()
        while time.monotonic() - start < 0.03:
            time.sleep(0.005)
        second = _one(f"SELECT {store.clock_sql}")[0]
    assert second - first >= 30


@pytest.mark.django_db
def test_prepare_connection_keeps_the_connection_usable():
    store = storage.for_connection(connection)
    store.prepare_connection(connection)  # what connection_created runs on django-fq's alias
    assert _one("SELECT 1") == (1,)


@pytest.mark.django_db
def test_clock_with_test_offset(settings):
    settings.FQ_TEST_CLOCK_OFFSET_MS = 86_400_000
    store = storage.for_connection(connection)
    shifted, plain = _one(f"SELECT {db.now_sql(connection)}, {store.clock_sql}")
    assert 86_400_000 <= shifted - plain < 86_400_000 + 60_000


@pytest.mark.django_db
def test_greatest_sql():
    store = storage.for_connection(connection)
    assert _one(f"SELECT {store.greatest_sql('3', '5')}, {store.greatest_sql('7', '2')}") == (5, 7)
    assert _one(f"SELECT {store.greatest_sql('%s', '%s')}", [4, 4]) == (4,)


@pytest.mark.django_db(transaction=True)
def test_write_atomic_is_a_transaction_and_a_savepoint_inside_one():
    store = storage.for_connection(connection)
    fq.configure("st:atomic")
    with pytest.raises(RuntimeError), store.write_atomic(connection) as conn:
        assert conn is connection and connection.in_atomic_block
        Queue.objects.filter(name="st:atomic").update(name="st:renamed")
        raise RuntimeError("roll back")
    assert Queue.objects.filter(name="st:atomic").exists()
    with transaction.atomic():
        with pytest.raises(RuntimeError), store.write_atomic(connection):
            Queue.objects.filter(name="st:atomic").update(name="st:renamed")
            raise RuntimeError("roll back the savepoint only")
        assert connection.in_atomic_block
        assert Queue.objects.filter(name="st:atomic").exists()
    assert not connection.in_atomic_block


@pytest.mark.django_db(transaction=True)
def test_take_write_lock_changes_nothing():
    store = storage.for_connection(connection)
    fq.configure("st:lock")
    store.take_write_lock(connection, "st:lock")  # outside a transaction: nothing to do
    with transaction.atomic():
        store.take_write_lock(connection, "st:lock")
        store.take_write_lock(connection, "st:no-such-queue")
    assert list(Queue.objects.filter(name__startswith="st:").values_list("name", flat=True)) == ["st:lock"]


@pytest.mark.django_db(transaction=True)
def test_relax_commit_inside_an_owned_transaction():
    store = storage.for_connection(connection)
    fq.configure("st:relax")
    with transaction.atomic():
        store.relax_commit(connection)
        Queue.objects.filter(name="st:relax").update(name="st:relaxed")
    assert Queue.objects.filter(name="st:relaxed").exists()
    assert db.relaxed_commit(connection) is store.supports_relaxed_commit


@pytest.mark.django_db
def test_hot_cursor_runs_statements_with_parameters():
    store = storage.for_connection(connection)
    for i in range(db.PREPARE_THRESHOLD + 2):  # past the point where PostgreSQL prepares it
        with store.hot_cursor(connection) as cur:
            cur.execute("SELECT %s + 1", [i])
            assert cur.fetchone()[0] == i + 1


@pytest.mark.django_db
def test_notify_inside_a_transaction():
    store = storage.for_connection(connection)
    with transaction.atomic():
        store.notify(connection, db.NOTIFY_CHANNEL, "st:notify")  # delivered at commit where supported


@pytest.mark.django_db(transaction=True)
def test_release_connection():
    store = storage.for_connection(connection)
    connection.ensure_connection()
    with transaction.atomic():
        assert store.release_connection(connection) is False  # never inside an atomic block
    released = store.release_connection(connection)
    assert released is (not store.embedded)
    assert (connection.connection is None) is released
    assert _one("SELECT 1") == (1,)  # Django reconnects on the next use
    connection.close()
    assert store.release_connection(connection) is False  # nothing to release


@pytest.mark.django_db(transaction=True)
def test_read_snapshot_sees_one_snapshot_and_takes_no_write_lock():
    store = storage.for_connection(connection)
    fq.configure("st:snap")
    seen, errors = [], []
    read, changed = threading.Event(), threading.Event()

    def writer():
        try:
            read.wait(30)
            # Commits while the snapshot is open: it would wait (and time out) behind a write lock.
            fq.configure("st:snap-later")
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()
            changed.set()

    thread = threading.Thread(target=writer)
    thread.start()
    with store.read_snapshot(connection):
        assert connection.in_atomic_block
        seen.append(Queue.objects.filter(name__startswith="st:snap").count())
        read.set()
        assert changed.wait(30)
        seen.append(Queue.objects.filter(name__startswith="st:snap").count())
    thread.join(30)
    assert not errors
    assert seen == [1, 1]  # the second read still sees the first one's snapshot
    assert Queue.objects.filter(name__startswith="st:snap").count() == 2


@pytest.mark.django_db(transaction=True)
def test_lock_queue_row():
    store = storage.for_connection(connection)
    fq.configure("st:row")
    qid = Queue.objects.get(name="st:row").id
    with store.write_atomic(connection):
        assert store.lock_queue_row(connection, Queue._meta.db_table, qid) is True
        # Only a store whose transaction does not hold the whole database looks the row up.
        assert store.lock_queue_row(connection, Queue._meta.db_table, qid + 1000) is store.embedded
    assert store.export_name == connection.vendor


@pytest.mark.django_db(transaction=True)
def test_lock_clauses_and_queue_creation_lock_run_in_a_transaction():
    store = storage.for_connection(connection)
    fq.configure("st:clauses")
    table = Queue._meta.db_table
    with store.write_atomic(connection):
        store.lock_queue_creation(connection, 0x66710001)
        assert _one(f"SELECT name FROM {table} WHERE name = %s{store.key_share_sql}", ["st:clauses"]) == ("st:clauses",)
        assert _one(f"SELECT name FROM {table} WHERE name = %s{store.skip_locked_sql}", ["st:clauses"]) == ("st:clauses",)
        qid = Queue.objects.get(name="st:clauses").id
        assert store.lock_queue_row(connection, table, qid, exclusive=True) is True


@pytest.mark.django_db(transaction=True)
def test_skip_locked_passes_over_a_row_another_transaction_holds():
    store = storage.for_connection(connection)
    if not store.supports_skip_locked:
        pytest.skip("this store's writers hold the whole database: nothing to pass over")
    fq.configure("st:skip")
    table = Queue._meta.db_table
    held, done, errors = threading.Event(), threading.Event(), []

    def holder():
        try:
            with transaction.atomic():
                _one(f"SELECT id FROM {table} WHERE name = %s{store.skip_locked_sql}", ["st:skip"])
                held.set()
                done.wait(30)
        except Exception as exc:
            errors.append(exc)
        finally:
            held.set()
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(f"SELECT id FROM {table} WHERE name = %s{store.skip_locked_sql}", ["st:skip"])
            assert list(cur.fetchall()) == []  # held by the other transaction: passed over, not waited for
    finally:
        done.set()
        thread.join(30)
    assert not errors


@pytest.mark.django_db
def test_schema_sql_only_where_the_models_cannot_say_it():
    # Migration 0003 runs these; a backend with partial indexes needs none (and compares text byte for byte).
    store = storage.for_connection(connection)
    for reverse in (False, True):
        statements = store.schema_sql(connection, reverse=reverse)
        assert isinstance(statements, list) and all(isinstance(s, str) and "%" not in s for s in statements)
        assert bool(statements) is not store.supports_partial_indexes


@pytest.mark.django_db
def test_journal_mode_and_startup_probe():
    store = storage.for_connection(connection)
    mode = store.journal_mode(connection)
    assert mode is None or (store.embedded and mode.lower() == "wal")  # the test database runs in WAL
    store.startup_probe(connection)


@pytest.mark.django_db
def test_failure_buckets_counts_failed_attempts_per_bucket():
    store = storage.for_connection(connection)
    fq.configure("st:fail")
    start, bucket = 1_800_000_000_000, 60_000
    ids = [fq.enqueue("st:fail", {"n": i}).id for i in range(3)] + [fq.enqueue("st:other", {}).id]
    histories = [
        # bucket 0 twice (a nack and an expiry), bucket 2 once; "released" is not a failure
        [{"at": start, "kind": "nack"}, {"at": start + 59_999, "kind": "expired"}, {"at": start + 5, "kind": "released"}],
        [{"at": start + 2 * bucket + 1, "kind": "timeout"}, {"at": start - 1, "kind": "nack"}, {"at": start + 10 * bucket, "kind": "nack"}],
        # not counted: an "at" that is not a whole number, an entry that is not an object
        [{"at": "soon", "kind": "nack"}, {"at": start + 1.5, "kind": "nack"}, ["nack"], {"kind": "nack"}],
        [{"at": start + 1, "kind": "nack"}],
    ]
    for uid, errors in zip(ids, histories, strict=True):
        Job.objects.filter(uid=uid).update(errors=errors, changed_at=start + 1)
    kwargs = {"job_table": Job._meta.db_table, "kinds": ["expired", "nack", "timeout"], "bucket_ms": bucket}
    end = start + 10 * bucket
    qid = Queue.objects.get(name="st:fail").id
    found, partial = store.failure_buckets(connection, start=start, end=end, queue_id=qid, scan_limit=100, **kwargs)
    assert sorted(found) == [(0, 2), (2, 1)] and partial is False
    found, partial = store.failure_buckets(connection, start=start, end=end, queue_id=None, scan_limit=100, **kwargs)
    assert sorted(found) == [(0, 3), (2, 1)] and partial is False
    # Only the jobs changed since start are looked at, and the scan says when it was cut.
    found, _ = store.failure_buckets(connection, start=start + 2, end=end, queue_id=None, scan_limit=100, **kwargs)
    assert found == []
    _, partial = store.failure_buckets(connection, start=start, end=end, queue_id=None, scan_limit=3, **kwargs)
    assert partial is True
