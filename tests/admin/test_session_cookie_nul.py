"""A session cookie that Django unquotes to a key with NUL (``sessionid="\\000…"``): refused, never a 500.

Django reads ``"\\000"`` in a quoted cookie value as a NUL character, so any
client can send a session key that PostgreSQL cannot compare; Django's
session store then fails with ``DataError``. The REST API answers
``authentication_failed`` in its JSON shape, and the metrics view 403, without
looking the session up (docs/security.md, "Credentials the database cannot compare").
These tests live here because this package installs sessions.
"""

from __future__ import annotations

import pytest
from django.test import Client

from django_fq import services as fq

pytestmark = pytest.mark.django_db

#: Cookie headers whose session key, as Django parses it, holds a NUL character.
NUL_COOKIES = ['sessionid="\\000aaaaaaaaaaaa"', 'sessionid="abcdefgh\\000"']


@pytest.fixture
def client(settings):
    settings.ROOT_URLCONF = "tests.admin.urls_with_api"
    return Client(raise_request_exception=False)


@pytest.mark.parametrize("cookie", NUL_COOKIES)
def test_the_rest_api_refuses_a_session_key_with_nul(client, cookie):
    fq.configure("sess:q")
    for r in (
        client.get("/api/fq/queues/", HTTP_COOKIE=cookie),
        client.post("/api/fq/queues/sess:q/jobs/", b'{"payload": 1}', content_type="application/json", HTTP_COOKIE=cookie),
    ):
        assert r.status_code in (401, 403), (r.status_code, r.content[:200])
        body = r.json()
        assert body["code"] == "authentication_failed" and "session cookie" in body["message"]
    assert fq.stats("sess:q").totals["enqueued"] == 0


@pytest.mark.parametrize("cookie", NUL_COOKIES)
def test_the_metrics_view_refuses_a_session_key_with_nul(client, cookie):
    r = client.get("/metrics/", HTTP_COOKIE=cookie)
    assert r.status_code == 403, (r.status_code, r.content[:200])


def test_a_real_session_still_works(client, make_user):
    user = make_user("sess-staff", "manage")  # staff, with the manage permission
    client.force_login(user)
    assert client.get("/api/fq/queues/").status_code == 200
    assert client.get("/metrics/").status_code in (200, 503)  # 503 only without prometheus-client
