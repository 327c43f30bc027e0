"""Handler middleware in a worker run in this process: snooze, retry-after, metadata for the handler."""

from __future__ import annotations

import pytest

from django_fq import db
from django_fq import services as fq
from django_fq.exceptions import RetryAfter, Snooze, WorkerConfigError
from django_fq.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.mwin"
DAY_MS = 24 * 3600 * 1000


def test_snooze_releases_with_the_delay_and_gives_the_attempt_back():
    job = fq.enqueue(Q, {}).id

    def handler(job):
        raise Snooze(DAY_MS)

    before = db.db_now_ms()
    stats = Worker([Q], handlers={Q: handler}, burst=True, poll_interval_ms=10, reaper=False).run()
    after = db.db_now_ms()
    assert stats.snoozed == 1 and stats.failed == 0
    info = fq.get(Q, job)
    assert info.state == "scheduled" and info.attempts == 0
    assert before + DAY_MS <= info.run_at <= after + DAY_MS
    assert info.errors[-1]["kind"] == "snooze" and info.errors[-1]["error"] == "snoozed"
    assert fq.stats(Q).totals["released"] == 1


def test_retry_after_nacks_with_its_delay_instead_of_the_backoff():
    fq.configure(Q, backoff_ms=0, max_attempts=5)
    job = fq.enqueue(Q, {}).id

    def handler(job):
        raise RetryAfter(2 * DAY_MS, error="rate limited")

    before = db.db_now_ms()
    stats = Worker([Q], handlers={Q: handler}, burst=True, poll_interval_ms=10, reaper=False).run()
    info = fq.get(Q, job)
    assert stats.failed == 1
    assert info.state == "scheduled" and info.attempts == 1
    assert info.run_at >= before + 2 * DAY_MS
    assert info.last_error.startswith("RetryAfter: rate limited") or "rate limited" in info.last_error


def test_a_bad_snooze_delay_is_a_failed_attempt_with_a_clear_error():
    fq.configure(Q, max_attempts=1)
    job = fq.enqueue(Q, {}).id

    def handler(job):
        raise Snooze(-5)

    stats = Worker([Q], handlers={Q: handler}, burst=True, poll_interval_ms=10, reaper=False).run()
    assert stats.failed == 1
    info = fq.get(Q, job)
    assert info.state == "dead" and "delay_ms must be an integer between 0 and 2592000000" in info.last_error


def test_the_handler_reads_its_metadata(settings):
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.inner"]
    job = fq.enqueue(Q, {}, metadata={"tenant": "acme", "tags": ["a"]}).id
    bare = fq.enqueue(Q, {}).id
    Worker([Q], handlers={Q: lambda job: job.metadata}, burst=True, poll_interval_ms=10, reaper=False).run()
    assert fq.get(Q, job).result == {"inner": {"tenant": "acme", "tags": ["a"]}}
    assert fq.get(Q, bare).result == {"inner": {}}


def test_a_worker_refuses_to_start_with_broken_middleware(settings):
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.async_only"]
    with pytest.raises(WorkerConfigError, match="async-only"):
        Worker([Q], handlers={Q: lambda job: None})


def test_a_snooze_past_the_limit_fails_the_attempt_with_a_clear_error():
    from django_fq.models import Job
    from django_fq.validation import MAX_SNOOZES

    fq.configure(Q, max_attempts=3, backoff_ms=0)
    job = fq.enqueue(Q, {}).id
    Job.objects.filter(uid=job).update(snoozes=MAX_SNOOZES)

    def handler(job):
        raise Snooze(1000)

    stats = Worker([Q], handlers={Q: handler}, burst=True, poll_interval_ms=10, reaper=False, max_jobs=1).run()
    assert stats.snoozed == 0 and stats.failed == 1
    info = fq.get(Q, job)
    assert info.attempts == 1 and info.snoozes == MAX_SNOOZES
    assert info.errors[-1]["kind"] == "nack" and "snooze limit reached" in info.last_error
