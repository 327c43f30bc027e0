"""Credentials a client may send that the database cannot compare: refused with 401, never a 500.

HTTP Basic carries the user name base64-encoded, so any client can put a NUL
character in it although no header may hold one. PostgreSQL cannot compare
text holding NUL (``DataError``), so such a name reaching the user lookup was a
500 on every request (and an error mail to ``ADMINS`` each time). See
docs/security.md, "Credentials the database cannot compare".
"""

from __future__ import annotations

import base64

import pytest
from django.contrib.auth.models import User
from django.test import Client as DjangoClient

from django_fq import services as fq
from tests.api.conftest import make_user, url

pytestmark = pytest.mark.django_db

Q = "sec:credentials"


@pytest.fixture(autouse=True)
def api_urls_mounted(settings):
    settings.ROOT_URLCONF = "tests.api.urls"
    settings.FQ_API_AUTHENTICATION_CLASSES = [
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ]


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _post(authorization: str):
    return DjangoClient().post(
        url("jobs", Q), b'{"payload": 1}', content_type="application/json", HTTP_AUTHORIZATION=authorization
    )


@pytest.mark.parametrize(
    "authorization",
    [
        _basic("a\x00b", "pw"),
        _basic("\x00", "\x00"),
        _basic("producer\x00", "pw"),
        "Basic " + base64.b64encode("n\x00é:pw".encode("latin-1")).decode(),  # not UTF-8: read as Latin-1
        "Token abc\x00def",
    ],
    ids=["nul-in-name", "nul-only", "nul-after-a-real-name", "latin-1-name", "token"],
)
def test_a_nul_in_the_credentials_is_a_401_not_a_500(authorization):
    fq.configure(Q)
    User.objects.create_user("producer", password="pw")
    r = _post(authorization)
    assert r.status_code == 401, (r.status_code, r.content[:300])
    body = r.json()
    assert body["code"] == "authentication_failed"
    assert "NUL" in body["message"]
    assert "\x00" not in body["message"]
    assert fq.stats(Q).totals["enqueued"] == 0


def test_real_basic_credentials_still_work():
    fq.configure(Q)
    user = make_user("produce")
    r = _post(_basic(user.get_username(), "pw"))
    assert r.status_code == 201, r.content
    assert _post(_basic(user.get_username(), "wrong")).status_code == 401


@pytest.mark.parametrize("authorization", [_basic("a\x00b", "pw"), "Token abc\x00def"], ids=["basic", "token"])
def test_the_schema_refuses_a_nul_in_the_credentials_too(authorization):
    r = DjangoClient().get(url("schema"), HTTP_AUTHORIZATION=authorization)
    assert r.status_code == 401, (r.status_code, r.content[:300])
    assert r.json()["code"] == "authentication_failed"
