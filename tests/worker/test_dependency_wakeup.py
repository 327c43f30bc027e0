"""A released dependent wakes an idle worker at once, on every database (docs/reference/semantics.md §9 "Dependencies").

The worker polls every two minutes here, so only the wakeup sent with the
release (PostgreSQL: the NOTIFY in the releasing ack's statement; SQLite and
MariaDB: the in-process wakeup at the ack's commit) can start the dependent
within the test's bound. A lost or late wakeup fails the test.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_fq import services as fq
from django_fq.worker import JobsClaimed, Worker

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.wake.dependent"
DEPS = "t.wake.deps"  # served by nobody: the test claims and acks the dependencies itself
POLL_MS = 120_000
#: Far below the poll, far above a loaded machine's pickup.
BOUND_S = 15.0


def _start(worker: Worker, idle: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    assert idle.wait(60), "the worker never made its first (empty) claim"
    return thread


@pytest.mark.parametrize("hinted", [False, True], ids=["services.ack", "ack_many-hinted"])
def test_an_idle_worker_with_a_long_poll_starts_a_released_dependent_promptly(hinted):
    fq.configure(DEPS)
    fq.configure(Q)
    a = fq.enqueue(DEPS, {"dep": 1}).id
    b = fq.enqueue(DEPS, {"dep": 2}).id
    dependent = fq.enqueue(Q, {"after": [a, b]}, depends_on=[a, b]).id
    claimed = {j.id: j for j in fq.claim(DEPS, count=2, visibility_ms=600_000)}
    fq.ack(DEPS, claimed[a].receipt)  # one dependency left: still waiting

    started = threading.Event()
    seen: list[str] = []

    def handler(job):
        seen.append(job.id)
        started.set()

    idle = threading.Event()

    def on_claimed(event: JobsClaimed) -> None:
        if event.got == 0:
            idle.set()

    worker = Worker(
        [Q],
        handlers={Q: handler},
        poll_interval_ms=POLL_MS,
        max_poll_interval_ms=POLL_MS,
        reaper=False,
        subscribers=[(on_claimed, JobsClaimed)],
    )
    thread = _start(worker, idle)
    try:
        assert fq.get(Q, dependent).state == "waiting"
        t0 = time.monotonic()
        if hinted:  # as a worker's completer acks a job its claim said others depend on
            [settled] = fq.ack_many(DEPS, [(claimed[b].receipt, None)], has_dependents=[b])
            assert settled.state == "succeeded"
        else:
            fq.ack(DEPS, claimed[b].receipt)
        assert started.wait(BOUND_S), f"the released dependent did not start within {BOUND_S} s (poll {POLL_MS} ms)"
        assert time.monotonic() - t0 < BOUND_S
        assert seen == [dependent]
    finally:
        worker.request_stop("test over")
        thread.join(30)
    assert not thread.is_alive()
    assert fq.get(Q, dependent).state == "succeeded"
