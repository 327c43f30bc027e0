"""REST API and dependencies: the envelope's depends_on, the job view's edges, 400 naming the field."""

from __future__ import annotations

import pytest

from django_fq import services
from django_fq.exceptions import QueueNotFound

from .conftest import url

pytestmark = pytest.mark.django_db

Q = "api:deps"


def test_enqueue_with_depends_on_and_the_job_view(api):
    a = api.post(url("jobs", Q), {"payload": 1}).json()["id"]
    r = api.post(url("jobs", Q), {"payload": 2, "depends_on": [a]})
    assert r.status_code == 201
    b = r.json()["id"]
    body = api.get(url("job", Q, b)).json()
    assert body["state"] == "waiting"
    assert body["depends_on"] == [{"id": a, "queue": Q, "state": "ready", "on_failure": "cancel", "pending": True}]
    assert api.get(url("job", Q, a)).json()["dependents"][0]["id"] == b
    listed = api.get(url("jobs", Q), {"state": "waiting"}).json()
    assert [j["id"] for j in listed["jobs"]] == [b] and "depends_on" not in listed["jobs"][0]
    assert api.get(url("stats", Q)).json()["counts"]["waiting"] == 1


@pytest.mark.parametrize(
    "value, field",
    [
        ("x", "depends_on"),
        (["0" * 32], "depends_on[0]"),
        ([{"id": "0" * 32, "on_failure": "later"}], "depends_on[0].on_failure"),
    ],
)
def test_bad_depends_on_is_400_naming_the_field(api, value, field):
    r = api.post(url("jobs", Q), {"payload": 1, "depends_on": value})
    assert r.status_code == 400
    assert (r.json()["code"], r.json()["field"]) == ("invalid_dependency", field)
    with pytest.raises(QueueNotFound):
        services.policy(Q)  # nothing written: not even the queue


def test_bulk_names_the_envelope(api):
    r = api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": 1}, {"payload": 2, "depends_on": ["f" * 32]}]})
    assert r.status_code == 400
    assert r.json()["field"] == "jobs[1].depends_on[0]"


def _own_queues_only(settings, capability: str):
    """A client of a new user holding ``capability`` on the queues named ``<username>:…`` only, and that user."""
    from tests.api.conftest import Client, make_user

    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.OwnQueuesOnly"]
    user = make_user(capability)
    client = Client()
    client.force_authenticate(user)
    return client, user


def test_a_dependency_in_a_queue_the_user_may_not_produce_to_is_refused_as_missing(settings):
    client, user = _own_queues_only(settings, "produce")
    mine = f"{user.username}:a"
    services.configure(mine)
    own = services.enqueue(f"{user.username}:b", 1).id
    theirs = services.enqueue("someone-else:mail", 1).id
    ok = client.post(url("jobs", mine), {"payload": 1, "depends_on": [own]})
    assert ok.status_code == 201
    r = client.post(url("jobs", mine), {"payload": 2, "depends_on": [own, theirs]})
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (400, "invalid_dependency", "depends_on[1]")
    missing = client.post(url("jobs", mine), {"payload": 2, "depends_on": [own, "e" * 32]}).json()
    assert r.json()["message"].replace(theirs, "X") == missing["message"].replace("e" * 32, "X")
    bulk = client.post(url("enqueue-bulk", mine), {"jobs": [{"payload": 1}, {"payload": 2, "depends_on": [theirs]}]})
    assert (bulk.status_code, bulk.json()["field"]) == (400, "jobs[1].depends_on[0]")
    assert services.stats(mine).totals["enqueued"] == 1


def test_workflow_show_and_cancel(api):
    a = services.enqueue(Q, "a").id
    b = services.enqueue(Q, "b", depends_on=[a]).id
    shown = api.get(url("job-workflow", Q, b)).json()
    assert [s["id"] for s in shown["steps"]] == [a, b] and shown["steps"][1]["depends_on"] == [a]
    done = api.post(url("job-workflow-cancel", Q, a))
    assert done.status_code == 200 and done.json()["cancelled"] == 2
    assert services.get(Q, b).state == "cancelled"
    assert api.get(url("job-workflow", Q, "f" * 32)).status_code == 404


def test_workflow_of_other_queues_is_hidden_and_not_cancelled(settings):
    client, user = _own_queues_only(settings, "manage")
    mine = f"{user.username}:w"
    theirs = services.enqueue("someone-else:w", 1).id
    own = services.enqueue(mine, 2, depends_on=[theirs]).id
    shown = client.get(url("job-workflow", mine, own)).json()
    assert [s["id"] for s in shown["steps"]] == [own] and shown["steps"][0]["depends_on"] == []
    r = client.post(url("job-workflow-cancel", mine, own))
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    assert services.get(mine, own).state == "waiting"
