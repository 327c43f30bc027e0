"""A database that refuses connections: the API answers 503 JSON with Retry-After, never an HTML 500.

The request's connection is pointed at a database that really refuses: on
a database server (PostgreSQL, MariaDB) a closed port, or a role whose connection limit
is reached ("too many connections"); on SQLite a file in a directory that does not exist. See
docs/rest-api.md, "Limits and errors".
"""

from __future__ import annotations

import base64
import contextlib
import socket

import pytest
from django.db import DatabaseError, OperationalError, connections

from django_fq import conf, storage
from django_fq import services as fq
from django_fq.api.exceptions import database_unavailable

from .conftest import Client, client_as, make_user, url

Q = "db:down"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


@pytest.fixture
def refusing(transactional_db):
    """``with refusing(): …`` makes django-fq's connection refuse until the block ends."""
    conn = connections[conf.database()]

    @contextlib.contextmanager
    def refuse(**changes):
        saved = dict(conn.settings_dict)
        conn.close()
        if not changes:
            if storage.for_connection(conn).embedded:
                changes = {"NAME": "/nonexistent-fq-dir/sub/db.sqlite3"}
            else:
                changes = {"HOST": "127.0.0.1", "PORT": str(_closed_port())}
        conn.settings_dict.update(changes)
        try:
            yield
        finally:
            conn.close()
            conn.settings_dict.clear()
            conn.settings_dict.update(saved)

    return refuse


def _unavailable(response) -> None:
    assert response.status_code == 503, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    assert response["Retry-After"] == "1"
    body = response.json()
    assert body["code"] == "database_unavailable" and set(body) == {"code", "message", "field"}
    assert "127.0.0.1" not in body["message"] and "nonexistent" not in body["message"]


CALLS = [
    ("get", "queues", None),
    ("get", "queue", None),
    ("get", "stats", None),
    ("get", "jobs", None),
    ("post", "jobs", {"payload": 1}),
    ("post", "enqueue-bulk", {"jobs": [{"payload": 1}]}),
    ("put", "queue", {"max_attempts": 2}),
    ("post", "claim", {}),
    ("post", "claim", {"wait_ms": 500}),
    ("post", "ack", {"receipt": "fq1.x"}),
    ("get", "job", None),
    ("post", "job-wait", {"timeout_ms": 500}),
    ("post", "job-cancel", None),
]


@pytest.mark.parametrize("method, name, body", CALLS, ids=[f"{m}-{n}-{i}" for i, (m, n, _) in enumerate(CALLS)])
def test_every_endpoint_answers_503_when_the_database_refuses(refusing, method, name, body):
    job = fq.enqueue(Q, 1).id
    client = client_as(superuser=True)  # forced authentication: no user lookup before the view
    args = [] if name == "queues" else ([Q, job] if name.startswith("job") and name != "jobs" else [Q])
    with refusing():
        if method == "get":
            r = client.get(url(name, *args))
        else:
            r = getattr(client, method)(url(name, *args), body)
    _unavailable(r)
    assert fq.get(Q, job).state == "ready"  # the database works again, nothing was done


def test_a_refused_lookup_of_the_user_is_503_too(refusing):
    """HTTP Basic looks the user up in the database: that refusal is the same 503, not a 500."""
    name = make_user("manage", password="pw").username
    client = Client()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{name}:pw".encode()).decode())
    with refusing():
        _unavailable(client.get(url("queues")))


@pytest.mark.postgres_only
def test_too_many_connections_is_503(refusing):
    """A role at its connection limit: PostgreSQL refuses with SQLSTATE 53300, as when max_connections is reached."""
    role = "fq_wt_no_connections"
    with connections[conf.database()].cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {role}")
        cur.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        client = client_as(superuser=True)
        with refusing(USER=role):
            _unavailable(client.get(url("queues")))
    finally:
        with connections[conf.database()].cursor() as cur:
            cur.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_database_error_that_is_not_about_availability_stays_a_500(db):
    """Only refusals map to 503: a bug (bad SQL, a missing table) must not pass for a busy database."""
    conn = connections[conf.database()]
    for sql in ("SELEC 1", "SELECT * FROM fq_no_such_table"):
        with pytest.raises(DatabaseError) as caught, conn.cursor() as cur:
            cur.execute(sql)
        assert not database_unavailable(caught.value), caught.value
    assert database_unavailable(OperationalError("no cause")) is False


def test_the_metrics_view_answers_503_when_the_staff_check_cannot_reach_the_database(refusing):
    pytest.importorskip("prometheus_client")
    from django.http import HttpRequest
    from django.utils.functional import SimpleLazyObject

    from django_fq.metrics.views import metrics_view

    def user():
        from django.contrib.auth.models import User

        return User.objects.get(pk=1)  # what AuthenticationMiddleware's lazy user does

    request = HttpRequest()
    request.method = "GET"
    request.user = SimpleLazyObject(user)
    with refusing():
        response = metrics_view(request)
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.content.decode().strip() == "unavailable: database error"  # no server text before login
