"""Batch handlers run by a worker in the test process (threads): what a handler returns or raises, the checks
at registration and at worker start, middleware and a worker serving both kinds (docs/how-to/batch-handlers.md)."""

from __future__ import annotations

import pytest

from django_fq import BatchFailure, BatchResult, JobBatch, PermanentFailure, handlers
from django_fq import services as fq
from django_fq.exceptions import HandlerLoadError, WorkerConfigError
from django_fq.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.binproc"


def batch(size):
    """Mark a plain function as a batch handler for ``Worker(handlers=...)`` (the registry's ``batch=``)."""

    def mark(fn):
        fn.fq_batch = size
        return fn

    return mark


def run(handler, n: int, *, queue: str = Q, **kwargs) -> list[str]:
    fq.configure(queue, max_attempts=1)  # a failed attempt is final: the test reads the dead job's error
    ids = [r.id for r in fq.enqueue_many(queue, [{"payload": {"n": i}} for i in range(n)])]
    Worker([queue], handlers={queue: handler}, burst=True, poll_interval_ms=10, reaper=False, **kwargs).run()
    return ids


def test_a_mapping_stores_each_jobs_result_and_acks_the_others():
    @batch(10)
    def h(jobs):
        assert isinstance(jobs, JobBatch) and jobs.queue == Q
        return {job.id: {"double": 2 * job.payload["n"]} for job in jobs if job.payload["n"] % 2}

    ids = run(h, 6)
    assert [fq.get(Q, i).result for i in ids] == [None, {"double": 2}, None, {"double": 6}, None, {"double": 10}]


def test_batch_failure_fails_the_named_jobs_and_acks_the_rest():
    @batch(10)
    def h(jobs):
        raise BatchFailure(
            {jobs[0]: RuntimeError("first broke"), jobs[1].id: PermanentFailure("second is hopeless")},
            results={jobs[2].id: "third ok"},
        )

    fq.configure(Q, max_attempts=3, backoff_ms=60_000)  # before the enqueue: the jobs get 3 attempts
    ids = [r.id for r in fq.enqueue_many(Q, [{"payload": {"n": i}} for i in range(4)])]
    Worker([Q], handlers={Q: h}, burst=True, poll_interval_ms=10, reaper=False).run()
    first, second, third, fourth = (fq.get(Q, i) for i in ids)
    assert first.state == "scheduled" and "RuntimeError: first broke" in first.last_error
    assert second.state == "dead" and "second is hopeless" in second.last_error
    assert (third.state, third.result) == ("succeeded", "third ok")
    assert (fourth.state, fourth.result) == ("succeeded", None)


def test_a_result_for_a_job_not_in_the_batch_fails_the_batch_and_says_so():
    @batch(10)
    def h(jobs):
        return BatchResult().ack("f" * 32, 1)

    ids = run(h, 3)
    for i in ids:
        info = fq.get(Q, i)
        assert info.state == "dead" and "which is not a job of this batch" in info.last_error


def test_a_return_value_of_another_kind_fails_the_batch_with_a_clear_error():
    @batch(10)
    def h(jobs):
        return [1, 2, 3]

    ids = run(h, 2)
    assert all(
        "a batch handler returns None, a mapping {job id: result} or a BatchResult, not list" in fq.get(Q, i).last_error
        for i in ids
    )


def test_an_unstorable_result_fails_that_job_alone():
    @batch(10)
    def h(jobs):
        return {jobs[0].id: {"x": object()}}

    first, *rest = run(h, 3)
    assert fq.get(Q, first).state == "dead" and "cannot be stored" in fq.get(Q, first).last_error
    assert all(fq.get(Q, i).state == "succeeded" for i in rest)


def test_middleware_sees_the_batch_once(settings):
    seen = []

    def mw(job, call_next):
        seen.append((type(job).__name__, len(job)))
        return call_next(job)

    settings.FQ_HANDLER_MIDDLEWARE = [mw]

    @batch(4)
    def h(jobs):
        return None

    run(h, 10)
    assert seen == [("JobBatch", 4), ("JobBatch", 4), ("JobBatch", 2)]


def test_a_worker_serves_batch_and_one_job_queues_together():
    calls = []

    @batch(5)
    def many(jobs):
        calls.append(len(jobs))

    def one(job):
        return job.payload["n"]

    fq.enqueue_many(Q, [{"payload": {"n": i}} for i in range(12)])
    single = [r.id for r in fq.enqueue_many("t.binproc1", [{"payload": {"n": i}} for i in range(7)])]
    stats = Worker(
        [Q, "t.binproc1"], handlers={Q: many, "t.binproc1": one}, concurrency=2, burst=True, poll_interval_ms=10
    ).run()
    assert stats.ok == 19 and sorted(calls) == [2, 5, 5]
    assert [fq.get("t.binproc1", i).result for i in single] == list(range(7))


@pytest.mark.parametrize("size", [0, 1001, True, "5", 2.0])
def test_handler_refuses_a_batch_size_outside_1_to_1000(size):
    with pytest.raises(ValueError, match=r"@handler\('t.bbad'\): batch must be an integer from 1 to 1000"):
        handlers.handler("t.bbad", batch=size)


def test_fq_handlers_entry_with_a_bad_batch_is_a_load_error(settings, monkeypatch):
    monkeypatch.setattr(handlers, "_registry", dict(handlers._registry))
    monkeypatch.setattr(handlers, "_batch", dict(handlers._batch))
    settings.FQ_HANDLERS = {"t.bset": {"handler": "tests.testapp.fq_handlers.record", "batch": 0}}
    with pytest.raises(HandlerLoadError, match=r"FQ_HANDLERS\['t.bset'\]: batch must be an integer from 1 to 1000"):
        handlers.autodiscover()
    settings.FQ_HANDLERS = {"t.bset": {"handler": "tests.testapp.fq_handlers.record", "batch": 25}}
    handlers.autodiscover()
    assert handlers.batch_of("t.bset") == 25


def test_the_registered_batch_size_is_used_by_the_worker():
    worker = Worker(["t.batch"], reaper=False)
    assert worker.batches == {"t.batch": 50}
    assert worker.capacity == 1 + 50 * 2  # one thread's slot, one running batch and one claimed ahead


def test_an_async_batch_handler_is_refused_naming_the_queue():
    @batch(10)
    async def h(jobs):
        return None

    with pytest.raises(WorkerConfigError, match=r"queue 't.binproc': a batch handler must be a plain function"):
        Worker([Q], handlers={Q: h})


def test_the_process_pool_is_refused_for_a_batch_queue():
    with pytest.raises(WorkerConfigError, match=r"queue 't.batch' has a batch handler.*--pool threads"):
        Worker(["t.batch"], pool="processes")


def test_check_e016_reports_an_async_batch_handler(monkeypatch):
    from django_fq import checks

    monkeypatch.setattr(handlers, "_registry", {})
    monkeypatch.setattr(handlers, "_middleware", {})
    monkeypatch.setattr(handlers, "_batch", {})
    monkeypatch.setattr(checks, "load_handlers", lambda: None)
    monkeypatch.setattr(checks, "check_tasks", list)

    def plain(jobs):
        return None

    async def later(jobs):
        return None

    handlers.handler("t.bchk", batch=10)(plain)
    assert checks.check_handlers() == []
    monkeypatch.setattr(handlers, "_registry", {})
    handlers.handler("t.bchk", batch=10)(later)
    (msg,) = checks.check_handlers()
    assert msg.id == "django_fq.E016" and "queue 't.bchk': a batch handler must be a plain function" in msg.msg


def test_drain_runs_a_batch_handler_one_job_per_call():
    from django_fq.testing import drain

    calls = []

    @batch(50)
    def h(jobs):
        calls.append(len(jobs))
        result = BatchResult()
        for job in jobs:
            if job.payload["n"] == 1:
                result.fail(job, "one is odd")
            elif job.payload["n"] == 2:
                result.dead(job, "two is hopeless")
            else:
                result.ack(job, job.payload["n"] * 10)
        return result

    fq.configure(Q, max_attempts=2, backoff_ms=60_000)
    ids = [r.id for r in fq.enqueue_many(Q, [{"payload": {"n": i}} for i in range(3)])]
    report = drain(Q, handlers={Q: h})
    assert calls == [1, 1, 1]
    assert [j.outcome for j in report.jobs] == ["succeeded", "retry", "dead"]
    assert fq.get(Q, ids[0]).result == 0
    assert "BatchItemFailed: one is odd" in fq.get(Q, ids[1]).last_error
    assert "two is hopeless" in fq.get(Q, ids[2]).last_error
