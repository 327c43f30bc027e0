"""REST API batches under ``queues/{q}/batches/``: create, add in several calls, seal, show, members,
cancel; errors naming the field; another queue's batch is not found; per-queue permissions hold."""

from __future__ import annotations

import json

import pytest

from django_fq import batches, services
from django_fq.models import Job

from .conftest import client_as, url
from .test_dependencies import _own_queues_only

pytestmark = pytest.mark.django_db

Q = "api:batch"
R = "api:batch-reports"


def test_create_add_twice_seal_and_the_callback(api):
    r = api.post(url("batches", Q), {"callback": {"queue": R, "payload": {"report": 1}, "priority": 2}})
    assert r.status_code == 201, r.json()
    bid = r.json()["id"]
    assert r.json()["state"] == "open"
    for n in (2, 1):
        added = api.post(url("batch-jobs", Q, bid), {"jobs": [{"payload": i} for i in range(n)]})
        assert added.status_code == 201 and len(added.json()) == n
    one = api.post(url("jobs", Q), {"payload": "x", "batch": bid})
    assert one.status_code == 201
    got = api.get(url("batch", Q, bid)).json()
    assert (got["total"], got["done"], got["progress"]) == (4, 0, 0.0)
    assert api.post(url("batch-seal", Q, bid)).json()["state"] == "sealed"
    jobs = services.claim(Q, count=4)
    services.nack(Q, jobs[0].receipt, error="x", permanent=True)
    for job in jobs[1:]:
        services.ack(Q, job.receipt)
    got = api.get(url("batch", Q, bid)).json()
    assert (got["state"], got["succeeded"], got["dead"]) == ("finished", 3, 1)
    cb = Job.objects.get(queue__name=R)
    assert got["callback_job"] == cb.uid and cb.priority == 2
    assert json.loads(cb.metadata)["batch"] == {"id": bid, "total": 4, "succeeded": 3, "dead": 1, "cancelled": 0}
    members = api.get(url("batch-jobs", Q, bid), {"state": "dead"}).json()
    assert members == [{"id": jobs[0].id, "state": "dead"}]
    assert [b["id"] for b in api.get(url("batches", Q)).json()] == [bid]
    late = api.post(url("batch-jobs", Q, bid), {"jobs": [{"payload": 9}]})
    assert (late.status_code, late.json()["code"], late.json()["field"]) == (409, "invalid_state", "jobs[0].batch")


def test_errors_name_the_field_and_another_queues_batch_is_not_found(api):
    other = batches.create("api:batch-other")
    for r in (
        api.get(url("batch", Q, other.id)),
        api.post(url("batch-seal", Q, other.id)),
        api.post(url("batch-cancel", Q, other.id)),
        api.post(url("batch-jobs", Q, other.id), {"jobs": [{"payload": 1}]}),
        api.get(url("batch-jobs", Q, other.id)),
    ):
        assert (r.status_code, r.json()["code"]) == (404, "batch_not_found")
    services.configure(Q)
    r = api.post(url("jobs", Q), {"payload": 1, "batch": other.id})
    assert (r.status_code, r.json()["code"], r.json()["field"]) == (404, "batch_not_found", "batch")
    r = api.post(url("batches", Q), {"callback": {"payload": 1, "at": 5}})
    assert (r.status_code, r.json()["field"]) == (400, "callback.at")
    r = api.post(url("batches", Q), {"callback": {"priority": 1}})
    assert (r.status_code, r.json()["field"]) == (400, "callback.payload")
    r = api.post(url("batches", Q), {"size": 3})
    assert (r.status_code, r.json()["field"]) == (400, "size")
    assert api.get(url("batch", Q, "nope")).status_code == 404
    assert services.stats(Q).totals["enqueued"] == 0
    assert batches.get(other.id).total == 0


def test_cancel(api):
    bid = api.post(url("batches", Q), {}).json()["id"]
    api.post(url("batch-jobs", Q, bid), {"jobs": [{"payload": 1}, {"payload": 2}]})
    done = api.post(url("batch-cancel", Q, bid))
    assert done.status_code == 200 and (done.json()["state"], done.json()["cancelled"]) == ("cancelled", 2)
    assert api.post(url("batch-cancel", Q, bid)).status_code == 200  # again: nothing more to cancel


def test_capabilities():
    producer, consumer = client_as("produce"), client_as("consume")
    services.configure(Q)  # a producer creates no queue (FQ_API_CREATE_QUEUES)
    bid = producer.post(url("batches", Q), {}).json()["id"]
    assert producer.post(url("batch-jobs", Q, bid), {"jobs": [{"payload": 1}]}).status_code == 201
    assert producer.get(url("batch", Q, bid)).status_code == 200
    assert producer.get(url("batch-jobs", Q, bid)).status_code == 403  # the members' ids: manage
    assert producer.post(url("batch-cancel", Q, bid)).status_code == 403
    assert consumer.get(url("batch", Q, bid)).status_code == 403
    assert consumer.post(url("batch-seal", Q, bid)).status_code == 403


def test_a_user_limited_to_own_queues_reaches_no_other_batch(settings):
    client, user = _own_queues_only(settings, "manage")
    theirs = batches.create("someone-else:b")
    mine = f"{user.username}:b"
    services.configure(mine)
    assert client.get(url("batch", "someone-else:b", theirs.id)).status_code == 403
    assert client.get(url("batches", "someone-else:b")).status_code == 403
    assert client.get(url("batch", mine, theirs.id)).status_code == 404


def test_the_callback_queue_needs_produce_there(settings):
    client, user = _own_queues_only(settings, "produce")
    mine = f"{user.username}:b"
    services.configure(mine)
    r = client.post(url("batches", mine), {"callback": {"queue": "someone-else:r", "payload": 1}})
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    ok = client.post(url("batches", mine), {"callback": {"queue": f"{user.username}:r", "payload": 1}})
    assert ok.status_code == 201
    assert len(batches.list_batches(mine)) == 1
