"""The worker run in the test process (threads), for what needs a hook inside it: injected
database errors, the reaper's prune/scheduler calls, the handler's view of its lease."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError

from django_fq import services
from django_fq import services as fq
from django_fq.worker import JobContext, LeaseLost, Worker, _LeaseState, current_job, emit
from tests.listening import listen_alias

from .helpers import record_claims

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.inproc"


def ok_handler(job):
    return {"id": job.id}


def run_for(worker: Worker, seconds: float):
    """Run ``worker`` on a thread for ``seconds``, then stop it and return its stats."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("stats", worker.run()))
    thread.start()
    time.sleep(seconds)
    worker.request_stop("test over")
    thread.join(timeout=30)
    assert not thread.is_alive()
    return out["stats"]


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "django_fq.worker"]


def test_claim_loop_survives_database_errors_and_logs_the_reconnect(monkeypatch, caplog):
    real_claim = services.claim
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OperationalError("server closed the connection unexpectedly")
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(services, "claim", flaky)
    job = fq.enqueue(Q, {}).id
    worker = Worker([Q], handlers={Q: ok_handler}, burst=True, poll_interval_ms=10, reaper=False)
    with caplog.at_level(logging.INFO, logger="django_fq.worker"):
        stats = worker.run()

    assert stats.ok == 1
    assert fq.get(Q, job).state == "succeeded"
    lines = messages(caplog)
    assert sum("worker.db_error" in m and "step=claim" in m for m in lines) == 2
    assert any(m.startswith("worker.reconnected") and "step=claim" in m for m in lines)


def test_reaper_round_prunes_and_runs_due_periodic_jobs_and_survives_their_errors(monkeypatch, caplog):
    class FakeScheduler:
        calls = 0

        def run_due(self):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("bad schedule")
            return 1

    prunes = {"n": 0}
    real_prune = services.prune

    def counting_prune(**kwargs):
        prunes["n"] += 1
        return real_prune(**kwargs)

    monkeypatch.setattr(services, "prune", counting_prune)
    fake = FakeScheduler()
    worker = Worker([Q], handlers={Q: ok_handler}, reaper_interval_ms=20, prune_interval_ms=60_000, poll_interval_ms=10)
    monkeypatch.setattr(worker.reaping, "scheduler_module", lambda: fake)
    with caplog.at_level(logging.INFO, logger="django_fq.worker"):
        run_for(worker, 0.4)

    assert fake.calls >= 4  # every reaper round, on past the failing one
    assert prunes["n"] == 1  # once at start, then every 60 s
    lines = messages(caplog)
    assert any(m.startswith("scheduler.error") and "bad schedule" in m for m in lines)
    assert any(m == "scheduler.enqueued jobs=1" for m in lines)

    prunes["n"] = 0
    quiet = Worker([Q], handlers={Q: ok_handler}, reaper_interval_ms=20, prune_interval_ms=0, poll_interval_ms=10)
    monkeypatch.setattr(quiet.reaping, "scheduler_module", lambda: None)
    run_for(quiet, 0.2)
    assert prunes["n"] == 0


def test_graceful_stop_releases_what_outlives_the_grace_and_tells_its_handler():
    told = {}
    release = threading.Event()
    started = threading.Semaphore(0)

    def handler(job):
        started.release()
        if job.payload.get("quick"):
            release.wait(5)
            return {"quick": True}
        try:
            while True:
                job.sleep(0.05)
        except LeaseLost as exc:
            told["reason"], told["lost"] = exc.reason, job.lease_lost
            raise

    slow = fq.enqueue(Q, {}).id
    quick = fq.enqueue(Q, {"quick": True}).id
    worker = Worker([Q], handlers={Q: handler}, concurrency=2, grace_s=0.5, poll_interval_ms=10, reaper=False)
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("stats", worker.run()))
    thread.start()
    # Both handlers are running (a claimed job that has not started yet would be given back at once).
    assert started.acquire(timeout=10) and started.acquire(timeout=10)
    worker.request_stop("test")
    time.sleep(0.1)
    release.set()  # the quick job ends inside the grace period
    thread.join(timeout=10)

    stats = out["stats"]
    assert (stats.ok, stats.released) == (1, 1)
    assert fq.get(Q, quick).state == "succeeded"
    info = fq.get(Q, slow)
    assert (info.state, info.attempts, info.last_error) == ("ready", 0, "shutdown")
    deadline = time.monotonic() + 5
    while "reason" not in told and time.monotonic() < deadline:
        time.sleep(0.01)
    assert told == {"reason": "shutdown", "lost": True}


def test_handler_exits_and_lease_lost_never_kill_a_runner(caplog):
    def handler(job):
        if job.payload["kind"] == "exit":
            raise SystemExit(3)
        if job.payload["kind"] == "lost":
            raise LeaseLost("expired")
        return "fine"

    fq.configure(Q, backoff_ms=60_000)
    ids = {kind: fq.enqueue(Q, {"kind": kind}).id for kind in ("exit", "lost", "ok")}
    with caplog.at_level(logging.INFO, logger="django_fq.worker"):
        stats = Worker([Q], handlers={Q: handler}, burst=True, poll_interval_ms=10, reaper=False).run()
    assert (stats.ok, stats.failed, stats.settle_errors) == (1, 1, 1)
    assert fq.get(Q, ids["exit"]).last_error.startswith("SystemExit: 3")
    assert fq.get(Q, ids["ok"]).result == "fine"
    assert fq.get(Q, ids["lost"]).state == "running"  # not settled: its lease runs out and the reaper decides
    assert any(m.startswith(f"job.not_settled job={ids['lost']}") and "lease_lost:expired" in m for m in messages(caplog))


def test_job_context_reports_lease_loss_and_never_holds_a_receipt():
    state = _LeaseState(deadline=1_000, expires_mono=time.monotonic() + 60)
    ctx = JobContext(id="a" * 32, queue="q", payload={"p": 1}, attempts=2, max_attempts=5, deadline=1_000,
                     enqueued_at=1, claimed_at=5, lease=state)
    assert current_job() is None
    assert (ctx.attempt, ctx.deadline, ctx.lease_lost, ctx.lost_reason, ctx.timed_out) == (2, 1_000, False, None, False)
    ctx.check()
    state.deadline = 2_000
    assert ctx.deadline == 2_000

    threading.Timer(0.05, state.mark_lost, args=("cancelled",)).start()
    started = time.monotonic()
    with pytest.raises(LeaseLost) as raised:
        ctx.sleep(30)
    assert raised.value.reason == "cancelled" and time.monotonic() - started < 10
    assert (ctx.lease_lost, ctx.lost_reason) == (True, "cancelled")

    # A deadline that may have passed without an extend is a loss too; at the job's timeout it is a timeout.
    expired = _LeaseState(deadline=1, expires_mono=time.monotonic() - 1)
    expired.at_timeout = True
    late = JobContext(id="b" * 32, queue="q", payload=None, attempts=1, max_attempts=1, deadline=1, enqueued_at=1, lease=expired)
    assert (late.lease_lost, late.lost_reason, late.timed_out) == (True, "timeout", True)
    with pytest.raises(LeaseLost, match="timeout"):
        late.check()
    assert "fq1." not in repr(ctx) + repr(state)
    assert not hasattr(ctx, "receipt")


def test_log_lines_are_key_value_and_quote_what_needs_it(caplog):
    with caplog.at_level(logging.INFO, logger="django_fq.worker"):
        emit(logging.INFO, "job.nacked", job="j1", ms=5, ok=True, skip=None, error='Boom: a "b" c=d')
    [record] = [r for r in caplog.records if r.name == "django_fq.worker"]
    assert record.getMessage() == 'job.nacked job=j1 ms=5 ok=true error="Boom: a \\"b\\" c=d"'
    assert record.fq == {"event": "job.nacked", "job": "j1", "ms": 5, "ok": True, "error": 'Boom: a "b" c=d'}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"concurrency": 0}, "--concurrency"),
        ({"processes": 0}, "--processes"),
        ({"poll_interval": 500, "max_poll_interval": 100}, "--max-poll-interval"),
        ({"grace": -1}, "--grace"),
    ],
)
def test_command_rejects_bad_options(options, message):
    with pytest.raises(CommandError, match=message):
        call_command("fq_worker", queues=["t.ok"], burst=True, **options)


@pytest.mark.postgres_only
def test_listener_calls_subscribers_on_each_committed_enqueue():
    from django_fq import wakeup

    seen: list = []

    def record(queue):
        seen.append(queue)

    listener = wakeup.Listener("default")
    try:
        # It listens through FQ_LISTEN_DATABASE when the project names one (behind a pooler), else "default".
        assert listener.active and listener.listen_alias == listen_alias()
        deadline = time.monotonic() + 10
        while not listener.listening and time.monotonic() < deadline:
            time.sleep(0.01)
        listener.subscribe(record)
        fq.enqueue("t.sub", {})
        deadline = time.monotonic() + 10
        while "t.sub" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "t.sub" in seen
        listener.unsubscribe(record)
        seen.clear()
        fq.enqueue("t.sub", {})
        time.sleep(0.3)
        assert "t.sub" not in seen
    finally:
        listener.stop()
        listener._thread.join(timeout=5)


def test_the_listener_listens_exactly_where_the_database_can_notify():
    from django.db import connection

    from django_fq import storage, wakeup

    assert wakeup.listener().active is storage.for_connection(connection).supports_listen_notify


def _listening_now():
    """The process's listener, once it hears other processes (where the database can notify)."""
    from django_fq import wakeup

    listener = wakeup.listener()
    deadline = time.monotonic() + 10
    while listener.active and not listener.listening and time.monotonic() < deadline:
        time.sleep(0.01)
    assert listener.listening or not listener.active
    return listener


def test_an_enqueue_in_the_workers_own_process_wakes_it_at_once(monkeypatch):
    """An idle worker polling every 10 s starts a job enqueued by its own process within 2 s, on every database.

    Where the database cannot notify (docs/reference/semantics.md §7: workers poll), the enqueue's
    commit wakes this process's waiters itself; on PostgreSQL the NOTIFY does.
    """
    fq.configure(Q)
    _listening_now()
    asks = record_claims(monkeypatch)
    started = threading.Event()
    worker = Worker(
        [Q],
        handlers={Q: lambda job: started.set()},
        poll_interval_ms=10_000,
        max_poll_interval_ms=10_000,
        reaper=False,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not asks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asks == [(asks[0][0], 0)]  # one empty round: the worker sleeps now, for 10 s
        time.sleep(0.2)  # well into that sleep
        t0 = time.monotonic()
        fq.enqueue(Q, {})
        assert started.wait(5)
        assert time.monotonic() - t0 < 2.0
        # Woken, not a poll: the very next claim took the job. (Once the job is done its freed
        # slot may ring for one more, empty, claim: that one comes after and proves nothing.)
        assert asks[1] == (asks[0][0], 1)
    finally:
        worker.request_stop("test over")
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_an_in_process_wakeup_comes_at_commit_and_never_after_a_rollback():
    from django.db import transaction

    listener = _listening_now()
    seen: list = []
    record = seen.append
    listener.subscribe(record)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            fq.enqueue(Q, {"n": 1})
            assert Q not in seen  # not before the commit
            raise RuntimeError
        mark = listener.mark()
        assert not listener.wait(mark, {Q}, 0.3)
        assert Q not in seen
        with transaction.atomic():
            fq.enqueue(Q, {"n": 2})
            assert Q not in seen
        assert listener.wait(mark, {Q}, 5)
        deadline = time.monotonic() + 5
        while Q not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert Q in seen
    finally:
        listener.unsubscribe(record)


def test_prefetch_claims_ahead_and_a_stop_gives_unstarted_jobs_back_at_once():
    """With one thread and prefetch 9, one claim takes 10 jobs; on stop, the 9 waiting ones are released."""
    ids = [r.id for r in fq.enqueue_many(Q, [{"payload": n} for n in range(10)])]
    started = threading.Event()
    release_first = threading.Event()
    ran = []

    def slow(job):
        ran.append(job.id)
        started.set()
        release_first.wait(10)
        return None

    worker = Worker([Q], handlers={Q: slow}, concurrency=1, prefetch=9, poll_interval_ms=10, reaper=False, grace_s=5)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(10)
    assert fq.stats(Q).counts["running"] == 10  # claimed in one batch: 1 running + 9 waiting
    worker.request_stop("test over")
    release_first.set()  # the running job finishes within the grace period
    thread.join(timeout=30)
    assert not thread.is_alive()

    assert ran == [ids[0]]
    assert fq.get(Q, ids[0]).state == "succeeded"
    for job in ids[1:]:
        info = fq.get(Q, job)
        assert (info.state, info.attempts) == ("ready", 0)  # given back, the attempt not counted
    assert fq.stats(Q).totals["released"] == 9


def test_claims_ask_for_few_jobs_after_a_lull_and_for_full_batches_again_under_a_burst(monkeypatch):
    """An idle worker woken for one job prepares a couple of receipts, not one per free thread;
    a burst of work brings the asks back up to the free slots within a few claims."""
    asks = record_claims(monkeypatch)
    fq.configure(Q, max_attempts=3)  # the queue exists: a worker does not claim from a missing one
    worker = Worker([Q], handlers={Q: ok_handler}, concurrency=64, poll_interval_ms=10, max_poll_interval_ms=20, reaper=False)
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("stats", worker.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not any(got == 0 for _, got in asks) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asks and asks[0] == (64, 0), asks  # the first claim asks for every free slot
        seen = len(asks)
        lone = fq.enqueue(Q, {}).id
        while fq.get(Q, lone).state != "succeeded" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (2, 1) in asks[seen:], asks[seen:]  # after the lull: 2, not 64
        seen = len(asks)
        fq.enqueue_many(Q, [{"payload": i} for i in range(500)])
        while fq.stats(Q).counts["succeeded"] < 501 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.request_stop("test over")
        thread.join(timeout=30)
    assert out["stats"].ok == 501
    burst = [count for count, got in asks[seen:] if got]
    # 2 → 8 → 32 → then as many as there are free slots (64 at most, fewer while jobs still run).
    assert burst[:3] == [2, 8, 32], burst
    assert 32 <= max(burst) <= 64, burst
    assert len(burst) <= 40, burst  # 500 jobs in batches, not 250 claims of 2


def test_burst_does_not_stop_on_an_empty_claim_made_while_its_own_jobs_held_the_limit(monkeypatch):
    """The queue's concurrency limit is 1. A claim made while the worker's own job holds the limit
    comes back empty; if that job is acked before the worker looks at the result, the burst run
    must claim again, not say "nothing left to do" with a job still ready."""
    q = "t.burst.limit"
    fq.configure(q, concurrency=1)
    first, second = (fq.enqueue(q, {"n": n}).id for n in (1, 2))
    worker = Worker([q], handlers={q: ok_handler}, concurrency=4, burst=True, poll_interval_ms=10, reaper=False)
    real_claim = services.claim

    def slow_to_answer(queue, *, count, **kwargs):
        held = worker.running_count
        jobs = real_claim(queue, count=count, **kwargs)
        if not jobs and held:
            # The empty answer was caused by our own job: let it finish before the worker reads the answer.
            give_up = time.monotonic() + 10
            while worker.running_count and time.monotonic() < give_up:
                time.sleep(0.005)
        return jobs

    monkeypatch.setattr(services, "claim", slow_to_answer)
    stats = worker.run()
    assert stats.ok == 2
    assert fq.get(q, first).state == fq.get(q, second).state == "succeeded"
