"""What each REST capability may learn of a job it did not enqueue (docs/security.md, "What a producer may learn").

A producer that reuses somebody else's idempotency token or unique key gets
that job's id and ``created: false``, nothing more. ``wait`` with only the
produce permission answers the job's id, queue, state and result: never its
payload, error texts or workers, which need ``manage`` as the job's page does.
Every endpoint is called by users holding one permission each, and no answer
carries what that permission may not see.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from tests.api.conftest import Client, client_as, url
from tests.api.test_permissions import ENDPOINTS

pytestmark = pytest.mark.django_db

Q = "sec:disclosure"
PAYLOAD, RESULT, ERROR, WORKER = "PAYLOAD-SECRET-1", "RESULT-SECRET-2", "ERROR-SECRET-3", "WORKER-SECRET-4"
OUTCOME_KEYS = {"id", "queue", "state", "result"}


@pytest.fixture(autouse=True)
def api_urls_mounted(settings):
    settings.ROOT_URLCONF = "tests.api.urls"


def _finished_job() -> str:
    """A job that failed once (error text, worker) and then succeeded with a result: every secret stored."""
    job = fq.enqueue(Q, {"secret": PAYLOAD}, idempotency="owner-token").id
    [first] = fq.claim(Q, worker=WORKER)
    fq.nack(Q, first.receipt, error=ERROR, delay_ms=0)
    [second] = fq.claim(Q, worker=WORKER)
    fq.ack(Q, second.receipt, result={"secret": RESULT})
    assert fq.get(Q, job).state == "succeeded"
    return job


def _holds_none_of(response, *secrets: str) -> None:
    text = response.content.decode()
    for secret in secrets:
        assert secret not in text, (response.status_code, secret, text[:500])


def test_a_duplicate_enqueue_answers_the_id_and_nothing_else():
    job = _finished_job()
    active = fq.enqueue(Q, {"secret": PAYLOAD}, unique_key="owner-key").id
    stranger = client_as("produce")
    by_token = stranger.post(url("jobs", Q), {"payload": "mine", "idempotency": "owner-token"})
    assert by_token.status_code == 200 and by_token.json() == {"id": job, "created": False}
    by_key = stranger.post(url("jobs", Q), {"payload": "mine", "unique_key": "owner-key"})
    assert by_key.status_code == 200 and by_key.json() == {"id": active, "created": False}
    bulk = stranger.post(url("enqueue-bulk", Q), {"jobs": [{"payload": 1, "idempotency": "owner-token"}]})
    assert bulk.status_code == 200 and bulk.json() == [{"id": job, "created": False}]
    assert fq.get(Q, job).payload == {"secret": PAYLOAD}  # the stranger's payload replaced nothing


@pytest.mark.parametrize("method", ["get", "post"])
def test_wait_with_only_produce_answers_state_and_result(method):
    job = _finished_job()
    stranger = client_as("produce")
    path = url("job-wait", Q, job)
    r = stranger.get(path, {"timeout_ms": 0}) if method == "get" else stranger.post(path, {"timeout_ms": 0})
    assert r.status_code == 200
    assert r.json() == {"id": job, "queue": Q, "state": "succeeded", "result": {"secret": RESULT}}
    _holds_none_of(r, PAYLOAD, ERROR, WORKER)
    # The job's own page stays closed to the same user.
    assert stranger.get(url("job", Q, job)).status_code == 403


def test_wait_that_times_out_tells_a_producer_the_state_only():
    job = fq.enqueue(Q, {"secret": PAYLOAD}).id
    r = client_as("produce").post(url("job-wait", Q, job), {"timeout_ms": 0})
    assert r.status_code == 408 and r.json()["state"] == "ready"
    _holds_none_of(r, PAYLOAD)


def test_wait_gives_the_whole_job_to_a_user_who_may_manage():
    job = _finished_job()
    for client in (client_as("manage"), client_as("produce", "manage"), client_as(superuser=True)):
        body = client.post(url("job-wait", Q, job), {"timeout_ms": 0}).json()
        assert body["payload"] == {"secret": PAYLOAD} and body["errors"][0]["error"] == ERROR


def test_wait_asks_the_permission_class_about_the_queue(settings):
    """A class granting manage on the user's own queues only: on another queue wait is the outcome."""
    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.ManageOwnQueuesOnly"]
    client = client_as("produce", "manage")
    own = f"{client.handler._force_user.username}:q"
    jobs = {}
    for queue in (own, "other:q"):
        jobs[queue] = fq.enqueue(queue, {"secret": PAYLOAD}).id
        fq.cancel(queue, jobs[queue])
    mine = client.post(url("job-wait", own, jobs[own]), {"timeout_ms": 0})
    assert mine.status_code == 200 and mine.json()["payload"] == {"secret": PAYLOAD}
    theirs = client.post(url("job-wait", "other:q", jobs["other:q"]), {"timeout_ms": 0})
    assert theirs.status_code == 200 and set(theirs.json()) == OUTCOME_KEYS
    _holds_none_of(theirs, PAYLOAD)


def _call(client: Client, method: str, name: str, body, job: str):
    if name in ("queues", "schema", "workers"):
        args: list = []
    elif name.startswith("job") and name != "jobs":
        args = [Q, job]
    else:
        args = [Q]
    path = url(name, *args)
    if method == "get":
        return client.get(path, body or {})
    return getattr(client, method)(path, body)


@pytest.mark.parametrize("role", ["produce", "consume", "manage"])
@pytest.mark.parametrize("method, name, body, admits", ENDPOINTS, ids=[f"{m}-{n}" for m, n, _, _ in ENDPOINTS])
def test_no_endpoint_shows_a_one_permission_user_more_than_its_permission_allows(role, method, name, body, admits):
    """Every endpoint, called by a user holding one permission: only ``manage`` sees payloads, errors and workers."""
    job = _finished_job()
    if name == "enqueue-bulk" and body:
        body = {"jobs": [{"payload": 1, "idempotency": "owner-token"}]}
    elif name == "jobs" and method == "post":
        body = {"payload": 1, "idempotency": "owner-token"}
    r = _call(client_as(role), method, name, body, job)
    assert r.status_code < 500
    if role == "manage":
        return  # manage may read everything but receipts (tests/security/test_api_access.py)
    _holds_none_of(r, PAYLOAD, ERROR, WORKER)
    if not (role == "produce" and name == "job-wait"):
        _holds_none_of(r, RESULT)
    if role == "produce" and name == "job-wait":
        assert set(r.json()) == OUTCOME_KEYS
