"""``manage.py fq progress`` and the progress fields of ``fq get`` / ``fq jobs`` (docs/how-to/progress.md)."""

from __future__ import annotations

import pytest

from django_fq import services

from .test_cli import claim_one, fails, fq, ok

pytestmark = pytest.mark.django_db

Q = "cli:test"


def test_progress_is_stored_and_shown_by_get_and_jobs():
    job_id = ok("enqueue", Q, "1")["id"]
    job = claim_one(Q)
    info = ok("get", Q, job_id)
    assert (info["progress"], info["progress_message"], info["progress_at"]) == (None, "", None)
    assert ok("progress", Q, job["receipt"], "42.5", "--message", "rows 425 of 1000") == {
        "progress": 42.5,
        "message": "rows 425 of 1000",
    }
    info = ok("get", Q, job_id)
    assert (info["progress"], info["progress_message"]) == (42.5, "rows 425 of 1000")
    assert info["progress_at"] == services.get(Q, job_id).progress_at
    listed = ok("jobs", Q, "--state", "running")["jobs"][0]
    assert (listed["progress"], listed["progress_message"]) == (42.5, "rows 425 of 1000")
    human = fq("get", Q, job_id)
    assert human.code == 0 and "42.5% rows 425 of 1000 (at " in human.out
    run = fq("progress", Q, job["receipt"], "100")
    assert run.code == 0 and run.out.strip() == "progress 100% stored"
    assert ok("get", Q, job_id)["progress_message"] == ""


@pytest.mark.parametrize(
    "argv, field",
    [
        (("-1",), "progress"),
        (("100.5",), "progress"),
        (("nan",), "progress"),
        (("inf",), "progress"),
        (("1e400",), "progress"),
        (("half",), "progress"),
        (("５",), "progress"),  # a digit of another script is not a number here
        (("5", "--message", "x" * 201), "message"),
    ],
)
def test_bad_progress_names_the_field_and_changes_nothing(argv, field):
    job_id = ok("enqueue", Q, "1")["id"]
    job = claim_one(Q)
    ok("progress", Q, job["receipt"], "7", "--message", "kept")
    before = services.get(Q, job_id)
    err = fails("progress", Q, job["receipt"], *argv, code="invalid", field=field)
    assert job["receipt"] not in str(err)
    assert services.get(Q, job_id) == before
    human = fq("progress", Q, job["receipt"], *argv)
    assert human.code == 1 and ("PERCENT" in human.err or "--message" in human.err) and "Traceback" not in human.err


def test_progress_with_a_bad_receipt_or_queue():
    ok("enqueue", Q, "1")
    job = claim_one(Q)
    fails("progress", Q, "nope", "5", code="invalid_receipt", field="receipt")
    fails("progress", "cli:none", job["receipt"], "5", code="queue_not_found", field="queue")
    ok("ack", Q, job["receipt"])
    fails("progress", Q, job["receipt"], "5", code="invalid_receipt", field="receipt")
    assert fq("progress", Q, job["receipt"]).code == 2  # PERCENT is required
