"""kill -9 and SIGTERM storms against real ``fq_worker`` processes (slow tier).

docs/reference/semantics.md §7: a killed worker loses no job (its leases expire and the jobs run
again); SIGTERM releases what it holds and exits 0. §9: attempts = claims −
releases, and every enqueued job ends in exactly one state, matching stats.
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from django_fq import services as fq
from tests.worker.helpers import Events, WorkerProc, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

Q = "t.ctl"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50", "--grace=5")
JOBS = 120
STORM_S = 6.0


def test_kill_storm_loses_no_job_and_keeps_the_books(tmp_path):
    events = Events(tmp_path / "events.jsonl")
    rng = random.Random(7)
    fq.configure(Q, max_attempts=1000, backoff_ms=0)
    # Jobs of 50-250 ms: 120 of them keep 9 slots busy for about 2 s even on an idle machine, so the
    # kills land while jobs run (with 0-40 ms jobs an idle machine drained everything before the first kill).
    ids = [r.id for r in fq.enqueue_many(Q, [{"payload": {"events": events.path, "sleep_ms": rng.randint(50, 250)}} for _ in range(JOBS)])]

    def start(n: int) -> WorkerProc:
        extra = ("--prefetch=3",) if n % 2 else ()
        return WorkerProc(f"--queue={Q}", "--concurrency=3", "--visibility=400", *extra, *FAST)

    live = [start(n) for n in range(3)]
    killed, stopped = [], []
    n = 3
    try:
        wait_until(lambda: events.of("start"), 30, what="a first job to start")
        give_up = time.monotonic() + STORM_S
        while time.monotonic() < give_up:
            time.sleep(rng.uniform(0.15, 0.5))
            # SIGTERM is only promised to a worker that runs (signal handlers are set when it starts serving).
            ready = [p for p in live if p.count(r"worker\.start")]
            if not ready:
                continue
            victim = ready[rng.randrange(len(ready))]
            live.remove(victim)
            if rng.random() < 0.7:
                victim.kill()
                killed.append(victim)
            else:
                victim.signal(signal.SIGTERM)
                stopped.append(victim)
            live.append(start(n))
            n += 1
        wait_until(lambda: fq.stats(Q).counts["succeeded"] == JOBS, 90, interval=0.2, what="every job to succeed")
    finally:
        for proc in live:
            if proc.alive():
                proc.wait_for(r"worker\.start", 30)
                proc.signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in live + stopped]
        for proc in killed:
            proc.wait(10)

    assert codes == [0] * len(codes), [(p.pid, p.proc.returncode, p.stderr[-2000:]) for p in live + stopped if p.proc.returncode]
    assert len(killed) >= 3
    stats = fq.stats(Q)
    counts, totals = stats.counts, stats.totals
    assert counts == {"waiting": 0, "scheduled": 0, "ready": 0, "running": 0, "succeeded": JOBS, "dead": 0, "cancelled": 0}
    assert totals["enqueued"] == totals["acked"] == JOBS
    assert totals["claimed"] == totals["acked"] + totals["nacked"] + totals["released"] + totals["expired"] + totals["timed_out"]
    assert totals["expired"] > 0  # the storm did kill jobs mid-lease
    for job_id in ids:
        info = fq.get(Q, job_id)
        kinds = [e["kind"] for e in info.errors]
        assert set(kinds) <= {"expired", "release"}, kinds
        # attempts = claims − releases = (expiries + the final claim)
        assert info.attempts == kinds.count("expired") + 1, (job_id, info.attempts, kinds)
        assert info.result and info.result.get("ok") is True
