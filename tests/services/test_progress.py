"""Progress reports through the Python API (docs/how-to/progress.md): stored, shown, guarded by the lease."""

from __future__ import annotations

import math

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidArgument, InvalidReceipt, QueueNotFound
from django_fq.models import Job

from .helpers import claim_one, snapshot

pytestmark = pytest.mark.django_db


def test_a_report_is_stored_with_the_database_clock_and_shown_by_get_and_jobs(q, frozen):
    fq.enqueue(q, {})
    job = claim_one(q)
    assert (fq.get(q, job.id).progress, fq.get(q, job.id).progress_message, fq.get(q, job.id).progress_at) == (
        None,
        "",
        None,
    )
    frozen.advance(250)
    fq.report_progress(q, job.receipt, 42.5, "rows 425 of 1000")
    info = fq.get(q, job.id)
    assert info.progress == 42.5
    assert info.progress_message == "rows 425 of 1000"
    assert info.progress_at == frozen.now  # the database clock, not the caller's
    listed = fq.jobs(q, state="running").jobs[0]
    assert (listed.progress, listed.progress_message, listed.progress_at) == (42.5, "rows 425 of 1000", frozen.now)
    # The next report replaces it; the message defaults to "".
    fq.report_progress(q, job.receipt, 100)
    info = fq.get(q, job.id)
    assert (info.progress, info.progress_message) == (100.0, "")


def test_a_finished_job_keeps_its_last_report_and_a_new_attempt_starts_with_none(q):
    fq.configure(q, backoff_ms=0)
    fq.enqueue(q, {})
    first = claim_one(q)
    fq.report_progress(q, first.receipt, 30, "first attempt")
    fq.nack(q, first.receipt, error="boom")
    info = fq.get(q, first.id)
    assert info.state == "ready"
    assert (info.progress, info.progress_message) == (30.0, "first attempt")  # the last attempt's, until the next claim
    second = claim_one(q)
    assert second.attempts == 2
    info = fq.get(q, second.id)
    assert (info.progress, info.progress_message, info.progress_at) == (None, "", None)
    fq.report_progress(q, second.receipt, 100, "done")
    fq.ack(q, second.receipt)
    info = fq.get(q, second.id)
    assert info.state == "succeeded"
    assert (info.progress, info.progress_message) == (100.0, "done")
    # A settled receipt cannot report any more.
    with pytest.raises(InvalidReceipt):
        fq.report_progress(q, second.receipt, 5)
    assert fq.get(q, second.id).progress == 100.0


def test_a_run_that_lost_its_lease_cannot_overwrite_the_next_runs_progress(q, frozen):
    fq.configure(q, backoff_ms=0)
    fq.enqueue(q, {})
    old = claim_one(q, visibility_ms=1000)
    fq.report_progress(q, old.receipt, 10, "old run")
    frozen.set(old.deadline)
    # Expired but not yet reaped: the lease row is still there, its deadline has passed.
    with pytest.raises(InvalidReceipt):
        fq.report_progress(q, old.receipt, 20, "old run, late")
    assert fq.get(q, old.id).progress == 10.0
    assert fq.reap(q).expired == 1
    new = claim_one(q, visibility_ms=60_000)
    fq.report_progress(q, new.receipt, 60, "new run")
    before = snapshot(q, new.id)
    with pytest.raises(InvalidReceipt):
        fq.report_progress(q, old.receipt, 99, "old run, after the new claim")
    assert snapshot(q, new.id) == before
    assert (before["progress"], before["progress_message"]) == (60.0, "new run")


BAD_VALUES = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "negative": -0.5,
    "above 100": 100.01,
    "huge int": 10**400,
    "bool": True,
    "string": "50",
    "none": None,
    "list": [50],
}
BAD_MESSAGES = {
    "too long": "x" * 201,
    "nul": "half\x00way",
    "lone surrogate": "\ud800",
    "not a string": 12,
    "bytes": b"half",
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_value_names_the_field_and_changes_nothing(q, name):
    fq.enqueue(q, {})
    job = claim_one(q)
    fq.report_progress(q, job.receipt, 5, "kept")
    before = snapshot(q, job.id)
    with pytest.raises(InvalidArgument) as err:
        fq.report_progress(q, job.receipt, BAD_VALUES[name], "bad")
    assert err.value.field == "progress"
    assert job.receipt not in str(err.value)
    assert snapshot(q, job.id) == before


@pytest.mark.parametrize("name", sorted(BAD_MESSAGES))
def test_a_bad_message_names_the_field_and_changes_nothing(q, name):
    fq.enqueue(q, {})
    job = claim_one(q)
    before = snapshot(q, job.id)
    with pytest.raises(InvalidArgument) as err:
        fq.report_progress(q, job.receipt, 5, BAD_MESSAGES[name])
    assert err.value.field == "message"
    assert snapshot(q, job.id) == before


def test_limits_are_inclusive_and_text_is_kept_exactly(q):
    fq.enqueue(q, {})
    job = claim_one(q)
    for value in (0, 100, 0.0, 99.999):
        fq.report_progress(q, job.receipt, value)
        assert fq.get(q, job.id).progress == float(value)
    message = "é" * 100 + "漢字" * 49 + "🎉!"  # 200 characters, several bytes each
    assert len(message) == 200
    fq.report_progress(q, job.receipt, 1, message)
    assert fq.get(q, job.id).progress_message == message
    fq.report_progress(q, job.receipt, 1, None)
    assert fq.get(q, job.id).progress_message == ""


def test_unknown_queue_and_a_receipt_of_another_queue(q):
    fq.enqueue(q, {})
    job = claim_one(q)
    with pytest.raises(QueueNotFound):
        fq.report_progress("no-such-queue", job.receipt, 5)
    fq.configure("other")
    with pytest.raises(InvalidReceipt):
        fq.report_progress("other", job.receipt, 5)
    assert Job.objects.get(uid=job.id).progress is None
