"""Async handlers in an in-process worker: how a handler is recognised, which pool a worker picks,
``current_job()`` per task, ``asleep`` and the outcome of each way an async handler ends."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest
from asgiref.sync import markcoroutinefunction, sync_to_async

from django_fq import services as fq
from django_fq.exceptions import PermanentFailure
from django_fq.worker import LeaseLost, ThreadPool, Worker, current_job
from django_fq.worker.aio import AsyncioPool, SplitPool, is_async_handler
from tests.testapp.models import Done

pytestmark = pytest.mark.django_db(transaction=True)

Q, Q2 = "t.ainproc", "t.ainproc.sync"


async def async_fn(job):
    return None


def sync_fn(job):
    return None


class AsyncCallable:
    async def __call__(self, job):
        return None

    async def method(self, job):
        return None


class SyncCallable:
    def __call__(self, job):
        return None


def marked(job):
    return None


markcoroutinefunction(marked)


@pytest.mark.parametrize(
    "fn, expected",
    [
        (async_fn, True),
        (functools.partial(async_fn), True),
        (functools.partial(functools.partial(async_fn)), True),
        (AsyncCallable(), True),
        (AsyncCallable().method, True),
        (marked, True),
        (sync_fn, False),
        (functools.partial(sync_fn), False),
        (SyncCallable(), False),
        (AsyncCallable, False),  # the class: calling it makes an instance, not a coroutine
        (print, False),
    ],
    ids=[
        "async",
        "partial",
        "nested-partial",
        "async-call",
        "async-method",
        "marked",
        "sync",
        "sync-partial",
        "sync-call",
        "class",
        "builtin",
    ],
)
def test_async_handlers_are_recognised(fn, expected):
    assert is_async_handler(fn) is expected


def test_the_pool_follows_the_handlers():
    assert type(Worker([Q], handlers={Q: sync_fn}).pool) is ThreadPool  # the default path is unchanged
    assert type(Worker([Q], handlers={Q: async_fn}).pool) is AsyncioPool
    assert type(Worker([Q, Q2], handlers={Q: async_fn, Q2: sync_fn}).pool) is SplitPool


def run(handlers: dict, **kwargs):
    kwargs.setdefault("concurrency", 4)
    worker = Worker(list(handlers), handlers=handlers, burst=True, poll_interval_ms=10, reaper=False, **kwargs)
    stats = worker.run()
    return worker, stats


def test_each_task_sees_its_own_job_and_the_async_orm_works():
    seen = {}

    async def handler(job):
        await asyncio.sleep(0.01)  # let the other tasks run in between
        mine = current_job()
        in_thread = await sync_to_async(current_job)()
        await Done.objects.acreate(job_id=job.id)
        seen[job.id] = (mine is job, in_thread is job, threading.current_thread().name)
        return {"n": job.payload["n"]}

    ids = [fq.enqueue(Q, {"n": n}).id for n in range(6)]
    worker, stats = run({Q: handler})

    assert stats.ok == 6
    assert seen == dict.fromkeys(ids, (True, True, "fq-asyncio"))
    assert [fq.get(Q, i).result for i in ids] == [{"n": n} for n in range(6)]
    assert set(Done.objects.values_list("job_id", flat=True)) == set(ids)
    assert current_job() is None
    assert [t.name for t in worker.pool.threads] == ["fq-asyncio"]


def test_outcomes_of_an_async_handler():
    async def handler(job):
        kind = job.payload["kind"]
        if kind == "fail":
            raise ValueError("bad input")
        if kind == "permanent":
            raise PermanentFailure("never")
        if kind == "cancel-itself":
            raise asyncio.CancelledError()  # not a lost lease: a failure like any other
        if kind == "sleep":
            await job.asleep(0.05)
        return kind

    fq.configure(Q, backoff_ms=60_000)
    ids = {kind: fq.enqueue(Q, {"kind": kind}).id for kind in ("ok", "fail", "permanent", "cancel-itself", "sleep")}
    _, stats = run({Q: handler})

    assert (stats.ok, stats.failed) == (2, 3)
    assert fq.get(Q, ids["ok"]).result == "ok" and fq.get(Q, ids["sleep"]).result == "sleep"
    assert "ValueError: bad input" in fq.get(Q, ids["fail"]).errors[-1]["error"]
    assert fq.get(Q, ids["permanent"]).state == "dead"
    assert "CancelledError" in fq.get(Q, ids["cancel-itself"]).errors[-1]["error"]


def test_asleep_raises_lease_lost_once_the_lease_is_gone():
    raised = {}

    async def handler(job):
        job._lease.mark_lost("expired")  # as the heartbeat does (its cancel comes after the check raised)
        try:
            await job.asleep(10)
        except LeaseLost as exc:
            raised["reason"] = exc.reason
            raise

    fq.enqueue(Q, {})
    worker = Worker([Q], handlers={Q: handler}, burst=True, poll_interval_ms=10, reaper=False)
    stats = worker.run()
    assert raised == {"reason": "expired"}
    assert stats.settle_errors == 1  # a lost lease is not settled


def test_mixed_worker_runs_sync_jobs_on_threads_and_async_ones_on_the_loop():
    threads = {}

    async def a(job):
        threads[job.id] = threading.current_thread().name

    def s(job):
        threads[job.id] = threading.current_thread().name

    ids_a = [fq.enqueue(Q, {}).id for _ in range(3)]
    ids_s = [fq.enqueue(Q2, {}).id for _ in range(3)]
    _, stats = run({Q: a, Q2: s}, concurrency=2)
    assert stats.ok == 6
    assert {threads[i] for i in ids_a} == {"fq-asyncio"}
    assert {threads[i] for i in ids_s} <= {"fq-runner-0", "fq-runner-1"}


def test_a_sync_only_middleware_cannot_wrap_an_async_handler(settings):
    from django_fq.exceptions import WorkerConfigError

    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.outer"]
    with pytest.raises(
        WorkerConfigError,
        match=r"tests\.middleware\.mw\.outer is sync-only; the handler of queue 't\.ainproc' is async",
    ):
        Worker([Q], handlers={Q: AsyncCallable()})
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.both"]
    assert type(Worker([Q], handlers={Q: functools.partial(async_fn)}).pool) is AsyncioPool
