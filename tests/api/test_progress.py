"""``POST /queues/{queue}/progress/`` and the progress fields of the job views (docs/how-to/progress.md).

Responses are checked against the OpenAPI schema by the test client (tests/api/conftest.py).
"""

from __future__ import annotations

import pytest

from django_fq import services

from .conftest import client_as, url
from .test_endpoints import claim, enqueue, err

pytestmark = pytest.mark.django_db

Q = "api:test"


def test_progress_is_stored_and_shown_by_the_job_views(api):
    job_id = enqueue(api)
    row = claim(api)[0]
    r = api.get(url("job", Q, job_id))
    assert (r.json()["progress"], r.json()["progress_message"], r.json()["progress_at"]) == (None, "", None)
    r = api.post(url("progress", Q), {"receipt": row["receipt"], "progress": 42.5, "message": "rows 425 of 1000"})
    assert r.status_code == 200, r.json()
    assert r.json() == {"progress": 42.5, "message": "rows 425 of 1000"}
    info = services.get(Q, job_id)
    assert (info.progress, info.progress_message) == (42.5, "rows 425 of 1000")
    body = api.get(url("job", Q, job_id)).json()
    assert (body["progress"], body["progress_message"], body["progress_at"]) == (
        42.5,
        "rows 425 of 1000",
        info.progress_at,
    )
    listed = api.get(url("jobs", Q), {"state": "running"}).json()["jobs"][0]
    assert (listed["progress"], listed["progress_message"]) == (42.5, "rows 425 of 1000")
    # The message is optional (""), an integer percentage fine.
    r = api.post(url("progress", Q), {"receipt": row["receipt"], "progress": 100})
    assert r.json() == {"progress": 100.0, "message": ""}
    assert services.get(Q, job_id).progress_message == ""


@pytest.mark.parametrize(
    "body, field",
    [
        ({"receipt": "R"}, "progress"),
        ({"progress": 5}, "receipt"),
        ({"receipt": "R", "progress": -1}, "progress"),
        ({"receipt": "R", "progress": 100.5}, "progress"),
        ({"receipt": "R", "progress": "50"}, "progress"),
        ({"receipt": "R", "progress": True}, "progress"),
        ({"receipt": "R", "progress": None}, "progress"),
        ({"receipt": "R", "progress": [5]}, "progress"),
        ({"receipt": "R", "progress": 5, "message": "x" * 201}, "message"),
        ({"receipt": "R", "progress": 5, "message": "a\u0000b"}, "message"),
        ({"receipt": "R", "progress": 5, "message": 7}, "message"),
        ({"receipt": "R", "progress": 5, "message": {"a": 1}}, "message"),
        ({"receipt": "R", "progress": 5, "extra": 1}, "extra"),
    ],
)
def test_bad_progress_bodies_are_400_naming_the_field_and_change_nothing(api, body, field):
    job_id = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    api.post(url("progress", Q), {"receipt": receipt, "progress": 7, "message": "kept"})
    before = services.get(Q, job_id)
    body = {k: (receipt if v == "R" else v) for k, v in body.items()}
    response = api.post(url("progress", Q), body)
    err(response, 400, "invalid", field)
    assert receipt not in response.content.decode()
    assert services.get(Q, job_id) == before


def test_progress_needs_the_consume_capability_and_a_live_queue(api):
    enqueue(api)
    receipt = claim(api)[0]["receipt"]
    r = client_as("produce", "manage").post(url("progress", Q), {"receipt": receipt, "progress": 5})
    assert r.status_code == 403
    err(api.post(url("progress", "nope"), {"receipt": receipt, "progress": 5}), 404, "queue_not_found", "queue")
    job_id = services.jobs(Q).jobs[0].id
    services.cancel(Q, job_id)
    err(api.post(url("progress", Q), {"receipt": receipt, "progress": 5}), 409, "cancelled", "receipt")
    assert services.get(Q, job_id).progress is None


@pytest.mark.parametrize(
    "number, code, field",
    [
        ("1e400", "invalid", "progress"),
        ("-1e400", "invalid", "progress"),
        ("NaN", "invalid_json", None),
        ("Infinity", "invalid_json", None),
    ],
)
def test_numbers_json_cannot_store_are_refused(api, number, code, field):
    job_id = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    raw = f'{{"receipt": "{receipt}", "progress": {number}}}'
    response = api.post(url("progress", Q), raw, content_type="application/json")
    err(response, 400, code, field)
    assert services.get(Q, job_id).progress is None
