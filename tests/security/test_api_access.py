"""REST API access control, beyond the permission matrix of ``tests/api/test_permissions.py``.

That file proves, endpoint by endpoint and role by role, that anonymous users
get 401/403 and that produce / consume / manage admit exactly their verbs.
This one closes the gaps: the default does not follow a project-wide DRF
``AllowAny``, every method of every view names its capabilities, methods
the matrix does not try (HEAD, OPTIONS, unknown ones) are denied too, a
denied request's body is never read, and no listing carries a receipt.
"""

from __future__ import annotations

import json

import pytest

from django_fq import services as fq
from django_fq.api import urls as api_urls
from django_fq.api.permissions import CAPABILITIES
from django_fq.api.views import FqAPIView
from django_fq.models import Job, Lease
from tests.api.conftest import Client, client_as, url

pytestmark = pytest.mark.django_db

Q = "sec:api"
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture(autouse=True)
def api_urls_mounted(settings):
    settings.ROOT_URLCONF = "tests.api.urls"


def _views():
    """Every view class of the API's URL patterns, with its route name."""
    out = []
    for pattern in api_urls.api_patterns():
        out.append((pattern.name, pattern.callback.view_class))
    return out


def test_every_method_of_every_view_names_the_capabilities_it_needs():
    """No handler is reachable through the fall-back "any capability of the endpoint" rule (default deny)."""
    seen = 0
    for name, view in _views():
        assert issubclass(view, FqAPIView), name
        for method in METHODS:
            if hasattr(view, method):
                caps = view.capabilities.get(method.upper())
                assert caps, f"{name} {method.upper()} names no capability"
                assert set(caps) <= set(CAPABILITIES), (name, method, caps)
                seen += 1
    assert seen >= 19  # the 14 routes have 19 handlers


def test_project_wide_allow_any_does_not_open_the_api(settings):
    """DRF's ``DEFAULT_PERMISSION_CLASSES`` is not used: only ``FQ_API_PERMISSION_CLASSES`` opens the API."""
    settings.REST_FRAMEWORK = {
        "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
        "UNAUTHENTICATED_USER": None,
    }
    fq.enqueue(Q, {"n": 1})
    anonymous = Client()
    for r in (
        anonymous.get(url("queues")),
        anonymous.post(url("claim", Q), {}),
        anonymous.post(url("jobs", Q), {"payload": 2}),
        anonymous.delete(url("queue", Q)),
    ):
        assert r.status_code in (401, 403), r.status_code
    assert fq.stats(Q).counts["ready"] == 1 and fq.stats(Q).totals["enqueued"] == 1


@pytest.mark.parametrize("method", ["head", "options", "trace"])
def test_methods_outside_the_matrix_are_denied_to_anonymous_users(method):
    fq.enqueue(Q, 1)
    job = fq.jobs(Q).jobs[0].id
    client = Client()
    for name, args in (("queues", []), ("queue", [Q]), ("jobs", [Q]), ("job", [Q, job]), ("claim", [Q]), ("ack", [Q])):
        r = client.generic(method.upper(), url(name, *args))
        assert r.status_code in (401, 403), (method, name, r.status_code)
        assert Q.encode() not in r.content or method == "options"  # nothing of the queue is shown


def test_options_never_shows_more_than_the_endpoint_description():
    """An authenticated user without the capability gets 403 for OPTIONS too."""
    producer = client_as("produce")
    assert producer.options(url("claim", Q)).status_code == 403
    assert producer.options(url("queues")).status_code == 403
    assert producer.options(url("jobs", Q)).status_code == 200  # produce is one of the endpoint's capabilities


def test_a_denied_request_body_is_never_read():
    """Permissions are judged before the body is parsed: 401/403, not 413, for a huge declared body."""
    huge = str(1 << 40)
    small = json.dumps({"payload": 1}).encode()
    anonymous = Client()
    r = anonymous.generic("POST", url("jobs", Q), small, content_type="application/json", CONTENT_LENGTH=huge)
    assert r.status_code in (401, 403)
    consumer = client_as("consume")
    r = consumer.generic("POST", url("jobs", Q), small, content_type="application/json", CONTENT_LENGTH=huge)
    assert r.status_code == 403
    assert fq.queues() == []


def test_capabilities_do_not_leak_into_each_other():
    """One-capability users, one verb each way: nothing is done for the others' verbs (state checked)."""
    fq.configure(Q, max_attempts=5)
    job = fq.enqueue(Q, {"n": 1}).id
    producer, consumer, manager = client_as("produce"), client_as("consume"), client_as("manage")
    [claimed] = consumer.post(url("claim", Q), {}).json()
    assert producer.post(url("ack", Q), {"receipt": claimed["receipt"]}).status_code == 403
    assert manager.post(url("ack", Q), {"receipt": claimed["receipt"]}).status_code == 403
    assert producer.patch(url("queue", Q), {"max_attempts": 1}).status_code == 403
    assert consumer.patch(url("queue", Q), {"max_attempts": 1}).status_code == 403
    assert consumer.post(url("job-cancel", Q, job)).status_code == 403
    assert manager.post(url("jobs", Q), {"payload": 2}).status_code == 403
    assert manager.post(url("claim", Q), {}).status_code == 403
    assert fq.get(Q, job).state == "running" and fq.policy(Q).max_attempts == 5
    assert fq.stats(Q).totals["enqueued"] == 1
    assert consumer.post(url("ack", Q), {"receipt": claimed["receipt"]}).status_code == 200


# --- receipts in responses ----------------------------------------------------------------------------------


def _properties(schema: dict, node, seen=None) -> set[str]:
    """Every property name reachable from ``node`` of an OpenAPI document (following ``$ref``)."""
    seen = set() if seen is None else seen
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref and ref not in seen:
            seen.add(ref)
            target = schema
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            found |= _properties(schema, target, seen)
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                found |= set(value)
            found |= _properties(schema, value, seen)
    elif isinstance(node, list):
        for value in node:
            found |= _properties(schema, value, seen)
    return found


def test_only_the_claim_response_carries_a_receipt_by_the_schema():
    schema = json.loads(client_as("manage").get(url("schema"), {"format": "json"}).content)
    carrying = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            for status, response in op.get("responses", {}).items():
                if "receipt" in _properties(schema, response):
                    carrying.append((path, method, status))
    assert carrying == [("/queues/{queue}/claim/", "post", "200")]


def test_listings_and_details_never_carry_a_receipt_or_its_hash():
    fq.configure(Q, backoff_ms=0)
    for n in range(3):
        fq.enqueue(Q, {"n": n})
    api = client_as("consume", "manage", "produce")
    claimed = api.post(url("claim", Q), {"count": 3}).json()
    receipts = [c["receipt"] for c in claimed]
    api.post(url("ack", Q), {"receipt": receipts[0]})
    api.post(url("nack", Q), {"receipt": receipts[1], "error": "x"})
    hashes = set(Lease.objects.values_list("receipt_hash", flat=True))
    hashes |= set(Job.objects.exclude(settled_hash=None).values_list("settled_hash", flat=True))
    assert len(hashes) == 3
    pages = [api.get(url("queues")), api.get(url("stats", Q)), api.get(url("queue", Q))]
    for state in ("", "running", "succeeded", "scheduled", "ready"):
        pages.append(api.get(url("jobs", Q), {"state": state} if state else {}))
    for c in claimed:
        pages += [api.get(url("job", Q, c["id"])), api.get(url("job-wait", Q, c["id"]), {"timeout_ms": 0})]
    text = "\n".join(p.content.decode() for p in pages)
    assert all(c["id"] in text for c in claimed)
    for receipt in receipts:
        assert receipt not in text and receipt.rsplit(".", 1)[1] not in text
    assert not [h for h in hashes if h in text]
    assert "receipt" not in text and "settled_" not in text
