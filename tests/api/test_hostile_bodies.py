"""Hostile bodies and hostile rows on the REST API: nesting (C17), odd charsets, and what a body may cost.

Every refusal is the API's JSON error shape, never an HTML 500; nothing is
written by a refused request (docs/rest-api.md, "Limits").
"""

from __future__ import annotations

import json
import tracemalloc

import pytest

from django_fq import services
from django_fq.api import conf as api_conf
from django_fq.api.parsers import BODY_DEPTH
from django_fq.validation import MAX_JSON_DEPTH, UNREADABLE_KEY

from ..cases.test_c17_poison_payload import nested_text, store_raw
from .conftest import url
from .test_endpoints import err

pytestmark = pytest.mark.django_db

Q = "hostile"
TOO_DEEP = f"nests deeper than {MAX_JSON_DEPTH} levels"


def post(api, name: str, text: str | bytes, *args, content_type: str = "application/json"):
    data = text.encode() if isinstance(text, str) else text
    return api.generic("POST", url(name, *args), data, content_type=content_type)


# --- C17 on the API: refused by name, before anything is written ------------------------------------


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, BODY_DEPTH, 1500, 100_000])
def test_c17_rest_enqueue_refuses_a_deep_payload_single_and_bulk(api, levels):
    deep = nested_text(levels)
    r = post(api, "jobs", '{"payload":' + deep + "}", Q)
    by_name = levels < BODY_DEPTH  # within the body's bound the payload is decoded and named
    body = err(r, 400, "invalid_json", "payload" if by_name else None)
    assert TOO_DEEP in body["message"] if by_name else f"nests deeper than {BODY_DEPTH} levels" in body["message"]
    r = post(api, "enqueue-bulk", '{"jobs":[{"payload":1},{"payload":' + deep + "}]}", Q)
    bulk_named = levels + 3 <= BODY_DEPTH
    body = err(r, 400, "invalid_json", "jobs[1].payload" if bulk_named else None)
    assert "deeper than" in body["message"]
    assert services.queues() == []


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 100_000])
def test_c17_rest_ack_result_and_nack_error_refuse_deep_json(api, levels):
    job = services.enqueue(Q, 1).id
    receipt = services.claim(Q, visibility_ms=60_000)[0].receipt
    deep = nested_text(levels)
    text = json.dumps({"receipt": receipt, "result": "@"}).replace('"@"', deep)
    body = err(post(api, "ack", text, Q), 400, "invalid_json", "result" if levels < BODY_DEPTH else None)
    assert "deeper than" in body["message"] and receipt not in body["message"]
    text = json.dumps({"receipt": receipt, "error": "@"}).replace('"@"', deep)
    r = post(api, "nack", text, Q)
    assert r.status_code == 400 and r.json()["code"] in ("invalid", "invalid_json", "invalid_argument")
    assert services.get(Q, job).state == "running" and services.get(Q, job).attempts == 1


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 3000])
def test_c17_rest_reads_and_repairs_answer_for_a_stored_row_too_deep(api, levels):
    job = services.enqueue(Q, {"n": 1}).id
    store_raw(job, nested_text(levels))
    store_raw(job, nested_text(levels), column="result")
    r = api.get(url("job", Q, job))
    assert r.status_code == 200, r.content
    assert r.json()["payload"] == {UNREADABLE_KEY: f"payload {TOO_DEEP}", "bytes": 2 * levels + 1}
    assert r.json()["result"][UNREADABLE_KEY] == f"result {TOO_DEEP}"
    r = api.get(url("job", Q, job), HTTP_ACCEPT="application/json; indent=4")  # DRF's pure-Python renderer
    assert r.status_code == 200
    r = api.post(url("job-cancel", Q, job))
    assert r.status_code == 200, r.content
    assert r.json()["state"] == "cancelled"
    r = api.post(url("job-wait", Q, job), {"timeout_ms": 0})
    assert r.status_code == 200 and r.json()["state"] == "cancelled"

    dead = services.enqueue(Q, 2, max_attempts=1).id
    services.nack(Q, services.claim(Q, visibility_ms=60_000)[0].receipt, error="x")
    store_raw(dead, nested_text(levels))
    r = api.post(url("job-retry", Q, dead))
    assert r.status_code == 200, r.content
    assert r.json()["state"] == "ready" and r.json()["payload"][UNREADABLE_KEY] == f"payload {TOO_DEEP}"


def test_c17_rest_claim_skips_a_poison_row_and_hands_out_the_rest(api):
    ids = [services.enqueue(Q, {"n": i}).id for i in range(3)]
    store_raw(ids[0], nested_text(3000))
    r = api.post(url("claim", Q), {"count": 3, "visibility_ms": 60_000})
    assert r.status_code == 200, r.content
    assert [j["id"] for j in r.json()] == ids[1:]
    assert services.get(Q, ids[0]).state == "dead"


# --- charset ---------------------------------------------------------------------------------------------

BYTE_CODECS = ["hex", "rot13", "base64", "zlib", "bz2", "uu", "quopri", "no-such-charset"]


@pytest.mark.parametrize("charset", BYTE_CODECS)
def test_an_odd_charset_is_415_in_the_api_error_shape_on_every_endpoint_with_a_body(api, charset):
    services.enqueue(Q, 1)
    job = services.enqueue(Q, 2).id
    content_type = f"application/json; charset={charset}"
    bodies = {
        ("jobs", Q): '{"payload":1}',
        ("enqueue-bulk", Q): '{"jobs":[{"payload":1}]}',
        ("claim", Q): '{"count":1}',
        ("ack", Q): '{"receipt":"x"}',
        ("nack", Q): '{"receipt":"x"}',
        ("release", Q): '{"receipt":"x"}',
        ("extend", Q): '{"receipt":"x","visibility_ms":1000}',
        ("job-wait", Q, job): '{"timeout_ms":0}',
    }  # cancel and retry read no body
    for (name, *args), text in bodies.items():
        r = post(api, name, text, *args, content_type=content_type)
        body = err(r, 415, "unsupported_media_type")
        assert f'charset "{charset}"' in body["message"], (name, body)
    r = api.generic("PUT", url("queue", Q), b'{"max_attempts":3}', content_type=content_type)
    err(r, 415, "unsupported_media_type")
    assert services.stats(Q).counts["ready"] == 2  # nothing was claimed or settled


def test_a_text_charset_still_works(api):
    r = post(api, "jobs", '{"payload":"é"}'.encode("latin-1"), Q, content_type="application/json; charset=latin-1")
    assert r.status_code == 201, r.content
    assert services.get(Q, r.json()["id"]).payload == "é"
    r = post(api, "jobs", b'{"payload":1}', Q, content_type="application/json; charset=undefined")
    err(r, 400, "invalid_json")


# --- what a body may cost -----------------------------------------------------------------------


def test_a_bulk_of_ten_million_empty_objects_is_refused_naming_jobs_without_building_them(api):
    raw = b'{"jobs":[' + b",".join([b"{}"] * 10_000_000) + b"]}"
    assert len(raw) > 28 * 2**20 and len(raw) <= api_conf.max_bulk_body_bytes()
    tracemalloc.start()
    try:
        r = post(api, "enqueue-bulk", raw, Q)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    body = err(r, 413, "payload_too_large", "jobs")
    assert str(api_conf.max_body_values()) in body["message"] and "FQ_API_MAX_BODY_VALUES" in body["message"]
    # The body itself is read once (30 MiB) and its shape copied once at most; decoding it
    # would have cost about 900 MiB.
    assert peak < 3 * len(raw), peak
    assert services.queues() == []


def test_the_value_count_ignores_commas_and_brackets_inside_strings(api, settings):
    settings.FQ_API_MAX_BODY_VALUES = 100
    r = post(api, "jobs", json.dumps({"payload": ",[{" * 1000}), Q)
    assert r.status_code == 201, r.content
    r = post(api, "jobs", json.dumps({"payload": list(range(100))}), Q)
    err(r, 413, "payload_too_large")
    r = post(api, "enqueue-bulk", json.dumps({"jobs": [{"payload": i} for i in range(60)]}), Q)
    err(r, 413, "payload_too_large", "jobs")


#: Charsets that spell the JSON punctuation with other bytes than UTF-8 does: EBCDIC (no 0x2C comma
#: at all), and UTF-16/32, where characters such as "∀" (U+2200) carry a 0x22 quote byte.
OTHER_CHARSETS = ("cp500", "utf-16", "utf-32")


@pytest.mark.parametrize("charset", OTHER_CHARSETS)
def test_the_value_count_holds_in_every_charset(api, settings, charset):
    """The body's values are counted in the characters of its charset, not on its raw bytes."""
    settings.FQ_API_MAX_BODY_VALUES = 100
    services.configure(Q)
    first = "a" if charset == "cp500" else "∀"  # cp500 has no "∀"
    body = json.dumps({"payload": [first, *range(200)]}, ensure_ascii=False).encode(charset)
    r = post(api, "jobs", body, Q, content_type=f"application/json; charset={charset}")
    err(r, 413, "payload_too_large")
    body = json.dumps({"jobs": [{"payload": first}] + [{"payload": i} for i in range(60)]}, ensure_ascii=False)
    r = post(api, "enqueue-bulk", body.encode(charset), Q, content_type=f"application/json; charset={charset}")
    err(r, 413, "payload_too_large", "jobs")
    assert services.stats(Q).totals["enqueued"] == 0
    small = json.dumps({"payload": [first, 1, 2]}, ensure_ascii=False).encode(charset)
    r = post(api, "jobs", small, Q, content_type=f"application/json; charset={charset}")
    assert r.status_code == 201, r.content  # a body within the count still works in that charset


def test_a_bulk_of_ten_million_empty_objects_in_ebcdic_is_refused_without_building_them(api):
    """The ten-million-objects body of the test above, sent as ``charset=cp500``: no 0x2C byte in it."""
    raw = ('{"jobs":[' + ",".join(["{}"] * 10_000_000) + "]}").encode("cp500")
    assert b"," not in raw and len(raw) <= api_conf.max_bulk_body_bytes()
    tracemalloc.start()
    try:
        r = post(api, "enqueue-bulk", raw, Q, content_type="application/json; charset=cp500")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err(r, 413, "payload_too_large", "jobs")
    # The body (30 MiB) and its text (30 MiB) once each; decoding it as JSON would cost about 900 MiB.
    assert peak < 3 * len(raw), peak
    assert services.queues() == []


def test_too_many_envelopes_are_refused_naming_jobs(api, settings):
    settings.FQ_API_MAX_BULK_JOBS = 5
    r = post(api, "enqueue-bulk", json.dumps({"jobs": [{"payload": i} for i in range(6)]}), Q)
    err(r, 400, "count_out_of_range", "jobs")
    assert services.queues() == []


def _deep_wide_payload(levels: int, items: int):
    value: object = [0] * items
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("accept", ["application/json; indent=8", "application/json; indent=4", "*/*; indent=8"])
def test_an_indent_asked_in_accept_is_ignored_so_an_answer_stays_compact(api, accept):
    """docs/rest-api.md, "Limits": a payload nesting 64 levels must not answer hundreds of times its size."""
    payload = _deep_wide_payload(MAX_JSON_DEPTH, 2000)
    compact = len(json.dumps(payload, separators=(",", ":")))
    services.configure(Q)
    job_id = services.enqueue(Q, payload).id
    claimed = api.post(url("claim", Q), {"count": 1}, HTTP_ACCEPT=accept)
    assert claimed.status_code == 200
    assert b"\n" not in claimed.content and len(claimed.content) < compact + 1000
    assert claimed.json()[0]["payload"] == payload
    detail = api.get(url("job", Q, job_id), HTTP_ACCEPT=accept)
    assert detail.status_code == 200 and b"\n" not in detail.content
