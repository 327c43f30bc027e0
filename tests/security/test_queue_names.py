"""Queue names are checked on every interface before anything is read or written (docs/reference/semantics.md §2).

A name is 1-200 characters of ASCII ``[A-Za-z0-9:._-]``. Everything else —
empty, too long, NUL, newlines, Unicode look-alikes and digits, path-ish
names, SQL and format-string fragments — is refused with the error
``invalid_queue_name`` (field ``queue``) by every verb of the Python API,
``manage.py fq``, ``manage.py fq_worker`` and the REST API, and no queue is
created.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from django_fq import services as fq
from django_fq.exceptions import InvalidQueueName
from django_fq.models import Job, Queue
from tests.api.conftest import client_as, make_user
from tests.test_cli import fq as cli

pytestmark = pytest.mark.django_db

BAD = {
    "empty": "",
    "201 chars": "a" * 201,
    "huge": "a" * 100_000,
    "nul": "a\x00b",
    "trailing newline": "abc\n",
    "leading newline": "\nabc",
    "space": "a b",
    "tab": "a\tb",
    "accent": "naïve",
    "fullwidth": "ｑｕｅｕｅ",
    "arabic digits": "q١٢٣",
    "zero width": "a\u200bb",
    "kelvin": "\u212a",
    "slash": "a/b",
    "dotdot": "../etc",
    "backslash": "a\\b",
    "sql": "q';DROP TABLE django_fq_job;--",
    "percent": "q%s",
    "pyformat": "%(q)s",
    "braces": "{now}",
    "quote": 'q"x',
    "emoji": "q🙂",
    "surrogate": "q\ud800",
}
GOOD = ["a", "a" * 200, "docs:native", "A.b_c-d:9", "-", "..", "::"]

#: Every verb of the Python API that takes a queue name, with harmless other arguments.
VERBS = {
    "configure": lambda q: fq.configure(q),
    "policy": lambda q: fq.policy(q),
    "delete_queue": lambda q: fq.delete_queue(q),
    "enqueue": lambda q: fq.enqueue(q, 1),
    "enqueue_many": lambda q: fq.enqueue_many(q, [{"payload": 1}]),
    "claim": lambda q: fq.claim(q),
    "ack": lambda q: fq.ack(q, "fq1.x"),
    "ack_many": lambda q: fq.ack_many(q, [("fq1.x", None)]),
    "nack": lambda q: fq.nack(q, "fq1.x"),
    "release": lambda q: fq.release(q, "fq1.x"),
    "extend": lambda q: fq.extend(q, "fq1.x", visibility_ms=10),
    "get": lambda q: fq.get(q, "0" * 32),
    "jobs": lambda q: fq.jobs(q),
    "stats": lambda q: fq.stats(q),
    "retry": lambda q: fq.retry(q, "0" * 32),
    "cancel": lambda q: fq.cancel(q, "0" * 32),
    "requeue": lambda q: fq.requeue(q, "0" * 32),
    "wait": lambda q: fq.wait(q, "0" * 32, timeout_ms=0),
    "reap": lambda q: fq.reap(q),
}


def _nothing_created():
    assert not Queue.objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize("name", list(BAD.values()), ids=list(BAD))
def test_python_api_refuses_bad_names_in_every_verb(name):
    for verb, call in VERBS.items():
        with pytest.raises(InvalidQueueName) as caught:
            call(name)
        assert caught.value.field == "queue", verb
        assert caught.value.code == "invalid_queue_name"
    _nothing_created()


@pytest.mark.parametrize("name", GOOD)
def test_every_allowed_character_and_both_length_bounds_are_accepted(name):
    job = fq.enqueue(name, {"ok": True}).id
    assert fq.get(name, job).queue == name


CLI_VERBS = [
    ("config", "--max-attempts", "3"),
    ("enqueue", "1"),
    ("enqueue-many", "-"),
    ("claim",),
    ("ack", "fq1.x"),
    ("extend", "fq1.x", "--visibility", "10"),
    ("get", "0" * 32),
    ("jobs",),
    ("stats",),
    ("delete",),
    ("reap",),
]


@pytest.mark.parametrize(
    "name", [v for k, v in BAD.items() if k not in ("empty",)], ids=[k for k in BAD if k != "empty"]
)
def test_cli_refuses_bad_names(name):
    for op, *rest in CLI_VERBS:
        run = cli(op, name, *rest, "--json", stdin='[{"payload": 1}]')
        assert run.code == 1, (op, run.code, run.err[:200])
        err = json.loads(run.err)
        assert (err["code"], err["field"]) == ("invalid_queue_name", "queue"), op
    _nothing_created()


def test_cli_refuses_an_empty_name():
    run = cli("enqueue", "", "1", "--json")
    assert run.code == 1 and json.loads(run.err)["code"] == "invalid_queue_name"
    _nothing_created()


@pytest.mark.parametrize("name", ["a b", "naïve", "a" * 201, "q';DROP TABLE x;--"])
def test_fq_worker_refuses_bad_names_before_starting(name):
    with pytest.raises(CommandError, match="invalid queue name"):
        call_command("fq_worker", "--queue", name, "--burst")


REST_CALLS = [
    ("put", "/api/fq/queues/{q}/", {"max_attempts": 3}),
    ("get", "/api/fq/queues/{q}/", None),
    ("post", "/api/fq/queues/{q}/jobs/", {"payload": 1}),
    ("post", "/api/fq/queues/{q}/jobs/bulk/", {"jobs": [{"payload": 1}]}),
    ("get", "/api/fq/queues/{q}/jobs/", None),
    ("post", "/api/fq/queues/{q}/claim/", {}),
    ("post", "/api/fq/queues/{q}/ack/", {"receipt": "fq1.x"}),
    ("get", "/api/fq/queues/{q}/stats/", None),
    ("delete", "/api/fq/queues/{q}/", None),
]


@pytest.mark.parametrize(
    "name",
    [v for v in BAD.values() if v not in ("", "a" * 100_000)],
    ids=[k for k, v in BAD.items() if v not in ("", "a" * 100_000)],
)
def test_rest_api_refuses_bad_names(settings, name):
    settings.ROOT_URLCONF = "tests.api.urls"
    api = APIClient()  # not the schema-checking client: a path with a slash matches no documented route
    api.force_authenticate(make_user("produce", "consume", "manage"))
    api.raise_request_exception = False
    encoded = quote(name.encode("utf-8", "surrogatepass"), safe="")
    for method, path, body in REST_CALLS:
        # Every write declares JSON, a body-less one too (docs/security.md, "Cross-site requests cannot write").
        typed = {"content_type": "application/json"} if body is None else {"format": "json"}
        r = getattr(api, method)(path.format(q=encoded), body, **typed)
        if "/" in name:
            # A slash splits the path: no route matches, Django answers 404 before any view runs.
            assert r.status_code in (400, 404), (method, path, r.status_code)
        else:
            assert r.status_code == 400, (method, path, r.status_code, r.content[:200])
            assert (r.json()["code"], r.json()["field"]) == ("invalid_queue_name", "queue")
    _nothing_created()


def test_rest_api_refuses_a_very_long_name(settings):
    settings.ROOT_URLCONF = "tests.api.urls"
    api = client_as("produce")
    r = api.post(f"/api/fq/queues/{'a' * 100_000}/jobs/", {"payload": 1})
    assert r.status_code == 400 and r.json()["code"] == "invalid_queue_name"
    _nothing_created()
