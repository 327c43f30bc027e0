"""The heartbeat thread woken only when a new lease needs it sooner, and the adaptive claim size (in-process worker, real threads).

Each test asserts what the database ends up holding: a short lease kept alive while the heartbeat
thread slept, fair service of several queues, burst / max_jobs / prefetch / per-queue concurrency.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_fq import services as fq
from django_fq.worker import LeaseLost, Worker

from .helpers import record_claims

pytestmark = pytest.mark.django_db(transaction=True)


def start(worker: Worker):
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("stats", worker.run()))
    thread.start()
    return thread, out


def stop(worker: Worker, thread: threading.Thread, out: dict):
    worker.request_stop("test over")
    thread.join(timeout=30)
    assert not thread.is_alive()
    return out["stats"]


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# --- heartbeat: a short lease claimed while the heartbeat thread sleeps ---------------------------


def test_a_short_lease_claimed_while_the_heartbeat_sleeps_is_extended_in_time():
    """A long-lease job keeps the heartbeat thread asleep for ~1 s at a time; jobs of a 600 ms lease
    arrive one by one meanwhile and run 1.5 s each (2.5 leases). Every one must be acked on its
    first attempt: none may expire in the hand of its handler, which it would if the claim did
    not wake the heartbeat thread (its first beat is due after 300 ms, its deadline at 600 ms).
    """
    long_q, short_q = "rv.hb.long", "rv.hb.short"
    fq.configure(long_q, visibility_ms=3_000)
    fq.configure(short_q, visibility_ms=600, max_attempts=1)
    release = threading.Event()
    lost: list[str] = []

    def hold(job):
        release.wait(10)

    def short(job):
        try:
            job.sleep(1.5)
        except LeaseLost as exc:
            lost.append(exc.reason)
            raise
        return "ok"

    worker = Worker(
        [long_q, short_q], handlers={long_q: hold, short_q: short}, concurrency=8, poll_interval_ms=5,
        max_poll_interval_ms=20, reaper=False,
    )  # fmt: skip
    thread, out = start(worker)
    try:
        holder = fq.enqueue(long_q, {}).id
        wait_for(lambda: fq.get(long_q, holder).state == "running", what="the long job to start")
        time.sleep(0.2)  # the heartbeat thread is asleep until the long job's beat (~1 s away)
        ids = []
        for _ in range(4):
            ids.append(fq.enqueue(short_q, {}).id)
            time.sleep(0.15)
        wait_for(
            lambda: all(fq.get(short_q, i).state in ("succeeded", "dead") for i in ids),
            timeout=15,
            what="the short jobs",
        )
    finally:
        release.set()
        stats = stop(worker, thread, out)
    states = [(fq.get(short_q, i).state, fq.get(short_q, i).attempts) for i in ids]
    assert lost == [] and stats.settle_errors == 0, (lost, stats)
    assert states == [("succeeded", 1)] * 4, states


def test_a_job_timeout_shorter_than_the_heartbeat_sleep_is_noticed_and_reaped_by_the_worker():
    """A capped lease (timeout 300 ms, lease 30 s) claimed while the heartbeat thread sleeps: the
    heartbeat thread must wake for its end, record the timeout and reap it (no reaper runs here),
    while the handler ignores the lease."""
    long_q, capped_q = "rv.cap.long", "rv.cap.short"
    fq.configure(long_q, visibility_ms=3_000)
    fq.configure(capped_q, visibility_ms=30_000, timeout_ms=300, max_attempts=1)
    release = threading.Event()

    def hold(job):
        release.wait(10)

    worker = Worker(
        [long_q, capped_q], handlers={long_q: hold, capped_q: hold}, concurrency=4, poll_interval_ms=5,
        max_poll_interval_ms=20, reaper=False,
    )  # fmt: skip
    thread, out = start(worker)
    try:
        holder = fq.enqueue(long_q, {}).id
        wait_for(lambda: fq.get(long_q, holder).state == "running", what="the long job to start")
        time.sleep(0.2)
        job = fq.enqueue(capped_q, {}).id
        # The worker's heartbeat thread reaps it while its handler still blocks.
        wait_for(lambda: fq.get(capped_q, job).state == "dead", timeout=5, what="the timed-out job to be reaped")
        assert "timeout" in (fq.get(capped_q, job).last_error or "").lower()
    finally:
        release.set()
        stop(worker, thread, out)


# --- adaptive claim size ------------------------------------------------------------------------


def test_a_queue_woken_after_a_lull_is_served_while_another_queue_floods_the_worker():
    """Queue B is idle (its ask shrinks to 2) while A has a backlog of 600 jobs; a job enqueued on B
    must run long before A's backlog is drained."""
    a, b = "rv.fair.a", "rv.fair.b"
    fq.configure(b, max_attempts=1)
    order: list[str] = []
    lock = threading.Lock()

    def handler(job):
        time.sleep(0.002)
        with lock:
            order.append(job.queue)

    worker = Worker(
        [a, b],
        handlers={a: handler, b: handler},
        concurrency=4,
        poll_interval_ms=5,
        max_poll_interval_ms=20,
        reaper=False,
    )
    thread, out = start(worker)
    try:
        time.sleep(0.2)  # a few empty rounds: both asks are down to 2
        fq.enqueue_many(a, [{"payload": i} for i in range(600)])
        wait_for(lambda: len(order) >= 40, what="A to be under way")
        fq.enqueue(b, {"late": True})
        wait_for(lambda: b in order, timeout=15, what="B's job to run")
        position = order.index(b)
        wait_for(lambda: fq.stats(a).counts["succeeded"] == 600, timeout=30, what="A to drain")
    finally:
        stats = stop(worker, thread, out)
    assert stats.ok == 601 and stats.settle_errors == 0
    assert position < 400, position  # served alongside A's backlog, not after it


@pytest.mark.parametrize("prefetch", [0, 7])
def test_burst_over_three_queues_drains_every_job_before_saying_nothing_is_left(prefetch):
    queues = ["rv.burst.a", "rv.burst.b", "rv.burst.c"]
    fq.configure(queues[0], max_attempts=1)  # exists, empty
    fq.enqueue(queues[1], {"one": 1})
    fq.enqueue_many(queues[2], [{"payload": i} for i in range(257)])
    ran: list[str] = []
    lock = threading.Lock()

    def handler(job):
        with lock:
            ran.append(job.id)

    worker = Worker(
        queues,
        handlers=dict.fromkeys(queues, handler),
        concurrency=3,
        prefetch=prefetch,
        burst=True,
        poll_interval_ms=5,
        reaper=False,
    )
    stats = worker.run()
    assert stats.ok == 258 and stats.claimed == 258 and len(set(ran)) == 258
    assert fq.stats(queues[1]).counts["succeeded"] == 1
    assert fq.stats(queues[2]).counts == {**fq.stats(queues[2]).counts, "ready": 0, "running": 0, "succeeded": 257}


def test_max_jobs_is_exact_across_queues_with_growing_asks():
    queues = ["rv.max.a", "rv.max.b", "rv.max.c"]
    for q in queues:
        fq.enqueue_many(q, [{"payload": i} for i in range(40)])
    worker = Worker(
        queues, handlers=dict.fromkeys(queues, lambda job: None), concurrency=4, prefetch=5, max_jobs=37,
        poll_interval_ms=5, reaper=False,
    )  # fmt: skip
    stats = worker.run()
    done = sum(fq.stats(q).counts["succeeded"] for q in queues)
    left = sum(fq.stats(q).counts["ready"] for q in queues)
    running = sum(fq.stats(q).counts["running"] for q in queues)
    assert (stats.claimed, stats.ok, done, left, running) == (37, 37, 37, 83, 0)


def test_burst_with_a_queue_concurrency_limit_drains_it_and_never_exceeds_the_limit():
    q = "rv.limit"
    fq.configure(q, concurrency=2, max_attempts=1)
    fq.enqueue_many(q, [{"payload": i} for i in range(60)])
    lock = threading.Lock()
    now = {"running": 0, "peak": 0}

    def handler(job):
        with lock:
            now["running"] += 1
            now["peak"] = max(now["peak"], now["running"])
        time.sleep(0.002)
        with lock:
            now["running"] -= 1

    worker = Worker([q], handlers={q: handler}, concurrency=8, prefetch=4, burst=True, poll_interval_ms=5, reaper=False)
    stats = worker.run()
    assert stats.ok == 60 and fq.stats(q).counts["succeeded"] == 60
    assert now["peak"] <= 2, now


def test_asks_grow_again_after_a_claim_cut_short_by_max_jobs_or_free_slots(monkeypatch):
    """A claim that got all it asked for only because few slots were free must not leave the next
    ask stuck low: a burst run then still drains in batches, not job by job."""
    q = "rv.ramp"
    fq.enqueue_many(q, [{"payload": i} for i in range(400)])
    asks = record_claims(monkeypatch)
    worker = Worker([q], handlers={q: lambda job: None}, concurrency=16, burst=True, poll_interval_ms=5, reaper=False)
    stats = worker.run()
    assert stats.ok == 400
    assert asks[0] == (16, 16), asks  # a new worker asks for every free slot
    assert all(count >= 2 for count, _ in asks), asks
    assert len([1 for _, got in asks if got]) <= 100, asks  # batches, not 400 claims of one


def test_after_a_lull_asks_ramp_2_8_32_then_exactly_the_free_slots(monkeypatch):
    """The ramp of the asks, made deterministic: no job finishes until the worker is full, so the
    free slots are known at every claim (64 - 2 - 8 - 32 = 22). The exact sequence that
    test_inprocess.test_claims_ask_for_few_jobs_after_a_lull_... can only bound, as there jobs finish
    between two claims."""
    q = "rv.ramp.gate"
    fq.configure(q, max_attempts=1)
    asks = record_claims(monkeypatch)
    gate = threading.Event()
    worker = Worker(
        [q],
        handlers={q: lambda job: gate.wait(10)},
        concurrency=64,
        poll_interval_ms=5,
        max_poll_interval_ms=20,
        reaper=False,
    )
    thread, out = start(worker)
    try:
        wait_for(lambda: (64, 0) in asks, what="an empty first claim")
        wait_for(lambda: (2, 0) in asks, what="an idle claim of 2")
        seen = len(asks)
        fq.enqueue_many(q, [{"payload": i} for i in range(500)])
        wait_for(lambda: worker.running_count == 64, what="the worker to fill up")
        burst = [count for count, got in asks[seen:] if got]
        assert burst == [2, 8, 32, 22], asks[seen:]
        gate.set()
        wait_for(lambda: fq.stats(q).counts["succeeded"] == 500, timeout=20, what="the drain")
    finally:
        gate.set()
        stats = stop(worker, thread, out)
    assert stats.ok == 500 and stats.settle_errors == 0
