"""The worker (in-process, real threads and database) against handlers that misbehave.

docs/reference/semantics.md §7: a handler returning normally → ack with its return value; raising →
nack with the error text and traceback; a graceful stop lets running jobs finish
within the grace period and releases the rest for immediate re-claim.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq.worker import LeaseLost, Worker, current_job
from tests.testapp.models import Done

pytestmark = pytest.mark.django_db(transaction=True)


def burst(queue: str, handler, **options):
    options = {"burst": True, "poll_interval_ms": 10, "reaper": False, **options}
    return Worker([queue], handlers={queue: handler}, **options).run()


def wait_until(predicate, timeout: float) -> bool:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


# --- bugs ---------------------------------------------------------------------------------------


def test_handler_that_leaves_a_transaction_open_does_not_cost_later_jobs_their_writes():
    """Job A's handler enters transaction.atomic() and never leaves it; job B then runs on the same thread.

    Whatever the worker does about A, a job it records as succeeded must have its
    handler's writes committed, and the queue must keep moving. Today the runner
    keeps its connection inside A's open transaction (``_tidy_connections`` skips
    connections in an atomic block): B's handler writes into it, B is acked by the
    completer's connection, and B's writes are rolled back when the thread ends
    (PostgreSQL). On SQLite the open transaction holds the write lock and every
    other write of the worker waits on it (the queue stalls).
    """
    q = "adv.leak"
    leaked = []

    def handler(job):
        if job.payload.get("leak"):
            transaction.atomic().__enter__()  # a handler bug: the block is never left
            leaked.append(connection)
        Done.objects.create(job_id=job.id)
        return "wrote"

    a = fq.enqueue(q, {"leak": True}, priority=1).id
    b = fq.enqueue(q, {}).id
    worker = Worker([q], handlers={q: handler}, concurrency=1, poll_interval_ms=10, reaper=False, grace_s=0)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    finished = wait_until(lambda: all(fq.get(q, j).state in ("succeeded", "scheduled", "dead") for j in (a, b)), 3)
    if not finished and leaked and connection.vendor == "sqlite":
        leaked[0].connection.rollback()  # unblock the stalled worker so the test can end
    worker.request_stop("test over")
    thread.join(30)
    for t in worker._threads:
        t.join(10)

    assert finished, "the worker stalled behind the transaction a handler left open"
    done = set(Done.objects.values_list("job_id", flat=True))
    succeeded = {j for j in (a, b) if fq.get(q, j).state == "succeeded"}
    assert succeeded <= done, f"jobs recorded succeeded whose handler writes were rolled back: {sorted(succeeded - done)}"
    assert b in succeeded, "a well-behaved job after the leaking one must still succeed"


class Unprintable(Exception):
    """An exception whose text cannot be produced (``str()`` raises)."""

    def __str__(self):
        raise RuntimeError("no text")


def test_handler_raising_an_exception_without_text_is_still_nacked():
    """str(exc) raising inside the worker's error formatting must not skip the nack.

    Today ``execute`` calls ``str(exc)`` in its except clause; that raises, the runner
    logs an internal error and frees the slot without settling: the job stays
    running on its lease, nothing is recorded, and it comes back only as a lease
    expiry (with the wrong error) a visibility later.
    """
    q = "adv.unprintable"

    def handler(job):
        raise Unprintable()

    job = fq.enqueue(q, {}).id
    stats = burst(q, handler)
    info = fq.get(q, job)
    assert info.state in ("scheduled", "ready"), info.state
    assert info.attempts == 1 and stats.failed == 1
    assert "Unprintable" in info.last_error


def test_stop_gives_prefetched_jobs_back_at_once_while_a_long_job_finishes():
    """One runner thread, prefetch 3: a long job runs while 3 claimed jobs wait for the thread.

    On a stop, jobs that never started are not "running jobs" to wait for: they
    must be released at once for other workers (docs/reference/semantics.md §7:
    the rest are released so that any worker can claim them again at once),
    not held (their leases kept alive by heartbeats) until the long job ends or
    the grace period runs out.
    """
    q = "adv.prefetch"
    started, finish = threading.Event(), threading.Event()

    def handler(job):
        if job.payload.get("long"):
            started.set()
            finish.wait(15)
        return None

    fq.enqueue(q, {"long": True}, priority=1)
    waiting = [fq.enqueue(q, {"n": n}).id for n in range(3)]
    worker = Worker([q], handlers={q: handler}, concurrency=1, prefetch=3, poll_interval_ms=10, reaper=False, grace_s=10)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        assert wait_until(lambda: fq.stats(q).counts["running"] == 4, 5)
        worker.request_stop("test")
        released = wait_until(lambda: all(fq.get(q, j).state == "ready" for j in waiting), 2)
        states = [fq.get(q, j).state for j in waiting]
    finally:
        finish.set()
        thread.join(30)
    assert released, f"2 s after the stop the unstarted jobs are still {states}"
    assert [fq.get(q, j).attempts for j in waiting] == [0, 0, 0]


# --- held ---------------------------------------------------------------------------------------


def test_odd_handler_outcomes_are_settled_and_the_worker_carries_on():
    """KeyboardInterrupt, GeneratorExit, oversized / non-JSON / NaN results, LeaseLost-free check(): each settled once."""
    q = "adv.odd"
    fq.configure(q, backoff_ms=60_000)

    def handler(job):
        kind = job.payload["kind"]
        current_job().check()  # the lease is held: no exception
        assert current_job() is job and not job.lease_lost
        if kind == "kbint":
            raise KeyboardInterrupt()
        if kind == "genexit":
            raise GeneratorExit()
        if kind == "huge":
            return "x" * (1024 * 1024 + 1)
        if kind == "set":
            return {1, 2}
        if kind == "nan":
            return float("nan")
        if kind == "deep":
            value = []
            for _ in range(100_000):
                value = [value]
            return value
        return {"kind": kind}

    kinds = ["kbint", "genexit", "huge", "set", "nan", "deep", "ok"]
    ids = {k: fq.enqueue(q, {"kind": k}).id for k in kinds}
    stats = burst(q, handler)
    assert (stats.ok, stats.failed, stats.settle_errors) == (1, 6, 0)
    for kind, job in ids.items():
        info = fq.get(q, job)
        if kind == "ok":
            assert (info.state, info.result) == ("succeeded", {"kind": "ok"})
        else:
            assert (info.state, info.attempts) == ("scheduled", 1), (kind, info.state)
            assert info.last_error, kind
    assert "KeyboardInterrupt" in fq.get(q, ids["kbint"]).last_error
    assert "cannot be stored" in fq.get(q, ids["huge"]).last_error


def test_check_raises_once_the_job_is_cancelled_and_the_run_is_not_settled():
    """A handler polling current_job().check() learns of its cancellation within a heartbeat."""
    q = "adv.check"
    seen = {}
    started = threading.Event()

    def handler(job):
        started.set()
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            try:
                current_job().check()
            except LeaseLost as exc:
                seen["reason"] = exc.reason
                raise
            time.sleep(0.01)
        return "never"

    job = fq.enqueue(q, {}).id
    worker = Worker([q], handlers={q: handler}, visibility_ms=300, poll_interval_ms=10, reaper=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        fq.cancel(q, job)
        assert wait_until(lambda: "reason" in seen, 5)
    finally:
        worker.request_stop("test")
        thread.join(30)
    assert seen["reason"] == "cancelled"
    info = fq.get(q, job)
    assert (info.state, info.result) == ("cancelled", None)
