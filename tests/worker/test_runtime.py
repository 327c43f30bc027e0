"""The production worker in real processes: heartbeats, timeouts, wakeups, concurrency, supervisor, fairness."""

from __future__ import annotations

import fcntl
import itertools
import os
import pty
import re
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import time

import pytest
from django.db import connection

from django_fq import services as fq

from .helpers import ROOT, LeaseSampler, child_env, touch, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.ctl"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def max_overlap(runs: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant."""
    points = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs], key=lambda p: (p[0], p[1]))
    best = current = 0
    for _, step in points:
        current += step
        best = max(best, current)
    return best


def runs_of(events) -> list[tuple[float, float]]:
    ends = {(e["id"], e["attempt"]): e["t"] for e in events.of("end")}
    return [(s["t"], ends[(s["id"], s["attempt"])]) for s in events.of("start") if (s["id"], s["attempt"]) in ends]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- heartbeat and timeouts -------------------------------------------------------------------------


def test_heartbeat_keeps_a_job_three_times_its_visibility_alive_and_it_runs_once(workers, events):
    fq.configure(Q, backoff_ms=0)
    job = fq.enqueue(Q, {"events": events.path, "sleep_ms": 1600, "done": True}).id
    # Two workers with 500 ms leases and busy reapers: only heartbeats keep the job with its first runner.
    w1 = workers(f"--queue={Q}", "--visibility=500", "--worker-id=w1", *FAST)
    [start] = events.wait_for("start", job)
    w2 = workers(f"--queue={Q}", "--visibility=500", "--worker-id=w2", *FAST)
    w2.wait_for("worker.start")

    [end] = events.wait_for("end", job, timeout=20)
    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the ack")
    info = fq.get(Q, job)
    assert (info.attempts, info.errors) == (1, [])
    assert len(events.of("start", job)) == 1
    assert end["lost"] is False
    assert end["deadline"] >= start["deadline"] + 1000  # the lease was moved on while it ran
    totals = fq.stats(Q).totals
    assert (totals["expired"], totals["claimed"], totals["acked"]) == (0, 1, 1)
    for w in (w1, w2):
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=20) == 0


@pytest.mark.parametrize(
    "timeout_ms, visibility_ms",
    [(1200, 400), (200, 5000)],
    ids=["timeout-reached-by-heartbeats", "timeout-shorter-than-lease"],
)
def test_job_past_its_timeout_is_failed_and_its_handler_told(workers, events, timeout_ms, visibility_ms):
    fq.configure(Q, backoff_ms=60_000)
    job = fq.enqueue(Q, {"events": events.path, "until_lost": True}, timeout_ms=timeout_ms).id
    other = fq.enqueue(Q, {"events": events.path}).id
    # No reaper in this worker: it records the timeout itself once the lease reaches it.
    worker = workers(f"--queue={Q}", f"--visibility={visibility_ms}", "--no-reaper", *FAST)

    [start] = events.wait_for("start", job)
    [lost] = events.wait_for("lost", job, timeout=20)
    assert (lost["reason"], lost["timed_out"], lost["raised"]) == ("timeout", True, "timeout")
    assert lost["t"] >= start["t"]
    worker.wait_for(rf"job.timeout job={job} queue={Q} attempt=1/25 reason=timeout")
    worker.wait_for(rf"job.not_settled job={job} .*reason=lease_lost:timeout")

    info = wait_until(lambda: (lambda i: i if i.errors else None)(fq.get(Q, job)), what="the timeout to be recorded")
    assert [e["kind"] for e in info.errors] == ["timeout"]
    # When is checked on the database clock, which is exact: the handler's own clock is not (the
    # worker dates the claim before its round trip, and the handler starts some time after it). The
    # timeout is recorded no earlier than timeout_ms after the claim, so with a 400 ms visibility the
    # heartbeats did carry the lease past its first deadline.
    assert info.errors[0]["at"] >= info.claimed_at + timeout_ms
    assert info.state == "scheduled" and info.attempts == 1 and info.result is None
    assert fq.stats(Q).totals["timed_out"] == 1
    wait_until(lambda: fq.get(Q, other).state == "succeeded", what="the next job")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    worker.wait_for(r"worker\.stop .* ok=1 failed=0 not_settled=1 timed_out=1 ")  # its counts tell a timeout apart


# --- wakeup and polling ------------------------------------------------------------------------------


@pytest.mark.postgres_only
def test_idle_worker_is_woken_by_an_enqueue_long_before_its_poll_interval(workers, events):
    worker = workers(f"--queue={Q}", "--poll-interval=5000", "--max-poll-interval=5000", "--reaper-interval=60000")
    worker.wait_for("worker.start .*wakeup=listen")
    time.sleep(0.5)  # its first claim round found nothing: it now sleeps up to 5 s
    for n in range(3):
        job = fq.enqueue(Q, {"events": events.path, "n": n}).id
        wait_until(lambda job=job: fq.get(Q, job).state == "succeeded", timeout=10, what="the pickup")
        info = fq.get(Q, job)
        assert info.claimed_at - info.enqueued_at < 1000, "picked up by polling, not by the notification"
        time.sleep(0.2)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_idle_polling_backs_off_to_its_cap_and_resets_when_work_is_found(workers, events):
    worker = workers(f"--queue={Q}", "--poll-interval=20", "--max-poll-interval=160", "--reaper-interval=60000", "-v", "2")
    worker.wait_for(r"worker.idle .*wait_s=0.16$")
    waits = [float(m) for m in re.findall(r"worker.idle .*wait_s=([0-9.]+)", worker.stderr)]
    # Each idle pause repeats the last (woken early, e.g. by the listener connecting) or doubles it.
    assert waits[0] == 0.02 and sorted(set(waits)) == [0.02, 0.04, 0.08, 0.16]
    assert all(b in (a, 2 * a) for a, b in itertools.pairwise(waits))
    mark = len(worker.lines)
    job = fq.enqueue(Q, {"events": events.path}).id
    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the job")
    worker.wait_for(r"worker.idle .*wait_s=0.02$", start=mark)  # back to the short interval after work
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


# --- concurrency ------------------------------------------------------------------------------------------


def test_concurrency_runs_jobs_at_once_and_claims_the_free_slots_in_one_call(workers, events, gate):
    ids = [fq.enqueue(Q, {"events": events.path, "gate": str(gate), "n": n}).id for n in range(4)]
    worker = workers(f"--queue={Q}", "--concurrency=4", *FAST)
    events.wait_for("start", n=4)  # all four run before any may finish
    worker.wait_for(rf"worker.claim .*queue={Q} asked=4 got=4")
    assert {e["current"] for e in events.of("start")} == {True}  # current_job() is the handler's context
    extra = fq.enqueue(Q, {"events": events.path}).id
    time.sleep(0.3)
    assert fq.get(Q, extra).state == "ready"  # no free slot: not claimed
    touch(gate)
    wait_until(lambda: all(fq.get(Q, i).state == "succeeded" for i in [*ids, extra]), what="all jobs")
    assert max_overlap(runs_of(events)) == 4
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_concurrency_limit_holds_across_three_worker_processes(workers, events):
    """Three processes with one slot each want three jobs at once; the queue allows two."""
    fq.configure(Q, concurrency=2, backoff_ms=0)
    with LeaseSampler(Q) as sampler:
        supervisor = workers(f"--queue={Q}", "--processes=3", "--concurrency=1", "--grace=5", *FAST)
        pids = [int(re.search(r"pid=(\d+)", supervisor.wait_for(rf"supervisor.child_start index={i} ")).group(1)) for i in range(3)]
        for pid in pids:
            supervisor.wait_for(rf"worker.start .*pid={pid} ")
        ids = [fq.enqueue(Q, {"events": events.path, "sleep_ms": 60, "done": True, "n": n}).id for n in range(18)]
        wait_until(lambda: fq.stats(Q).counts["succeeded"] == 18, timeout=60, what="all 18 jobs")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.stderr

    assert max(sampler.samples) == 2, "the limit was never reached: the test proves nothing"
    assert max(sampler.running) <= 2
    runs = runs_of(events)
    assert len(runs) == 18 and max_overlap(runs) == 2
    assert len({e["pid"] for e in events.of("start")}) >= 2
    assert {fq.get(Q, i).attempts for i in ids} == {1}


def test_supervisor_restarts_a_crashed_worker_and_forwards_sigterm(workers, events):
    supervisor = workers(f"--queue={Q}", "--processes=2", "--grace=2", *FAST)
    starts = [supervisor.wait_for(rf"supervisor.child_start index={i} ") for i in (0, 1)]
    pids = [int(re.search(r"pid=(\d+)", line).group(1)) for line in starts]
    for pid in pids:
        supervisor.wait_for(rf"worker.start .*pid={pid} ")

    os.kill(pids[1], signal.SIGKILL)
    supervisor.wait_for(rf"supervisor.child_exit index=1 pid={pids[1]} code=-9")
    supervisor.wait_for(r"supervisor.restart index=1 in_s=1")
    line = supervisor.wait_for(r"supervisor.child_start index=1 ", start=supervisor.lines.index(starts[1]) + 1)
    new_pid = int(re.search(r"pid=(\d+)", line).group(1))
    assert new_pid not in pids
    supervisor.wait_for(rf"worker.start .*pid={new_pid} ")

    ids = [fq.enqueue(Q, {"events": events.path, "n": n}).id for n in range(4)]
    wait_until(lambda: all(fq.get(Q, i).state == "succeeded" for i in ids), what="jobs after the restart")

    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.stderr
    for pid in (pids[0], new_pid):
        assert not pid_alive(pid)
        assert re.search(rf"worker.stop worker=\S+:{pid}:\S+ reason=\"signal SIGTERM\"", supervisor.stderr)


def test_orphaned_workers_stop_when_their_supervisor_dies(workers):
    supervisor = workers(f"--queue={Q}", "--processes=2", "--grace=1", *FAST)
    pids = [int(re.search(r"pid=(\d+)", supervisor.wait_for(rf"supervisor.child_start index={i} ")).group(1)) for i in (0, 1)]
    for pid in pids:
        supervisor.wait_for(rf"worker.start .*pid={pid} ")
    supervisor.kill()
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=20, what="the orphans to stop")


def test_fairness_a_busy_queue_does_not_starve_a_small_one(workers, events):
    busy = [fq.enqueue("t.ctl.a", {"events": events.path, "sleep_ms": 10, "n": n}).id for n in range(40)]
    worker = workers("--queue=t.ctl.a", "--queue=t.ctl.b", *FAST)
    events.wait_for("start", n=3)
    small = [fq.enqueue("t.ctl.b", {"events": events.path, "n": n}).id for n in range(4)]
    before = len(events.of("start"))  # busy-queue runs started before the small jobs existed (at most)
    wait_until(lambda: all(fq.get("t.ctl.b", i).state == "succeeded" for i in small), what="the small queue")
    order = [e["queue"] for e in events.of("start")]
    last_small = len(order) - 1 - order[::-1].index("t.ctl.b")
    # The small queue's jobs alternate with the busy queue's instead of waiting behind its 40 jobs:
    # all four ran within the next 2 x 4 runs (plus one in flight).
    assert last_small <= before + 2 * len(small) + 1, order
    wait_until(lambda: all(fq.get("t.ctl.a", i).state == "succeeded" for i in busy), what="the busy queue")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


# --- SQLite locking -----------------------------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_sqlite_database_is_locked_never_kills_the_loop(workers, events, gate):
    job = fq.enqueue(Q, {"events": events.path, "gate": str(gate)}).id
    worker = workers(f"--queue={Q}", "--concurrency=2", "--visibility=30000", *FAST, env={"FQ_CHILD_SQLITE_TIMEOUT": "0.05"})
    events.wait_for("start", job)

    holder = sqlite3.connect(connection.settings_dict["NAME"], timeout=10)
    try:
        holder.execute("BEGIN IMMEDIATE")  # take the write lock from outside
        touch(gate)  # the handler ends: its ack meets a locked database, and so do the claim rounds
        worker.wait_for(r"job.settle_retry .*op=ack .*locked", timeout=30)
        worker.wait_for(r"worker.db_error .*step=claim .*locked", timeout=30)
        time.sleep(0.3)
    finally:
        holder.rollback()
        holder.close()

    wait_until(lambda: fq.get(Q, job).state == "succeeded", what="the retried ack")
    info = fq.get(Q, job)
    assert (info.attempts, info.errors) == (1, [])
    nxt = fq.enqueue(Q, {"events": events.path}).id
    wait_until(lambda: fq.get(Q, nxt).state == "succeeded", what="the next job")
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


# --- progress bar -------------------------------------------------------------------------------------------


def test_burst_shows_a_progress_bar_on_a_terminal_only(workers):
    ids = [fq.enqueue(Q, {"n": n}).id for n in range(20)]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "fq_worker", f"--queue={Q}", "--burst", *FAST],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    assert proc.wait(timeout=10) == 0
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "draining" in screen and "20/20" in screen, screen
    assert "fq_worker: 20 jobs ok, 0 failed" in screen
    assert {fq.get(Q, i).state for i in ids} == {"succeeded"}

    more = [fq.enqueue(Q, {"n": n}).id for n in range(3)]
    piped = workers(f"--queue={Q}", "--burst", *FAST)
    assert piped.wait(timeout=30) == 0
    assert "draining" not in piped.stderr and "\r" not in piped.stderr
    assert {fq.get(Q, i).state for i in more} == {"succeeded"}
