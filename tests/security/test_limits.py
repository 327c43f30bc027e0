"""Size and range limits hold on every path, before anything large is parsed or stored.

* ``FQ_MAX_PAYLOAD_BYTES`` caps payloads and results through the Python
  API, the object API, ``manage.py fq``, the REST API and the Tasks backend:
  a value of exactly the limit is stored, one byte more is refused with
  ``payload_too_large`` and nothing is written.
* The REST API judges a body by its declared ``Content-Length`` before
  reading it (413), reads at most the limit plus one byte otherwise, and
  turns hostile JSON (nesting, giant numbers) into 400, never a 500.
* Every count, wait and duration a caller can ask for is bounded by the
  documented limit, on every interface.
"""

from __future__ import annotations

import io
import json

import pytest
from django.test import override_settings

from django_fq import Queue as QueueObject
from django_fq import services as fq
from django_fq.exceptions import CountOutOfRange, FqError, InvalidArgument, PayloadTooLarge
from django_fq.models import Job
from tests.api.conftest import client_as, url
from tests.test_cli import fq as cli

pytestmark = pytest.mark.django_db

Q = "sec:limits"
LIMIT = 1000


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = LIMIT
    settings.FQ_API_CREATE_QUEUES = "produce"  # these producers enqueue into a queue they create
    settings.ROOT_URLCONF = "tests.api.urls"


def _text(size: int) -> str:
    """A JSON string value whose compact encoding is exactly ``size`` bytes (two of them quotes)."""
    return "x" * (size - 2)


# --- FQ_MAX_PAYLOAD_BYTES on every path ------------------------------------------------------------------


def _python(payload):
    return fq.enqueue(Q, payload).id


def _python_many(payload):
    return fq.enqueue_many(Q, [{"payload": 1}, {"payload": payload}])[1].id


def _object_api(payload):
    return QueueObject(Q).enqueue(payload)


def _cli(payload):
    run = cli("enqueue", Q, json.dumps(payload), "--json")
    if run.code:
        raise (
            PayloadTooLarge(json.loads(run.err)["message"])
            if json.loads(run.err)["code"] == "payload_too_large"
            else AssertionError(run.err)
        )
    return run.json["id"]


def _cli_many(payload):
    run = cli("enqueue-many", Q, "-", "--json", stdin=json.dumps([{"payload": 1}, {"payload": payload}]))
    if run.code:
        err = json.loads(run.err)
        assert err["field"] == "items[1].payload"
        raise PayloadTooLarge(err["message"]) if err["code"] == "payload_too_large" else AssertionError(run.err)
    return run.json[1]["id"]


def _rest(payload):
    r = client_as("produce").post(url("jobs", Q), {"payload": payload})
    if r.status_code == 413:
        assert r.json()["code"] == "payload_too_large" and r.json()["field"] == "payload"
        raise PayloadTooLarge(r.json()["message"])
    assert r.status_code == 201, r.content
    return r.json()["id"]


def _rest_bulk(payload):
    r = client_as("produce").post(url("enqueue-bulk", Q), {"jobs": [{"payload": 1}, {"payload": payload}]})
    if r.status_code == 413:
        assert r.json()["field"] == "jobs[1].payload"
        raise PayloadTooLarge(r.json()["message"])
    assert r.status_code == 201, r.content
    return r.json()[1]["id"]


class _Probe(Exception):
    """Carries the size measured inside a rolled-back savepoint."""


def _tasks(payload):
    """Enqueue ``sample_tasks.echo(s, 0)`` with ``s`` sized so the job's payload is as big as ``payload``'s."""
    from django.db import transaction

    from django_fq.tasks import FqBackend

    from . import sample_tasks

    backend = FqBackend("sec", {"QUEUES": ["default"], "OPTIONS": {"queue_prefix": "sec:"}})
    try:
        with transaction.atomic():
            probe = backend.enqueue(sample_tasks.echo, ["", 0], {})
            raise _Probe(Job.objects.get(uid=probe.id).payload_size)
    except _Probe as measured:
        base = measured.args[0]  # the task envelope around an empty string argument
    wanted = len(json.dumps(payload))
    return backend.enqueue(sample_tasks.echo, ["x" * (wanted - base), 0], {}).id


PATHS = {
    "python": _python,
    "python enqueue_many": _python_many,
    "object api": _object_api,
    "cli": _cli,
    "cli enqueue-many": _cli_many,
    "rest": _rest,
    "rest bulk": _rest_bulk,
    "tasks backend": _tasks,
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_payload_limit_holds_on_every_path(path):
    enqueue = PATHS[path]
    job_id = enqueue(_text(LIMIT))
    assert Job.objects.get(uid=job_id).payload_size == LIMIT  # exactly the limit is stored
    before = Job.objects.count()
    with pytest.raises(PayloadTooLarge):
        enqueue(_text(LIMIT + 1))
    assert Job.objects.count() == before  # nothing written, not even the valid first item of a batch


@pytest.mark.parametrize("path", ["python", "cli", "rest"])
def test_result_limit_holds_on_every_path(path):
    fq.enqueue(Q, 1)
    [job] = fq.claim(Q)
    too_big = _text(LIMIT + 1)
    if path == "python":
        with pytest.raises(PayloadTooLarge):
            fq.ack(Q, job.receipt, result=too_big)
    elif path == "cli":
        run = cli("ack", Q, job.receipt, "--result", json.dumps(too_big), "--json")
        assert run.code == 1 and json.loads(run.err)["code"] == "payload_too_large"
    else:
        r = client_as("consume").post(url("ack", Q), {"receipt": job.receipt, "result": too_big})
        assert r.status_code == 413 and r.json()["field"] == "result"
    assert fq.get(Q, job.id).state == "running"
    assert fq.ack(Q, job.receipt, result=_text(LIMIT)).state == "succeeded"


def test_the_payload_limit_cannot_be_raised_past_the_hard_cap(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 10**12
    from django_fq import conf

    assert conf.max_payload_bytes() == 32 * 1024 * 1024


# --- REST bodies --------------------------------------------------------------------------------------------------


def test_body_limit_boundary_and_a_clear_413(settings):
    settings.FQ_API_MAX_BODY_BYTES = 2000
    api = client_as("produce")
    body = json.dumps({"payload": "x"}).encode()
    exact = body[:-1] + b" " * (2000 - len(body)) + b"}"
    assert len(exact) == 2000
    assert api.generic("POST", url("jobs", Q), exact, content_type="application/json").status_code == 201
    over = exact[:-1] + b" }"
    r = api.generic("POST", url("jobs", Q), over, content_type="application/json")
    assert r.status_code == 413
    err = r.json()
    assert err["code"] == "payload_too_large" and err["limit"] == 2000 and err["size"] == 2001
    assert "2001" in err["message"] and "2000" in err["message"]
    assert fq.stats(Q).totals["enqueued"] == 1


def test_a_body_longer_than_its_content_length_is_read_only_to_the_declared_length():
    """The WSGI input is read no further than Content-Length: the rest of a lying body is never parsed."""
    api = client_as("produce")
    head = json.dumps({"payload": 1}).encode()
    lying = head + b" " * (50 * 1024 * 1024)  # 50 MiB the server must not read
    r = api.generic("POST", url("jobs", Q), lying, content_type="application/json", CONTENT_LENGTH=str(len(head)))
    assert r.status_code == 201
    assert fq.get(Q, r.json()["id"]).payload == 1


class _Endless(io.RawIOBase):
    """A request stream that never ends, counting what is read from it."""

    def __init__(self):
        self.read_bytes = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        n = len(buffer)
        buffer[:n] = b" " * n
        self.read_bytes += n
        return n


def test_the_parser_reads_at_most_the_limit_plus_one_byte(settings):
    """Even where the declared length says nothing useful, the parser stops one byte past the limit."""
    from django_fq.api.parsers import FqJSONParser

    settings.FQ_API_MAX_BODY_BYTES = 4096
    stream = _Endless()
    with pytest.raises(PayloadTooLarge):
        FqJSONParser().parse(io.BufferedReader(stream, buffer_size=1), parser_context={})
    assert stream.read_bytes == 4097


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 20_000 + b"]" * 20_000,  # nesting deeper than Python's recursion limit
        b'{"payload": ' + b"9" * 5000 + b"}",  # an integer Python refuses to parse (int max str digits)
        b'{"payload": 1e400}',  # a float that overflows to infinity
        b'{"payload": NaN}',
        b'{"payload": "\\ud800"}',  # a lone surrogate
        b'{"payload": "a\\u0000b"}',  # a NUL character
        b"\xff\xfe{}",  # not UTF-8
    ],
    ids=["deep", "huge-int", "overflow", "nan", "surrogate", "nul", "not-utf8"],
)
def test_hostile_json_is_a_400_never_a_500(raw):
    api = client_as("produce")
    api.raise_request_exception = False
    r = api.generic("POST", url("jobs", Q), raw, content_type="application/json")
    assert r.status_code == 400, (r.status_code, r.content[:200])
    assert r.json()["code"] == "invalid_json"
    assert fq.queues() == []


# --- bounded requests -------------------------------------------------------------------------------------------------


#: (what, Python call, CLI argv, REST (method, name, body or query), error code, field)
BOUNDS = [
    ("claim count", lambda: fq.claim(Q, count=1001), ("claim", Q, "--count", "1001"), ("post", "claim", {"count": 1001}), "count_out_of_range", "count"),
    ("claim count huge", lambda: fq.claim(Q, count=10**30), ("claim", Q, "--count", str(10**30)), ("post", "claim", {"count": 10**30}), "count_out_of_range", "count"),
    ("claim count zero", lambda: fq.claim(Q, count=0), ("claim", Q, "--count", "0"), ("post", "claim", {"count": 0}), "count_out_of_range", "count"),
    ("claim wait", lambda: fq.claim(Q, wait_ms=20_001), ("claim", Q, "--wait", "20001"), ("post", "claim", {"wait_ms": 20_001}), "invalid", "wait_ms"),
    ("claim wait huge", lambda: fq.claim(Q, wait_ms=10**15), ("claim", Q, "--wait", str(10**15)), ("post", "claim", {"wait_ms": 10**15}), "invalid", "wait_ms"),
    ("claim visibility", lambda: fq.claim(Q, visibility_ms=86_400_001), ("claim", Q, "--visibility", "86400001"), ("post", "claim", {"visibility_ms": 86_400_001}), "visibility_out_of_range", "visibility_ms"),
    ("jobs page", lambda: fq.jobs(Q, count=1001), ("jobs", Q, "--count", "1001"), ("get", "jobs", {"count": 1001}), "count_out_of_range", "count"),
    ("jobs cursor", lambda: fq.jobs(Q, cursor="A" * 10_000), ("jobs", Q, "--cursor", "A" * 10_000), ("get", "jobs", {"cursor": "A" * 10_000}), "invalid_cursor", "cursor"),
    ("worker id", lambda: fq.claim(Q, worker="w" * 201), ("claim", Q, "--worker", "w" * 201), ("post", "claim", {"worker": "w" * 201}), "invalid", "worker"),
    ("idempotency token", lambda: fq.enqueue(Q, 1, idempotency="t" * 256), ("enqueue", Q, "1", "--idempotency", "t" * 256), ("post", "jobs", {"payload": 1, "idempotency": "t" * 256}), "invalid", "idempotency"),
    ("delay", lambda: fq.enqueue(Q, 1, delay_ms=10**18), ("enqueue", Q, "1", "--delay", str(10**18)), ("post", "jobs", {"payload": 1, "delay_ms": 10**18}), "invalid_delay", "delay_ms"),
    ("priority", lambda: fq.enqueue(Q, 1, priority=2**31), ("enqueue", Q, "1", "--priority", str(2**31)), ("post", "jobs", {"payload": 1, "priority": 2**31}), "invalid", "priority"),
]  # fmt: skip


@pytest.mark.parametrize("what, call, argv, rest, code, field", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_every_interface_bounds_what_a_caller_may_ask_for(what, call, argv, rest, code, field):
    fq.configure(Q)
    fq.enqueue(Q, {"n": 1})
    before = fq.stats(Q)
    with pytest.raises(FqError) as caught:
        call()
    assert (caught.value.code, caught.value.field) == (code, field)
    run = cli(*argv, "--json")
    assert run.code == 1, run.out
    assert (json.loads(run.err)["code"], json.loads(run.err)["field"]) == (code, field)
    method, name, data = rest
    api = client_as("produce", "consume", "manage")
    r = api.get(url(name, Q), data) if method == "get" else api.post(url(name, Q), data)
    assert r.status_code == 400, (r.status_code, r.content)
    assert (r.json()["code"], r.json()["field"]) == (code, field)
    after = fq.stats(Q)
    assert (after.counts, after.totals) == (before.counts, before.totals)


def test_rest_bounds_of_bulk_enqueue_and_wait(settings):
    api = client_as("produce", "manage")
    r = api.post(url("enqueue-bulk", Q), {"jobs": [{"payload": i} for i in range(1001)]})
    assert r.status_code == 400 and (r.json()["code"], r.json()["field"]) == ("count_out_of_range", "jobs")
    job = fq.enqueue(Q, 1).id
    r = api.post(url("job-wait", Q, job), {"timeout_ms": 20_001})
    assert r.status_code == 400 and r.json()["field"] == "timeout_ms"
    assert fq.stats(Q).totals["enqueued"] == 1


def test_error_text_is_cut_to_64_kib_on_every_settle():
    fq.enqueue(Q, 1)
    [job] = fq.claim(Q)
    fq.nack(Q, job.receipt, error="e" * (1024 * 1024), delay_ms=0)
    stored = fq.get(Q, job.id)
    assert len(stored.last_error.encode()) <= 64 * 1024
    assert len(stored.errors[-1]["error"].encode()) <= 64 * 1024


def test_python_errors_are_fq_errors_with_the_field(settings):
    """The same bound errors as classes: callers can catch ``FqError`` and read ``field``."""
    with pytest.raises(CountOutOfRange):
        fq.claim(Q, count=1001)
    with pytest.raises(InvalidArgument):
        fq.claim(Q, wait_ms=-1)
    with override_settings(FQ_MAX_PAYLOAD_BYTES=10), pytest.raises(PayloadTooLarge) as caught:
        fq.enqueue(Q, "x" * 20)
    assert caught.value.field == "payload" and caught.value.as_dict()["limit"] == 10
