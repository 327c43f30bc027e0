"""C02 — The reaper and a late ack never both win.

Real threads, each with its own database connection. One side runs inside a
transaction that is held open (paused on an Event) while the other side
acts; then the paused side commits. On PostgreSQL the second side waits for
(or skips) the first side's row locks; on SQLite it waits for the write
lock, so it always runs in a thread and every join has a timeout.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_fq import db
from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt, ReceiptCancelled
from django_fq.models import Queue
from django_fq.services.leases import expire_leases
from django_fq.types import ReapResult

from .procs import advance_to

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 30


class Side(threading.Thread):
    """Run ``fn`` in a thread on its own connection; keep its return value or exception."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.value, self.error = fn, None, None

    def run(self):
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed to the test thread
            self.error = exc
        finally:
            connections.close_all()

    def finish(self):
        self.join(TIMEOUT)
        assert not self.is_alive(), "thread did not finish (deadlock?)"
        return self


def _snapshot(queue: str, job: str) -> dict:
    info = fq.get(queue, job)
    return {
        "state": info.state,
        "attempts": info.attempts,
        "errors": info.errors,
        "last_error": info.last_error,
        "result": info.result,
        "lease_deadline": info.lease_deadline,
    }


def _claimed(queue: str):
    fq.configure(queue, backoff_ms=10_000, max_attempts=5)
    job = fq.enqueue(queue, {"n": 1}).id
    [claimed] = fq.claim(queue, visibility_ms=1000, worker="w1")
    assert claimed.id == job
    return claimed


def test_c02_reaper_selects_first_then_late_ack_loses(clock):
    queue = "c02-reaper-first"
    claimed = _claimed(queue)
    advance_to(clock, claimed.deadline)  # the lease is over (at the deadline it has expired)
    queue_id = Queue.objects.get(name=queue).id
    selected, resume = threading.Event(), threading.Event()

    def reaper():
        with db.write_atomic():
            done = expire_leases(db.connection(), queue_id=queue_id, limit=10)
            selected.set()
            assert resume.wait(TIMEOUT)
        return done

    r = Side(reaper)
    r.start()
    assert selected.wait(TIMEOUT), r.error
    # The reaper has taken J and holds its transaction open; the late ack comes in now.
    a = Side(lambda: fq.ack(queue, claimed.receipt, result={"late": True}))
    a.start()
    time.sleep(0.2)  # let the ack reach the lock it must wait for
    resume.set()
    r.finish()
    a.finish()

    assert r.error is None and r.value == (1, 0, 0)
    assert isinstance(a.error, InvalidReceipt) and not isinstance(a.error, ReceiptCancelled)
    after = _snapshot(queue, claimed.id)
    assert after["state"] == "scheduled"  # backoff counts from the deadline
    assert after["attempts"] == 1
    assert after["result"] is None and after["lease_deadline"] is None
    assert [(e["kind"], e["attempt"]) for e in after["errors"]] == [("expired", 1)]
    totals = fq.stats(queue).totals
    assert (totals["acked"], totals["expired"], totals["claimed"]) == (0, 1, 1)

    # The losing ack stays lost, and the job runs again under a new claim.
    with pytest.raises(InvalidReceipt):
        fq.ack(queue, claimed.receipt)
    assert _snapshot(queue, claimed.id) == after
    advance_to(clock, fq.get(queue, claimed.id).run_at)
    [again] = fq.claim(queue, visibility_ms=60_000)
    assert (again.id, again.attempts) == (claimed.id, 2)


def test_c02_ack_commits_first_then_reaper_changes_nothing(clock):
    queue = "c02-ack-first"
    claimed = _claimed(queue)
    acked, resume = threading.Event(), threading.Event()

    def late_ack():
        with db.write_atomic():
            out = fq.ack(queue, claimed.receipt, result={"ok": 1})  # the lease is still live here
            acked.set()
            assert resume.wait(TIMEOUT)
        return out

    a = Side(late_ack)
    a.start()
    assert acked.wait(TIMEOUT), a.error
    # While the ack's transaction is open, the deadline passes and the reaper runs.
    advance_to(clock, claimed.deadline)
    r = Side(lambda: fq.reap())
    r.start()
    time.sleep(0.2)
    resume.set()
    a.finish()
    r.finish()

    assert a.error is None and a.value.state == "succeeded" and not a.value.replay
    assert r.error is None and r.value == ReapResult(0, 0, 0)
    after = _snapshot(queue, claimed.id)
    assert after["state"] == "succeeded"
    assert after["attempts"] == 1
    assert after["errors"] == [] and after["last_error"] == ""
    assert after["result"] == {"ok": 1} and after["lease_deadline"] is None
    totals = fq.stats(queue).totals
    assert (totals["acked"], totals["expired"], totals["dead"]) == (1, 0, 0)

    # A succeeded job never goes back to ready: later reaper passes and claims leave it alone.
    advance_to(clock, claimed.deadline + 10_000)
    assert fq.reap() == ReapResult(0, 0, 0)
    assert fq.claim(queue) == []
    assert _snapshot(queue, claimed.id) == after


def test_c02_unpaused_race_never_has_two_winners(clock):
    """Both sides race freely around the deadline, many rounds: never both win."""
    queue = "c02-race"
    fq.configure(queue, backoff_ms=0, max_attempts=1000)
    for round_no in range(12):
        job = fq.enqueue(queue, {"round": round_no}).id
        [claimed] = fq.claim(queue, visibility_ms=1000)
        assert claimed.id == job
        go = threading.Barrier(2, timeout=TIMEOUT)

        def reaper(go=go):
            go.wait()
            return fq.reap(queue)

        def ack(receipt=claimed.receipt, go=go):
            go.wait()
            return fq.ack(queue, receipt)

        # Put "now" a few ms before the deadline so either side may come first.
        advance_to(clock, claimed.deadline - round_no % 4)
        r, a = Side(reaper), Side(ack)
        for side in (a, r) if round_no % 2 else (r, a):
            side.start()
        r.finish()
        a.finish()
        assert r.error is None, r.error
        ack_won, reaper_won = a.error is None, r.value.expired == 1
        assert not (ack_won and reaper_won)
        if not ack_won:
            assert isinstance(a.error, InvalidReceipt)
            fq.reap(queue)  # the ack may have lost to the clock alone; expiry handling follows
        info = fq.get(queue, job)
        if ack_won:
            assert info.state == "succeeded" and info.errors == []
        else:
            assert info.state == "ready" and [e["kind"] for e in info.errors] == ["expired"]
            fq.cancel(queue, job)  # out of the way of the next round
        assert info.attempts == 1
