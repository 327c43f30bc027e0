"""The writes that take no body (retry, cancel, DELETE of a queue) still refuse unknown fields.

docs/rest-api.md, Conventions: "A body with an unknown field is rejected (400,
naming the field)", and a request that fails has changed nothing. These three
verbs used to ignore their body, so ``{"force": true}`` on a cancel cancelled
the job as if the client had sent nothing.
"""

from __future__ import annotations

import pytest

from django_fq import services

from .conftest import url
from .test_endpoints import Q, claim, enqueue, err

pytestmark = pytest.mark.django_db


def _dead_job(api) -> str:
    job = enqueue(api)
    receipt = claim(api)[0]["receipt"]
    assert api.post(url("nack", Q), {"receipt": receipt, "permanent": True}).json()["state"] == "dead"
    return job


def test_retry_with_an_unknown_field_is_400_and_the_job_stays_dead(api):
    job = _dead_job(api)
    err(api.post(url("job-retry", Q, job), {"force": True}), 400, "invalid", "force")
    assert services.get(Q, job).state == "dead"
    # An empty object and no body at all are both fine.
    assert api.post(url("job-retry", Q, job), {}).json()["state"] == "ready"


def test_cancel_with_an_unknown_field_is_400_and_the_job_stays_ready(api):
    job = enqueue(api)
    err(api.post(url("job-cancel", Q, job), {"reason": "x"}), 400, "invalid", "reason")
    assert services.get(Q, job).state == "ready"
    assert api.post(url("job-cancel", Q, job)).json()["state"] == "cancelled"


def test_delete_queue_with_an_unknown_field_is_400_and_the_queue_stays(api):
    enqueue(api)
    err(api.delete(url("queue", Q), {"cascade": False}), 400, "invalid", "cascade")
    assert [q.name for q in services.queues()] == [Q]
    assert api.delete(url("queue", Q), {}).json() == {"queue": Q, "deleted": True}


@pytest.mark.parametrize("body", ["[]", "1", '"x"'])
def test_a_body_that_is_not_an_object_is_400_invalid_json(api, body):
    job = enqueue(api)
    r = api.post(url("job-cancel", Q, job), body, content_type="application/json")
    err(r, 400, "invalid_json")
    assert services.get(Q, job).state == "ready"
