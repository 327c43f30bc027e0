"""Fuzzing the REST API with malformed requests: a 4xx naming the field, and nothing changes.

``tests/api/test_fuzz.py`` fuzzes the OpenAPI schema with schemathesis (typed
values, no 500). This file adds what a schema does not generate: raw bodies
that are not JSON or not UTF-8, ``NaN``/``1e309``/``-0``, nesting too deep,
NUL bytes and lone surrogates (as ``\\u`` escapes) in names, tokens and
payloads, lying ``Content-Length`` headers and wrong content types, oversized
bodies and payloads, queue names and job ids in the URL percent-encoded with
NUL, newlines and unicode, and receipts forged from a real live one. Every
answer is checked against docs/rest-api.md:

* never a 5xx, never a traceback;
* an error is a JSON object ``{"code", "message", "field", ...}``; a 400 about
  one field of the body names that field; no error quotes the receipt;
* a request that fails changes nothing (every django-fq table compared).
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.urls import Resolver404, resolve
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from django_fq import services as fq

from .fuzzing import QUEUE, QUEUE_NAMES, make_world, snapshot

pytestmark = pytest.mark.django_db

MAX_PAYLOAD = 2000
API = "/api/fq/queues/"

#: JSON values that are odd for any field (as Python values; lone surrogates travel as \u escapes).
ODD_VALUES = [
    None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63) - 1, 10**40, 1.5, 1000.0, 1e308, "", "x", "1",
    "\x00", "a\x00b", "\ud800", "é" * 300, "x" * 300, [], {}, [1], {"a": 1}, "x" * (MAX_PAYLOAD + 1),
]  # fmt: skip
#: Raw JSON texts for a field's value that Python's json module would not produce.
RAW_VALUES = ["NaN", "Infinity", "-Infinity", "1e309", "-0", "-0.0", "1E400", "9" * 5000, "[" * 3000 + "]" * 3000]
#: Whole bodies that are not a JSON object of fields.
RAW_BODIES = [
    b"", b"{", b"NaN", b"\xff\xfe\x00", b"[]", b'"text"', b"\x00", b"[" * 100_000, b"\xef\xbb\xbf{}",
    b'{"payload": 1,}', b"{'payload': 1}", b'{"payload": 1} {"payload": 2}', b"null", b"1e309",
    b'{"payload": "\xc3"}', b'{"\\ud800": 1}',
]  # fmt: skip
#: (method, path after /api/fq/queues/{q}/, a valid body, the fields of the body to spoil)
ENDPOINTS = [
    ("POST", "jobs/", {"payload": {"a": 1}}, ["payload", "priority", "delay_ms", "at", "idempotency",
     "idempotency_retention_ms", "unique_key", "max_attempts", "timeout_ms", "bogus"]),
    ("POST", "jobs/bulk/", {"jobs": [{"payload": 1}]}, ["jobs", "jobs[0].payload", "jobs[0].priority",
     "jobs[0].at", "jobs[0].idempotency", "jobs[0].bogus"]),
    ("POST", "claim/", {"count": 1, "visibility_ms": 1000}, ["count", "visibility_ms", "wait_ms", "worker"]),
    ("POST", "ack/", {"receipt": "{receipt}"}, ["receipt", "result"]),
    ("POST", "nack/", {"receipt": "{receipt}"}, ["receipt", "delay_ms", "error", "permanent"]),
    ("POST", "release/", {"receipt": "{receipt}"}, ["receipt", "error"]),
    ("POST", "extend/", {"receipt": "{receipt}", "visibility_ms": 1000}, ["receipt", "visibility_ms"]),
    ("PATCH", "", {"concurrency": 0}, ["concurrency", "max_attempts", "backoff_ms", "max_backoff_ms",
     "visibility_ms", "idempotency_retention_ms", "timeout_ms", "queue"]),
    ("PUT", "", {}, ["max_attempts", "visibility_ms", "queue"]),
    ("POST", "jobs/{job}/wait/", {"timeout_ms": 1}, ["timeout_ms"]),
]  # fmt: skip
#: Fields whose odd values the API may accept (an error text is stored as given, within its cap).
LENIENT = {"error", "result", "payload", "jobs[0].payload", "worker", "idempotency", "unique_key",
           "jobs[0].idempotency"}  # fmt: skip


@pytest.fixture
def world(settings):
    settings.ROOT_URLCONF = "tests.api.urls"
    settings.FQ_MAX_PAYLOAD_BYTES = MAX_PAYLOAD
    return make_world()


@pytest.fixture
def client(world):
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("fuzz", "fuzz@example.com", "pw"))
    client.raise_request_exception = False
    return client


def _set(body: dict, field: str, raw: str) -> str:
    """``body`` as JSON text with ``field`` (``a`` or ``jobs[0].a``) set to the raw JSON text ``raw``."""
    marker = "\u2063MARK\u2063"
    target = body
    if field.startswith("jobs[0]."):
        body = {**body, "jobs": [dict(body["jobs"][0])]}
        target = body["jobs"][0]
        field = field[len("jobs[0].") :]
    target[field] = marker
    return json.dumps(body).replace(json.dumps(marker), raw)


def check(response, *, spoiled: str | None, before: dict, receipt: str) -> str:
    """The contract of one answer; returns ``"ok"`` or the error code."""
    shown = (response.request.get("REQUEST_METHOD"), response.request.get("PATH_INFO"), spoiled, response.status_code)
    assert response.status_code < 500, (shown, response.content[:300])
    assert b"Traceback" not in response.content, shown
    if response.status_code < 400:
        return "ok"
    if response.status_code == 404 and not response["Content-Type"].startswith("application/json"):
        # Django's own 404: the path matches no route of the API (an empty queue name, say).
        with pytest.raises(Resolver404):
            resolve(response.request["PATH_INFO"])
        assert snapshot() == before, shown
        return "no_route"
    assert response["Content-Type"].startswith("application/json"), shown
    body = response.json()
    assert isinstance(body, dict) and {"code", "message", "field"} <= set(body), (shown, body)
    assert receipt not in json.dumps(body), (shown, "an error quoted the receipt")
    if response.status_code == 400 and spoiled and body["code"] not in ("invalid_json", "invalid_queue_name"):
        # The field itself, or a part of it (``jobs[0]`` when ``jobs`` holds a non-object).
        named = body["field"]
        assert named == spoiled or named.startswith((f"{spoiled}[", f"{spoiled}.")), (shown, body)
    assert snapshot() == before, (shown, body, "a failed request changed the database")
    return body["code"]


def requests(world) -> st.SearchStrategy:
    """``(method, path, raw body or None, content type, extra headers, spoiled field)``."""
    receipt = world.receipt
    receipts = world.receipts()
    job_ids = world.job_ids()

    def url_part(value: str) -> str:
        return quote(value.encode("utf-8", "surrogatepass"), safe="")

    @st.composite
    def one(draw):
        method, path, base, fields = draw(st.sampled_from(ENDPOINTS), label="endpoint")
        queue = draw(st.sampled_from(QUEUE_NAMES), label="queue")
        path = path.replace("{job}", url_part(draw(st.sampled_from(job_ids), label="job")))
        url = f"{API}{url_part(queue)}/{path}"
        base = json.loads(json.dumps(base).replace("{receipt}", receipt))
        kind = draw(st.sampled_from(["field", "field", "field", "raw value", "body", "headers"]), label="spoil")
        content_type, extra, spoiled = "application/json", {}, None
        if kind in ("field", "raw value"):
            spoiled = draw(st.sampled_from(fields), label="field")
            if spoiled == "receipt":
                raw = json.dumps(draw(st.sampled_from([*receipts[1:], None, 1, [], ""]), label="receipt"))
            elif kind == "field":
                raw = json.dumps(draw(st.sampled_from(ODD_VALUES), label="value"))
            else:
                raw = draw(st.sampled_from(RAW_VALUES), label="raw value")
            data = _set(base, spoiled, raw).encode("utf-8", "surrogatepass")
            if spoiled in LENIENT or spoiled == "bogus" or spoiled.endswith(".bogus"):
                spoiled = None if spoiled in LENIENT else spoiled
        elif kind == "body":
            data = draw(st.sampled_from(RAW_BODIES), label="body")
        else:
            data = json.dumps(base).encode()
            header = draw(st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1",
                                           "", "application/json; charset=nonesuch", "length:huge", "length:0", "length:abc",
                                           "length:-1"]), label="header")  # fmt: skip
            if header.startswith("length:"):
                extra["CONTENT_LENGTH"] = {"huge": str(10**12), "0": "0", "abc": "abc", "-1": "-1"}[header[7:]]
            else:
                content_type = header
        return method, url, data, content_type, extra, spoiled

    return one()


def _fuzz(client, world, *, examples: int, derandomize: bool) -> dict:
    seen: dict[str, int] = {}

    @hsettings(
        max_examples=examples, deadline=None, derandomize=derandomize, database=None,
        suppress_health_check=list(HealthCheck), print_blob=True,
    )  # fmt: skip
    @given(request=requests(world))
    def one(request):
        method, url, data, content_type, extra, spoiled = request
        before = snapshot()
        response = client.generic(method, url, data=data, content_type=content_type, **extra)
        code = check(response, spoiled=spoiled, before=before, receipt=world.receipt)
        seen[code] = seen.get(code, 0) + 1

    one()
    return seen


def test_malformed_requests_get_a_named_4xx_and_change_nothing(client, world):
    seen = _fuzz(client, world, examples=300, derandomize=True)
    print("answers:", seen)
    assert {"invalid_json", "invalid", "invalid_queue_name", "invalid_receipt", "payload_too_large"} <= set(seen), seen
    assert fq.get(QUEUE, world.ids["running"]).state in ("running", "ready", "scheduled", "succeeded", "dead")


@pytest.mark.slow
def test_many_malformed_requests(client, world):
    _fuzz(client, world, examples=int(os.environ.get("FQ_FUZZ_EXAMPLES", 800)), derandomize=False)
