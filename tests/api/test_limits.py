"""Request size limits: 413 from the declared Content-Length (before the body is read) and from Django."""

from __future__ import annotations

import json

import pytest

from django_fq import services
from django_fq.api import conf as api_conf

from .conftest import Client, make_user, url
from .test_endpoints import err

pytestmark = pytest.mark.django_db

Q = "limits"


def test_declared_content_length_over_the_limit_is_413_without_reading_the_body(api):
    small = json.dumps({"payload": 1}).encode()
    # The test client's input stream fails loudly if read past its real 15 bytes:
    # a 413 here shows the body was judged by its declared length alone.
    r = api.generic("POST", url("jobs", Q), small, content_type="application/json", CONTENT_LENGTH=str(50 * 2**20))
    body = err(r, 413, "payload_too_large")
    assert body["size"] == 50 * 2**20
    assert body["limit"] == api_conf.max_body_bytes()
    assert services.queues() == []


def test_default_body_limit_follows_fq_max_payload_bytes(api, settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 1000
    limit = 3 * 1000 + 64 * 1024
    assert api_conf.max_body_bytes() == limit
    over = {"payload": "x" * 10, "idempotency": None, "pad": " " * limit}
    err(api.post(url("jobs", Q), over), 413, "payload_too_large")
    assert services.queues() == []


def test_an_escaped_encoding_of_a_payload_within_the_limit_is_accepted(api, settings):
    """A client's ``\\uXXXX`` escapes make the body larger than the payload django-fq measures."""
    settings.FQ_MAX_PAYLOAD_BYTES = 20_000
    payload = "é" * 9_000  # 18 000 bytes as compact UTF-8
    raw = json.dumps({"payload": payload}, ensure_ascii=True).encode()
    assert len(raw) > 50_000
    r = api.generic("POST", url("jobs", Q), raw, content_type="application/json")
    assert r.status_code == 201, r.content
    assert services.get(Q, r.json()["id"]).payload == payload


def test_body_limit_setting_applies_to_every_endpoint(api, settings):
    settings.FQ_API_MAX_BODY_BYTES = 500
    services.enqueue(Q, 1)
    receipt = services.claim(Q)[0].receipt
    err(api.post(url("ack", Q), {"receipt": receipt, "result": "r" * 600}), 413, "payload_too_large")
    err(api.put(url("queue", Q), {"max_attempts": 3, "queue": Q + " " * 600}), 413, "payload_too_large")
    assert api.post(url("ack", Q), {"receipt": receipt, "result": "r" * 100}).status_code == 200


def test_bulk_enqueue_has_its_own_larger_body_limit(api, settings):
    settings.FQ_API_MAX_BODY_BYTES = 1000
    jobs = {"jobs": [{"payload": "x" * 100} for _ in range(40)]}  # ~5 kB
    assert api.post(url("enqueue-bulk", Q), jobs).status_code == 201
    settings.FQ_API_MAX_BULK_BODY_BYTES = 2000
    err(api.post(url("enqueue-bulk", Q), jobs), 413, "payload_too_large")
    assert services.stats(Q).totals["enqueued"] == 40


def test_djangos_request_data_too_big_is_413(settings):
    """An authentication class that reads ``request.body`` meets Django's own size limit first."""
    settings.FQ_API_AUTHENTICATION_CLASSES = ["tests.api.auth.BodySignatureAuthentication"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200
    user = make_user("produce")
    client = Client()
    client.credentials(HTTP_X_USER=user.username)
    err(client.post(url("jobs", Q), {"payload": "x" * 300}), 413, "payload_too_large")
    assert services.queues() == []
    services.configure(Q)  # a producer may enqueue into an existing queue (FQ_API_CREATE_QUEUES)
    assert client.post(url("jobs", Q), {"payload": "small"}).status_code == 201
