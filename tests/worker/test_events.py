"""The worker's events (django_fq.worker.events) as a subscriber sees them from a real worker on the test database.

A subscriber gets the worker's start, each claim, each job's start and end
(outcome and timings), a lost lease, the stop; its exceptions never reach
the worker.
"""

from __future__ import annotations

import logging
import threading

import pytest

from django_fq import services as fq
from django_fq.exceptions import PermanentFailure
from django_fq.worker import (
    JobFinished,
    JobsClaimed,
    JobStarted,
    LeaseLostEvent,
    Worker,
    WorkerStarted,
    WorkerStopped,
    WorkerStopping,
)
from django_fq.worker.events import Events

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.events"


class Recorder:
    """A subscriber keeping every event it gets, in order (thread-safe)."""

    def __init__(self):
        self.events: list = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def __call__(self, event) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def of(self, kind: type) -> list:
        with self.lock:
            return [e for e in self.events if isinstance(e, kind)]

    def names(self) -> list[str]:
        with self.lock:
            return [type(e).__name__ for e in self.events]


def test_a_subscriber_sees_started_finished_with_outcomes_lease_lost_and_the_stop():
    running = threading.Event()

    def handler(job):
        kind = job.payload["kind"]
        if kind == "fail":
            raise RuntimeError("boom")
        if kind == "permanent":
            raise PermanentFailure("never")
        if kind == "cancel-me":
            running.set()
            while True:
                job.sleep(0.05)  # raises LeaseLost once the heartbeat learns of the cancellation
        return {"ok": True}

    ok = fq.enqueue(Q, {"kind": "ok"}).id
    fail = fq.enqueue(Q, {"kind": "fail"}, max_attempts=1).id
    permanent = fq.enqueue(Q, {"kind": "permanent"}).id
    lost = fq.enqueue(Q, {"kind": "cancel-me"}).id
    recorder = Recorder()
    worker = Worker(
        [Q], handlers={Q: handler}, concurrency=4, visibility_ms=600, burst=True, poll_interval_ms=10, reaper=False,
        subscribers=[recorder],
    )
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("stats", worker.run()))
    thread.start()
    assert running.wait(30), "the cancellable job never started"
    fq.cancel(Q, lost)
    thread.join(60)
    assert not thread.is_alive()

    names = recorder.names()
    assert names[0] == "WorkerStarted" and names[-2:] == ["WorkerStopping", "WorkerStopped"]
    assert [e.worker for e in recorder.of(WorkerStarted)] == [worker]
    assert recorder.of(WorkerStopping)[0].reason == recorder.of(WorkerStopped)[0].reason == "nothing left to do"
    assert sum(e.got for e in recorder.of(JobsClaimed)) == 4
    assert all(e.queue == Q and e.got <= e.asked for e in recorder.of(JobsClaimed))

    started = {e.job.id: e for e in recorder.of(JobStarted)}
    finished = {e.job.id: e for e in recorder.of(JobFinished)}
    assert set(started) == set(finished) == {ok, fail, permanent, lost}
    assert {job: e.outcome for job, e in finished.items()} == {ok: "ok", fail: "failed", permanent: "permanent", lost: "lost"}
    assert finished[fail].error == "RuntimeError: boom" and finished[ok].error == ""
    for job, event in finished.items():
        assert recorder.events.index(started[job]) < recorder.events.index(event)  # a job ends after it started
        assert event.run_ms >= 0 and event.wait_ms == started[job].wait_ms >= 0
        assert event.job.attempt == 1
    assert finished[lost].run_ms >= 50  # it slept at least once before the loss was noticed

    [loss] = recorder.of(LeaseLostEvent)
    assert (loss.job.id, loss.reason) == (lost, "cancelled")
    # No order between the two: the handler learns of the loss first and may end before the event is out.
    assert (fq.get(Q, ok).state, fq.get(Q, fail).state, fq.get(Q, permanent).state) == ("succeeded", "dead", "dead")
    assert fq.get(Q, lost).state == "cancelled"
    stats = out["stats"]
    assert (stats.ok, stats.failed, stats.settle_errors) == (1, 2, 1)
    assert all("receipt" not in repr(e).lower() and "fq1." not in repr(e) for e in recorder.events)


def test_a_stop_request_is_published_at_once_and_only_once():
    gate = threading.Event()
    recorder = Recorder()

    def handler(job):
        gate.wait(30)

    job = fq.enqueue(Q, {}).id
    worker = Worker([Q], handlers={Q: handler}, poll_interval_ms=10, reaper=False, grace_s=30)
    worker.events.subscribe(recorder, WorkerStopping, WorkerStopped, JobStarted)
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_until(lambda: recorder.of(JobStarted), what="the job to start")
    worker.request_stop("test over")
    worker.request_stop("again")
    # Published by request_stop itself, while the job still runs (its grace has not passed).
    assert [e.reason for e in recorder.of(WorkerStopping)] == ["test over"]
    assert thread.is_alive() and not recorder.of(WorkerStopped)
    gate.set()
    thread.join(30)
    assert [type(e).__name__ for e in recorder.events] == ["JobStarted", "WorkerStopping", "WorkerStopped"]
    assert fq.get(Q, job).state == "succeeded"


def test_a_failing_subscriber_is_logged_and_never_breaks_the_worker(caplog):
    def broken(event):
        raise ValueError("subscriber bug")

    jobs = [fq.enqueue(Q, {"n": n}).id for n in range(3)]
    worker = Worker([Q], handlers={Q: lambda job: None}, burst=True, poll_interval_ms=10, reaper=False)
    worker.events.subscribe(broken)
    with caplog.at_level(logging.ERROR, logger="django_fq.worker"):
        stats = worker.run()

    assert stats.ok == 3
    assert {fq.get(Q, j).state for j in jobs} == {"succeeded"}
    lines = [r.getMessage() for r in caplog.records if r.name == "django_fq.worker"]
    assert any("worker.subscriber_error event_type=JobFinished" in m and "subscriber bug" in m for m in lines)


def test_subscribing_to_something_that_is_not_a_worker_event_is_refused():
    events = Events()
    with pytest.raises(TypeError, match="not a worker event type: int"):
        events.subscribe(print, int)
    assert not events.wants(JobStarted)
    events.subscribe(print, JobStarted)
    assert events.wants(JobStarted) and not events.wants(JobFinished)
    events.unsubscribe(print)
    assert not events.wants(JobStarted)
