"""Rate limits and the snooze count over HTTP (docs/reference/semantics.md §9 "Rate limits")."""

from __future__ import annotations

import pytest

from django_fq import services
from django_fq.models import Job
from django_fq.validation import MAX_SNOOZES

from .conftest import url

Q = "api:rate"


def test_the_policy_fields_go_through_put_patch_and_get(api):
    r = api.patch(url("queue", Q), {"rate_limit": 10, "rate_window_ms": 500}, content_type="application/json")
    assert r.status_code == 201, r.content
    assert (r.json()["rate_limit"], r.json()["rate_window_ms"]) == (10, 500)
    got = api.get(url("queue", Q)).json()
    assert (got["rate_limit"], got["rate_window_ms"]) == (10, 500)
    r = api.put(url("queue", Q), {"max_attempts": 3}, content_type="application/json")
    assert (r.json()["rate_limit"], r.json()["rate_window_ms"]) == (0, 1000)  # PUT: omitted fields are defaults
    [info] = [q for q in api.get(url("queues")).json() if q["name"] == Q]
    assert info["policy"]["rate_limit"] == 0


def test_key_rate_limit_goes_through_patch_get_and_put(api):
    r = api.patch(url("queue", Q), {"key_rate_limit": 4}, content_type="application/json")
    assert r.status_code == 201, r.content
    assert r.json()["key_rate_limit"] == 4
    assert api.get(url("queue", Q)).json()["key_rate_limit"] == 4
    r = api.put(url("queue", Q), {"max_attempts": 3}, content_type="application/json")
    assert r.json()["key_rate_limit"] == 0


@pytest.mark.parametrize("value", [-1, 1_000_001, "x", 1.5])
def test_a_bad_key_rate_limit_is_a_400_naming_it_and_writes_nothing(api, value):
    services.configure(Q, key_rate_limit=2)
    r = api.patch(url("queue", Q), {"key_rate_limit": value, "concurrency": 4}, content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "key_rate_limit"
    assert services.policy(Q).key_rate_limit == 2 and services.policy(Q).concurrency == 0


@pytest.mark.parametrize(
    ("field", "value"), [("rate_limit", -1), ("rate_limit", 1_000_001), ("rate_window_ms", 0), ("rate_window_ms", "x")]
)
def test_a_bad_rate_field_is_a_400_naming_it_and_writes_nothing(api, field, value):
    services.configure(Q, rate_limit=5)
    r = api.patch(url("queue", Q), {field: value}, content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == field
    assert services.policy(Q).rate_limit == 5 and services.policy(Q).rate_window_ms == 1000


def test_a_claim_stopped_by_the_rate_limit_says_when_the_next_slot_frees(api):
    services.configure(Q, rate_limit=2, rate_window_ms=60_000)
    for i in range(3):
        services.enqueue(Q, {"i": i})
    r = api.post(url("claim", Q), {"count": 3}, content_type="application/json")
    assert r.status_code == 200 and len(r.json()) == 2
    wait = int(r["Fq-Rate-Wait-Ms"])
    until = int(r["Fq-Rate-Limited-Until"])
    assert 0 < wait <= 60_000 and until > r.json()[0]["deadline"] - 30_000 - 1
    r = api.post(url("claim", Q), {"count": 1}, content_type="application/json")
    assert r.json() == [] and int(r["Fq-Rate-Limited-Until"]) == until
    services.configure(Q, rate_limit=0)
    r = api.post(url("claim", Q), {"count": 1}, content_type="application/json")
    assert len(r.json()) == 1 and "Fq-Rate-Wait-Ms" not in r


def test_the_snooze_count_is_in_the_job_and_the_limit_is_a_409(api):
    job = services.enqueue(Q, {}).id
    lease = api.post(url("claim", Q), {}, content_type="application/json").json()[0]
    r = api.post(url("release", Q), {"receipt": lease["receipt"], "delay_ms": 0}, content_type="application/json")
    assert r.status_code == 200
    assert api.get(url("job", Q, job)).json()["snoozes"] == 1
    Job.objects.filter(uid=job).update(snoozes=MAX_SNOOZES)
    lease = api.post(url("claim", Q), {}, content_type="application/json").json()[0]
    r = api.post(url("release", Q), {"receipt": lease["receipt"], "delay_ms": 0}, content_type="application/json")
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (409, "snooze_limit", "delay_ms")
    assert api.get(url("job", Q, job)).json()["state"] == "running"


def test_a_long_poll_waits_for_the_rate_limits_next_slot(api):
    services.configure(Q, rate_limit=1, rate_window_ms=300)
    for i in range(2):
        services.enqueue(Q, {"i": i})
    first = api.post(url("claim", Q), {}, content_type="application/json").json()
    r = api.post(url("claim", Q), {"wait_ms": 5000}, content_type="application/json")
    assert r.status_code == 200 and len(r.json()) == 1
    a = services.get(Q, first[0]["id"]).claimed_at
    b = services.get(Q, r.json()[0]["id"]).claimed_at
    assert b - a >= 300
