"""Every endpoint of the REST API: happy paths, then each error with its status, code and field.

Responses are also checked against the OpenAPI schema by the test client
(see ``conftest.Client``).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from django_fq import services
from django_fq.types import STATE_NAMES, TOTAL_NAMES

from .conftest import url

pytestmark = pytest.mark.django_db

Q = "api:test"
CLAIM_KEYS = {"id", "payload", "receipt", "deadline", "attempts", "enqueued_at", "metadata"}
SETTLE_KEYS = {"id", "state", "run_at", "replay"}
POLICY_DEFAULTS = {
    "concurrency": 0,
    "max_attempts": 25,
    "backoff_ms": 1000,
    "max_backoff_ms": 3_600_000,
    "visibility_ms": 30_000,
    "idempotency_retention_ms": 300_000,
    "timeout_ms": 0,
    "ttl_ms": 0,
    "key_concurrency": 0,
    "rate_limit": 0,
    "rate_window_ms": 1000,
    "key_rate_limit": 0,
}
EPOCH_2020_MS = 1_577_836_800_000


def err(response, status: int, code: str, field=None):
    """Assert an error response: status, code and field; return its body."""
    body = response.json()
    assert response.status_code == status, (response.status_code, body)
    assert set(body) >= {"code", "message", "field"}, body
    assert body["code"] == code, body
    assert body["field"] == field, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def enqueue(api, payload=None, queue=Q, **options):
    r = api.post(url("jobs", queue), {"payload": payload if payload is not None else {"n": 1}, **options})
    assert r.status_code in (200, 201), r.json()
    return r.json()["id"]


def claim(api, queue=Q, **body):
    r = api.post(url("claim", queue), body)
    assert r.status_code == 200, r.json()
    return r.json()


# --- queues ---------------------------------------------------------------------------------


def test_list_queues_empty_then_with_policy_and_counts(api):
    assert api.get(url("queues")).json() == []
    services.configure("b", max_attempts=3)
    enqueue(api, queue="a")
    rows = api.get(url("queues")).json()
    assert [r["name"] for r in rows] == ["a", "b"]
    assert rows[0]["counts"] == {**dict.fromkeys(STATE_NAMES, 0), "ready": 1}
    assert rows[1]["policy"] == {**POLICY_DEFAULTS, "max_attempts": 3}
    assert rows[0]["created_at"] > EPOCH_2020_MS


def test_get_queue_returns_its_policy(api):
    services.configure(Q, visibility_ms=5000)
    r = api.get(url("queue", Q))
    assert r.status_code == 200
    assert r.json() == {"queue": Q, **POLICY_DEFAULTS, "visibility_ms": 5000}


def test_get_missing_queue_is_404_and_does_not_create_it(api):
    err(api.get(url("queue", "nope")), 404, "queue_not_found", "queue")
    assert services.queues() == []


def test_invalid_queue_name_is_400(api):
    err(api.get(url("queue", "bad name!")), 400, "invalid_queue_name", "queue")
    err(api.post(url("jobs", "x" * 201), {"payload": 1}), 400, "invalid_queue_name", "queue")


def test_put_creates_with_defaults_and_replaces_the_whole_policy(api):
    r = api.put(url("queue", Q), {"max_attempts": 3, "backoff_ms": 10})
    assert r.status_code == 201
    assert r.json() == {"queue": Q, **POLICY_DEFAULTS, "max_attempts": 3, "backoff_ms": 10}
    r = api.put(url("queue", Q), {"queue": Q, "concurrency": 2})
    assert r.status_code == 200
    assert r.json() == {"queue": Q, **POLICY_DEFAULTS, "concurrency": 2}  # omitted fields back to defaults
    assert services.policy(Q).max_attempts == 25


def test_patch_changes_only_the_given_fields(api):
    services.configure(Q, max_attempts=3)
    r = api.patch(url("queue", Q), {"timeout_ms": 500, "concurrency": None})
    assert r.status_code == 200
    assert r.json() == {"queue": Q, **POLICY_DEFAULTS, "max_attempts": 3, "timeout_ms": 500}


def test_patch_creates_a_missing_queue(api):
    r = api.patch(url("queue", "fresh"), {"visibility_ms": 10})
    assert r.status_code == 201
    assert services.policy("fresh").visibility_ms == 10


@pytest.mark.parametrize(
    "body, code, field",
    [
        ({"max_attempts": 0}, "invalid_policy", "max_attempts"),
        ({"visibility_ms": "5"}, "invalid_policy", "visibility_ms"),
        ({"concurrency": 1.5}, "invalid_policy", "concurrency"),
        ({"ttl_ms": -1}, "invalid_policy", "ttl_ms"),
        ({"backoff_ms": 5000, "max_backoff_ms": 10}, "invalid_policy", "max_backoff_ms"),
        ({"speed": 1}, "invalid", "speed"),
        ({"queue": "other"}, "invalid", "queue"),
    ],
)
@pytest.mark.parametrize("method", ["put", "patch"])
def test_configure_errors_name_the_field_and_change_nothing(api, method, body, code, field):
    err(getattr(api, method)(url("queue", Q), body), 400, code, field)
    assert services.queues() == []


def test_delete_queue_then_404(api):
    enqueue(api)
    r = api.delete(url("queue", Q))
    assert r.status_code == 200
    assert r.json() == {"queue": Q, "deleted": True}
    assert services.queues() == []
    err(api.delete(url("queue", Q)), 404, "queue_not_found", "queue")


def test_stats(api):
    enqueue(api)
    job = claim(api)[0]
    api.post(url("ack", Q), {"receipt": job["receipt"]})
    body = api.get(url("stats", Q)).json()
    assert body["queue"] == Q
    assert body["counts"] == {**dict.fromkeys(STATE_NAMES, 0), "succeeded": 1}
    assert set(body["totals"]) == set(TOTAL_NAMES)
    assert body["totals"]["enqueued"] == body["totals"]["claimed"] == body["totals"]["acked"] == 1
    assert body["wait_count"] == body["run_count"] == 1
    err(api.get(url("stats", "nope")), 404, "queue_not_found", "queue")


def test_unsupported_method_is_405(api):
    err(api.delete(url("queues")), 405, "method_not_allowed")


# --- enqueue ----------------------------------------------------------------------------------


def test_enqueue_201_with_location_and_the_job_stored(api):
    r = api.post(url("jobs", Q), {"payload": {"to": "a@example.com", "n": [1, 2]}, "priority": 5})
    assert r.status_code == 201
    body = r.json()
    assert body["created"] is True
    assert set(body) == {"id", "created"}
    assert r["Location"] == url("job", Q, body["id"])
    info = services.get(Q, body["id"])
    assert info.payload == {"to": "a@example.com", "n": [1, 2]}
    assert info.priority == 5
    assert info.state == "ready"


def test_enqueue_duplicate_token_is_200_with_the_original_id(api):
    first = api.post(url("jobs", Q), {"payload": 1, "idempotency": "tok"})
    again = api.post(url("jobs", Q), {"payload": 2, "idempotency": "tok", "priority": 9})
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "created": False}
    info = services.get(Q, first.json()["id"])
    assert (info.payload, info.priority) == (1, 0)  # the duplicate changed nothing


def test_enqueue_unique_key_coalesces(api):
    a = api.post(url("jobs", Q), {"payload": 1, "unique_key": "k"}).json()
    b = api.post(url("jobs", Q), {"payload": 2, "unique_key": "k"})
    assert b.status_code == 200
    assert b.json() == {"id": a["id"], "created": False}


def test_enqueue_options(api):
    job = enqueue(api, delay_ms=60_000, max_attempts=2, timeout_ms=500, idempotency_retention_ms=10, unique_key="u")
    info = services.get(Q, job)
    assert info.state == "scheduled"
    assert info.run_at - info.enqueued_at == 60_000
    assert (info.max_attempts, info.timeout_ms, info.unique_key) == (2, 500, "u")


def test_enqueue_at_epoch_ms_and_iso_datetime(api):
    now_ms = services.get(Q, enqueue(api)).enqueued_at
    at = now_ms + 3_600_000
    by_ms = services.get(Q, enqueue(api, at=at))
    iso = dt.datetime.fromtimestamp(at / 1000, tz=dt.timezone(dt.timedelta(hours=2))).isoformat()
    by_iso = services.get(Q, enqueue(api, at=iso))
    assert by_ms.run_at == by_iso.run_at == at
    assert by_ms.state == "scheduled"


@pytest.mark.parametrize(
    "body, status, code, field",
    [
        ({}, 400, "invalid", "payload"),
        ({"payload": 1, "color": "red"}, 400, "invalid", "color"),
        ({"payload": 1, "delay_ms": 5, "at": 1}, 400, "delay_and_at", "delay_ms"),
        ({"payload": 1, "delay_ms": -1}, 400, "invalid_delay", "delay_ms"),
        ({"payload": 1, "delay_ms": "5"}, 400, "invalid_delay", "delay_ms"),
        ({"payload": 1, "at": "2030-01-01T00:00:00"}, 400, "invalid_time", "at"),
        ({"payload": 1, "at": "tomorrow"}, 400, "invalid_time", "at"),
        ({"payload": 1, "at": -5}, 400, "invalid_time", "at"),
        ({"payload": 1, "at": 10**15}, 400, "invalid_time", "at"),
        ({"payload": 1, "priority": 2**31}, 400, "invalid", "priority"),
        ({"payload": 1, "priority": 1.5}, 400, "invalid", "priority"),
        ({"payload": 1, "max_attempts": 0}, 400, "invalid", "max_attempts"),
        ({"payload": 1, "timeout_ms": -1}, 400, "invalid", "timeout_ms"),
        ({"payload": 1, "idempotency_retention_ms": 0}, 400, "invalid", "idempotency_retention_ms"),
        ({"payload": 1, "idempotency": ""}, 400, "invalid", "idempotency"),
        ({"payload": 1, "unique_key": "x" * 256}, 400, "invalid", "unique_key"),
        ({"payload": "a\u0000b"}, 400, "invalid_json", "payload"),
    ],
)
def test_enqueue_errors_name_the_field_and_create_nothing(api, body, status, code, field):
    err(api.post(url("jobs", Q), body), status, code, field)
    assert services.queues() == [] or services.stats(Q).totals["enqueued"] == 0


@pytest.mark.parametrize(
    "raw",
    [b"{bad", b'{"payload": NaN}', b'{"payload": Infinity}', b"\xff\xfe{}", b"[1, 2]", b'"text"', b"[" * 100_000],
)
def test_bad_json_bodies_are_400_invalid_json(api, raw):
    r = api.generic("POST", url("jobs", Q), raw, content_type="application/json")
    err(r, 400, "invalid_json")
    assert services.queues() == []


def test_non_json_content_type_is_415(api):
    r = api.post(url("jobs", Q), {"payload": "1"}, format="multipart")
    err(r, 415, "unsupported_media_type")


def test_payload_over_the_limit_is_413_naming_the_payload(api, settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 100
    body = err(api.post(url("jobs", Q), {"payload": "x" * 200}), 413, "payload_too_large", "payload")
    assert body["limit"] == 100
    assert enqueue(api, payload="x" * 90)  # just under the limit is fine


def test_full_queue_is_429(api, settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = 1
    enqueue(api)
    err(api.post(url("jobs", Q), {"payload": 2}), 429, "queue_full", "queue")
    assert services.stats(Q).counts["ready"] == 1


# --- bulk enqueue --------------------------------------------------------------------------------


def test_bulk_enqueue_in_order_with_duplicates_coalesced(api):
    r = api.post(
        url("enqueue-bulk", Q),
        {"jobs": [{"payload": 1, "idempotency": "t"}, {"payload": 2}, {"payload": 3, "idempotency": "t"}]},
    )
    assert r.status_code == 201
    rows = r.json()
    assert [row["created"] for row in rows] == [True, True, False]
    assert rows[2]["id"] == rows[0]["id"]
    assert [services.get(Q, row["id"]).payload for row in rows[:2]] == [1, 2]
    again = api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": 9, "idempotency": "t"}]})
    assert again.status_code == 200
    assert again.json() == [{"id": rows[0]["id"], "created": False}]


def test_bulk_enqueue_empty_list(api):
    r = api.post(url("enqueue-bulk", Q), {"jobs": []})
    assert (r.status_code, r.json()) == (200, [])


@pytest.mark.parametrize(
    "body, code, field",
    [
        ({}, "invalid", "jobs"),
        ({"jobs": {"payload": 1}}, "invalid", "jobs"),
        ({"jobs": [{"payload": 1}, 5]}, "invalid", "jobs[1]"),
        ({"jobs": [{"payload": 1}, {"priority": 1}]}, "invalid", "jobs[1].payload"),
        ({"jobs": [{"payload": 1}, {"payload": 1, "nope": 1}]}, "invalid", "jobs[1].nope"),
        ({"jobs": [{"payload": 1}, {"payload": 1, "priority": "high"}]}, "invalid", "jobs[1].priority"),
        ({"jobs": [{"payload": 1}, {"payload": 1, "at": "soon"}]}, "invalid_time", "jobs[1].at"),
        ({"jobs": [{"payload": 1}, {"payload": 1, "delay_ms": 1, "at": 1}]}, "delay_and_at", "jobs[1].delay_ms"),
        ({"jobs": [{"payload": 1}], "extra": 1}, "invalid", "extra"),
    ],
)
def test_bulk_enqueue_errors_name_the_envelope_and_write_nothing(api, body, code, field):
    body = err(api.post(url("enqueue-bulk", Q), body), 400, code, field)
    assert "items[" not in body["message"]
    assert services.queues() == []


def test_bulk_enqueue_too_many_jobs(api, settings):
    settings.FQ_API_MAX_BULK_JOBS = 2
    err(api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": i} for i in range(3)]}), 400, "count_out_of_range", "jobs")
    assert len(api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": i} for i in range(2)]}).json()) == 2


def test_bulk_enqueue_payload_too_large_names_the_envelope(api, settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 50
    body = {"jobs": [{"payload": "ok"}, {"payload": "x" * 100}]}
    err(api.post(url("enqueue-bulk", Q), body), 413, "payload_too_large", "jobs[1].payload")
    assert services.queues() == []


# --- listing and reading jobs ------------------------------------------------------------------------


def test_jobs_pages_with_a_cursor_and_no_payloads_or_receipts(api):
    ids = [enqueue(api, payload={"i": i}) for i in range(5)]
    claim(api)
    seen, cursor = [], None
    while True:
        params = {"count": 2, **({"cursor": cursor} if cursor else {})}
        page = api.get(url("jobs", Q), params).json()
        for job in page["jobs"]:
            assert not {"payload", "result", "errors", "receipt"} & set(job)
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)
    ready = api.get(url("jobs", Q), {"state": "ready"}).json()["jobs"]
    assert [j["id"] for j in ready] == ids[1:]  # claim order; the first one is running
    running = api.get(url("jobs", Q), {"state": "running"}).json()["jobs"]
    assert [j["id"] for j in running] == ids[:1]
    assert running[0]["lease_deadline"] > running[0]["claimed_at"]


def test_jobs_cursor_0_is_the_first_page(api):
    """``?cursor=0``, as FQ.JOBS and Redis SCAN users write it, is the first page (docs/rest-api.md)."""
    ids = [enqueue(api, payload={"i": i}) for i in range(3)]
    first = api.get(url("jobs", Q), {"count": 2, "state": "ready"}).json()
    zero = api.get(url("jobs", Q), {"count": 2, "state": "ready", "cursor": "0"})
    assert zero.status_code == 200 and zero.json() == first
    assert [j["id"] for j in first["jobs"]] == ids[:2]
    assert services.jobs(Q, state="ready", cursor="0", count=2).next_cursor == first["next_cursor"]


@pytest.mark.parametrize(
    "params, code, field",
    [
        ({"state": "sleeping"}, "invalid", "state"),
        ({"count": 0}, "count_out_of_range", "count"),
        ({"count": 1001}, "count_out_of_range", "count"),
        ({"count": "many"}, "count_out_of_range", "count"),
        ({"cursor": "%%%"}, "invalid_cursor", "cursor"),
    ],
)
def test_jobs_listing_errors(api, params, code, field):
    enqueue(api)
    err(api.get(url("jobs", Q), params), 400, code, field)


def test_jobs_listing_of_a_missing_queue_is_404(api):
    err(api.get(url("jobs", "nope")), 404, "queue_not_found", "queue")


def test_get_job_with_payload_result_and_errors(api):
    job = enqueue(api, payload={"x": 1})
    first = claim(api)[0]
    api.post(url("nack", Q), {"receipt": first["receipt"], "delay_ms": 0, "error": "boom"})
    second = claim(api)[0]
    api.post(url("ack", Q), {"receipt": second["receipt"], "result": {"ok": True}})
    body = api.get(url("job", Q, job)).json()
    assert body["id"] == job and body["queue"] == Q
    assert (body["state"], body["payload"], body["result"], body["attempts"]) == ("succeeded", {"x": 1}, {"ok": True}, 2)
    assert [e["error"] for e in body["errors"]] == ["boom"]
    assert "receipt" not in body


def test_get_unknown_job_or_another_queues_job_is_404(api):
    other = enqueue(api, queue="other")
    enqueue(api)
    err(api.get(url("job", Q, "0" * 32)), 404, "job_not_found", "job_id")
    err(api.get(url("job", Q, other)), 404, "job_not_found", "job_id")
    err(api.get(url("job", "nope", other)), 404, "queue_not_found", "queue")


@pytest.mark.parametrize("name", ["job", "job-retry", "job-cancel", "job-wait"])
def test_a_nul_in_the_job_id_is_not_found(api, name):
    enqueue(api)
    method = api.get if name == "job" else api.post
    err(method(url(name, Q, "ab\x00cd")), 404, "job_not_found", "job_id")


# --- repair ---------------------------------------------------------------------------------------------


def test_retry_a_dead_job(api):
    job = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    assert api.post(url("nack", Q), {"receipt": receipt, "permanent": True}).json()["state"] == "dead"
    r = api.post(url("job-retry", Q, job))
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["attempts"]) == ("ready", 0)
    err(api.post(url("ack", Q), {"receipt": receipt}), 409, "invalid_receipt", "receipt")
    err(api.post(url("job-retry", Q, job)), 409, "invalid_state", "job_id")
    err(api.post(url("job-retry", Q, "f" * 32)), 404, "job_not_found", "job_id")


def test_cancel_a_ready_job_then_again_is_409(api):
    job = enqueue(api)
    r = api.post(url("job-cancel", Q, job))
    assert (r.status_code, r.json()["state"]) == (200, "cancelled")
    body = err(api.post(url("job-cancel", Q, job)), 409, "invalid_state", "job_id")
    assert body["state"] == "cancelled"


def test_cancel_a_running_job_makes_its_receipt_fail_with_cancelled(api):
    job = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    assert api.post(url("job-cancel", Q, job)).json()["state"] == "cancelled"
    for name, extra in (("ack", {}), ("nack", {}), ("release", {}), ("extend", {"visibility_ms": 10})):
        err(api.post(url(name, Q), {"receipt": receipt, **extra}), 409, "cancelled", "receipt")


def test_wait_returns_a_finished_job_at_once(api):
    job = enqueue(api)
    api.post(url("ack", Q), {"receipt": claim(api)[0]["receipt"], "result": 42})
    r = api.post(url("job-wait", Q, job), {"timeout_ms": 1000})
    assert (r.status_code, r.json()["state"], r.json()["result"]) == (200, "succeeded", 42)
    r = api.get(url("job-wait", Q, job), {"timeout_ms": 0})
    assert r.json()["id"] == job


def test_wait_timeout_is_408_with_the_state(api):
    job = enqueue(api)
    body = err(api.post(url("job-wait", Q, job), {"timeout_ms": 0}), 408, "wait_timeout", "timeout_ms")
    assert body["state"] == "ready"
    err(api.get(url("job-wait", Q, job), {"timeout_ms": 30}), 408, "wait_timeout", "timeout_ms")


@pytest.mark.parametrize("timeout", [20_001, -1, "soon"])
def test_wait_timeout_bounds(api, timeout):
    job = enqueue(api)
    err(api.post(url("job-wait", Q, job), {"timeout_ms": timeout}), 400, "invalid", "timeout_ms")


def test_wait_for_an_unknown_job_is_404(api):
    enqueue(api)
    err(api.post(url("job-wait", Q, "0" * 32), {"timeout_ms": 0}), 404, "job_not_found", "job_id")


# --- leases -------------------------------------------------------------------------------------------------


def test_claim_shape_deadline_and_worker(api):
    job = enqueue(api, payload={"k": "v"})
    rows = claim(api, count=5, visibility_ms=60_000)
    assert len(rows) == 1
    row = rows[0]
    assert set(row) == CLAIM_KEYS
    assert (row["id"], row["payload"], row["attempts"]) == (job, {"k": "v"}, 1)
    info = services.get(Q, job)
    assert row["deadline"] == info.lease_deadline == info.claimed_at + 60_000
    assert row["enqueued_at"] == info.enqueued_at
    assert info.worker.startswith("api:user")
    enqueue(api)
    claim(api, worker="box-7")
    assert api.get(url("jobs", Q), {"state": "running"}).json()["jobs"][0]["worker"] in ("box-7", info.worker)


def test_claim_with_no_body_takes_one_job(api):
    enqueue(api)
    enqueue(api)
    r = api.generic("POST", url("claim", Q), content_type="application/json")
    assert r.status_code == 200 and len(r.json()) == 1


def test_claim_from_an_empty_queue_returns_an_empty_list(api):
    services.configure(Q)
    assert claim(api, wait_ms=0) == []


@pytest.mark.parametrize(
    "body, code, field",
    [
        ({"count": 0}, "count_out_of_range", "count"),
        ({"count": 1001}, "count_out_of_range", "count"),
        ({"count": "2"}, "count_out_of_range", "count"),
        ({"visibility_ms": 0}, "visibility_out_of_range", "visibility_ms"),
        ({"visibility_ms": 86_400_001}, "visibility_out_of_range", "visibility_ms"),
        ({"wait_ms": 20_001}, "invalid", "wait_ms"),
        ({"wait_ms": -1}, "invalid", "wait_ms"),
        ({"worker": "w" * 201}, "invalid", "worker"),
        ({"worker": "a\u0000b"}, "invalid", "worker"),
        ({"worker": 7}, "invalid", "worker"),
        ({"receipt": "x"}, "invalid", "receipt"),
    ],
)
def test_claim_errors_name_the_field_and_claim_nothing(api, body, code, field):
    enqueue(api)
    err(api.post(url("claim", Q), body), 400, code, field)
    assert services.stats(Q).counts["ready"] == 1


def test_claim_from_a_missing_queue_is_404(api):
    err(api.post(url("claim", "nope"), {}), 404, "queue_not_found", "queue")


def test_ack_stores_the_result_and_a_repeat_is_a_replay(api):
    job = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    r = api.post(url("ack", Q), {"receipt": receipt, "result": {"sent": 3}})
    assert r.status_code == 200
    assert r.json() == {"id": job, "state": "succeeded", "run_at": None, "replay": False}
    assert services.get(Q, job).result == {"sent": 3}
    again = api.post(url("ack", Q), {"receipt": receipt, "result": {"sent": 3}})
    assert again.json() == {"id": job, "state": "succeeded", "run_at": None, "replay": True}
    err(api.post(url("ack", Q), {"receipt": receipt, "result": "other"}), 409, "invalid_receipt", "receipt")


def test_nack_with_delay_then_permanent(api):
    job = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    body = api.post(url("nack", Q), {"receipt": receipt, "delay_ms": 60_000, "error": "smtp down"}).json()
    assert set(body) == SETTLE_KEYS
    assert (body["id"], body["state"], body["replay"]) == (job, "scheduled", False)
    info = services.get(Q, job)
    assert body["run_at"] == info.run_at
    assert info.last_error == "smtp down"
    services.requeue(Q, job)
    receipt = claim(api)[0]["receipt"]
    assert api.post(url("nack", Q), {"receipt": receipt, "permanent": True}).json()["state"] == "dead"


def test_release_gives_the_attempt_back(api):
    job = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    body = api.post(url("release", Q), {"receipt": receipt, "error": "shutting down"}).json()
    assert (body["id"], body["state"]) == (job, "ready")
    assert services.get(Q, job).attempts == 0
    assert claim(api)[0]["attempts"] == 1


def test_extend_moves_the_deadline(api):
    enqueue(api)
    row = claim(api, visibility_ms=1000)[0]
    r = api.post(url("extend", Q), {"receipt": row["receipt"], "visibility_ms": 600_000})
    assert r.status_code == 200
    assert set(r.json()) == {"deadline"}
    assert r.json()["deadline"] >= row["deadline"] + 599_000
    assert services.get(Q, row["id"]).lease_deadline == r.json()["deadline"]


@pytest.mark.parametrize(
    "name, body, code, field",
    [
        ("ack", {}, "invalid", "receipt"),
        ("ack", {"receipt": "R", "result": 1, "extra": 1}, "invalid", "extra"),
        ("ack", {"receipt": "R", "result": "a\u0000b"}, "invalid_json", "result"),
        ("nack", {"receipt": "R", "delay_ms": -1}, "invalid_delay", "delay_ms"),
        ("nack", {"receipt": "R", "delay_ms": 30 * 86_400_000 + 1}, "invalid_delay", "delay_ms"),
        ("nack", {"receipt": "R", "permanent": "yes"}, "invalid", "permanent"),
        ("nack", {"receipt": "R", "error": 5}, "invalid", "error"),
        ("release", {"receipt": "R", "error": ["x"]}, "invalid", "error"),
        ("extend", {"receipt": "R"}, "invalid", "visibility_ms"),
        ("extend", {"receipt": "R", "visibility_ms": 0}, "visibility_out_of_range", "visibility_ms"),
        ("extend", {"receipt": "R", "visibility_ms": "10"}, "visibility_out_of_range", "visibility_ms"),
    ],
)
def test_settle_bad_input_is_400_and_the_lease_lives_on(api, name, body, code, field):
    enqueue(api)
    receipt = claim(api)[0]["receipt"]
    body = {k: (receipt if v == "R" else v) for k, v in body.items()}
    err(api.post(url(name, Q), body), 400, code, field)
    assert api.post(url("ack", Q), {"receipt": receipt}).json()["state"] == "succeeded"


@pytest.mark.parametrize("name", ["ack", "nack", "release", "extend", "progress"])
def test_forged_expired_or_foreign_receipts_are_409_invalid_receipt(api, clock, name):
    extra = {"extend": {"visibility_ms": 1000}, "progress": {"progress": 50}}.get(name, {})
    enqueue(api)
    enqueue(api, queue="other")
    foreign = claim(api, queue="other")[0]["receipt"]
    row = claim(api, visibility_ms=1000)[0]
    forged = row["receipt"][:-4] + ("AAAA" if not row["receipt"].endswith("AAAA") else "BBBB")
    for receipt in (forged, "garbage", 12345, foreign):
        err(api.post(url(name, Q), {"receipt": receipt, **extra}), 409, "invalid_receipt", "receipt")
    clock.advance(1000)  # at the exact deadline the lease has expired
    err(api.post(url(name, Q), {"receipt": row["receipt"], **extra}), 409, "invalid_receipt", "receipt")


def test_settles_on_a_missing_queue_are_404(api):
    for name in ("ack", "nack", "release"):
        err(api.post(url(name, "nope"), {"receipt": "x"}), 404, "queue_not_found", "queue")
    err(api.post(url("extend", "nope"), {"receipt": "x", "visibility_ms": 5}), 404, "queue_not_found", "queue")


# --- receipts stay secret ------------------------------------------------------------------------------------


def test_receipts_never_appear_in_listings_job_pages_stats_or_errors(api, clock):
    job = enqueue(api)
    row = claim(api, visibility_ms=1000)[0]
    receipt, secret = row["receipt"], row["receipt"].rsplit(".", 1)[1]
    seen = [
        api.get(url("queues")),
        api.get(url("queue", Q)),
        api.get(url("jobs", Q)),
        api.get(url("jobs", Q), {"state": "running"}),
        api.get(url("job", Q, job)),
        api.get(url("stats", Q)),
        api.post(url("job-wait", Q, job), {"timeout_ms": 0}),
        api.post(url("extend", Q), {"receipt": receipt, "visibility_ms": 0}),
        api.post(url("nack", Q), {"receipt": receipt, "delay_ms": -5}),
        api.post(url("ack", Q), {"receipt": receipt, "bogus": 1}),
    ]
    clock.advance(1000)
    seen += [
        api.post(url("ack", Q), {"receipt": receipt}),
        api.post(url("extend", Q), {"receipt": receipt, "visibility_ms": 10}),
        api.post(url("release", Q), {"receipt": receipt}),
        api.get(url("job", Q, job)),
        api.post(url("job-cancel", Q, job)),
        api.post(url("ack", Q), {"receipt": receipt}),
    ]
    assert all(r.status_code != 500 for r in seen)
    for r in seen:
        text = r.content.decode()
        assert secret not in text and receipt not in text, (r.status_code, text)
    assert json.loads(seen[-1].content)["code"] == "cancelled"
