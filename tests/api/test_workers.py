"""``GET workers/``: the worker registry over REST (docs/rest-api.md; ``manage``, as the queue list)."""

from __future__ import annotations

import pytest

import django_fq

from ..worker_rows import add_worker
from .conftest import client_as, url

pytestmark = pytest.mark.django_db


def test_lists_live_and_gone_workers_and_filters(api):
    add_worker("a:1:x", queues=("w:q", "w:r"), pid=11, running=3)
    add_worker("b:2:y", host="host-b", pid=22, gone=True)
    response = api.get(url("workers"))
    assert response.status_code == 200, response.content
    rows = response.json()
    assert [(r["worker_id"], r["state"], r["pid"]) for r in rows] == [("a:1:x", "live", 11), ("b:2:y", "gone", 22)]
    assert rows[0]["queues"] == ["w:q", "w:r"] and rows[0]["running"] == 3
    assert rows[0]["version"] == django_fq.__version__ and rows[1]["age_ms"] >= 4 * 10_000 - 1
    assert [r["worker_id"] for r in api.get(url("workers"), {"state": "live"}).json()] == ["a:1:x"]
    assert [r["worker_id"] for r in api.get(url("workers"), {"queue": "w:r", "state": "gone"}).json()] == []
    assert api.get("/api/fq/workers").status_code == 200  # without the trailing slash too


@pytest.mark.parametrize(
    "params, field",
    [
        ({"state": "dead"}, "state"),
        ({"state": "live\x00"}, "state"),
        ({"queue": "not a queue"}, "queue"),
        ({"queue": "q\x00"}, "queue"),
        ({"queue": "x" * 201}, "queue"),
        ({"limit": "5"}, "limit"),
    ],
)
def test_bad_query_parameters_are_400_naming_the_field(api, params, field):
    add_worker("a:1:x")
    response = api.get(url("workers"), params)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == field, body


def test_needs_manage():
    add_worker("a:1:x")
    assert client_as("produce", "consume").get(url("workers")).status_code == 403
    assert client_as("manage").get(url("workers")).status_code == 200
