"""Bad input on every interface: clear errors naming the field, no 500s, no state change (docs/reference/semantics.md §2, §8, §9)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from django_fq import services as fq
from django_fq.exceptions import FqError, InvalidQueueName, InvalidReceipt, InvalidTime
from django_fq.models import Job, Queue
from tests.test_cli import fq as cli

pytestmark = pytest.mark.django_db


@pytest.fixture
def rest(settings):
    """An API client holding every capability; server errors come back as 500 responses, not exceptions."""
    settings.ROOT_URLCONF = "tests.api.urls"
    user = User.objects.create_user("adv", "adv@example.com", "pw")
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_fq"))
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    client.raise_request_exception = False
    return client


# --- queue names -------------------------------------------------------------------------------

# Python's "$" also matches just before a final newline: validation.QUEUE_NAME
# (^[A-Za-z0-9:._-]{1,200}$ with .match) lets "name\n" through.
NEWLINE_NAMES = ["abc\n", "a" * 200 + "\n"]


@pytest.mark.parametrize("name", NEWLINE_NAMES, ids=["short", "200+newline"])
def test_queue_name_with_a_trailing_newline_is_rejected_by_the_python_api(name):
    """Today "abc\\n" creates a queue of that name (and 200 chars + newline is a DataError on PostgreSQL)."""
    with pytest.raises(InvalidQueueName) as err:
        fq.enqueue(name, {"n": 1})
    assert err.value.field == "queue"
    with pytest.raises(InvalidQueueName):
        fq.configure(name)
    assert not Queue.objects.exists() and not Job.objects.exists()


def test_queue_name_with_a_trailing_newline_is_400_over_rest_not_a_500_after_the_commit(rest):
    """POST /queues/abc%0A/jobs/: today the job is committed, then the Location header (with the newline) raises: 500."""
    response = rest.post("/api/fq/queues/abc%0A/jobs/", data=json.dumps({"payload": 1}), content_type="application/json")
    assert response.status_code == 400, response.status_code
    assert response.json()["code"] == "invalid_queue_name"
    assert not Job.objects.exists()


def test_queue_name_with_a_trailing_newline_is_refused_by_the_cli():
    run = cli("enqueue", "abc\n", "1", "--json")
    assert run.code == 1, (run.code, run.out)
    assert json.loads(run.err)["code"] == "invalid_queue_name"
    assert not Queue.objects.exists()


# --- instants before 1970 ------------------------------------------------------------------------


def test_at_before_1970_is_refused_whether_given_as_ms_or_as_a_datetime():
    """enqueue(at=-1) is refused ("at must not be before 1970"); the same instant as an aware datetime is stored.

    One instant, two spellings, two answers: validation.epoch_ms checks the int
    but not the datetime (nor REST's ISO strings), and a negative run_at is stored.
    """
    with pytest.raises(InvalidTime):
        fq.enqueue("adv.at", {}, at=-1)
    with pytest.raises(InvalidTime) as err:
        fq.enqueue("adv.at", {}, at=dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC))
    assert err.value.field == "at"
    assert not Job.objects.exists()


# --- receipts ----------------------------------------------------------------------------------


def test_the_same_ack_twice_in_one_ack_many_is_a_replay_not_an_invalid_receipt():
    """docs/reference/semantics.md §9: repeating the very same settle with the same receipt returns the recorded outcome as a replay.

    ack_many([(r, x), (r, x)]) answers the second with InvalidReceipt, while the
    same repeat in the next call is a replay: the answer depends on batching.
    """
    fq.enqueue("adv.ackmany", 1)
    [job] = fq.claim("adv.ackmany")
    first, second = fq.ack_many("adv.ackmany", [(job.receipt, {"r": 1}), (job.receipt, {"r": 1})])
    assert (first.state, first.replay) == ("succeeded", False)
    assert not isinstance(second, InvalidReceipt), second
    assert (second.state, second.replay) == ("succeeded", True)
    assert fq.stats("adv.ackmany").totals["acked"] == 1


# --- held: odd values for every REST field ------------------------------------------------------------

ODD_VALUES = [True, -1, 2**63, -(2**63) - 1, 10**40, 1.5, 1e308, "x", "", "\x00", "\ud800", "é" * 300, [], {}, [1], {"a": 1}]
FIELDS = {
    "jobs": ["payload", "priority", "delay_ms", "at", "idempotency", "idempotency_retention_ms", "unique_key", "max_attempts", "timeout_ms"],
    "claim": ["count", "visibility_ms", "wait_ms", "worker"],
    "ack": ["receipt", "result"],
    "nack": ["receipt", "delay_ms", "error", "permanent"],
    "release": ["receipt", "error"],
    "extend": ["receipt", "visibility_ms"],
    "queue": ["concurrency", "max_attempts", "backoff_ms", "max_backoff_ms", "visibility_ms",
              "idempotency_retention_ms", "timeout_ms", "queue"],
}  # fmt: skip
PATHS = {"jobs": "jobs/", "claim": "claim/", "ack": "ack/", "nack": "nack/", "release": "release/", "extend": "extend/", "queue": ""}


def test_odd_values_in_every_rest_field_never_give_a_500_and_errors_name_their_field(rest):
    """Each field of each write endpoint gets wrong types, huge numbers, NUL, lone surrogates, containers.

    Every answer is a 2xx or a 4xx with ``{code, message, field}``; a 400 names the
    field it was about; the lease under test is only ever ended by a 2xx settle.
    """
    q = "adv.rest"
    fq.configure(q)

    def fresh_lease():
        fq.enqueue(q, {"lease": True})
        return fq.claim(q, visibility_ms=600_000)[0].receipt

    receipt = fresh_lease()
    problems = []
    for endpoint, fields in FIELDS.items():
        for name in fields:
            for value in ODD_VALUES:
                body = {"payload": 1} if endpoint == "jobs" else {}
                if endpoint in ("ack", "nack", "release", "extend"):
                    body["receipt"] = receipt
                if endpoint == "extend":
                    body["visibility_ms"] = 1000
                body[name] = value
                raw = json.dumps(body)  # lone surrogates travel as \\ud800 escapes
                call = rest.patch if endpoint == "queue" else rest.post
                response = call(f"/api/fq/queues/{q}/{PATHS[endpoint]}", data=raw, content_type="application/json")
                status = response.status_code
                if status >= 500:
                    problems.append((endpoint, name, value, status))
                    continue
                if status >= 400:
                    err = response.json()
                    if set(err) < {"code", "message", "field"} or (
                        status == 400 and name != "queue" and err["field"] not in (name, None)
                    ):
                        problems.append((endpoint, name, value, err))
                elif endpoint in ("ack", "nack", "release"):
                    receipt = fresh_lease()  # that settle ended the lease
    assert problems == []
    assert fq.policy(q).max_attempts >= 1 and Queue.objects.filter(name__startswith="adv").count() == 1


def test_python_api_odd_arguments_raise_fq_errors_only():
    """The same kind of values through the Python API: FqError subclasses, never TypeError/DB errors."""
    q = "adv.py"
    fq.enqueue(q, 1)
    [job] = fq.claim(q, visibility_ms=600_000)
    calls = {
        "enqueue.priority": lambda v: fq.enqueue(q, 1, priority=v),
        "enqueue.delay_ms": lambda v: fq.enqueue(q, 1, delay_ms=v),
        "enqueue.at": lambda v: fq.enqueue(q, 1, at=v),
        "enqueue.idempotency": lambda v: fq.enqueue(q, 1, idempotency=v),
        "enqueue.unique_key": lambda v: fq.enqueue(q, 1, unique_key=v),
        "enqueue.payload": lambda v: fq.enqueue(q, v),
        "claim.count": lambda v: fq.claim(q, count=v),
        "claim.visibility_ms": lambda v: fq.claim(q, visibility_ms=v),
        "claim.worker": lambda v: fq.claim(q, worker=v),
        "ack.receipt": lambda v: fq.ack(q, v),
        "nack.error": lambda v: fq.nack(q, "fq1.bad", error=v),
        "extend.visibility_ms": lambda v: fq.extend(q, job.receipt, visibility_ms=v),
        "jobs.cursor": lambda v: fq.jobs(q, cursor=v),
        "jobs.count": lambda v: fq.jobs(q, count=v),
        "get.job_id": lambda v: fq.get(q, v),
        "cancel.job_id": lambda v: fq.cancel(q, v),
        "wait.timeout_ms": lambda v: fq.wait(q, "0" * 32, timeout_ms=v),
        "reap.limit": lambda v: fq.reap(q, limit=v),
        "prune.retention_ms": lambda v: fq.prune(retention_ms=v),
    }
    odd = [None, True, -1, 2**63, 10**40, 1.5, float("nan"), "x" * 10_000, "\x00", "\ud800", b"bytes", [], {}, object()]
    problems = []
    for name, call in calls.items():
        for value in odd:
            if value is None and name.startswith(("get.", "cancel.", "claim.", "jobs.")):
                continue  # None means "default" for some of these
            try:
                call(value)
            except FqError:
                pass
            except Exception as exc:
                problems.append((name, repr(value)[:30], repr(exc)[:120]))
    assert problems == []
    assert fq.get(q, job.id).state == "running"  # nothing above touched the live lease
