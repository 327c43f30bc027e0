"""Store.may_read_stale / Store.fresh_read_sql, called directly: the same assertions on every backend.

A caller's transaction may read from a snapshot older than the newest commit
(InnoDB's REPEATABLE READ takes it at the first read). Services that write a
row they read, or must find a row committed since, append
``fresh_read_sql`` to that read (docs/reference/semantics.md §5, §9). The
contract: such a read sees the newest commit, or the write that follows it
fails with an error the store calls retryable — never a silent write from
stale rows. Where a capability flag decides, the tests say which.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import DatabaseError, connection, transaction

from django_fq import db, storage
from django_fq.models import Job, Queue
from tests.threads import elsewhere

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 60


def _store():
    return storage.for_connection(connection)


def _job(name: str) -> int:
    t = db.db_now_ms()
    q = Queue.objects.create(name=name, created_at=t)
    return Job.objects.create(
        uid=uuid.uuid4().hex,
        queue_id=q.id,
        run_at=t,
        enqueued_at=t,
        changed_at=t,
        max_attempts=5,
        payload="{}",
        payload_size=2,
    ).seq


def test_reads_are_never_stale_outside_a_transaction_or_in_django_fqs_own():
    store = _store()
    assert not store.may_read_stale(connection)
    assert store.fresh_read_sql(connection) == store.fresh_read_sql(connection, update=True) == ""
    with db.write_atomic():
        assert not store.may_read_stale(connection)
        with transaction.atomic():  # a savepoint of django-fq's own transaction
            assert not store.may_read_stale(connection)
            assert store.fresh_read_sql(connection, update=True) == ""


def test_the_fresh_suffix_is_a_locking_read_exactly_where_reads_may_be_stale():
    store = _store()
    # The caller's transaction, and a savepoint of django-fq inside it: still the caller's snapshot.
    with transaction.atomic(), db.write_atomic():
        stale = store.may_read_stale(connection)
        share, update = store.fresh_read_sql(connection), store.fresh_read_sql(connection, update=True)
    if not stale:
        assert share == update == ""
    else:
        assert "FOR UPDATE" in update.upper()
        assert share.strip() and share == store.key_share_sql


def test_a_failed_transaction_of_django_fq_leaves_no_mark_on_the_connection():
    store = _store()
    with transaction.atomic():
        before = store.may_read_stale(connection)
    with pytest.raises(RuntimeError), db.write_atomic():
        raise RuntimeError("rolled back")
    assert not store.may_read_stale(connection)
    with transaction.atomic():
        assert store.may_read_stale(connection) == before


def test_a_fresh_read_in_an_old_snapshot_sees_the_newest_commit_or_its_write_fails():
    """A caller's REPEATABLE READ transaction reads a job, another commits attempts = 7, then the
    caller reads it again with the fresh suffix and writes attempts + 1."""
    store = _store()
    if store.embedded:
        pytest.skip("embedded (SQLite): one writer locks the whole file; a caller's write after a stale read fails")
    seq = _job("fresh:rr")
    outcome = None
    with transaction.atomic():
        with connection.cursor() as cur:
            # The first statement of the transaction (PostgreSQL) / before its first read (InnoDB).
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert Job.objects.get(seq=seq).attempts == 0  # the snapshot is taken here
        elsewhere(lambda: Job.objects.filter(seq=seq).update(attempts=7), timeout_s=TIMEOUT)
        fresh = store.fresh_read_sql(connection, update=True)
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(f"SELECT attempts FROM django_fq_job WHERE seq = %s{fresh}", [seq])
                seen = cur.fetchone()[0]
                cur.execute("UPDATE django_fq_job SET attempts = %s WHERE seq = %s", [seen + 1, seq])
            outcome = seen
        except DatabaseError as exc:
            outcome = "retryable" if store.is_retryable(exc) else repr(exc)
    if outcome == "retryable":
        assert Job.objects.get(seq=seq).attempts == 7  # nothing written from the stale row
    else:
        assert outcome == 7, f"a write from the stale row (or a non-retryable error): {outcome}"
        assert Job.objects.get(seq=seq).attempts == 8
