"""Progress reports of a handler run by ``fq_worker --pool processes`` reach the job (real worker processes).

The handler runs in a child process that has no receipt and no database
writer of its own: its reports cross the pipe to the worker, which stores them
as it stores a thread's (the first at once, then at most one write a second,
the last one before the job is settled; docs/how-to/progress.md).
"""

from __future__ import annotations

import signal

import pytest

from django_fq import services as fq

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.progress"
PROC = ("--pool=processes", f"--queue={Q}", "--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def test_reports_of_a_running_child_are_stored_while_it_runs_and_the_last_one_with_the_finished_job(workers, events):
    fq.configure(Q)
    job = fq.enqueue(Q, {"events": events.path, "report_s": 1.5, "per_s": 100, "quiet_s": 3}).id
    w = workers(*PROC)
    [reported] = events.wait_for("reported", job, timeout=120)
    last = (reported["last"], reported["message"])
    # Stored while the handler still runs (its quiet spell), not only once it returned.
    info = wait_until(lambda: (i := fq.get(Q, job)).progress == last[0] and i, timeout=10, what="the last report")
    assert (info.state, info.progress_message) == ("running", last[1])
    assert info.progress_at is not None and info.progress_at >= info.claimed_at
    wait_until(lambda: fq.get(Q, job).state == "succeeded", timeout=30, what="the ack")
    info = fq.get(Q, job)
    assert (info.progress, info.progress_message) == last
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0, w.stderr


def test_a_report_right_before_the_child_returns_is_stored_with_the_finished_job(workers, events):
    fq.configure(Q)
    job = fq.enqueue(Q, {"events": events.path, "report_s": 0.5, "per_s": 100}).id
    w = workers(*PROC, "--burst")
    assert w.wait(timeout=120) == 0, w.stderr
    [reported] = events.of("reported", job)
    info = fq.get(Q, job)
    assert info.state == "succeeded"
    assert (info.progress, info.progress_message) == (reported["last"], reported["message"])
