"""Progress reports from handlers run by real ``fq_worker`` processes (docs/how-to/progress.md).

The handler ``t.progress`` (tests/testapp/fq_handlers.py) reports many times a
second; the child appends every progress write it makes to a log file
(``FQ_TEST_PROGRESS_LOG``), so the test counts the writes themselves, and
reads what they stored through ``get``.
"""

from __future__ import annotations

import itertools
import json
import signal

import pytest

from django_fq import services as fq

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.progress"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def read_writes(path) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


# --pool processes: the handler runs in a child process, which forwards its reports to the worker.
POOLS = pytest.mark.parametrize("pool", ["threads", "processes"])


@POOLS
def test_many_reports_a_second_cost_at_most_one_write_a_second_and_get_shows_the_latest(
    workers, events, tmp_path, pool
):
    log = tmp_path / "writes.jsonl"
    fq.configure(Q)
    job = fq.enqueue(Q, {"events": events.path, "report_s": 3.2, "per_s": 100, "quiet_s": 2.5}).id
    w = workers(f"--queue={Q}", f"--pool={pool}", *FAST, env={"FQ_TEST_PROGRESS_LOG": str(log)})
    [start] = events.wait_for("start", job)
    [reported] = events.wait_for("reported", job, timeout=30)
    # The last report, made right before a quiet spell, is stored within about a second.
    last = (reported["last"], reported["message"])
    info = wait_until(
        lambda: (i := fq.get(Q, job)).progress == last[0] and i, timeout=10, what="the last report in get"
    )
    assert (info.state, info.progress_message) == ("running", last[1])
    # The child logs a write once it returned: the row may be seen a moment before its line.
    writes = wait_until(
        lambda: (ws := read_writes(log)) and ws[-1]["progress"] == last[0] and ws,
        timeout=10,
        what="the write's log line",
    )
    assert writes[-1]["written"] is True
    assert writes[-1]["t"] - reported["t"] <= 1.0 + 0.5  # the throttle's second, plus a loaded machine's slack
    assert info.progress_at is not None and info.progress_at >= info.claimed_at
    [end] = events.wait_for("end", job, timeout=30)
    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the ack")

    writes = read_writes(log)
    assert reported["n"] >= 100  # hundreds of reports ...
    starts = [x["t"] for x in writes]
    # ... made this many writes: the first at once, then at most one per second.
    assert len(writes) <= int(reported["t"] - start["t"]) + 2, writes
    # (The log's times are read a moment after the throttle's own, hence the 10 ms.)
    assert all(b - a >= 1.0 - 0.01 for a, b in itertools.pairwise(starts)), starts
    assert starts[0] - start["t"] < 1.0  # the first report is written at once, not after a second
    assert all(x["written"] for x in writes)
    # Nothing was written in the quiet spell, and the finished job shows its last report.
    assert starts[-1] < end["t"]
    info = fq.get(Q, job)
    assert (info.progress, info.progress_message) == last
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=20) == 0


@POOLS
def test_a_report_right_before_the_handler_returns_is_stored_with_the_finished_job(workers, events, tmp_path, pool):
    log = tmp_path / "writes.jsonl"
    fq.configure(Q)
    # Reports for half a second, returns at once: the last report is still pending when it returns.
    job = fq.enqueue(Q, {"events": events.path, "report_s": 0.5, "per_s": 100}).id
    w = workers(f"--queue={Q}", f"--pool={pool}", *FAST, env={"FQ_TEST_PROGRESS_LOG": str(log)})
    [reported] = events.wait_for("reported", job, timeout=30)
    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the ack")
    info = fq.get(Q, job)
    assert (info.progress, info.progress_message) == (reported["last"], reported["message"])
    writes = read_writes(log)
    # The first report at once, the last one when the handler returned: two writes for ~50 reports.
    assert reported["n"] >= 20
    assert len(writes) == 2, writes
    assert writes[-1]["progress"] == reported["last"]
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=20) == 0


def test_a_run_that_lost_its_lease_cannot_overwrite_the_next_runs_progress(workers, events, tmp_path):
    log = tmp_path / "writes.jsonl"
    fq.configure(Q, backoff_ms=0)
    job = fq.enqueue(Q, {"events": events.path, "report_s": 0.3, "until_lost": True, "after_lost": 50}).id
    # No reaper of its own, one job at a time: frozen, the worker holds no lock a reap here would pass over.
    w = workers(f"--queue={Q}", "--visibility=3000", "--no-reaper", *FAST, env={"FQ_TEST_PROGRESS_LOG": str(log)})
    events.wait_for("reported", job, timeout=30)
    wait_until(lambda: fq.get(Q, job).progress is not None, what="the first run's progress")
    # Freeze the worker right after an extend committed (its next beat is a second away, so it is
    # not inside the extend's transaction) until its lease ends; then claim the job again here,
    # as a second run, and report.
    deadline = fq.get(Q, job).lease_deadline
    wait_until(lambda: fq.get(Q, job).lease_deadline != deadline, interval=0.005, what="an extend")
    w.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: fq.reap(Q).expired == 1, timeout=30, interval=0.05, what="the lease to expire")
        [second] = fq.claim(Q, visibility_ms=60_000)
        assert second.attempts == 2
        fq.report_progress(Q, second.receipt, 77, "second run")
    finally:
        w.signal(signal.SIGCONT)
    # The first run goes on reporting until (and after) its worker sees the lease is gone.
    [lost] = events.wait_for("lost", job, timeout=30)
    assert lost["reason"] in ("expired", "invalid_receipt")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=20) == 0
    info = fq.get(Q, job)
    assert (info.state, info.attempts) == ("running", 2)
    assert (info.progress, info.progress_message) == (77.0, "second run")
    # Whatever the first run's worker tried after the freeze was refused by the lease guard.
    stored = [x for x in read_writes(log) if x["written"]]
    assert all(not x["message"].startswith("after loss") for x in stored)
    fq.ack(Q, second.receipt)
