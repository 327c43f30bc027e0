"""A write must declare a JSON body (docs/security.md, "Cross-site requests").

HTTP Basic has no CSRF token, and an HTML form on another site can POST to
``…/jobs/<id>/cancel/`` with the victim's saved credentials. A form (or a
``text/plain`` fetch) cannot send ``Content-Type: application/json`` without a
CORS preflight, so the API refuses every POST/PUT/PATCH/DELETE without that
type with 415, in its JSON error shape, even when the body is empty, and
changes nothing.
"""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client as DjangoClient

from django_fq import services as fq
from tests.api.conftest import client_as, make_user, url
from tests.api.test_permissions import ENDPOINTS

pytestmark = pytest.mark.django_db

Q = "sec:xsite"
WRITES = [(m, n, b) for m, n, b, _ in ENDPOINTS if m in ("post", "put", "patch", "delete")]


@pytest.fixture(autouse=True)
def api_urls_mounted(settings):
    settings.ROOT_URLCONF = "tests.api.urls"


def _path(name: str, job: str) -> str:
    return url(name, Q, job) if name.startswith("job-") else url(name, Q)


def _browser_with_basic_credentials() -> DjangoClient:
    """What a victim's browser sends to the API from another site's form: saved Basic credentials, no CSRF token."""
    user = make_user("produce", "consume", "manage", password="pw")
    token = base64.b64encode(f"{user.username}:pw".encode()).decode()
    return DjangoClient(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Basic {token}")


def _refused(response) -> None:
    assert response.status_code == 415, (response.status_code, response.content)
    body = response.json()
    assert body["code"] == "unsupported_media_type" and "application/json" in body["message"]
    assert set(body) == {"code", "message", "field"}


def test_a_cross_site_form_post_cannot_cancel_retry_or_claim():
    dead = fq.enqueue(Q, {"n": 2}, max_attempts=1).id
    [lease] = fq.claim(Q)
    fq.nack(Q, lease.receipt, error="boom")
    ready = fq.enqueue(Q, {"n": 1}).id
    browser = _browser_with_basic_credentials()
    before = (fq.stats(Q).totals, fq.policy(Q))
    for path in (url("job-cancel", Q, ready), url("job-retry", Q, dead), url("claim", Q), url("jobs", Q)):
        # An HTML form: urlencoded, with or without fields.
        _refused(browser.post(path, {}))
        _refused(browser.post(path, {"count": "5"}))
        # fetch(…, {method: "POST", mode: "no-cors", body: ""}) sends text/plain.
        _refused(browser.generic("POST", path, "", content_type="text/plain"))
        _refused(browser.generic("POST", path, "x", content_type="text/plain;charset=UTF-8"))
        _refused(browser.generic("POST", path, "", content_type="multipart/form-data; boundary=x"))
    assert (fq.stats(Q).totals, fq.policy(Q)) == before
    assert (fq.get(Q, ready).state, fq.get(Q, dead).state) == ("ready", "dead")


@pytest.mark.parametrize("method, name, body", WRITES, ids=[f"{m}-{n}" for m, n, _ in WRITES])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_every_write_endpoint_refuses_a_write_that_is_not_json(method, name, body, content_type):
    job = fq.enqueue(Q, {"n": 1}).id
    client = client_as(superuser=True)
    before = (fq.stats(Q).totals, fq.get(Q, job).state, fq.policy(Q))
    extra = {} if content_type is None else {"content_type": content_type}
    _refused(client.generic(method.upper(), _path(name, job), "", **extra))
    assert (fq.stats(Q).totals, fq.get(Q, job).state, fq.policy(Q)) == before


@pytest.mark.parametrize("method, name, body", WRITES, ids=[f"{m}-{n}" for m, n, _ in WRITES])
def test_json_writes_still_work_with_and_without_a_body(method, name, body):
    """The well-behaved client: ``Content-Type: application/json`` (a charset too), body or none."""
    job = fq.enqueue(Q, {"n": 1}).id
    client = client_as(superuser=True)
    data = "" if body is None else json.dumps(body)
    r = client.generic(method.upper(), _path(name, job), data, content_type="application/json; charset=utf-8")
    assert r.status_code not in (415, 500), (r.status_code, r.content)


def test_a_denied_write_is_still_401_or_403_not_415():
    """The permission check comes first: a refusal never tells an outsider about content types."""
    job = fq.enqueue(Q, 1).id
    anonymous = DjangoClient()
    assert anonymous.post(url("job-cancel", Q, job), {}).status_code in (401, 403)
    r = client_as("produce").generic("POST", url("job-cancel", Q, job), "", content_type="text/plain")
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    assert fq.get(Q, job).state == "ready"


def test_reads_need_no_content_type():
    fq.configure(Q)
    client = client_as("manage")
    assert client.generic("GET", url("queue", Q), "", content_type="text/plain").status_code == 200
