"""MariaDB / MySQL: what migration 0003 adds where the models' schema cannot say it.

Byte-wise key columns (a token or unique key is one exact string,
docs/reference/semantics.md §4), the active-unique-key column and its unique
index (§4: one scheduled, ready or running job per key), and the claim and prune indexes Django builds here
without their conditions (docs/explanation/storage.md). Plain ORM inserts:
the schema, not the services, must hold these rules.
"""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from django_fq import storage
from django_fq.models import IdempotencyToken, Job, Queue
from django_fq.storage.mysql import ACTIVE_KEY_COLUMN, ACTIVE_KEY_INDEX, BINARY_COLUMNS

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]


def _queue(name: str = "schema") -> Queue:
    return Queue.objects.create(name=name, created_at=1)


def _job(queue: Queue, key: str | None, state: str = "queued") -> Job:
    return Job.objects.create(
        uid=uuid.uuid4().hex, queue=queue, state=state, run_at=1, enqueued_at=1, changed_at=1,
        max_attempts=3, payload="{}", payload_size=2, unique_key=key,
    )


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, list(params))
        return list(cur.fetchall())


def test_tokens_differing_in_case_or_trailing_space_are_different_tokens():
    queue = _queue()
    for token in ("a", "A", "a ", "ä"):
        IdempotencyToken.objects.create(queue=queue, token=token, job_uid="J" + token.strip(), created_at=1, expires_at=2)
    assert sorted(IdempotencyToken.objects.filter(queue=queue).values_list("token", flat=True)) == ["A", "a", "a ", "ä"]
    assert list(IdempotencyToken.objects.filter(token="a").values_list("token", flat=True)) == ["a"]
    assert list(IdempotencyToken.objects.filter(job_uid="j").values_list("token", flat=True)) == []
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyToken.objects.create(queue=queue, token="A", job_uid="x", created_at=1, expires_at=2)


def test_queue_names_and_job_ids_compare_byte_for_byte():
    _queue("Mail")
    _queue("mail")
    _queue("mail ")
    assert Queue.objects.filter(name__startswith="").count() == 3
    assert Queue.objects.get(name="mail").name == "mail"
    queue = Queue.objects.get(name="Mail")
    job = _job(queue, None)
    assert Job.objects.filter(uid=job.uid.upper()).count() == 0


def test_two_active_jobs_cannot_share_a_unique_key_and_a_finished_one_frees_it():
    queue, other = _queue(), _queue("other")
    first = _job(queue, "k")
    for state in ("waiting", "queued", "running", "held"):  # migrations 0008 (held) and 0011 (waiting)
        with pytest.raises(IntegrityError) as caught, transaction.atomic():
            _job(queue, "k", state)
        assert ACTIVE_KEY_INDEX in str(caught.value)
    _job(other, "k")  # per queue
    _job(queue, "K")  # byte for byte
    _job(queue, "k ")
    _job(queue, None)
    _job(queue, None)  # no key: never a conflict
    Job.objects.filter(pk=first.pk).update(state="running")
    with pytest.raises(IntegrityError), transaction.atomic():
        _job(queue, "k")
    for held in ("waiting", "held"):
        Job.objects.filter(pk=first.pk).update(state=held)
        with pytest.raises(IntegrityError), transaction.atomic():
            _job(queue, "k")
    for finished in ("succeeded", "dead", "cancelled"):
        Job.objects.filter(pk=first.pk).update(state=finished)
        again = _job(queue, "k")  # a finished job holds its key no more
        again.delete()
    _job(queue, "k", "succeeded")  # finished jobs may share a key with each other and an active one
    _job(queue, "k")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=first.pk).update(state="queued")  # back to active: the key is taken


def test_the_indexes_exist():
    rows = _rows(
        "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, COLLATION FROM information_schema.STATISTICS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_fq_job' ORDER BY INDEX_NAME, SEQ_IN_INDEX"
    )
    indexes: dict[str, list] = {}
    for name, non_unique, column, order in rows:
        indexes.setdefault(name, []).append((int(non_unique), column, order))
    assert indexes[ACTIVE_KEY_INDEX] == [(0, "queue_id", "A"), (0, ACTIVE_KEY_COLUMN, "A")]
    assert [c for _, c, _ in indexes["fq_job_claim"]] == ["queue_id", "state", "priority", "seq"]
    assert [c for _, c, _ in indexes["fq_job_finished"]] == ["state", "finished_at"]
    generated = _rows(
        "SELECT EXTRA, COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME = 'django_fq_job' AND COLUMN_NAME = %s",
        [ACTIVE_KEY_COLUMN],
    )
    assert "STORED" in generated[0][0].upper()
    binary = storage.for_connection(connection).binary_collation(connection)
    assert generated[0][1] == binary
    for table, columns in BINARY_COLUMNS.items():
        for column in columns:
            (found,) = _rows(
                "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME = %s AND COLUMN_NAME = %s",
                [table, column],
            )
            assert found == (binary,), (table, column)


def test_the_claim_select_reads_the_claim_index_in_order():
    queue = _queue()
    Job.objects.bulk_create(
        Job(uid=uuid.uuid4().hex, queue=queue, state=state, priority=i % 3, run_at=1, enqueued_at=1, changed_at=1,
            max_attempts=3, payload="{}", payload_size=2)
        for i in range(600)
        for state in ("queued", "succeeded")
    )
    with connection.cursor() as cur:
        cur.execute("ANALYZE TABLE django_fq_job")
        cur.fetchall()
    store = storage.for_connection(connection)
    with connection.cursor() as cur:
        cur.execute(
            f"EXPLAIN SELECT seq FROM django_fq_job WHERE queue_id = %s AND state = 'queued' "
            f"AND run_at <= {store.clock_sql} ORDER BY priority DESC, seq LIMIT 10 FOR UPDATE SKIP LOCKED",
            [queue.id],
        )
        names = [d[0] for d in cur.description]
        row = dict(zip(names, cur.fetchone(), strict=True))
    assert row["key"] == "fq_job_claim", row
    assert "filesort" not in (row["Extra"] or "").lower(), row  # read in claim order, not sorted afterwards


def test_the_migration_is_reversible():
    store = storage.for_connection(connection)
    assert store.schema_sql(connection, reverse=True)
    try:
        call_command("migrate", "django_fq", "0002", verbosity=0)
        assert not _rows(
            "SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_fq_job' "
            "AND COLUMN_NAME = %s",
            [ACTIVE_KEY_COLUMN],
        )
        (default,) = _rows(
            "SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_fq_token'"
        )
        assert _rows(
            "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = 'django_fq_token' AND COLUMN_NAME = 'token'"
        ) == [default]
    finally:
        call_command("migrate", "django_fq", verbosity=0)
    assert _rows(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_fq_job' "
        "AND COLUMN_NAME = %s",
        [ACTIVE_KEY_COLUMN],
    ) == [(ACTIVE_KEY_COLUMN,)]



