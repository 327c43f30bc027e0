"""django-fq on a database of its own: ``FQ_DATABASE = "queue"``, ``default`` holds everything else.

Run with ``tests.settings_two_dbs`` (see ``tests/test_separate_database.py``).
Every test asserts where the rows are: django-fq's tables exist only in the
queue database, and the application's (users, the handlers' ``Done`` rows)
stay in ``default``.
"""

from __future__ import annotations

import io
from dataclasses import asdict

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.db import connections, router, transaction
from django.test import Client
from rest_framework.test import APIClient

from django_fq import backup, db
from django_fq import services as fq
from django_fq.checks import check_settings
from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter
from django_fq.types import QueuePolicy
from tests.testapp.models import Done
from tests.worker.helpers import WorkerProc

#: Every policy field of the admin's queue form at its default, as a browser posts the form.
POLICY_FORM = asdict(QueuePolicy())

pytestmark = pytest.mark.django_db(databases=["default", "queue"])

FQ_TABLES = {"django_fq_queue", "django_fq_job", "django_fq_lease", "django_fq_token", "django_fq_counter"}


class Boom(Exception):
    pass


def tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cur:
        return set(connections[alias].introspection.table_names(cur))


def job_rows(alias: str, uid: str) -> list[tuple]:
    """``(uid, state)`` rows of job ``uid`` read with plain SQL on ``alias``."""
    with connections[alias].cursor() as cur:
        cur.execute("SELECT uid, state FROM django_fq_job WHERE uid = %s", [uid])
        return cur.fetchall()


def test_two_distinct_databases_and_the_router_migrated_fq_tables_to_queue_only():
    assert connections["default"].settings_dict["NAME"] != connections["queue"].settings_dict["NAME"]
    assert db.connection().alias == "queue"
    assert tables("queue") >= FQ_TABLES
    assert not FQ_TABLES & tables("default")
    assert "testapp_done" in tables("default") and "auth_user" in tables("default")
    for model in (Queue, Job, Lease, IdempotencyToken, QueueCounter):
        assert router.db_for_read(model) == router.db_for_write(model) == "queue"
        assert router.allow_migrate_model("queue", model) and not router.allow_migrate_model("default", model)
    assert router.db_for_write(User) == "default"
    assert not [e for e in checks.run_checks() if e.id.startswith("django_fq.")]


def test_w003_when_no_router_sends_the_models_to_fq_database(settings):
    settings.DATABASE_ROUTERS = []
    ids = [e.id for e in check_settings()]
    assert ids.count("django_fq.W003") == 1


def test_enqueue_claim_ack_write_the_queue_database():
    job = fq.enqueue("two:svc", {"n": 1}, idempotency="tok-1").id
    assert job_rows("queue", job) == [(job, "queued")]
    (claimed,) = fq.claim("two:svc")
    assert Lease.objects.filter(job__uid=job).exists()  # the ORM, through the router
    fq.ack("two:svc", claimed.receipt, result={"ok": True})
    assert job_rows("queue", job) == [(job, "succeeded")]
    assert fq.stats("two:svc").totals["acked"] == 1
    assert fq.enqueue("two:svc", {"n": 2}, idempotency="tok-1").id == job


def test_transactional_enqueue_joins_the_queue_alias_transaction_not_defaults():
    with pytest.raises(Boom), transaction.atomic(using="queue"):
        gone = fq.enqueue("two:tx", {"n": 1}).id
        assert job_rows("queue", gone)  # visible inside the transaction
        raise Boom
    assert job_rows("queue", gone) == []  # rolled back with it

    with pytest.raises(Boom), transaction.atomic():  # "default": not the queue's transaction
        Done.objects.create(job_id="x" * 32)
        kept = fq.enqueue("two:tx", {"n": 2}).id
        raise Boom
    assert not Done.objects.filter(job_id="x" * 32).exists()  # default rolled back ...
    assert fq.get("two:tx", kept).state == "ready"  # ... the enqueue did not


@pytest.mark.django_db(transaction=True, databases=["default", "queue"])
def test_worker_takes_jobs_from_queue_and_handlers_write_default():
    ids = [fq.enqueue("t.ok", {"n": i}).id for i in range(3)]
    proc = WorkerProc(
        "--queue", "t.ok", "--burst", "--concurrency", "2",
        env={
            "DJANGO_SETTINGS_MODULE": "tests.settings_two_dbs",
            "FQ_CHILD_QUEUE_DB_NAME": str(connections["queue"].settings_dict["NAME"]),
        },
    )  # fmt: skip
    assert proc.wait(timeout=120) == 0, proc.stderr
    for uid in ids:
        assert fq.get("t.ok", uid).state == "succeeded"
        assert job_rows("queue", uid) == [(uid, "succeeded")]
    assert set(Done.objects.using("default").values_list("job_id", flat=True)) == set(ids)
    if "testapp_done" in tables("queue"):
        assert not Done.objects.using("queue").exists()


def test_admin_lists_shows_adds_and_repairs_through_the_queue_database():
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    assert User.objects.using("default").filter(username="root").exists()
    client = Client()
    client.force_login(user)
    uid = fq.enqueue("two:adm", {"n": 1}).id
    seq = Job.objects.get(uid=uid).seq
    qid = Queue.objects.get(name="two:adm").id

    r = client.get("/admin/django_fq/queue/")
    assert r.status_code == 200 and b"two:adm" in r.content
    r = client.get(f"/admin/django_fq/job/?queue__id__exact={qid}")  # the queue filter reads Queue rows
    assert r.status_code == 200 and uid.encode() in r.content
    r = client.get(f"/admin/django_fq/job/{seq}/change/")
    assert r.status_code == 200 and uid.encode() in r.content
    r = client.get("/admin/django_fq/queue/dashboard/")
    assert r.status_code == 200 and b"two:adm" in r.content

    # A new queue through the policy form: its unique-name check and the save both reach "queue".
    r = client.post("/admin/django_fq/queue/add/", {**POLICY_FORM, "name": "two:adm2", "max_attempts": 3})
    assert r.status_code == 302, r.content.decode()[:2000]
    assert fq.policy("two:adm2").max_attempts == 3
    r = client.post("/admin/django_fq/queue/add/", {**POLICY_FORM, "name": "two:adm2", "max_attempts": 3})
    assert r.status_code == 200 and b"already exists" in r.content

    r = client.post(f"/admin/django_fq/job/{seq}/cancel/")
    assert r.status_code == 302
    assert job_rows("queue", uid) == [(uid, "cancelled")]


def test_rest_api_through_the_queue_database():
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("api", "api@example.com", "pw"))
    r = client.post("/api/fq/queues/two:api/jobs/", {"payload": {"n": 1}}, format="json")
    assert r.status_code == 201, r.json()
    uid = r.json()["id"]
    assert job_rows("queue", uid) == [(uid, "queued")]
    r = client.post("/api/fq/queues/two:api/claim/", {"count": 1}, format="json")
    assert r.status_code == 200 and r.json()[0]["id"] == uid
    r = client.post("/api/fq/queues/two:api/ack/", {"receipt": r.json()[0]["receipt"], "result": 7}, format="json")
    assert r.status_code == 200, r.json()
    assert job_rows("queue", uid) == [(uid, "succeeded")]
    r = client.get("/api/fq/queues/")
    assert r.status_code == 200 and "two:api" in str(r.json())


def test_backup_reads_and_writes_the_queue_database():
    uid = fq.enqueue("two:bk", {"n": 1}, idempotency="t").id
    out = io.StringIO()
    backup.export_jsonl(out)
    assert uid in out.getvalue()
    fq.delete_queue("two:bk")
    assert job_rows("queue", uid) == []
    summary = backup.import_jsonl(io.StringIO(out.getvalue()))
    assert summary.jobs_created == 1 and summary.tokens_created == 1
    assert job_rows("queue", uid) == [(uid, "queued")]
