"""REST workflows: create a whole workflow (POST workflows/), read a job's upstream results (…/upstream/)."""

from __future__ import annotations

import pytest

from django_fq import services
from django_fq.exceptions import QueueNotFound
from django_fq.models import Job

from .conftest import Client, make_user, url

pytestmark = pytest.mark.django_db

Q, R = "api:wf", "api:wf-reports"


def _ack(queue: str, result) -> str:
    job = services.claim(queue)[0]
    services.ack(queue, job.receipt, result=result)
    return job.id


def test_create_a_workflow_then_read_results_forward(api):
    body = {
        "steps": [
            {"name": "split", "queue": Q, "payload": {"file": "a.csv"}},
            {"name": "chunk-0", "queue": Q, "payload": 0, "after": ["split"], "options": {"priority": 5}},
            {"name": "chunk-1", "queue": Q, "payload": 1, "after": ["split"]},
            {"name": "report", "queue": R, "payload": "r", "after": ["chunks"], "on_failure": "run"},
        ],
        "groups": {"chunks": ["chunk-0", "chunk-1"]},
    }
    r = api.post(url("workflows"), body)
    assert r.status_code == 201, r.json()
    ids = r.json()["ids"]
    assert list(ids) == ["split", "chunk-0", "chunk-1", "report"]
    assert services.get(Q, ids["chunk-0"]).priority == 5
    assert services.get(R, ids["report"]).state == "waiting"
    assert _ack(Q, {"rows": 2}) == ids["split"]
    for n in (10, 20):
        _ack(Q, {"rows": n})
    got = api.get(url("job-upstream", R, ids["report"]))
    assert got.status_code == 200
    up = {e["name"]: e for e in got.json()["upstream"]}
    assert {k: (e["state"], e["result"]) for k, e in up.items()} == {
        "chunk-0": ("succeeded", {"rows": 10}),
        "chunk-1": ("succeeded", {"rows": 20}),
    }
    assert up["chunk-0"]["id"] == ids["chunk-0"] and up["chunk-0"]["on_failure"] == "run"
    assert api.get(url("job-upstream", R, "f" * 32)).status_code == 404


def test_chains_shorthand_and_after_an_existing_job(api):
    before = services.enqueue(Q, "before").id
    body = {
        "steps": [{"name": n, "queue": Q, "payload": n} for n in ("a", "b", "c")]
        + [{"name": "d", "queue": Q, "payload": "d", "after": [before]}],
        "chains": [["a", "b", "c"]],
    }
    ids = api.post(url("workflows"), body).json()["ids"]
    edges = {k: [e["id"] for e in services.get(Q, v).depends_on or []] for k, v in ids.items()}
    assert edges == {"a": [], "b": [ids["a"]], "c": [ids["b"]], "d": [before]}


def _step(name="a", **extra):
    return {"name": name, "queue": Q, "payload": 1, **extra}


@pytest.mark.parametrize(
    "body, code, field",
    [
        ({"steps": []}, "invalid_workflow", "steps"),
        ({"steps": "x"}, "invalid_workflow", "steps"),
        ({"steps": [_step(), 3]}, "invalid_workflow", "steps[2]"),  # after the "ok" step added below
        ({"steps": [{"queue": Q, "payload": 1}]}, "invalid_workflow", "steps[1].name"),
        ({"steps": [_step(), _step()]}, "invalid_workflow", "steps[a]"),
        ({"steps": [_step(colour=1)]}, "invalid_workflow", "steps[a].colour"),
        ({"steps": [{"name": "a", "queue": Q}]}, "invalid_workflow", "steps[a].payload"),
        ({"steps": [_step(queue="bad queue")]}, "invalid_queue_name", "steps[a].queue"),
        ({"steps": [_step(after=["nope"])]}, "invalid_workflow", "steps[a].after[0]"),
        ({"steps": [_step(after="b")]}, "invalid_workflow", "steps[a].after"),
        ({"steps": [_step(after=["b"]), _step("b", after=["a"])]}, "invalid_workflow", "steps[a].after"),
        ({"steps": [_step(on_failure="later")]}, "invalid_workflow", "steps[a].on_failure"),
        ({"steps": [_step(options={"colour": 1})]}, "invalid_workflow", "steps[a].options.colour"),
        ({"steps": [_step(options={"depends_on": []})]}, "invalid_workflow", "steps[a].options.depends_on"),
        ({"steps": [_step(options={"priority": "high"})]}, "invalid", "steps[a].options.priority"),
        ({"steps": [_step(options={"delay_ms": -1})]}, "invalid_delay", "steps[a].options.delay_ms"),
        ({"steps": [_step(options=[1])]}, "invalid_workflow", "steps[a].options"),
        ({"steps": [_step(), _step("b", after=["f" * 32])]}, "invalid_dependency", "steps[b].depends_on[0]"),
        ({"steps": [_step()], "groups": {"g": ["zz"]}}, "invalid_workflow", "groups[g][0]"),
        ({"steps": [_step()], "groups": {"a": ["a"]}}, "invalid_workflow", "groups[a]"),
        ({"steps": [_step()], "chains": [["a", "x"]]}, "invalid_workflow", "chains[0][1]"),
        ({"steps": [_step()], "chains": [["a"]]}, "invalid_workflow", "chains[0]"),
        ({"steps": [_step()], "extra": 1}, "invalid", "extra"),
    ],
)
def test_each_error_names_the_step_and_field_and_writes_nothing(api, body, code, field):
    services.configure(R)  # a queue that exists, so "nothing written" is not just "no queue"
    ok = {"name": "ok", "queue": R, "payload": 1}
    body = {**body, "steps": [ok, *body["steps"]]} if isinstance(body["steps"], list) and body["steps"] else body
    r = api.post(url("workflows"), body)
    assert r.status_code == 400, r.json()
    assert (r.json()["code"], r.json()["field"]) == (code, field)
    assert not Job.objects.exists()
    with pytest.raises(QueueNotFound):
        services.policy(Q)


def test_over_the_step_limit_is_400(api):
    r = api.post(url("workflows"), {"steps": [_step(f"s{i}") for i in range(10_001)]})
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (400, "invalid_workflow", "steps")
    assert "10000" in r.json()["message"] and not Job.objects.exists()


def _own_queues_only(settings, *capabilities: str):
    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.OwnQueuesOnly"]
    user = make_user(*capabilities)
    client = Client()
    client.force_authenticate(user)
    return client, user


def test_every_steps_queue_needs_produce(settings):
    client, user = _own_queues_only(settings, "produce")
    mine = f"{user.username}:a"
    services.configure(mine)
    body = {"steps": [{"name": "x", "queue": mine, "payload": 1}, {"name": "y", "queue": "other:b", "payload": 2}]}
    r = client.post(url("workflows"), body)
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    assert "'y'" in r.json()["message"] and "other:b" in r.json()["message"]
    assert not Job.objects.exists()
    ok = client.post(url("workflows"), {"steps": body["steps"][:1]})
    assert ok.status_code == 201


def test_after_a_job_of_a_queue_the_user_may_not_produce_to_is_refused_as_missing(settings):
    client, user = _own_queues_only(settings, "produce")
    mine = f"{user.username}:a"
    services.configure(mine)
    theirs = services.enqueue("other:b", 1).id
    r = client.post(url("workflows"), {"steps": [{"name": "x", "queue": mine, "payload": 1, "after": [theirs]}]})
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (400, "invalid_dependency", "steps[x].after")
    assert theirs not in r.json()["message"] or "no job" in r.json()["message"]
    assert services.stats(mine).totals["enqueued"] == 0


def test_a_new_queue_is_created_only_for_users_who_may_create_queues(settings):
    settings.FQ_API_CREATE_QUEUES = "manage"
    client = Client()
    client.force_authenticate(make_user("produce"))
    r = client.post(url("workflows"), {"steps": [{"name": "x", "queue": "api:new", "payload": 1}]})
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (404, "queue_not_found", "steps[x].queue")
    assert "FQ_API_CREATE_QUEUES" in r.json()["message"]


def test_upstream_hides_the_queues_the_user_may_not_see(settings):
    client, user = _own_queues_only(settings, "consume")
    mine = f"{user.username}:a"
    theirs_queue = "other:b"
    secret = services.enqueue(theirs_queue, 1).id
    _ack(theirs_queue, {"secret": True})
    own = services.enqueue(mine, 1).id
    _ack(mine, {"mine": True})
    job = services.enqueue(mine, 2, depends_on=[{"id": own, "name": "own"}, {"id": secret, "name": "theirs"}]).id
    body = client.get(url("job-upstream", mine, job)).json()
    assert [(e["name"], e["result"]) for e in body["upstream"]] == [("own", {"mine": True})]
    assert client.get(url("job-upstream", theirs_queue, secret)).status_code == 403


def test_upstream_too_large_is_413_naming_the_size(api, monkeypatch):
    from django_fq.services import upstream

    monkeypatch.setattr(upstream, "MAX_RESULTS_BYTES", 10)
    a = services.enqueue(Q, 1).id
    _ack(Q, "x" * 20)
    b = services.enqueue(Q, 2, depends_on=[a]).id
    r = api.get(url("job-upstream", Q, b))
    assert (r.status_code, r.json()["code"], r.json()["size"], r.json()["limit"]) == (413, "results_too_large", 22, 10)
