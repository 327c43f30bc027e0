"""Handlers of the chaos scenarios (found by ``handlers.autodiscover()`` in the chaos worker processes).

Each records its run in the audit (:func:`tests.chaos.invariants.record_run`):
the run row (job, lease, attempt, pid, start and end on the database clock,
whether the run had been told its lease was lost) and the idempotent effect
row, in one transaction, right before returning.
"""

import json
import os
import time

from django_fq.handlers import handler

from . import invariants

TAG = os.environ.get("FQ_CHAOS_TAG", "")


def _finish(job, started: int) -> dict:
    invariants.record_run(job.id, job.claimed_at, job.attempts, started, lambda _end: job.lease_lost, tag=TAG, pid=os.getpid())
    return {"ok": True, "attempt": job.attempts, "pid": os.getpid()}


@handler("chaos.work")
def work(job):
    """Sleep ``payload["sleep_ms"]`` (default 0), then record the run."""
    started = invariants.now_ms()
    sleep_ms = (job.payload or {}).get("sleep_ms") or 0
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    return _finish(job, started)


@handler("chaos.wake")
def wake(job):
    """The failover scenario's wakeup probe: record the run (its worker polls only every 60 s)."""
    return _finish(job, invariants.now_ms())


def _event(path: str, job, ev: str, **extra) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"ev": ev, "id": job.id, "attempt": job.attempts, "pid": os.getpid(), "tag": TAG, **extra}) + "\n")


def _wait_file(path: str, timeout_s: float = 120.0) -> bool:
    give_up = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


@handler("chaos.part")
def partitioned(job):
    """The network-partition job, steered by ``payload["mode"]`` on its first attempt.

    ``ack_into_cut``: record the run, then wait until the ``cut`` file exists
    (the link is down) and return at once, so the ack leaves over a dead link. ``hold``: keep
    running until the ``heal`` file exists and the worker has heard back about
    the heartbeat's extend that was caught in the cut (at most 20 s more).
    Any later attempt (another worker) and any other mode just records the run.
    Events (``start``/``end`` with the lease state) go to ``payload["events"]``.
    """
    p = job.payload or {}
    started = invariants.now_ms()
    _event(p.get("events"), job, "start")
    if job.attempts == 1 and p.get("mode") == "ack_into_cut":
        # The work (and its record) is done before the cut; only the ack is left for after it.
        result = _finish(job, started)
        _wait_file(p["cut"])
        _event(p.get("events"), job, "end", lost=job.lease_lost, reason=job.lost_reason)
        return result
    if job.attempts == 1 and p.get("mode") == "hold":
        _wait_file(p["heal"])
        # The heartbeat's extend, stuck in the cut, is answered once the link is back:
        # wait for that verdict (anything but the local "expired" guess).
        give_up = time.monotonic() + 20
        while job.lost_reason in (None, "expired") and time.monotonic() < give_up:
            time.sleep(0.01)
    result = _finish(job, started)
    _event(p.get("events"), job, "end", lost=job.lease_lost, reason=job.lost_reason)
    return result


def upstream_counts(up) -> tuple[int, int]:
    """``(entries, entries that are not a succeeded dependency with its run's result)`` of an ``Upstream``."""
    bad = sum(1 for key in up if up.entry(key).state != "succeeded" or not (up[key] or {}).get("ok"))
    return len(up), bad


def _flow(job):
    """A workflow or batch step: write its start row first, then sleep, read upstream, record the run.

    The start row (database clock, written before anything else, so a run
    killed later still has it) is what the workflow storm checks against its
    dependencies' ack times. A job with dependencies reads ``job.upstream``
    and counts the entries that are not a succeeded dependency's result.
    ``payload["fail"]``: raise instead (the batch storm's members that
    exhaust their attempts), after the start row.
    """
    started = invariants.now_ms()
    p = job.payload or {}
    seen = bad = 0
    if p.get("deps"):
        seen, bad = upstream_counts(job.upstream)
    invariants.record_start(job.id, job.claimed_at, job.attempts, started, upstream_seen=seen, upstream_bad=bad, pid=os.getpid())
    if p.get("fail"):
        raise RuntimeError("chaos: this member always fails")
    sleep_ms = p.get("sleep_ms") or 0
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    return _finish(job, started)


for _queue in ("chaos.flow", "chaos.flow.cb", "chaos.batch", "chaos.batch.cb"):
    handler(_queue)(_flow)
