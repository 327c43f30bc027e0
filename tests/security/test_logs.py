"""Receipts never reach logs, error messages or error reports (docs/reference/semantics.md §5) — Python API, SQL debug log, CLI, REST.

Every logger is captured at DEBUG, with ``DEBUG = True`` so Django's
``django.db.backends`` logger writes each SQL statement with its parameters.
What those SQL lines may carry is the SHA-256 *hash* of a receipt's secret
(stored by the claim, copied by the settle): it cannot be turned back into
the secret, so it cannot settle anything. The secret and the receipt
themselves never appear.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest
from django.views.debug import ExceptionReporter
from rest_framework.test import APIClient

from django_fq import receipts
from django_fq import services as fq
from django_fq.exceptions import FqError, InvalidReceipt
from django_fq.services import leases
from tests.api.conftest import client_as, make_user, url
from tests.test_cli import fq as cli

from .helpers import capture_all_logs, leaked, secret_of

pytestmark = pytest.mark.django_db

Q = "sec:logs"


@pytest.fixture
def sql_logged(settings):
    """``DEBUG = True``: Django logs every SQL statement and its parameters on ``django.db.backends``."""
    settings.DEBUG = True
    return settings


def _bad_variants(receipt: str) -> list:
    secret = secret_of(receipt)
    head = receipt[: -len(secret)]
    return [
        head + secret[:-1] + ("A" if secret[-1] != "A" else "B"),  # one character wrong
        receipt + "x",  # malformed: too long
        receipt[:-5],  # malformed: truncated
        secret,  # the secret alone
        "fq1." + "0" * 32 + ".1." + secret,  # the secret on another job id
        receipt.replace("fq1.", "fq2.", 1),
    ]


def _every_verb_and_error(receipts_seen: list[str]) -> None:
    """Claim, settle and fail in every way the Python API allows, recording each receipt."""
    fq.configure(Q, backoff_ms=0, max_attempts=2)
    for i in range(6):
        fq.enqueue(Q, {"n": i})
    jobs = fq.claim(Q, count=6, visibility_ms=60_000)
    receipts_seen += [j.receipt for j in jobs]
    acked, nacked, released, extended, cancelled, expired = jobs
    fq.ack(Q, acked.receipt, result={"r": 1})
    fq.ack(Q, acked.receipt, result={"r": 1})  # a replay
    fq.nack(Q, nacked.receipt, error="boom")
    fq.release(Q, released.receipt, error="bye")
    fq.extend(Q, extended.receipt, visibility_ms=30_000)
    fq.cancel(Q, cancelled.id)
    fq.extend(Q, expired.receipt, visibility_ms=1)
    fq.ack_many(Q, [(extended.receipt, None), ("garbage", None)])
    errors: list[FqError] = []
    for receipt in (
        acked.receipt,
        nacked.receipt,
        released.receipt,
        cancelled.receipt,
        *_bad_variants(extended.receipt),
    ):
        for call in (
            lambda r: fq.ack(Q, r, result={"other": True}),
            lambda r: fq.nack(Q, r),
            lambda r: fq.release(Q, r),
            lambda r: fq.extend(Q, r, visibility_ms=10),
        ):
            with pytest.raises(InvalidReceipt) as caught:
                call(receipt)
            errors.append(caught.value)
    # Every error message and JSON form is free of receipts too.
    text = "\n".join(f"{e!s} {e!r} {json.dumps(e.as_dict())}" for e in errors)
    assert not leaked(text, receipts_seen)


def test_python_api_logs_and_errors_never_hold_a_receipt(sql_logged):
    seen: list[str] = []
    with capture_all_logs() as records:
        _every_verb_and_error(seen)
    text = records.text()
    assert "django_fq_lease" in text, "the SQL debug log was not captured"
    assert len(seen) == 6
    assert not leaked(text, seen)


def test_the_sql_log_carries_at_most_the_hash_of_a_secret(sql_logged):
    """What the claim sends to the database is the digest; the settle sends the job id, not the receipt."""
    fq.enqueue(Q, 1)
    with capture_all_logs() as records:
        [job] = fq.claim(Q)
        fq.ack(Q, job.receipt)
    text = records.text()
    assert not leaked(text, [job.receipt])
    assert job.id in text  # the settle looks the lease up by job id


def test_cli_output_and_logs_never_hold_a_receipt(sql_logged):
    fq.configure(Q, backoff_ms=0)
    for i in range(3):
        fq.enqueue(Q, i)
    with capture_all_logs() as records:
        claim = cli("claim", Q, "--count", "3", "--json")
        assert claim.code == 0, claim.err
        jobs = claim.json
        receipts = [j["receipt"] for j in jobs]
        runs = [
            cli("ack", Q, receipts[0], "--result", '{"x": 1}'),
            cli("ack", Q, receipts[0], "--result", '{"x": 1}', "--json"),  # replay
            cli("nack", Q, receipts[1], "--error", "e"),
            cli("extend", Q, receipts[2], "--visibility", "5000", "--json"),
            cli("release", Q, receipts[2]),
        ]
        # A bare secret may start with "-", which argparse would take for an option (a usage
        # error that echoes it); a whole receipt starts with "fq1." and never does.
        variants = [v for v in _bad_variants(receipts[2]) if not v.startswith("-")]
        for bad in (receipts[0], receipts[1], *variants):
            for argv in (("ack",), ("nack",), ("release",), ("extend", "--visibility", "10")):
                for fmt in ((), ("--json",)):
                    run = cli(argv[0], Q, bad, *argv[1:], *fmt)
                    assert run.code == 1
                    runs.append(run)
        runs += [cli("get", Q, jobs[0]["id"], "--json"), cli("jobs", Q, "--json"), cli("stats", Q)]
    output = "\n".join(r.out + r.err for r in runs)
    assert "invalid_receipt" in output
    assert not leaked(output, receipts)
    assert not leaked(records.text(), receipts)


def test_rest_api_responses_and_request_logs_never_hold_a_receipt(sql_logged):
    """4xx responses are logged by ``django.request``: with the path only, and no receipt travels in a path."""
    sql_logged.ROOT_URLCONF = "tests.api.urls"
    fq.configure(Q, backoff_ms=0)
    for i in range(3):
        fq.enqueue(Q, i)
    api = client_as("consume", "manage")
    with capture_all_logs() as records:
        claimed = api.post(url("claim", Q), {"count": 3}).json()
        receipts = [j["receipt"] for j in claimed]
        bodies = [
            api.post(url("ack", Q), {"receipt": receipts[0], "result": 1}),
            api.post(url("ack", Q), {"receipt": receipts[0], "result": 1}),
            api.post(url("nack", Q), {"receipt": receipts[1], "error": "e"}),
            api.post(url("extend", Q), {"receipt": receipts[2], "visibility_ms": 5000}),
        ]
        for bad in (receipts[0], receipts[1], *_bad_variants(receipts[2])):
            for verb, extra in (("ack", {}), ("nack", {}), ("release", {}), ("extend", {"visibility_ms": 10})):
                r = api.post(url(verb, Q), {"receipt": bad, **extra})
                assert r.status_code == 409, (verb, r.status_code, r.content)
                bodies.append(r)
        bodies.append(api.post(url("ack", "sec:nosuch"), {"receipt": receipts[2]}))  # 404
        bodies.append(api.post(url("ack", Q), {"receipt": receipts[2], "bogus": 1}))  # 400
        for job in claimed:
            bodies += [
                api.get(url("job", Q, job["id"])),
                api.get(url("jobs", Q)),
                api.get(url("jobs", Q), {"state": "running"}),
            ]
        bodies.append(api.get(url("queues")))
    text = "\n".join(r.content.decode() for r in bodies)
    assert "invalid_receipt" in text
    assert not leaked(text, receipts)
    logged = records.text()
    assert "Conflict: /api/fq/queues/" in logged, "the 4xx request log was not captured"
    assert not leaked(logged, receipts)


# --- error reports of a 500 -------------------------------------------------------------------------


def _unchecked_client(*capabilities: str) -> APIClient:
    """A client that gets 500 responses back (not the exception) and skips the schema check of 500s."""
    client = APIClient()
    client.force_authenticate(make_user(*capabilities))
    client.raise_request_exception = False
    return client


@pytest.mark.parametrize("verb", ["claim", "ack", "nack", "release", "extend"])
def test_a_500_error_report_hides_the_receipts_of_lease_endpoints(settings, monkeypatch, verb):
    """Django's error report (the mail to ADMINS with ``include_html``, the debug page) lists each frame's locals.

    The lease views are marked ``sensitive_variables``, so with ``DEBUG = False``
    every frame under them (the view's request body, the services' ``receipt``
    arguments, the secrets a claim has just drawn) is shown as stars.
    """
    settings.ROOT_URLCONF = "tests.api.urls"
    settings.DEBUG = False
    drawn: list[str] = []
    real_token = receipts.secrets.token_urlsafe
    real_bytes = receipts.secrets.token_bytes

    def spy(nbytes=None):
        drawn.append(real_token(nbytes))
        return drawn[-1]

    def spy_bytes(nbytes=None):  # a batch of secrets drawn at once: 32 bytes each
        value = real_bytes(nbytes)
        drawn.extend(base64.urlsafe_b64encode(value[i : i + 32]).rstrip(b"=").decode() for i in range(0, nbytes, 32))
        return value

    monkeypatch.setattr(receipts.secrets, "token_urlsafe", spy)
    monkeypatch.setattr(receipts.secrets, "token_bytes", spy_bytes)
    fq.configure(Q, backoff_ms=0)
    fq.enqueue(Q, 1)
    body = {}
    if verb != "claim":
        [job] = fq.claim(Q)
        body = {"receipt": job.receipt, **({"visibility_ms": 10} if verb == "extend" else {})}

    def fail(*args, **kwargs):
        raise RuntimeError("the database broke")

    # Fail deep inside the service, where its frames hold the receipt (or the new secrets).
    targets = {"claim": ["_new_claimed", "ClaimedJob"], "ack": ["_locked_leases", "_ack_matching_pg"]}.get(verb, ["_locked_lease"])
    for target in targets:
        if hasattr(leases, target):
            monkeypatch.setattr(leases, target, fail)
    api = _unchecked_client("consume")
    with capture_all_logs() as records:
        response = api.post(url(verb, Q), body, format="json")
    assert response.status_code == 500
    [record] = [r for r in records.records if r.name == "django.request" and r.exc_info]
    report = ExceptionReporter(record.request, *record.exc_info, is_email=True)
    html, text = report.get_traceback_html(), report.get_traceback_text()
    assert "the database broke" in text and "Local Vars" in html  # the full report, frames and all
    assert drawn
    found = [s for s in drawn if s in html or s in text]
    assert not found, f"{len(found)} receipt secret(s) in the error report"
    assert "fq1." not in html


def test_sensitive_variables_do_not_hide_errors_of_other_endpoints(settings, monkeypatch):
    """Only the lease endpoints are marked: a 500 elsewhere keeps its local variables for debugging."""
    settings.ROOT_URLCONF = "tests.api.urls"
    monkeypatch.setattr(fq, "stats", lambda queue: (_ for _ in ()).throw(RuntimeError("stats broke")))
    api = _unchecked_client("manage")
    fq.configure(Q)
    with capture_all_logs() as records:
        assert api.get(url("stats", Q)).status_code == 500
    [record] = [r for r in records.records if r.name == "django.request" and r.exc_info]
    html = ExceptionReporter(record.request, *record.exc_info, is_email=True).get_traceback_html()
    assert "&#x27;sec:logs&#x27;" in html  # the queue argument is visible


def test_capture_helper_sees_records_of_every_level():
    """The capture catches what it must (so the tests above are not vacuous)."""
    import django_fq.worker  # noqa: F401 - installs the worker logger's receipt mask

    with capture_all_logs() as records:
        logging.getLogger("django_fq.worker").debug("fq1.deadbeef probe")
        logging.getLogger("some.app").info("probe two")
        try:
            raise ValueError("probe three")
        except ValueError:
            logging.getLogger("django.request").exception("boom")
    text = records.text()
    assert "probe two" in text and "probe three" in text and "fq1.[masked]" in text
