"""Large payloads kept out of the job row (docs/explanation/storage.md#large-payloads).

A payload above ``FQ_PAYLOAD_OFFLOAD_BYTES`` is stored in ``django_fq_payload``
in the enqueue's transaction; the job row keeps the marker ``""`` and the
body's size. Every read face gives back the exact payload; the claim's 32 MiB
cap (docs/reference/semantics.md#s5) counts offloaded bodies; prune
and delete_queue remove bodies with their jobs; backups carry payloads
whichever side of the threshold they were on. Runs on every database.
"""

from __future__ import annotations

import io
import json

import pytest
from django.db import transaction

from django_fq import backup, conf, db, storage
from django_fq import services as fq
from django_fq.models import Job, JobPayload
from django_fq.storage.base import Store
from django_fq.testing import enqueued_jobs

from .helpers import QUEUE

pytestmark = pytest.mark.django_db

LIMIT = 64  # bytes: the tests' threshold, so small documents are offloaded

NESTED = {
    # A NUL character is refused at enqueue on every database (test below); its escape as text is kept.
    "text": 'ünïcödé ☃ 𝄞 日本語 \\u0000 escaped nul \t tab "quote" \\ back \u2028',
    "nested": [[[{"a": [1, 2.5, -3e10, None, True, False, "x" * 200]}]]],
    "empty": {"": [], "k": {}},
}


def padded(i: int, size: int) -> dict:
    """A payload whose compact JSON is exactly ``size`` bytes (``size`` >= 20)."""
    base = len(json.dumps({"i": i, "pad": ""}, separators=(",", ":")))
    return {"i": i, "pad": "y" * (size - base)}


@pytest.fixture
def offload(settings):
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = LIMIT
    fq.configure(QUEUE)
    return QUEUE


def stored_row(uid: str) -> tuple[str, int]:
    return Job.objects.using(conf.database()).values_list("payload", "payload_size").get(uid=uid)


def bodies() -> dict[str, str]:
    return dict(JobPayload.objects.using(conf.database()).values_list("job_uid", "body"))


def test_round_trip_is_exact_on_every_read_face(offload):
    job_id = fq.enqueue(offload, NESTED).id
    text = json.dumps(NESTED, separators=(",", ":"), ensure_ascii=False)
    payload, size = stored_row(job_id)
    assert payload == "" and size == len(text.encode())
    assert json.loads(bodies()[job_id]) == NESTED
    assert fq.get(offload, job_id).payload == NESTED
    assert [j.payload for j in enqueued_jobs(offload)] == [NESTED]
    assert Job.objects.using(conf.database()).get(uid=job_id).payload_value == NESTED  # the admin's
    [claimed] = fq.claim(offload, count=1, visibility_ms=60_000)
    assert claimed.id == job_id and claimed.payload == NESTED
    fq.ack(offload, claimed.receipt)
    assert fq.get(offload, job_id).payload == NESTED


def test_a_nul_character_is_refused_by_name_before_anything_is_written(offload):
    from django_fq.exceptions import InvalidJson

    with pytest.raises(InvalidJson, match="NUL") as err:
        fq.enqueue(offload, {"pad": "z" * 500, "nul": "a\u0000b"})
    assert err.value.field == "payload"
    assert Job.objects.using(conf.database()).count() == 0 and bodies() == {}


def test_small_payloads_stay_in_the_row_and_a_batch_mixes_both(offload):
    items = [
        {"payload": {"i": 1}},
        {"payload": padded(2, LIMIT + 1)},
        {"payload": padded(3, LIMIT)},
        {"payload": NESTED},
    ]
    ids = [r.id for r in fq.enqueue_many(offload, items)]
    assert set(bodies()) == {ids[1], ids[3]}
    assert stored_row(ids[0])[0] == '{"i":1}' and stored_row(ids[2])[0] != ""
    claimed = fq.claim(offload, count=10, visibility_ms=60_000)
    assert [c.id for c in claimed] == ids
    assert [c.payload for c in claimed] == [it["payload"] for it in items]


def test_offloading_off_keeps_every_payload_in_the_row(settings):
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = 0
    job_id = fq.enqueue(QUEUE, padded(1, 100_000)).id
    assert bodies() == {} and stored_row(job_id) == (json.dumps(padded(1, 100_000), separators=(",", ":")), 100_000)


def test_the_default_threshold_is_8_kib(db):
    assert conf.payload_offload_bytes() == 8192
    small, big = fq.enqueue(QUEUE, padded(1, 8192)).id, fq.enqueue(QUEUE, padded(2, 8193)).id
    assert set(bodies()) == {big} and stored_row(small)[0] != ""


def test_the_claim_cap_counts_offloaded_bytes(offload):
    # 33 payloads of exactly 1 MiB (FQ_MAX_PAYLOAD_BYTES): one claim returns 32 of them, 32 MiB.
    mib = conf.MIB
    assert conf.max_payload_bytes() == mib and 32 * mib == conf.CLAIM_PAYLOAD_CAP_BYTES
    for start in range(0, 33, 8):
        fq.enqueue_many(offload, [{"payload": padded(i, mib)} for i in range(start, min(33, start + 8))])
    assert len(bodies()) == 33
    first = fq.claim(offload, count=40, visibility_ms=60_000)
    assert [c.payload["i"] for c in first] == list(range(32))
    assert all(c.payload == padded(c.payload["i"], mib) for c in first)
    rest = fq.claim(offload, count=40, visibility_ms=60_000)
    assert [c.payload for c in rest] == [padded(32, mib)]


def test_retry_and_nack_keep_the_body(offload):
    fq.configure(offload, max_attempts=2, backoff_ms=0)
    job_id = fq.enqueue(offload, NESTED).id
    for _ in range(2):
        [c] = fq.claim(offload, count=1, visibility_ms=60_000)
        assert c.payload == NESTED
        fq.nack(offload, c.receipt, error="boom", delay_ms=0)
    assert fq.get(offload, job_id).state == "dead"
    fq.retry(offload, job_id)  # the redrive of a dead job
    [c] = fq.claim(offload, count=1, visibility_ms=60_000)
    assert c.id == job_id and c.payload == NESTED
    fq.release(offload, c.receipt)
    [c] = fq.claim(offload, count=1, visibility_ms=60_000)
    assert c.payload == NESTED


def test_prune_and_delete_queue_remove_the_bodies(offload, clock):
    done = fq.enqueue(offload, padded(1, 500)).id
    kept = fq.enqueue(offload, padded(2, 500)).id
    [c] = fq.claim(offload, count=1, visibility_ms=60_000)
    assert c.id == done
    fq.ack(offload, c.receipt)
    clock.advance(10_000)
    assert fq.prune(retention_ms=1_000).jobs == 1
    assert set(bodies()) == {kept}
    assert fq.get(offload, kept).payload == padded(2, 500)
    fq.delete_queue(offload)
    assert bodies() == {}


def test_a_failed_body_write_leaves_no_job(offload, monkeypatch):
    """The body is written in the jobs' transaction: a failure after both writes leaves neither."""
    original = Store.insert_bodies
    calls = []

    def failing(self, conn, rows):
        original(self, conn, rows)
        calls.append(len(rows))
        raise RuntimeError("crash after the body was written")

    monkeypatch.setattr(Store, "insert_bodies", failing)
    with pytest.raises(RuntimeError, match="crash"):
        fq.enqueue(offload, NESTED)
    with pytest.raises(RuntimeError, match="crash"), transaction.atomic(using=conf.database()):
        fq.enqueue_many(offload, [{"payload": NESTED}, {"payload": {"small": 1}}])
    assert calls == [1, 1]
    assert Job.objects.using(conf.database()).count() == 0 and bodies() == {}


def test_a_caller_rollback_drops_job_and_body(offload):
    with transaction.atomic(using=conf.database()):
        fq.enqueue(offload, NESTED)
        transaction.set_rollback(True, using=conf.database())
    assert Job.objects.using(conf.database()).count() == 0 and bodies() == {}


def test_idempotent_and_unique_key_repeats_write_one_body(offload):
    a = fq.enqueue(offload, NESTED, idempotency="tok")
    b = fq.enqueue(offload, NESTED, idempotency="tok")
    c = fq.enqueue(offload, padded(1, 300), unique_key="k")
    d = fq.enqueue(offload, padded(2, 300), unique_key="k")
    assert (a.created, b.created, a.id == b.id) == (True, False, True)
    assert (c.created, d.created, c.id == d.id) == (True, False, True)
    assert set(bodies()) == {a.id, c.id}
    assert fq.get(offload, c.id).payload == padded(1, 300)


def test_a_missing_body_makes_the_job_dead_not_the_worker_crash(offload):
    job_id = fq.enqueue(offload, NESTED).id
    JobPayload.objects.using(conf.database()).filter(job_uid=job_id).delete()
    assert fq.claim(offload, count=1, visibility_ms=60_000) == []
    info = fq.get(offload, job_id)
    assert info.state == "dead" and "payload body is missing" in info.last_error


@pytest.mark.parametrize(("export_limit", "import_limit"), [(LIMIT, 0), (0, LIMIT), (LIMIT, LIMIT)])
def test_export_import_both_ways(settings, export_limit, import_limit):
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = export_limit
    ids = [
        r.id for r in fq.enqueue_many(QUEUE, [{"payload": NESTED}, {"payload": {"i": 1}}, {"payload": padded(3, 5000)}])
    ]
    [c] = fq.claim(QUEUE, count=1, visibility_ms=60_000)
    fq.ack(QUEUE, c.receipt, result={"ok": True})
    out = io.StringIO()
    backup.export_jsonl(out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [x["payload"] for x in lines if x.get("type") == "job"] == [NESTED, {"i": 1}, padded(3, 5000)]
    fq.delete_queue(QUEUE)
    assert bodies() == {}
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = import_limit
    backup.import_jsonl(io.StringIO(out.getvalue()))
    assert set(bodies()) == ({ids[0], ids[2]} if import_limit else set())
    assert [fq.get(QUEUE, i).payload for i in ids] == [NESTED, {"i": 1}, padded(3, 5000)]
    assert [c.payload for c in fq.claim(QUEUE, count=5, visibility_ms=60_000)] == [{"i": 1}, padded(3, 5000)]


def test_fetch_bodies_reads_a_claims_worth_in_one_statement(offload):
    ids = [r.id for r in fq.enqueue_many(offload, [{"payload": padded(i, 100)} for i in range(1000)])]
    conn = db.connection()
    store = storage.for_connection(conn)
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(conn) as ctx:
        found = store.fetch_bodies(conn, ids)
    assert len(ctx.captured_queries) == 1
    assert {u: json.loads(b) for u, b in found.items()} == {u: padded(i, 100) for i, u in enumerate(ids)}


@pytest.mark.parametrize(
    ("value", "ok"), [(0, True), (8192, True), (-1, False), (True, False), ("8192", False), (1.5, False)]
)
def test_the_setting_is_checked(settings, value, ok):
    from django_fq import checks

    settings.FQ_PAYLOAD_OFFLOAD_BYTES = value
    found = [e for e in checks.check_settings() if "FQ_PAYLOAD_OFFLOAD_BYTES" in e.msg]
    assert (found == []) is ok
    assert all(e.id == "django_fq.E003" for e in found)
