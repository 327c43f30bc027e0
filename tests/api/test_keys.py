"""Per-key concurrency over HTTP (docs/reference/semantics.md §9 "Per-key limits"): the policy field and the envelope key."""

from __future__ import annotations

import pytest

from django_fq import services

from .conftest import url

Q = "api:keys"

pytestmark = pytest.mark.django_db


def test_the_key_limit_and_the_concurrency_key_through_the_api(api):
    r = api.patch(url("queue", Q), {"key_concurrency": 1})
    assert r.status_code == 201 and r.json()["key_concurrency"] == 1
    assert api.get(url("queue", Q)).json()["key_concurrency"] == 1
    ids = []
    for n in range(2):
        r = api.post(url("jobs", Q), {"payload": n, "concurrency_key": "customer-42"})
        assert r.status_code == 201, r.json()
        ids.append(r.json()["id"])
    r = api.post(url("jobs", Q) + "bulk/", {"jobs": [{"payload": 9, "concurrency_key": "customer-7"}]})
    assert r.status_code == 201, r.json()
    assert api.get(url("job", Q, ids[1])).json()["concurrency_key"] == "customer-42"
    claimed = api.post(url("claim", Q), {"count": 10}).json()
    assert sorted(j["payload"] for j in claimed) == [0, 9]
    listed = api.get(url("jobs", Q), {"state": "ready"}).json()["jobs"]
    assert [(j["id"], j["concurrency_key"]) for j in listed] == [(ids[1], "customer-42")]


@pytest.mark.parametrize("bad", ["", "x" * 201, 7, ["k"]])
def test_a_bad_concurrency_key_is_a_400_naming_it_and_writes_nothing(api, bad):
    services.configure(Q)
    r = api.post(url("jobs", Q), {"payload": 1, "concurrency_key": bad})
    assert r.status_code == 400, r.json()
    assert r.json()["field"] == "concurrency_key"
    assert services.stats(Q).totals["enqueued"] == 0


@pytest.mark.parametrize("bad", [-1, 100_001, "two"])
def test_a_bad_key_limit_is_a_400_naming_it(api, bad):
    r = api.patch(url("queue", Q), {"key_concurrency": bad})
    assert r.status_code == 400, r.json()
    assert r.json()["field"] == "key_concurrency"
    assert Q not in [q.name for q in services.queues()]
