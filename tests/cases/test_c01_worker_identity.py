"""C01 — Recovery never depends on worker identity; only the lease deadline decides.

django-fq keeps no worker registry: a lease is (job, generation, receipt hash,
deadline). A real child process claims the job and is SIGKILLed; the parent
then moves the database clock (the ``clock`` fixture) instead of sleeping
through the 60 s lease.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.types import ReapResult

from .procs import advance_to, set_offset_for

pytestmark = pytest.mark.django_db(transaction=True)

VISIBILITY = 60_000
HOUR = 3_600_000


def _hold_and_kill(spawn, queue: str, worker: str) -> dict:
    """A child claims one job of ``queue`` as ``worker`` and is killed; return what it claimed."""
    child = spawn("hold", queue, str(VISIBILITY), worker)
    [held] = child.until("claimed")["jobs"]
    child.kill()
    return held


@pytest.mark.parametrize("max_attempts, after", [(3, "scheduled"), (1, "dead")])
def test_c01_killed_worker_is_recovered_by_the_deadline_alone(spawn, clock, max_attempts, after):
    queue = "c01-a"
    fq.configure(queue, backoff_ms=10_000)
    job = fq.enqueue(queue, {"n": 1}, max_attempts=max_attempts).id

    held = _hold_and_kill(spawn, queue, "worker-7")
    assert held["id"] == job
    assert held["deadline"] == held["claimed_at"] + VISIBILITY
    info = fq.get(queue, job)
    assert (info.state, info.worker, info.lease_deadline) == ("running", "worker-7", held["deadline"])

    # The worker is gone, but nothing looks at workers: while the deadline is
    # ahead, a reaper pass and other claims leave the lease alone.
    assert fq.reap() == ReapResult(0, 0, 0)
    assert fq.claim(queue) == []
    set_offset_for(clock, held["deadline"] - 2000)  # two seconds before the deadline
    assert fq.reap() == ReapResult(0, 0, 0)
    assert fq.get(queue, job).state == "running"

    # At the deadline, one reaper pass recovers the job.
    advance_to(clock, held["deadline"])
    assert fq.reap() == ReapResult(expired=1, timed_out=0, dead=int(after == "dead"))
    info = fq.get(queue, job)
    assert info.state == after
    assert info.attempts == 1
    assert info.lease_deadline is None
    [entry] = info.errors
    assert (entry["kind"], entry["attempt"], entry["worker"]) == ("expired", 1, "worker-7")
    assert fq.reap() == ReapResult(0, 0, 0)  # handled exactly once

    if after == "scheduled":
        assert info.run_at == held["deadline"] + 10_000  # backoff counted from the deadline
        advance_to(clock, info.run_at)
        [again] = fq.claim(queue, visibility_ms=1000, worker="worker-8")
        assert (again.id, again.attempts) == (job, 2)
    else:
        assert fq.claim(queue) == []
        assert fq.stats(queue).counts["dead"] == 1


def test_c01_restarted_worker_with_same_id_does_not_keep_the_old_lease_alive(spawn, clock):
    queue, other = "c01-b", "c01-b-other"
    job = fq.enqueue(queue, {"n": 1}).id
    held = _hold_and_kill(spawn, queue, "worker-7")
    assert held["id"] == job

    # A new process starts under the very same worker id, claims work of its
    # own (1 h leases) and keeps heart-beating (extending) them.
    first = fq.enqueue(other, {"k": 1}).id
    second = spawn("heartbeat", other, str(HOUR), "worker-7", "50")
    assert [j["id"] for j in second.until("claimed")["jobs"]] == [first]
    assert second.until("extended")["id"] == first
    later = fq.enqueue(other, {"k": 2}).id
    assert [j["id"] for j in second.until("claimed")["jobs"]] == [later]

    # The old lease is still decided by its deadline only: alive before it …
    assert fq.reap() == ReapResult(0, 0, 0)
    assert fq.get(queue, job).state == "running"

    # … and recovered by one reaper pass after it, although "worker-7" is up
    # and heart-beating.
    advance_to(clock, held["deadline"])
    assert fq.reap() == ReapResult(expired=1, timed_out=0, dead=0)
    info = fq.get(queue, job)
    assert info.state in ("scheduled", "ready")
    assert info.attempts == 1 and info.lease_deadline is None

    # The restarted worker's own leases were untouched and it carries on.
    for j in (first, later):
        mine = fq.get(other, j)
        assert mine.state == "running" and mine.worker == "worker-7"
    before = fq.get(other, first).lease_deadline
    while True:
        msg = second.until("extended")
        if msg["id"] == first and msg["deadline"] > before:
            break
    assert second.proc.poll() is None
