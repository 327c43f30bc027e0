"""Found by a new user: a ``POST`` without the trailing slash was a 500, and "job not found" read three ways.

* ``POST /api/fq/queues/emails/jobs`` (no slash) hit Django's ``APPEND_SLASH``,
  which cannot redirect a ``POST``: with ``DEBUG`` a ``RuntimeError``, a 500
  HTML page. Every route now answers with and without the slash; ``reverse()``
  and the schema keep the documented slashed URLs.
* An unknown job id is ``no job <id> in queue <queue>`` on every verb; a
  malformed one is "not a job id" — both still 404 ``job_not_found``.
"""

from __future__ import annotations

import pytest
from django.urls import resolve
from drf_spectacular.generators import SchemaGenerator

from django_fq.api.urls import api_patterns

from .conftest import url

pytestmark = pytest.mark.django_db

Q = "slash:test"
ENDPOINTS = [
    ("queues",),
    ("queue", Q),
    ("stats", Q),
    ("jobs", Q),
    ("enqueue-bulk", Q),
    ("job", Q, "f" * 32),
    ("job-retry", Q, "f" * 32),
    ("job-cancel", Q, "f" * 32),
    ("job-wait", Q, "f" * 32),
    ("claim", Q),
    ("ack", Q),
    ("nack", Q),
    ("release", Q),
    ("extend", Q),
    ("schema",),
]


@pytest.fixture
def debug_with_append_slash(settings):
    """What the user ran: ``DEBUG`` on, Django's ``CommonMiddleware`` with ``APPEND_SLASH``."""
    settings.DEBUG = True
    settings.APPEND_SLASH = True
    settings.MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]


def test_post_without_the_trailing_slash_enqueues(api, debug_with_append_slash):
    slashed = url("jobs", Q)
    assert slashed == f"/api/fq/queues/{Q}/jobs/"  # the documented URL is unchanged

    made = api.post(slashed.rstrip("/"), {"payload": {"n": 1}})

    assert made.status_code == 201, made.content[:300]
    body = made.json()
    assert body["created"] is True
    again = api.get(url("job", Q, body["id"]))
    assert again.status_code == 200 and again.json()["payload"] == {"n": 1}
    assert api.get(url("job", Q, body["id"]).rstrip("/")).json()["id"] == body["id"]
    listed = api.get(slashed.rstrip("/"))
    assert listed.status_code == 200 and [j["id"] for j in listed.json()["jobs"]] == [body["id"]]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e[0])
def test_every_route_answers_without_its_slash_with_the_same_view(endpoint):
    name, *args = endpoint
    slashed = url(name, *args)
    assert slashed.endswith("/")

    with_slash, without = resolve(slashed), resolve(slashed.rstrip("/"))

    assert without.func.cls is with_slash.func.cls
    assert without.kwargs == with_slash.kwargs
    assert without.url_name is None  # reverse() only ever builds the slashed URL


def test_schema_without_slash_names_the_same_mount(api):
    body = api.get("/api/fq/schema", {"format": "json"})

    assert body.status_code == 200
    assert body.json()["servers"] == [{"url": "/api/fq"}]


def test_a_project_wide_schema_has_only_the_slashed_paths(settings):
    """drf-spectacular over the whole URL conf (as ``manage.py spectacular`` does) sees each route once."""
    settings.REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
    paths = set(SchemaGenerator(urlconf="tests.api.urls").get_schema(request=None, public=True)["paths"])

    assert paths, "no path at all"
    assert all(p.endswith("/") for p in paths), sorted(p for p in paths if not p.endswith("/"))
    per_mount = {p for p in paths if p.startswith("/api/fq/")}
    assert len(per_mount) == len(api_patterns()) + 1  # and schema/ itself


# --- one wording for "job not found" -------------------------------------------------------------


@pytest.mark.parametrize("name", ["job", "job-retry", "job-cancel", "job-wait"])
def test_an_unknown_job_reads_the_same_on_every_verb(api, name):
    api.post(url("jobs", Q), {"payload": 1})
    method = api.get if name == "job" else api.post
    job_id = "0" * 32

    body = method(url(name, Q, job_id), **({} if name == "job" else {"data": {}})).json()

    assert body == {"code": "job_not_found", "message": f"no job {job_id} in queue {Q}", "field": "job_id"}


@pytest.mark.parametrize("job_id", ["nosuchjob", "ab\x00cd", "F" * 32])
def test_a_malformed_job_id_is_said_to_be_none(api, job_id):
    api.post(url("jobs", Q), {"payload": 1})

    response = api.get(url("job", Q, job_id))

    assert response.status_code == 404
    assert response.json() == {
        "code": "job_not_found",
        "message": "not a job id: job ids are 32 lowercase hex characters",
        "field": "job_id",
    }
