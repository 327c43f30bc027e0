"""The inline mode: an enqueue's job runs when its transaction commits, through the real path."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq.testing import JobFailed, enqueued_jobs, inline
from django_fq.testing.inline_mode import active
from tests.testapp.models import Done

from .handlers import CHAIN, FAIL, NEXT, NOHANDLER, OK

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_job_runs_when_the_enqueuing_transaction_commits_not_before():
    with inline() as mode:
        with transaction.atomic():
            job = fq.enqueue(OK, {"n": 1}).id
            assert fq.get(OK, job).state == "ready"  # nothing runs inside the transaction
            assert not Done.objects.exists()
        assert fq.get(OK, job).state == "succeeded"
        assert fq.get(OK, job).result == {"n": 1, "attempt": 1, "current": True}
    assert Done.objects.filter(job_id=job).exists()
    assert [(j.id, j.outcome) for j in mode.jobs] == [(job, "succeeded")]


def test_a_rolled_back_enqueue_runs_nothing():
    class Abort(Exception):
        pass

    with inline() as mode, pytest.raises(Abort), transaction.atomic():
        fq.enqueue(OK, {"n": 1})
        raise Abort
    assert mode.jobs == []
    assert not Done.objects.exists()
    assert enqueued_jobs(OK, state=None) == []


def test_an_enqueue_in_autocommit_runs_its_job_before_enqueue_returns():
    with inline():
        job = fq.enqueue(OK, {"n": 2}).id
        assert fq.get(OK, job).state == "succeeded"


def test_a_failing_job_is_nacked_then_raised_from_the_commit():
    fq.configure(FAIL, backoff_ms=60_000, max_attempts=3)
    with inline(), pytest.raises(JobFailed) as caught, transaction.atomic():
        job = fq.enqueue(FAIL, {}).id
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "boom on attempt 1" in str(caught.value)
    info = fq.get(FAIL, job)  # committed, and settled as a worker would: a retry in 60 s
    assert info.state == "scheduled" and info.attempts == 1
    assert info.last_error.startswith("RuntimeError: boom on attempt 1")


def test_raise_errors_false_records_the_failure_without_raising():
    fq.configure(FAIL, backoff_ms=60_000)
    with inline(raise_errors=False) as mode:
        job = fq.enqueue(FAIL, {}).id
    [run] = mode.jobs
    assert (run.id, run.outcome) == (job, "retry")


def test_jobs_enqueued_by_a_handler_run_inline_too():
    with inline() as mode:
        first = fq.enqueue(CHAIN, {}).id
    assert [(j.queue, j.outcome) for j in mode.jobs] == [(NEXT, "succeeded"), (CHAIN, "succeeded")]
    [nested] = [j for j in mode.jobs if j.queue == NEXT]
    assert nested.result == {"from": first}
    # The outer handler still saw itself as the current job after the nested run.
    assert fq.get(CHAIN, first).result == {"current": True}
    assert Done.objects.count() == 2


def test_an_idempotent_repeat_runs_nothing_again():
    with inline() as mode:
        a = fq.enqueue(OK, {"n": 1}, idempotency="once").id
        b = fq.enqueue(OK, {"n": 1}, idempotency="once")
    assert b.id == a and not b.created
    assert [j.id for j in mode.jobs] == [a]
    assert Done.objects.count() == 1


def test_enqueue_many_runs_every_new_job():
    with inline() as mode, transaction.atomic():
        results = fq.enqueue_many(OK, [{"payload": {"n": i}} for i in range(3)])
    assert sorted(j.id for j in mode.jobs) == sorted(r.id for r in results)
    assert Done.objects.count() == 3


def test_queues_without_a_handler_and_queues_not_named_are_left_waiting():
    with inline(OK) as mode:
        plain = fq.enqueue(NOHANDLER, {}).id
        other = fq.enqueue(NEXT, {"from": "x"}).id
        ran = fq.enqueue(OK, {}).id
    assert [j.id for j in mode.jobs] == [ran]
    assert fq.get(NOHANDLER, plain).state == "ready"
    assert fq.get(NEXT, other).state == "ready"


def test_the_fq_inline_setting_turns_it_on_and_off(settings):
    settings.FQ_INLINE = True
    assert active() is not None
    job = fq.enqueue(OK, {}).id
    assert fq.get(OK, job).state == "succeeded"

    settings.FQ_INLINE = [NEXT]  # a list: only these queues
    waiting = fq.enqueue(OK, {}).id
    assert fq.get(OK, waiting).state == "ready"

    settings.FQ_INLINE = False
    assert active() is None
    later = fq.enqueue(NEXT, {"from": "y"}).id
    assert fq.get(NEXT, later).state == "ready"


def test_the_fq_inline_fixture(fq_inline):
    job = fq.enqueue(OK, {}).id
    assert [j.id for j in fq_inline.jobs] == [job]
    assert not connection.in_atomic_block


def test_the_mode_ends_with_its_block():
    with inline():
        pass
    assert active() is None
    job = fq.enqueue(OK, {}).id
    assert fq.get(OK, job).state == "ready"


# --- inside a test's transaction (django_db): the commit never comes, unless captured ---------------


@pytest.mark.django_db(transaction=False)
def test_in_a_django_db_test_the_job_runs_when_captured_commit_callbacks_execute(django_capture_on_commit_callbacks):
    with inline() as mode:
        with django_capture_on_commit_callbacks(execute=True):
            job = fq.enqueue(OK, {"n": 3}).id
            assert fq.get(OK, job).state == "ready"
        assert fq.get(OK, job).state == "succeeded"
        with django_capture_on_commit_callbacks(execute=True):
            first = fq.enqueue(CHAIN, {}).id  # the nested enqueue's callback is captured and run too
    assert fq.get(CHAIN, first).state == "succeeded"
    # Inside the test's transaction the nested enqueue's callback is queued, so it runs after the outer job.
    assert [(j.queue, j.outcome) for j in mode.jobs][-2:] == [(CHAIN, "succeeded"), (NEXT, "succeeded")]


@pytest.mark.django_db(transaction=False)
def test_in_a_django_db_test_nothing_runs_without_capturing_the_commit():
    with inline() as mode:
        job = fq.enqueue(OK, {}).id
    assert mode.jobs == []
    assert fq.get(OK, job).state == "ready"
