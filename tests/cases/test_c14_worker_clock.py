"""C14 — The worker's clock never matters.

A child process whose Python clock (``time.time``, ``time.time_ns``,
``datetime.now`` and so Django's ``timezone.now``) runs 10 minutes ahead
enqueues a job delayed 5 minutes and tries to claim it, then claims a ready
job. Due times and deadlines must come from the database clock.
"""

from __future__ import annotations

import pytest

from django_fq import db
from django_fq import services as fq

from .procs import advance_to

pytestmark = pytest.mark.django_db(transaction=True)

SKEW = 600_000  # the child's clock is 10 minutes ahead
DELAY = 300_000  # the job is delayed 5 minutes
VISIBILITY = 30_000


def test_c14_worker_clock_ten_minutes_ahead_changes_nothing(spawn, clock):
    delayed_queue, ready_queue = "c14-delayed", "c14-ready"
    ready = fq.enqueue(ready_queue, {"n": 1}).id
    fq.configure(delayed_queue)
    parent_before = db.db_now_ms()
    child = spawn("skewed", delayed_queue, ready_queue, str(VISIBILITY), extra_env={"FQ_CHILD_SKEW_MS": str(SKEW)})
    report = child.until("report", timeout=60)
    assert child.wait(timeout=30) == 0, child.stderr
    parent_after = db.db_now_ms()

    # The child's clocks really were ahead (its reports were taken between our two readings).
    for name in ("py_time_ms", "py_datetime_ms", "django_now_ms"):
        assert report[name] >= parent_before + SKEW - 1000, name

    # The delay counted from the database's now, and the job was not claimable
    # although the child's clock says it is due.
    delayed = fq.get(delayed_queue, report["delayed_id"])
    assert report["enqueue_before"] + DELAY <= delayed.run_at <= report["enqueue_after"] + DELAY
    assert report["delayed_claimed"] == []
    assert delayed.state == "scheduled" and delayed.attempts == 0

    # The lease deadline is the database's now + visibility.
    [job] = report["jobs"]
    assert job["id"] == ready
    assert job["deadline"] == job["claimed_at"] + VISIBILITY
    assert report["claim_before"] <= job["claimed_at"] <= report["claim_after"]
    assert parent_before <= job["claimed_at"] <= parent_after
    assert fq.get(ready_queue, ready).lease_deadline == job["deadline"]

    # Once the database says the delayed job is due, it can be claimed.
    advance_to(clock, delayed.run_at)
    [late] = fq.claim(delayed_queue, visibility_ms=VISIBILITY)
    assert late.id == report["delayed_id"]
