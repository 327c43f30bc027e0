"""REST: metadata in the envelope, on claim, in job and listing bodies; ?tag=; release delay_ms; enqueue refusal."""

from __future__ import annotations

import pytest

from django_fq import db, services
from django_fq.models import Job

from .conftest import url

pytestmark = pytest.mark.django_db(transaction=True)

Q = "api.meta"


def test_metadata_round_trip_and_tag_filter_with_cursor(api):
    ids = []
    for i in range(5):
        r = api.post(url("jobs", Q), {"payload": {"i": i}, "metadata": {"tenant": "t", "tags": ["x", f"n{i}"]}})
        assert r.status_code == 201, r.json()
        ids.append(r.json()["id"])
    api.post(url("jobs", Q), {"payload": 0})
    bulk = api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": 1, "metadata": {"tags": ["x"]}}]})
    assert bulk.status_code == 201, bulk.json()
    ids.append(bulk.json()[0]["id"])
    job = api.get(url("job", Q, ids[0])).json()
    assert job["metadata"] == {"tenant": "t", "tags": ["x", "n0"]} and job["tags"] == ["x", "n0"]
    seen, cursor = [], None
    while True:
        params = {"tag": "x", "count": 2, **({"cursor": cursor} if cursor else {})}
        page = api.get(url("jobs", Q), params).json()
        seen += [j["id"] for j in page["jobs"]]
        assert all("x" in j["tags"] for j in page["jobs"])
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(ids)
    claimed = api.post(url("claim", Q), {"count": 10}).json()
    by_id = {c["id"]: c for c in claimed}
    assert by_id[ids[1]]["metadata"] == {"tenant": "t", "tags": ["x", "n1"]}
    assert [c["metadata"] for c in claimed if c["id"] not in ids] == [{}]


@pytest.mark.parametrize(
    ("metadata", "field", "code", "status"),
    [
        ([1], "metadata", "invalid", 400),
        ({"tags": ["a b"]}, "metadata.tags[0]", "invalid", 400),
        ({"k": "x" * 5000}, "metadata", "payload_too_large", 413),
        ({"k": "\u0000"}, "metadata", "invalid_json", 400),
    ],
)
def test_bad_metadata_is_a_clear_error_and_changes_nothing(api, metadata, field, code, status):
    r = api.post(url("jobs", Q), {"payload": 1, "metadata": metadata})
    assert r.status_code == status, r.json()
    assert (r.json()["code"], r.json()["field"]) == (code, field)
    r = api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": 1}, {"payload": 2, "metadata": metadata}]})
    assert r.status_code == status
    assert r.json()["field"] == f"jobs[1].{field}"
    assert not Job.objects.exists()


def test_bad_tag_filter_is_400(api):
    services.enqueue(Q, 1)
    r = api.get(url("jobs", Q), {"tag": "no spaces"})
    assert r.status_code == 400 and r.json()["field"] == "tag"


def test_enqueue_middleware_refusal_is_403_with_its_code(api, settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.add_tenant", "tests.middleware.mw.refuse_forbidden"]
    r = api.post(url("jobs", Q), {"payload": 1, "metadata": {"tenant": "forbidden"}})
    assert r.status_code == 403 and r.json()["code"] == "enqueue_refused"
    r = api.post(url("jobs", Q), {"payload": 1})
    assert r.status_code == 201
    assert api.get(url("job", Q, r.json()["id"])).json()["metadata"] == {"tenant": "acme", "tags": ["stamped"]}


def test_release_with_delay_ms_snoozes_and_bad_delays_are_refused(api):
    services.enqueue(Q, 1)
    job = api.post(url("claim", Q), {}).json()[0]
    r = api.post(url("release", Q), {"receipt": job["receipt"], "delay_ms": -1})
    assert r.status_code == 400 and r.json()["field"] == "delay_ms"
    before = db.db_now_ms()
    r = api.post(url("release", Q), {"receipt": job["receipt"], "delay_ms": 60_000})
    assert r.status_code == 200, r.json()
    body = r.json()
    assert body["state"] == "scheduled" and body["run_at"] >= before + 60_000
    info = services.get(Q, job["id"])
    assert info.attempts == 0 and info.errors[-1]["kind"] == "snooze"
