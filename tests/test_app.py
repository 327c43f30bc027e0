"""App-level guarantees: migrations match the models, system checks, the object API."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from django_fq import Queue, checks
from django_fq import services as fq
from django_fq.exceptions import InvalidQueueName, VisibilityOutOfRange


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = io.StringIO()
    # Exits non-zero (SystemExit) if a migration is missing.
    call_command("makemigrations", "django_fq", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def _ids(messages):
    return sorted(m.id for m in messages)


def test_checks_accept_the_test_settings():
    assert checks.check_settings(None) == []


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("FQ_MAX_PAYLOAD_BYTES", 32 * 1024 * 1024 + 1, "django_fq.E001"),
        ("FQ_MAX_PAYLOAD_BYTES", 0, "django_fq.E001"),
        ("FQ_MAX_PAYLOAD_BYTES", "1MB", "django_fq.E001"),
        ("FQ_DATABASE", "nope", "django_fq.E002"),
        ("FQ_MAX_JOBS_PER_QUEUE", 0, "django_fq.E003"),
        ("FQ_MAX_TOKENS_PER_QUEUE", True, "django_fq.E003"),
        ("FQ_FINISHED_RETENTION_MS", -1, "django_fq.E003"),
        ("FQ_METRICS_MAX_QUEUES", -1, "django_fq.E003"),
        ("FQ_METRICS_MAX_QUEUES", "200", "django_fq.E003"),
        ("FQ_QUEUE_TTL_MS", -1, "django_fq.E003"),
        ("FQ_QUEUE_TTL_MS", 366 * 24 * 3600 * 1000, "django_fq.E003"),
        ("FQ_QUEUE_TTL_MS", "1h", "django_fq.E003"),
        ("FQ_WORKER_HEARTBEAT_MS", 49, "django_fq.E003"),
        ("FQ_WORKER_HEARTBEAT_MS", 3_600_001, "django_fq.E003"),
        ("FQ_WORKER_HEARTBEAT_MS", -1, "django_fq.E003"),
        ("FQ_WORKER_HEARTBEAT_MS", "10s", "django_fq.E003"),
        ("FQ_WORKER_HEARTBEAT_MS", True, "django_fq.E003"),
    ],
)
def test_bad_settings_are_reported(settings, name, value, check_id):
    setattr(settings, name, value)
    assert check_id in _ids(checks.check_settings(None))


def test_sqlite_without_immediate_or_busy_timeout_warns(monkeypatch):
    from django.conf import settings

    monkeypatch.setitem(settings.DATABASES["default"], "ENGINE", "django.db.backends.sqlite3")
    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", {})
    assert {"django_fq.W001", "django_fq.W002"} <= set(_ids(checks.check_settings(None)))


@pytest.mark.sqlite_only
@pytest.mark.django_db(transaction=True)  # the journal mode cannot change inside a transaction
def test_sqlite_file_database_must_use_wal():
    assert checks.check_sqlite_wal(None, databases=["default"]) == []
    with connection.cursor() as cur:
        cur.execute("PRAGMA journal_mode=DELETE")
    try:
        assert _ids(checks.check_sqlite_wal(None, databases=["default"])) == ["django_fq.E004"]
    finally:
        with connection.cursor() as cur:
            cur.execute("PRAGMA journal_mode=WAL")


@pytest.mark.django_db
def test_object_api_enqueue_dequeue_ack_size():
    emails = Queue("emails", visibility_ms=120_000)
    assert emails.size() == 0  # a queue that does not exist yet is empty
    first = emails.enqueue({"to": "a@example.com"})
    emails.enqueue({"to": "b@example.com"}, delay_ms=60_000)
    assert emails.size() == 2
    job = emails.dequeue()
    assert job.id == first and job.payload == {"to": "a@example.com"}
    assert job.deadline - job.claimed_at == 120_000
    assert "fq1." not in repr(job)
    assert emails.dequeue() is None  # the other one is scheduled
    assert emails.ack(job, result={"sent": True}).state == "succeeded"
    assert fq.get("emails", first).result == {"sent": True}
    assert emails.size() == 1


@pytest.mark.django_db
def test_object_api_nack_and_validation():
    q = Queue("retries")
    q.enqueue(1)
    job = q.dequeue()
    assert q.nack(job, delay_ms=0, error="boom").state == "ready"
    assert q.dequeue().attempts == 2
    with pytest.raises(InvalidQueueName):
        Queue("no spaces")
    with pytest.raises(VisibilityOutOfRange):
        Queue("ok", visibility_ms=0)


@pytest.mark.parametrize("value", [0, 50, 10_000, 3_600_000])
def test_worker_heartbeat_values_in_range_pass_the_check(settings, value):
    settings.FQ_WORKER_HEARTBEAT_MS = value
    assert "django_fq.E003" not in _ids(checks.check_settings(None))
    from django_fq import conf

    assert conf.worker_heartbeat_ms() == value


def test_a_worker_heartbeat_the_check_refuses_is_read_as_the_default(settings):
    from django_fq import conf

    settings.FQ_WORKER_HEARTBEAT_MS = "10s"
    assert conf.worker_heartbeat_ms() == 10_000
