"""Adversarial REST tests of flow control and workflows (issues 16 and 17): hostile bodies, other users' queues.

docs/rest-api.md: a permission class may limit a user to some queues; what a
user may not manage is never shown (a workflow lists only the jobs of queues
the user may manage), and ids of other queues' jobs are refused as missing.
"""

from __future__ import annotations

import json

import pytest

from django_fq import services as fq

from .conftest import Client, make_user, url

pytestmark = pytest.mark.django_db


def _own_queues_only(settings, *capabilities: str):
    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.OwnQueuesOnly"]
    user = make_user(*capabilities)
    client = Client()
    client.force_authenticate(user)
    return client, user


def test_job_view_hides_edges_to_jobs_of_queues_the_user_may_not_manage(settings):
    """The job's page (and retry/cancel/wait answers) lists only dependencies and dependents the user may manage."""
    client, user = _own_queues_only(settings, "manage")
    mine = f"{user.username}:w"
    secret_up = fq.enqueue("someone-else:up", {"secret": 1}).id
    own = fq.enqueue(mine, 1, depends_on=[secret_up]).id
    own_up = fq.enqueue(mine, 2).id
    secret_down = fq.enqueue("someone-else:down", 3, depends_on=[own_up]).id
    shown = client.get(url("job", mine, own)).json()
    assert shown["state"] == "waiting"
    assert secret_up not in str(shown) and "someone-else" not in str(shown)
    shown_up = client.get(url("job", mine, own_up)).json()
    assert secret_down not in str(shown_up) and "someone-else" not in str(shown_up)
    waited = client.get(url("job-wait", mine, own_up), {"timeout_ms": 0}).json()
    assert secret_down not in str(waited)
    cancelled = client.post(url("job-cancel", mine, own_up)).json()
    assert secret_down not in str(cancelled) and "someone-else" not in str(cancelled)
    # The edges are there: only this user's view of them is cut.
    assert fq.get(mine, own).depends_on[0]["id"] == secret_up
    assert [e["id"] for e in fq.get(mine, own_up).dependents] == [secret_down]


def test_workflow_cancel_refusal_does_not_name_a_queue_the_user_may_not_see(settings):
    client, user = _own_queues_only(settings, "manage")
    mine = f"{user.username}:w"
    theirs = fq.enqueue("hidden-queue-name:w", 1).id
    own = fq.enqueue(mine, 2, depends_on=[theirs]).id
    r = client.post(url("job-workflow-cancel", mine, own))
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    assert "hidden-queue-name" not in r.json()["message"]
    assert fq.get(mine, own).state == "waiting"


HOSTILE_NUMBERS = [
    "10",
    "NaN",
    "Infinity",
    True,
    None,
    -1,
    10**30,
    1.5,
    [1],
    {"n": 1},
]


@pytest.mark.parametrize("field", ["rate_limit", "rate_window_ms", "key_concurrency", "ttl_ms", "concurrency"])
@pytest.mark.parametrize("value", HOSTILE_NUMBERS, ids=repr)
@pytest.mark.parametrize("method", ["put", "patch"])
def test_hostile_policy_values_are_400_naming_the_field_and_write_nothing(api, field, value, method):
    q = "api:hostile:policy"
    fq.configure(q, rate_limit=5)
    before = fq.policy(q)
    r = getattr(api, method)(url("queue", q), {field: value})
    if value is None:
        assert r.status_code in (200, 400)  # null: "not given" (PUT: the default) or refused, never a 500
        return
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field
    assert "Traceback" not in r.content.decode()
    assert fq.policy(q) == before


@pytest.mark.parametrize(
    "raw",
    [
        b'{"rate_limit": NaN}',
        b'{"rate_limit": Infinity}',
        b'{"rate_limit": -Infinity}',
        b'{"rate_limit": 1e999}',
        b'{"rate_limit": ' + b"9" * 5000 + b"}",
        b'{"key_concurrency": ' + b"9" * 100_000 + b"}",
    ],
    ids=["nan", "inf", "-inf", "1e999", "5000-digits", "100000-digits"],
)
def test_raw_json_numbers_out_of_python_reach_are_400(api, raw):
    q = "api:hostile:raw"
    fq.configure(q)
    before = fq.policy(q)
    r = api.generic("PATCH", url("queue", q), raw, content_type="application/json")
    assert r.status_code == 400, r.content
    assert fq.policy(q) == before


@pytest.mark.parametrize(
    "key, code",
    [
        ("a\x00b", 400),
        ("\ud800", 400),
        ("x" * 201, 400),
        ("", 400),
        (5, 400),
        (["k"], 400),
        ("é" * 200, 201),
        ("🙂" * 200, 201),
        ("A", 201),
    ],
    ids=["nul", "lone-surrogate", "201-chars", "empty", "int", "list", "200-accented", "200-emoji", "plain"],
)
def test_hostile_concurrency_keys(api, key, code):
    q = "api:hostile:key"
    fq.configure(q, key_concurrency=1)
    # Raw JSON with ASCII escapes: a lone surrogate reaches the server as JSON can carry it.
    body = json.dumps({"payload": 1, "concurrency_key": key}).encode()
    r = api.generic("POST", url("jobs", q), body, content_type="application/json")
    assert r.status_code == code, r.content
    if code == 400:
        assert r.json()["field"] == "concurrency_key"
        assert fq.stats(q).totals["enqueued"] == 0
    else:
        job = fq.get(q, r.json()["id"])
        assert job.concurrency_key == key  # stored and read back byte for byte


def test_a_10_mb_concurrency_key_is_refused_without_a_500(api, settings):
    q = "api:hostile:bigkey"
    fq.configure(q, key_concurrency=1)
    r = api.post(url("jobs", q), {"payload": 1, "concurrency_key": "k" * 10_000_000})
    assert r.status_code in (400, 413), r.status_code
    assert fq.stats(q).totals["enqueued"] == 0


def test_depends_on_with_100000_ids_is_refused_cheaply(api, django_assert_max_num_queries):
    q = "api:hostile:manydeps"
    fq.configure(q)
    ids = [f"{i:032x}" for i in range(100_000)]
    with django_assert_max_num_queries(10):
        r = api.post(url("jobs", q), {"payload": 1, "depends_on": ids})
    assert r.status_code in (400, 413), r.content
    if r.status_code == 400:
        assert r.json()["field"] == "depends_on"
    assert fq.stats(q).totals["enqueued"] == 0


@pytest.mark.parametrize(
    "value, field",
    [
        ([{"id": None}], "depends_on[0]"),
        ([{"id": "A" * 32}], "depends_on[0]"),
        ([{"id": "0" * 32, "on_failure": None}], "depends_on[0].on_failure"),
        ([{"id": "0" * 32, "on_failure": ["cancel"]}], "depends_on[0].on_failure"),
        ([{}], "depends_on[0]"),
        ([["0" * 32]], "depends_on[0]"),
        ({"id": "0" * 32}, "depends_on"),
        ([1e308], "depends_on[0]"),
        (["0" * 31 + "\x00"], "depends_on[0]"),
    ],
)
def test_hostile_depends_on_shapes(api, value, field):
    q = "api:hostile:depshape"
    fq.configure(q)
    r = api.post(url("jobs", q), {"payload": 1, "depends_on": value})
    assert r.status_code == 400, r.content
    assert (r.json()["code"], r.json()["field"]) == ("invalid_dependency", field)
    assert fq.stats(q).totals["enqueued"] == 0


@pytest.mark.parametrize("delay", ["NaN", -1, 10**20, True, 1.5, "100"])
def test_hostile_snooze_delays_are_400_and_leave_the_lease(api, delay):
    q = "api:hostile:snooze"
    fq.enqueue(q, 1)
    job = fq.claim(q)[0]
    r = api.post(url("release", q), {"receipt": job.receipt, "delay_ms": delay})
    assert r.status_code == 400, r.content
    assert job.receipt not in r.content.decode()
    assert fq.get(q, job.id).state == "running"
    assert fq.ack(q, job.receipt).state == "succeeded"


def test_workflow_cancel_checks_the_queues_in_its_own_transaction(settings, monkeypatch):
    """A job of a queue the user may not manage joins the workflow between the view's check and the cancel.

    The cancel must not reach it: the permission is judged on the steps the cancel itself reads.
    """
    from django_fq import workflows
    from django_fq.api import views

    client, user = _own_queues_only(settings, "manage")
    mine = f"{user.username}:w"
    own = fq.enqueue(mine, 1).id
    joined: list[str] = []
    real_cancel = workflows.cancel

    def join_then_cancel(queue, job_id, **kw):
        # Another producer's job, run whatever happens to its dependency: a cancel of it releases it.
        joined.append(fq.enqueue("someone-else:w", 2, depends_on=[{"id": own, "on_failure": "run"}]).id)
        return real_cancel(queue, job_id, **kw)

    monkeypatch.setattr(views.workflows, "cancel", join_then_cancel)
    r = client.post(url("job-workflow-cancel", mine, own))
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    assert fq.get("someone-else:w", joined[0]).state == "waiting"
    assert fq.get(mine, own).state == "ready"  # nothing cancelled: all or nothing


def test_a_bulk_naming_more_than_100000_dependencies_is_400_before_any_lookup(api, django_assert_max_num_queries):
    import secrets

    q = "api:hostile:bulkdeps"
    fq.configure(q)
    jobs = [{"payload": i, "depends_on": [secrets.token_hex(16) for _ in range(1000)]} for i in range(101)]
    with django_assert_max_num_queries(12):  # the session and permission reads; no dependency look-up
        r = api.post(url("enqueue-bulk", q), {"jobs": jobs})
    assert r.status_code == 400, r.content[:500]
    assert (r.json()["code"], r.json()["field"]) == ("invalid_dependency", "jobs[100].depends_on")
    assert fq.stats(q).totals["enqueued"] == 0
