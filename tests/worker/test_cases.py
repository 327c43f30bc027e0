"""Acceptance cases C01, C03, C07, C09, C10, C11, C12 against real ``fq_worker`` processes.

Workers run as child processes on this test's database (``tests.worker_settings``),
serving the ``t.ctl`` queue whose handler (``tests/testapp/fq_handlers.py``)
is steered by the payload and reports what it saw to a JSON-lines file. Where
a lease must run out, the test either waits on a short visibility or moves
the database clock of its own process (``clock`` fixture) and runs the reaper
itself; deadlines always come from the database.
"""

from __future__ import annotations

import itertools
import signal
import time

import pytest
from django.db import connection

from django_fq import db
from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt
from tests.testapp.models import Done

from .helpers import LeaseSampler, live_leases, touch, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.ctl"
#: Poll, reap and back off quickly in every test worker.
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def advance_db_clock_to(clock, target_ms: int) -> int:
    """Shift this process's database clock so that it reads at least ``target_ms``."""
    now = db.db_now_ms()
    if now < target_ms:
        clock.advance(target_ms - now)
        now = db.db_now_ms()
    assert now >= target_ms
    return now


def reap_until(queue: str, expired: int = 1, tries: int = 50):
    """Reap ``queue`` until ``expired`` leases were handled (a lease locked by an extend is skipped once)."""
    total = 0
    for _ in range(tries):
        total += fq.reap(queue).expired
        if total >= expired:
            return total
        time.sleep(0.02)
    raise AssertionError(f"reaped {total} lease(s), expected {expired}")


# --- C01 ------------------------------------------------------------------------------------------


def test_c01_worker_with_the_same_id_does_not_keep_a_dead_workers_lease(workers, events, gate):
    """kill -9 a worker mid-job; another live process with the same worker id neither extends nor steals the lease.

    Only the lease deadline decides: the job stays running until it, then the
    reaper requeues it and it runs again (attempt 2).
    """
    fq.configure(Q, backoff_ms=0)
    job = fq.enqueue(Q, {"events": events.path, "gate": str(gate)}).id
    args = (f"--queue={Q}", "--worker-id=worker-7", "--visibility=4000", *FAST)

    first = workers(*args)
    [start] = events.wait_for("start", job)
    assert start["pid"] == first.pid and start["attempt"] == 1
    # A second process under the very same worker id, up and polling (as after a restart).
    second = workers(*args)
    second.wait_for("worker.start")
    first.kill()
    killed = fq.get(Q, job)
    assert (killed.state, killed.worker) == ("running", "worker-7")
    deadline = killed.lease_deadline

    touch(gate)  # the next run may finish
    time.sleep(0.2)  # several reaper and claim rounds of the live process
    seen_at = db.db_now_ms()
    info = fq.get(Q, job)
    assert seen_at < deadline, "the machine was too slow for this check"
    # Same worker id, alive and polling: yet the old lease is neither extended nor taken.
    assert (info.state, info.lease_deadline, info.attempts) == ("running", deadline, 1)

    again = events.wait_for("start", job, n=2, timeout=30)[1]
    assert again["pid"] == second.pid and again["attempt"] == 2
    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the second run to finish")
    info = fq.get(Q, job)
    assert info.attempts == 2
    [expired] = info.errors
    assert (expired["kind"], expired["attempt"], expired["worker"]) == ("expired", 1, "worker-7")
    assert expired["at"] >= deadline
    assert info.claimed_at >= deadline
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=20) == 0


# --- C03 ------------------------------------------------------------------------------------------


def test_c03_worker_learns_of_a_lost_lease_within_a_heartbeat_and_does_not_ack(workers, events, clock):
    fq.configure(Q, backoff_ms=0)
    job = fq.enqueue(Q, {"events": events.path, "until_lost": True}).id
    # 2 s leases: the worker extends every ~0.67 s while the handler runs.
    w1 = workers(f"--queue={Q}", "--visibility=2000", "--no-reaper", "--worker-id=w1", *FAST)
    events.wait_for("start", job)
    assert fq.claim(Q) == []  # a heart-beating lease is never handed out again

    # From the database's point of view W1 now held the lease 5 s without extending it:
    # move this process's clock on, let the reaper requeue the job, claim it as W2.
    clock.advance(5000)
    reap_until(Q)
    [second] = fq.claim(Q, visibility_ms=60_000, worker="w2")
    taken = time.monotonic()
    assert (second.id, second.attempts) == (job, 2)

    [lost] = events.wait_for("lost", job, timeout=10)
    assert lost["reason"] == "invalid_receipt" and lost["raised"] == "invalid_receipt"
    assert lost["timed_out"] is False
    # Told within one heartbeat interval (0.67 s), plus slack for a busy machine.
    assert lost["t"] - taken < 2.0
    w1.wait_for(rf"job.lease_lost job={job} queue={Q} attempt=1/25 reason=invalid_receipt")
    w1.wait_for(rf"job.not_settled job={job} .*reason=lease_lost:invalid_receipt")
    assert w1.count(rf"job.acked job={job}") == 0

    # W1's handler returned normally, but nothing was settled with its receipt: W2 still holds the job.
    info = fq.get(Q, job)
    assert (info.state, info.worker, info.attempts) == ("running", "w2", 2)
    assert fq.ack(Q, second.receipt, result={"by": "w2"}).state == "succeeded"
    assert fq.get(Q, job).result == {"by": "w2"}

    # W1 carries on with the next job (enqueued on the real clock, which W1 uses).
    clock.advance(-5000)
    nxt = fq.enqueue(Q, {"events": events.path}).id
    wait_until(lambda: fq.get(Q, nxt).state == "succeeded", what="W1 to run the next job")
    w1.signal(signal.SIGTERM)
    assert w1.wait(timeout=20) == 0


# --- C07 ------------------------------------------------------------------------------------------


def test_c07_concurrency_limit_holds_across_a_dead_holder_and_its_late_ack(workers, events, gate):
    fq.configure(Q, concurrency=1, backoff_ms=0)
    ids = [fq.enqueue(Q, {"events": events.path, "gate": str(gate), "n": n}).id for n in range(3)]
    # W1 is this test process: it claims J1 and then behaves like a killed worker (never extends, never acks).
    [held] = fq.claim(Q, visibility_ms=500, worker="w1")
    assert held.id == ids[0]

    with LeaseSampler(Q) as sampler:
        w2 = workers(f"--queue={Q}", "--concurrency=4", "--worker-id=w2", *FAST)
        # Once J1's lease expires W2 may take one job, and only one, although it has 4 free slots.
        [_first] = events.wait_for("start", timeout=20)
        time.sleep(0.3)
        assert len(events.of("start")) == 1
        assert fq.stats(Q).counts["running"] == 1

        # W1's late ack fails and frees no slot.
        with pytest.raises(InvalidReceipt):
            fq.ack(Q, held.receipt)
        time.sleep(0.3)
        assert len(events.of("start")) == 1
        assert live_leases(Q) == 1

        touch(gate)
        wait_until(lambda: all(fq.get(Q, i).state == "succeeded" for i in ids), what="all jobs done")
        w2.signal(signal.SIGTERM)
        assert w2.wait(timeout=20) == 0

    assert max(sampler.samples) == 1
    assert max(sampler.running) <= 1
    # Handler runs never overlapped.
    runs = sorted((s["t"], e["t"]) for s in events.of("start") for e in events.of("end") if e["id"] == s["id"])
    assert len(runs) == 3
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(runs))
    j1 = fq.get(Q, ids[0])
    assert j1.attempts == 2 and [e["kind"] for e in j1.errors] == ["expired"]
    assert fq.stats(Q).totals["acked"] == 3


# --- C09 ------------------------------------------------------------------------------------------


def test_c09_killed_workers_job_is_retried_until_attempts_run_out_and_retry_works(workers, events, gate, clock):
    fq.configure(Q, max_attempts=3, backoff_ms=1000)
    job = fq.enqueue(Q, {"events": events.path, "gate": str(gate)}).id

    def listed(state: str) -> bool:
        return job in [j.id for j in fq.jobs(Q, state=state, count=100).jobs]

    for attempt in (1, 2, 3):
        worker = workers(f"--queue={Q}", "--visibility=60000", "--no-reaper", *FAST)
        run = events.wait_for("start", job, n=attempt)[-1]
        assert (run["attempt"], run["pid"]) == (attempt, worker.pid)
        deadline = fq.get(Q, job).lease_deadline
        worker.kill()
        assert listed("running")

        advance_db_clock_to(clock, deadline)
        reap_until(Q)
        info = fq.get(Q, job)
        assert info.attempts == attempt
        assert [e["kind"] for e in info.errors] == ["expired"] * attempt
        if attempt < 3:
            assert info.state == "scheduled" and listed("scheduled")
            assert info.run_at == deadline + 1000 * 2 ** (attempt - 1)  # backoff counted from the expiry
            advance_db_clock_to(clock, info.run_at)
            assert listed("ready")
        else:
            assert info.state == "dead" and listed("dead")
    assert fq.stats(Q).totals["dead"] == 1

    again = fq.retry(Q, job)
    assert (again.state, again.attempts) == ("ready", 0)
    touch(gate)
    last = workers(f"--queue={Q}", "--burst", *FAST)
    assert last.wait(timeout=30) == 0, last.stderr
    info = fq.get(Q, job)
    assert (info.state, info.attempts) == ("succeeded", 1)
    assert len(events.of("start", job)) == 4


# --- C10 ------------------------------------------------------------------------------------------


def test_c10_sigterm_lets_short_jobs_finish_and_releases_the_rest(workers, events, gate):
    fq.configure(Q, backoff_ms=0)
    # A "30 s" job (it waits for the gate, at most 30 s) under a 1 h lease, and a job that ends within the grace.
    long = fq.enqueue(Q, {"events": events.path, "gate": str(gate), "gate_timeout_s": 30}).id
    w1 = workers(f"--queue={Q}", "--concurrency=2", "--grace=2", "--visibility=3600000", "--worker-id=w1", *FAST)
    events.wait_for("start", long)
    short = fq.enqueue(Q, {"events": events.path, "sleep_ms": 800}).id
    events.wait_for("start", short)
    w2 = workers(f"--queue={Q}", "--worker-id=w2", "--poll-interval=10", "--max-poll-interval=100", "--no-reaper")
    w2.wait_for("worker.start")

    signalled = time.monotonic()
    w1.signal(signal.SIGTERM)
    w1.wait_for("worker.signal .*signal=SIGTERM action=graceful")
    # W1 stops claiming at once: a job enqueued now is W2's, although W1 has a free slot soon.
    late = fq.enqueue(Q, {"events": events.path}).id
    assert w1.wait(timeout=30) == 0, w1.stderr
    exited = time.monotonic()
    assert exited - signalled >= 1.9  # the grace period was given to the long job

    s = fq.get(Q, short)
    assert (s.state, s.worker, s.attempts) == ("succeeded", "w1", 1)
    assert len(events.of("start", short)) == 1 and w1.count(rf"job.acked job={short}") == 1
    wait_until(lambda: fq.get(Q, late).state == "succeeded", what="W2 to run the late job")
    assert fq.get(Q, late).worker == "w2"
    assert [e["pid"] for e in events.of("start", late)] == [w2.pid]

    w1.wait_for(rf"job.released job={long} queue={Q} attempt=1/25 reason=shutdown")
    # Released (ready at once, attempt given back) and claimed by W2 within a second.
    info = wait_until(lambda: (lambda i: i if i.worker == "w2" and i.state == "running" else None)(fq.get(Q, long)))
    release = info.errors[-1]
    assert (release["kind"], release["error"], release["worker"]) == ("release", "shutdown", "w1")
    assert info.attempts == 1  # 1 (W1) - 1 (release) + 1 (W2)
    assert 0 <= info.claimed_at - release["at"] < 1000
    assert fq.stats(Q).totals["released"] == 1
    assert "fq_worker: 1 jobs ok, 0 failed" not in w1.stdout  # not a burst run: no summary line

    touch(gate)
    wait_until(lambda: fq.get(Q, long).state == "succeeded", what="W2 to finish the released job")
    assert fq.get(Q, long).attempts == 1
    w2.signal(signal.SIGTERM)
    assert w2.wait(timeout=20) == 0


def test_c10_second_signal_exits_at_once_and_leaves_the_lease_to_expire(workers, events, gate):
    job = fq.enqueue(Q, {"events": events.path, "gate": str(gate)}).id
    worker = workers(f"--queue={Q}", "--grace=30", "--visibility=3600000", *FAST)
    events.wait_for("start", job)
    deadline_before = fq.get(Q, job).lease_deadline

    worker.signal(signal.SIGTERM)
    worker.wait_for("worker.signal")
    second = time.monotonic()
    worker.signal(signal.SIGTERM)
    code = worker.wait(timeout=20)
    assert time.monotonic() - second < 5  # far inside the 30 s grace
    assert code == 128 + signal.SIGTERM
    assert "worker.forced_exit" in worker.stderr

    info = fq.get(Q, job)
    # Not released: the lease stays until its deadline (then the reaper decides).
    assert info.state == "running" and info.attempts == 1
    assert info.lease_deadline >= deadline_before
    assert info.errors == []
    assert fq.stats(Q).totals["released"] == 0


# --- C11 ------------------------------------------------------------------------------------------


def test_c11_job_cancelled_while_running_ends_cancelled_and_the_worker_carries_on(workers, events):
    job = fq.enqueue(Q, {"events": events.path, "until_lost": True}).id
    worker = workers(f"--queue={Q}", "--visibility=1000", *FAST)  # heartbeat every 0.33 s
    events.wait_for("start", job)

    fq.cancel(Q, job)
    [lost] = events.wait_for("lost", job, timeout=10)
    assert lost["reason"] == "cancelled" and lost["raised"] == "cancelled"
    worker.wait_for(rf"job.lease_lost job={job} .*reason=cancelled")
    worker.wait_for(rf"job.not_settled job={job} .*reason=lease_lost:cancelled")

    nxt = fq.enqueue(Q, {"events": events.path}).id
    wait_until(lambda: fq.get(Q, nxt).state == "succeeded", what="the next job")
    time.sleep(1.1)  # past the old lease's visibility and many reaper rounds
    info = fq.get(Q, job)
    assert info.state == "cancelled" and info.attempts == 1
    assert [e["kind"] for e in info.errors] == ["cancel"]
    assert fq.stats(Q).totals["expired"] == fq.stats(Q).totals["nacked"] == 0
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


@pytest.mark.parametrize("queue, op", [("t.cancelself", "ack"), ("t.cancelfail", "nack")])
def test_c11_settle_of_a_cancelled_job_gets_the_cancelled_error_and_is_never_requeued(workers, queue, op):
    gone = fq.enqueue(queue, {}).id
    others = [fq.enqueue("t.ok", {"n": n}).id for n in range(2)]

    worker = workers(f"--queue={queue}", "--queue=t.ok", "--burst", *FAST)
    assert worker.wait(timeout=30) == 0, worker.stderr

    info = fq.get(queue, gone)
    assert info.state == "cancelled" and info.attempts == 1
    assert [e["kind"] for e in info.errors] == ["cancel"]
    assert f"job.cancelled job={gone} queue={queue} attempt=1/25" in worker.stderr
    assert "code=cancelled" in worker.stderr
    assert {fq.get("t.ok", i).state for i in others} == {"succeeded"}
    assert "2 jobs ok, 0 failed, 1 not settled" in worker.stdout
    totals = fq.stats(queue).totals
    assert totals["nacked"] == totals["acked"] == totals["expired"] == 0


# --- C12 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault, replay", [("ack_before=1", False), ("ack_after=1", True)])
def test_c12_ack_interrupted_by_a_dropped_connection_is_retried_safely(workers, events, fault, replay):
    """The connection drops during an ack, before it reached the database or after it committed.

    The worker reconnects and repeats the very same ack; the job ends
    succeeded once (a repeat of a committed ack is answered as a replay).
    """
    ids = [fq.enqueue(Q, {"events": events.path, "done": True, "n": n}).id for n in range(2)]
    worker = workers(f"--queue={Q}", "--burst", *FAST, env={"DJANGO_SETTINGS_MODULE": "tests.worker_fault_settings", "FQ_TEST_WORKER_FAULTS": fault})
    assert worker.wait(timeout=30) == 0, worker.stderr

    for job in ids:
        info = fq.get(Q, job)
        assert (info.state, info.attempts, info.errors) == ("succeeded", 1, [])
        assert len(events.of("start", job)) == 1
    assert Done.objects.count() == 2
    assert fq.stats(Q).totals["acked"] == 2
    assert worker.count(r"job.settle_retry .*op=ack tries=1 .*test fault") == 1
    assert worker.count(r"worker.reconnected .*step=ack tries=2 replay=" + ("true" if replay else "false")) == 1
    assert worker.count(r"job.acked ") == 2
    assert worker.count(r"job.acked .*replay=true") == int(replay)
    assert "2 jobs ok, 0 failed" in worker.stdout


@pytest.mark.postgres_only
@pytest.mark.no_pooler("it ends the server sessions, and PgBouncer gives the next transaction a fresh one: the worker sees no error to retry")
def test_c12_server_drops_every_worker_connection_mid_job(workers, events, gate):
    """PostgreSQL terminates the worker's sessions while a job runs; the ack that follows reconnects and lands."""
    # A first job opens the completer thread's session (acks are sent from there), so the
    # kill below hits the connection the next ack will use.
    worker = workers(f"--queue={Q}", "--visibility=5000", *FAST)
    warm = fq.enqueue(Q, {"events": events.path}).id
    wait_until(lambda: fq.get(Q, warm).state == "succeeded", what="the warm-up job")
    # The runner thread queries the database before waiting, so its session is one of those killed.
    job = fq.enqueue(Q, {"events": events.path, "gate": str(gate), "touch_db": True}).id
    events.wait_for("touched", job)

    with connection.cursor() as cur:
        cur.execute(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        assert cur.fetchone()[0] >= 2  # at least the claim loop's and the listener's sessions
    touch(gate)

    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the ack after the connection loss")
    info = fq.get(Q, job)
    assert (info.attempts, info.errors) == (1, [])
    assert len(events.of("start", job)) == 1
    worker.wait_for(rf"job.acked job={job}")
    assert worker.count(rf"job.settle_retry job={job} .*op=ack") >= 1

    # The worker goes on with fresh connections.
    nxt = fq.enqueue(Q, {"events": events.path}).id
    wait_until(lambda: fq.get(Q, nxt).state == "succeeded", what="the next job")
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
