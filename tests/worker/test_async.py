"""``async def`` handlers in real ``fq_worker`` processes: one event loop, many jobs at once, no thread per job.

The handler is ``tests.testapp.fq_handlers.acontrolled`` (queues ``t.actl`` and
``t.actl.b``), steered through the payload; ``t.ctl`` is its sync twin.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from django_fq import services as fq
from tests.testapp.models import Done

from .helpers import touch, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

AQ, AQ2, SQ = "t.actl", "t.actl.b", "t.ctl"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def settled(queue: str, job_id: str, state: str = "succeeded"):
    return wait_until(
        lambda: (lambda i: i if i.state == state else None)(fq.get(queue, job_id)), what=f"job {job_id} {state}"
    )


def test_async_handlers_run_at_once_on_one_loop_without_a_thread_per_job(workers, events):
    n = 20
    barrier = uuid.uuid4().hex
    # Each job waits until all n are running in the process: only n at once on the loop lets any finish.
    ids = [fq.enqueue(AQ, {"events": events.path, "barrier": barrier, "n": n}).id for _ in range(n)]
    worker = workers(f"--queue={AQ}", f"--concurrency={n}", *FAST)

    ends = events.wait_for("end", n=n, timeout=60)
    assert sorted(e["id"] for e in ends) == sorted(ids)
    starts = events.of("start")
    assert {s["thread"] for s in starts} == {"fq-asyncio"}  # every handler ran on the loop's thread
    assert all(s["current"] for s in starts)  # current_job() is the task's own job
    running = events.of("all_running")
    assert len(running) == n and all(r["arrived"] == n for r in running)
    # main, completer, heartbeat, reaper, the loop, asgiref's ORM thread (+ a listener): not one per job.
    assert max(r["threads"] for r in running) <= 8 < n
    for job_id in ids:
        info = settled(AQ, job_id)
        assert info.result == {"ok": True, "attempt": 1, "async": True}
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    worker.wait_for(rf"worker\.stop .* ok={n} failed=0 not_settled=0 ")


def test_concurrency_bounds_the_async_handlers_running_at_once(workers, events):
    barrier = uuid.uuid4().hex
    # Three jobs meet at a barrier of three, but only two may run at once: the barrier times out.
    ids = [
        fq.enqueue(AQ, {"events": events.path, "barrier": barrier, "n": 3, "barrier_timeout_s": 1.5}).id
        for _ in range(3)
    ]
    fq.configure(AQ, backoff_ms=60_000)
    worker = workers(f"--queue={AQ}", "--concurrency=2", "--prefetch=1", *FAST)

    wait_until(lambda: sum(fq.get(AQ, i).state == "scheduled" for i in ids) >= 2, what="two timed-out barriers")
    assert all("TimeoutError" in fq.get(AQ, i).errors[-1]["error"] for i in ids if fq.get(AQ, i).state == "scheduled")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_async_orm_writes_are_visible_after_the_ack(workers, events):
    ids = [fq.enqueue(AQ, {"events": events.path, "orm": True}).id for _ in range(5)]
    worker = workers(f"--queue={AQ}", "--concurrency=5", *FAST)

    for job_id in ids:
        settled(AQ, job_id)
        assert Done.objects.get(job_id=job_id).pid == worker.pid
    orm = events.of("orm")
    assert len(orm) == 5 and all(e["pid"] == worker.pid and e["current_in_orm_thread"] for e in orm)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_sync_and_async_queues_share_one_worker(workers, events):
    barrier = uuid.uuid4().hex
    asyncs = [fq.enqueue(AQ, {"events": events.path, "barrier": barrier, "n": 2}).id for _ in range(2)]
    others = [fq.enqueue(AQ2, {"events": events.path}).id for _ in range(3)]
    syncs = [fq.enqueue(SQ, {"events": events.path, "sleep_ms": 50}).id for _ in range(3)]
    worker = workers(f"--queue={AQ}", f"--queue={AQ2}", f"--queue={SQ}", "--concurrency=4", *FAST)

    for queue, job_ids in ((AQ, asyncs), (AQ2, others), (SQ, syncs)):
        for job_id in job_ids:
            assert settled(queue, job_id).worker is not None
    by_id = {s["id"]: s for s in events.of("start")}
    assert {by_id[i]["pid"] for i in asyncs + others + syncs} == {worker.pid}
    assert {by_id[i]["thread"] for i in asyncs + others} == {"fq-asyncio"}
    assert fq.get(SQ, syncs[0]).result == {"ok": True, "attempt": 1}
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    worker.wait_for(r"worker\.stop .* ok=8 failed=0 ")


def test_an_async_exception_nacks_and_permanent_failure_is_dead(workers, events):
    fq.configure(AQ, backoff_ms=0, max_attempts=2)
    failing = fq.enqueue(AQ, {"events": events.path, "fail": True}).id
    dead = fq.enqueue(AQ, {"events": events.path, "permanent": True}).id
    worker = workers(f"--queue={AQ}", "--concurrency=2", *FAST)

    info = settled(AQ, failing, "dead")
    assert info.attempts == 2 and len(events.of("start", failing)) == 2
    assert "RuntimeError: async handler asked to fail on attempt 2" in info.errors[-1]["error"]
    info = settled(AQ, dead, "dead")
    assert info.attempts == 1 and "asked to fail for good" in info.errors[-1]["error"]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    worker.wait_for(r"worker\.stop .* ok=0 failed=3 ")


def test_an_open_transaction_left_by_an_async_handler_is_rolled_back_and_fails_the_run(workers, events):
    fq.configure(AQ, backoff_ms=60_000)
    job = fq.enqueue(AQ, {"events": events.path, "leave_transaction": True}).id
    after = fq.enqueue(AQ, {"events": events.path, "orm": True}).id
    worker = workers(f"--queue={AQ}", *FAST)

    info = settled(AQ, job, "scheduled")
    assert "left a database transaction open" in info.errors[-1]["error"]
    assert not Done.objects.filter(job_id=job).exists()  # its write was rolled back
    settled(AQ, after)
    assert Done.objects.filter(job_id=after).exists()  # the next job's write did not land in it
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_an_async_job_past_its_timeout_is_cancelled(workers, events):
    fq.configure(AQ, backoff_ms=60_000)
    job = fq.enqueue(AQ, {"events": events.path, "until_cancelled": True}, timeout_ms=600).id
    other = fq.enqueue(AQ, {"events": events.path}).id
    worker = workers(f"--queue={AQ}", "--concurrency=2", "--visibility=5000", "--no-reaper", *FAST)

    [start] = events.wait_for("start", job)
    [cancelled] = events.wait_for("cancelled", job, timeout=20)
    assert (cancelled["reason"], cancelled["timed_out"]) == ("timeout", True)
    assert cancelled["t"] - start["t"] < 5  # cancelled at the timeout, long before its hour of sleep
    worker.wait_for(rf"job.not_settled job={job} .*reason=lease_lost:timeout")
    info = wait_until(lambda: (lambda i: i if i.errors else None)(fq.get(AQ, job)), what="the timeout to be recorded")
    assert [e["kind"] for e in info.errors] == ["timeout"] and info.state == "scheduled"
    settled(AQ, other)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    worker.wait_for(r"worker\.stop .* ok=1 failed=0 not_settled=1 timed_out=1 ")


def test_an_async_job_whose_lease_is_lost_is_cancelled(workers, events):
    job = fq.enqueue(AQ, {"events": events.path, "until_lost": True}).id
    worker = workers(f"--queue={AQ}", "--visibility=600", *FAST)

    events.wait_for("start", job)
    fq.cancel(AQ, job)  # the next extend is refused: the lease is gone
    # The task is cancelled; job.asleep may notice first and raise LeaseLost: either way, at once.
    told = wait_until(lambda: events.of("cancelled", job) + events.of("lost", job), what="the handler to be told")
    assert [e["reason"] for e in told] == ["cancelled"]
    worker.wait_for(rf"job.not_settled job={job} .*reason=lease_lost:cancelled")
    assert fq.get(AQ, job).state == "cancelled"
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_sigterm_lets_async_jobs_finish_within_the_grace_and_releases_the_rest(workers, events, gate):
    fq.configure(AQ, backoff_ms=0)
    long = fq.enqueue(AQ, {"events": events.path, "until_cancelled": True}).id
    short = fq.enqueue(AQ, {"events": events.path, "gate": str(gate)}).id
    worker = workers(f"--queue={AQ}", "--concurrency=2", "--grace=2", "--visibility=3600000", *FAST)
    events.wait_for("start", long)
    events.wait_for("start", short)

    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    worker.wait_for("worker.signal .*signal=SIGTERM action=graceful")
    touch(gate)  # the short job ends within the grace period
    assert worker.wait(timeout=30) == 0, worker.stderr
    assert time.monotonic() - signalled >= 1.9  # the long job was given the grace period

    assert fq.get(AQ, short).state == "succeeded"
    worker.wait_for(rf"job.released job={long} queue={AQ} attempt=1/25 reason=shutdown")
    [cancelled] = events.wait_for("cancelled", long)
    assert cancelled["reason"] == "shutdown"
    info = fq.get(AQ, long)
    assert (info.state, info.attempts, info.errors[-1]["kind"]) == ("ready", 0, "release")
    worker.wait_for(r"worker\.stop .* ok=1 .*released=1")
