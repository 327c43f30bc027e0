"""Who may call what: the permissions matrix, DRF authentication classes, and the FQ_API_* plugs."""

from __future__ import annotations

import base64

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.test import Client as DjangoClient

from django_fq import services

from .conftest import Client, make_user, url

pytestmark = pytest.mark.django_db

Q = "perm:test"
ROLES = ("anonymous", "nobody", "produce", "consume", "manage", "superuser")
ANY = ("produce", "consume", "manage")

#: (method, endpoint, body, capabilities that admit it)
ENDPOINTS = [
    ("get", "queues", None, ("manage",)),
    ("get", "queue", None, ("manage",)),
    ("put", "queue", {"max_attempts": 3}, ("manage",)),
    ("patch", "queue", {"max_attempts": 3}, ("manage",)),
    ("delete", "queue", None, ("manage",)),
    ("get", "stats", None, ("manage",)),
    ("get", "history", None, ("manage",)),
    ("post", "queue-pause", None, ("manage",)),
    ("post", "queue-resume", None, ("manage",)),
    ("get", "jobs", None, ("manage",)),
    ("post", "jobs", {"payload": 1}, ("produce",)),
    ("post", "enqueue-bulk", {"jobs": [{"payload": 1}]}, ("produce",)),
    ("get", "job", None, ("manage",)),
    ("post", "job-retry", None, ("manage",)),
    ("post", "job-cancel", None, ("manage",)),
    ("get", "job-wait", {"timeout_ms": 0}, ("produce", "manage")),
    ("post", "job-wait", {"timeout_ms": 0}, ("produce", "manage")),
    ("post", "claim", {}, ("consume",)),
    ("post", "ack", {"receipt": "x"}, ("consume",)),
    ("post", "nack", {"receipt": "x"}, ("consume",)),
    ("post", "release", {"receipt": "x"}, ("consume",)),
    ("post", "extend", {"receipt": "x", "visibility_ms": 5}, ("consume",)),
    ("get", "schema", None, ANY),
    ("get", "workers", None, ("manage",)),
]


def _client(role: str) -> Client:
    client = Client()
    if role == "anonymous":
        return client
    if role == "superuser":
        client.force_authenticate(make_user(superuser=True))
    elif role == "nobody":
        client.force_authenticate(make_user())
    else:
        client.force_authenticate(make_user(role))
    return client


def _args(name: str, job: str) -> list:
    if name in ("queues", "schema", "workers"):
        return []
    if name.startswith("job") and name != "jobs":
        return [Q, job]
    return [Q]


def _call(client, method, name, body, job):
    path = url(name, *_args(name, job))
    if method == "get":
        return client.get(path, body or {})
    return getattr(client, method)(path, body) if body is not None else getattr(client, method)(path)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("method, name, body, admits", ENDPOINTS, ids=[f"{m}-{n}" for m, n, _, _ in ENDPOINTS])
def test_permission_matrix(role, method, name, body, admits):
    job = services.enqueue(Q, {"n": 1}).id
    r = _call(_client(role), method, name, body, job)
    if role == "superuser" or role in admits:
        assert r.status_code not in (401, 403), (r.status_code, r.content)
        assert r.status_code < 500
    elif role == "anonymous":
        assert r.status_code in (401, 403), r.status_code
        assert r.json()["code"] == "not_authenticated"
    else:
        assert r.status_code == 403, r.status_code
        body = r.json()
        assert body["code"] == "permission_denied"
        assert any(f"django_fq.{c}" in body["message"] for c in admits)


def test_denied_requests_change_nothing():
    job = services.enqueue(Q, 1).id
    producer = _client("produce")
    assert producer.post(url("claim", Q), {}).status_code == 403
    assert producer.delete(url("queue", Q)).status_code == 403
    assert producer.post(url("job-cancel", Q, job)).status_code == 403
    assert producer.post(url("queue-pause", Q)).status_code == 403
    consumer = _client("consume")
    assert consumer.post(url("queue-pause", Q)).status_code == 403
    assert consumer.post(url("jobs", Q), {"payload": 2}).status_code == 403
    assert services.get(Q, job).state == "ready"
    assert services.stats(Q).totals["enqueued"] == 1
    assert services.stats(Q).paused is False


def test_permissions_granted_through_a_group():
    group = Group.objects.create(name="producers")
    group.permissions.add(Permission.objects.get(content_type__app_label="django_fq", codename="produce"))
    user = make_user()
    user.groups.add(group)
    client = Client()
    client.force_authenticate(user)
    services.configure(Q)
    assert client.post(url("jobs", Q), {"payload": 1}).status_code == 201


def test_inactive_users_get_nothing():
    user = make_user("manage")
    user.is_active = False
    user.save()
    client = Client()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{user.username}:pw".encode()).decode())
    r = client.get(url("queues"))
    assert r.status_code in (401, 403)
    assert r.json()["code"] == "authentication_failed"


# --- DRF authentication classes -------------------------------------------------------------------


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_basic_authentication():
    user = make_user("manage", password="s3cret")
    client = Client()
    client.credentials(HTTP_AUTHORIZATION=_basic(user.username, "s3cret"))
    assert client.get(url("queues")).status_code == 200
    client.credentials(HTTP_AUTHORIZATION=_basic(user.username, "wrong"))
    r = client.get(url("queues"))
    assert r.status_code in (401, 403)
    assert r.json()["code"] == "authentication_failed"


@pytest.fixture
def sessions(settings):
    """Django sessions (signed cookies: no session table needed) and the auth middleware."""
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
    settings.MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]


def test_session_authentication_with_csrf(sessions):
    user = make_user("produce", "manage")
    browser = DjangoClient(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get(url("queues")).status_code == 200
    no_token = browser.post(url("jobs", Q), {"payload": 1}, content_type="application/json")
    assert no_token.status_code == 403
    assert no_token.json()["code"] == "permission_denied"
    assert "CSRF" in no_token.json()["message"]
    secret = "a" * 32
    browser.cookies["csrftoken"] = secret
    ok = browser.post(url("jobs", Q), {"payload": 1}, content_type="application/json", HTTP_X_CSRFTOKEN=secret)
    assert ok.status_code == 201
    assert services.stats(Q).totals["enqueued"] == 1


def test_drf_token_authentication_plugged_by_setting(settings):
    settings.FQ_API_AUTHENTICATION_CLASSES = ["tests.api.auth.FakeModelTokenAuthentication"]
    user = make_user("consume")
    services.enqueue(Q, 1)
    client = Client()
    r = client.post(url("claim", Q), {})
    assert r.status_code == 401  # TokenAuthentication names its scheme: a real 401
    assert r["WWW-Authenticate"] == "Token"
    assert r.json()["code"] == "not_authenticated"
    client.credentials(HTTP_AUTHORIZATION=f"Token tok-{user.username}")
    assert len(client.post(url("claim", Q), {}).json()) == 1
    client.credentials(HTTP_AUTHORIZATION="Token tok-nobody-at-all")
    assert client.post(url("claim", Q), {}).json()["code"] == "authentication_failed"


@pytest.mark.skipif(
    not apps.is_installed("rest_framework.authtoken"), reason="rest_framework.authtoken is not in INSTALLED_APPS"
)
def test_drf_token_model_authentication(settings):
    from rest_framework.authtoken.models import Token

    settings.FQ_API_AUTHENTICATION_CLASSES = ["rest_framework.authentication.TokenAuthentication"]
    token = Token.objects.create(user=make_user("produce"))
    services.configure(Q)
    client = Client()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.post(url("jobs", Q), {"payload": 1}).status_code == 201


# --- permission classes plugged by setting ------------------------------------------------------------


def test_permission_classes_setting_can_restrict_by_queue(settings):
    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.OwnQueuesOnly"]
    user = make_user("produce")
    client = Client()
    client.force_authenticate(user)
    services.configure(f"{user.username}:mail")
    assert client.post(url("jobs", f"{user.username}:mail"), {"payload": 1}).status_code == 201
    r = client.post(url("jobs", "someone-else:mail"), {"payload": 1})
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")


def test_permission_classes_setting_can_open_the_api(settings):
    settings.FQ_API_PERMISSION_CLASSES = ["rest_framework.permissions.AllowAny"]
    services.configure(Q)
    r = Client().get(url("queues"))
    assert r.status_code == 200
    assert [q["name"] for q in r.json()] == [Q]


def test_anonymous_gets_nothing_by_default():
    services.enqueue(Q, {"secret": "payload"})
    client = Client()
    for r in (client.get(url("queues")), client.get(url("jobs", Q)), client.get(url("schema"))):
        assert r.status_code in (401, 403)
        assert b"secret" not in r.content and Q.encode() not in r.content
