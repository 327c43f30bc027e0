"""``drain()``: the real claim → handler → ack/nack path in the test's thread, inside and outside a test transaction."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection

from django_fq import services as fq
from django_fq.exceptions import WorkerConfigError
from django_fq.testing import DrainReport, JobFailed, drain
from tests.testapp.models import Done

from .handlers import CHAIN, DUP, FAIL, LOOP, NEXT, NOHANDLER, OK, PERM


def _mixed_drain_then_retry_to_dead():
    """Two jobs succeed, one fails and is retried later, one dies at once; then run_scheduled retries to dead."""
    fq.configure(FAIL, max_attempts=2, backoff_ms=60_000)
    a = fq.enqueue(OK, {"n": 1}).id
    b = fq.enqueue(OK, {"n": 2}).id
    bad = fq.enqueue(FAIL, {}).id
    perm = fq.enqueue(PERM, {}).id

    report = drain(OK, FAIL, PERM)

    assert isinstance(report, DrainReport)
    assert [j.id for j in report.succeeded] == [a, b]
    assert [j.result for j in report.succeeded] == [
        {"n": 1, "attempt": 1, "current": True},
        {"n": 2, "attempt": 1, "current": True},
    ]
    assert report.stats.ok == 2 and report.stats.failed == 2 and report.stats.claimed == 4
    [failed] = report.failed
    assert failed.id == bad and failed.attempt == 1
    assert isinstance(failed.exception, RuntimeError) and str(failed.exception) == "boom on attempt 1"
    assert failed.error.startswith("RuntimeError: boom on attempt 1") and "Traceback" in failed.error
    assert failed.run_at is not None
    [dead] = report.dead
    assert dead.id == perm and "never" in dead.error
    assert not report.reached_max_jobs
    # What the database holds is what a worker would have left: results stored, the retry scheduled.
    assert fq.get(OK, a).state == "succeeded" and fq.get(OK, a).result == {"n": 1, "attempt": 1, "current": True}
    assert fq.get(FAIL, bad).state == "scheduled" and fq.get(FAIL, bad).attempts == 1
    assert fq.get(PERM, perm).state == "dead"
    assert set(Done.objects.values_list("job_id", flat=True)) == {a, b}
    assert "boom on attempt 1" in str(report) and "2 succeeded, 1 failed (retry), 1 dead" in str(report)

    # The retry waits out its 60 s backoff: a plain drain runs nothing more.
    assert len(drain(OK, FAIL)) == 0
    again = drain(FAIL, run_scheduled=True)
    assert [(j.id, j.attempt, j.outcome) for j in again.jobs] == [(bad, 2, "dead")]
    assert fq.get(FAIL, bad).state == "dead"


@pytest.mark.django_db
def test_drain_inside_the_tests_transaction_runs_acks_and_nacks():
    assert connection.in_atomic_block  # the test's own transaction is open all along
    _mixed_drain_then_retry_to_dead()


@pytest.mark.django_db(transaction=True)
def test_drain_in_a_transactional_test_runs_acks_and_nacks():
    assert not connection.in_atomic_block
    _mixed_drain_then_retry_to_dead()


@pytest.mark.django_db
def test_raise_errors_raises_after_settling_with_the_handlers_exception_as_cause():
    fq.configure(FAIL, backoff_ms=60_000)
    ok = fq.enqueue(OK, {}).id
    bad = fq.enqueue(FAIL, {}).id

    with pytest.raises(JobFailed) as caught:
        drain(OK, FAIL, raise_errors=True)

    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "boom on attempt 1" in str(caught.value)
    assert [j.id for j in caught.value.report.failed] == [bad]
    assert fq.get(OK, ok).state == "succeeded"  # the other jobs ran and were settled before the raise
    assert fq.get(FAIL, bad).state == "scheduled"


@pytest.mark.django_db
def test_a_delayed_job_waits_unless_run_scheduled_moves_it_on_the_database_clock():
    job = fq.enqueue(OK, {"n": 7}, delay_ms=3_600_000).id

    assert len(drain(OK)) == 0
    assert fq.get(OK, job).state == "scheduled"

    report = drain(OK, run_scheduled=True)

    assert [j.id for j in report.succeeded] == [job]
    assert fq.get(OK, job).state == "succeeded"


@pytest.mark.django_db
def test_a_job_enqueued_by_a_handler_runs_in_the_same_drain():
    first = fq.enqueue(CHAIN, {}).id

    report = drain(CHAIN, NEXT)

    assert [j.queue for j in report.succeeded] == [CHAIN, NEXT]
    assert report.succeeded[1].result == {"from": first}
    assert Done.objects.count() == 2


@pytest.mark.django_db
def test_max_jobs_stops_a_chain_that_never_ends():
    fq.enqueue(LOOP, {"n": 0})

    report = drain(LOOP, max_jobs=5)

    assert [j.result for j in report.jobs] == [0, 1, 2, 3, 4]
    assert report.reached_max_jobs
    assert fq.stats(LOOP).counts["ready"] == 1


@pytest.mark.django_db
def test_a_database_error_in_a_handler_fails_the_job_and_leaves_the_tests_transaction_usable():
    Done.objects.create(job_id="taken")
    fq.configure(DUP, backoff_ms=60_000)
    job = fq.enqueue(DUP, {"key": "taken"}).id

    report = drain(DUP)

    [failed] = report.failed
    assert failed.id == job and isinstance(failed.exception, IntegrityError)
    # The handler's savepoint was rolled back, the nack went through, and the test goes on.
    assert fq.get(DUP, job).state == "scheduled"
    assert list(Done.objects.values_list("job_id", flat=True)) == ["taken"]


@pytest.mark.django_db
def test_every_registered_queue_is_drained_when_none_is_named():
    job = fq.enqueue(OK, {}).id

    report = drain()

    assert job in [j.id for j in report.succeeded]


@pytest.mark.django_db
def test_a_queue_without_a_handler_is_refused_and_handlers_can_be_given():
    fq.enqueue(NOHANDLER, {"x": 1})
    with pytest.raises(WorkerConfigError, match="no handler is registered for queue"):
        drain(NOHANDLER)

    report = drain(NOHANDLER, handlers={NOHANDLER: lambda job: job.payload["x"] + 1})

    assert [j.result for j in report.succeeded] == [2]


@pytest.mark.django_db
def test_the_fq_drain_fixture_is_drain(fq_drain):
    job = fq.enqueue(OK, {}).id
    assert [j.id for j in fq_drain(OK).succeeded] == [job]


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_leaves_a_transaction_open_fails_as_with_a_worker():
    fq.configure("tt.leaveopen", backoff_ms=60_000)
    job = fq.enqueue("tt.leaveopen", {}).id

    report = drain("tt.leaveopen")

    [failed] = report.failed
    assert failed.id == job and failed.error == "the handler left a database transaction open; it was rolled back"
    assert not connection.in_atomic_block
    assert fq.get("tt.leaveopen", job).state == "scheduled"
    assert not Done.objects.filter(job_id=job).exists()  # its writes were rolled back with it


def _async_handlers_are_awaited():
    from .handlers import AIO, AIOFAIL, fail_async, record_async

    fq.configure(AIOFAIL, backoff_ms=60_000)
    job = fq.enqueue(AIO, {}).id
    bad = fq.enqueue(AIOFAIL, {}).id

    report = drain(AIO, AIOFAIL, handlers={AIO: record_async, AIOFAIL: fail_async})

    # Awaited, not called: a coroutine returned as the result would be a failed attempt ("not JSON").
    assert [(j.id, j.result) for j in report.succeeded] == [(job, {"done": 1, "current": True})]
    assert fq.get(AIO, job).state == "succeeded"
    [failed] = report.failed
    assert failed.id == bad and isinstance(failed.exception, RuntimeError) and "async boom" in failed.error
    assert fq.get(AIOFAIL, bad).state == "scheduled"
    return job, bad


@pytest.mark.django_db
def test_an_async_handler_is_awaited_inside_the_tests_transaction():
    job, _ = _async_handlers_are_awaited()
    assert connection.in_atomic_block
    # Its async ORM writes went through the test's connection; the failed run's row was rolled back.
    assert list(Done.objects.values_list("job_id", flat=True)) == [job]


@pytest.mark.django_db(transaction=True)
def test_an_async_handler_is_awaited_in_a_transactional_test():
    job, bad = _async_handlers_are_awaited()
    # In autocommit, as with a worker, what the failed run wrote before raising stays.
    assert set(Done.objects.values_list("job_id", flat=True)) == {job, bad}


@pytest.mark.django_db
def test_the_last_progress_report_is_stored_before_the_ack():
    from .handlers import PROGRESS

    job = fq.enqueue(PROGRESS, {}).id

    assert [j.id for j in drain(PROGRESS).succeeded] == [job]

    info = fq.get(PROGRESS, job)
    assert (info.progress, info.progress_message) == (100.0, "all done") and info.progress_at is not None
