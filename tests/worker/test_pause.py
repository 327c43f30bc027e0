"""A paused queue in real worker processes: no claim on any of them after pause() returned; resume drains it."""

from __future__ import annotations

import signal

import pytest

from django_fq import db
from django_fq import services as fq
from django_fq.models import Job, Queue

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.ctl"
IDLE = r"worker\.idle "


def _claimed_jobs() -> int:
    qid = Queue.objects.get(name=Q).id
    return Job.objects.filter(queue_id=qid, claimed_at__isnull=False).count()


def test_two_worker_processes_claim_nothing_while_paused_and_drain_after_resume(workers, events):
    fq.configure(Q)
    # -v 2 logs "worker.idle" after every claim round that found nothing: each one is a poll.
    procs = [
        workers(f"--queue={Q}", f"--worker-id=w{n}", "--poll-interval=20", "--max-poll-interval=100", "-v", "2")
        for n in (1, 2)
    ]
    for proc in procs:
        proc.wait_for(IDLE)

    assert fq.pause(Q).changed
    ids = [fq.enqueue(Q, {"events": events.path, "n": n}).id for n in range(6)]
    marks = [proc.count(IDLE) for proc in procs]
    # A poll logged after the mark may have begun before it; the round after that one began after
    # the enqueues. So three more polls each prove at least two claims that saw the jobs and the pause.
    for proc, mark in zip(procs, marks, strict=True):
        wait_until(lambda proc=proc, mark=mark: proc.count(IDLE) >= mark + 3, timeout=30, what="three more polls")
    assert _claimed_jobs() == 0
    assert fq.stats(Q).totals["claimed"] == 0
    assert events.of("start") == []
    assert {fq.get(Q, i).state for i in ids} == {"ready"}

    resumed_at = db.db_now_ms()
    assert fq.resume(Q).changed
    wait_until(lambda: all(fq.get(Q, i).state == "succeeded" for i in ids), timeout=30, what="the drain")
    first_claim = min(fq.get(Q, i).claimed_at for i in ids)
    # Picked up within the poll interval (100 ms at most here), with room for a loaded machine.
    assert first_claim - resumed_at < 3000
    assert fq.stats(Q).totals["claimed"] == 6
    assert len(events.of("end")) == 6
    for proc in procs:
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.mark.postgres_only
def test_a_resume_wakes_an_idle_worker_long_before_its_poll_interval(workers, events):
    fq.configure(Q)
    fq.pause(Q)
    job = fq.enqueue(Q, {"events": events.path}).id
    worker = workers(f"--queue={Q}", "--poll-interval=5000", "--max-poll-interval=5000", "--reaper-interval=60000", "-v", "2")
    worker.wait_for("worker.start .*wakeup=listen")
    worker.wait_for(IDLE)  # its claim found the queue paused: it now sleeps up to 5 s
    resumed_at = fq.resume(Q) and db.db_now_ms()
    wait_until(lambda: fq.get(Q, job).state == "succeeded", timeout=10, what="the pickup")
    assert fq.get(Q, job).claimed_at - resumed_at < 1000, "picked up by polling, not by the resume's NOTIFY"
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
