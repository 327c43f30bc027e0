"""A queue's rate limit across real worker processes (docs/reference/semantics.md §9 "Rate limits").

The claim instants are the ones the database recorded (``claimed_at``, database clock): no window
of ``rate_window_ms`` ever holds more than ``rate_limit`` of them, and while work waits the
workers use the slots as they free (at least 98 % of the limit over the run).
"""

from __future__ import annotations

import signal

import pytest

from django_fq import services as fq
from django_fq.models import Job, Queue
from tests.services.helpers import most_in_a_window

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.rate"


def _instants() -> list[int]:
    qid = Queue.objects.get(name=Q).id
    return sorted(Job.objects.filter(queue_id=qid, claimed_at__isnull=False).values_list("claimed_at", flat=True))


def _run(workers, *, limit: int, window_ms: int, seconds: int, processes: int) -> None:
    fq.configure(Q, rate_limit=limit, rate_window_ms=window_ms)
    span_ms = seconds * 1000
    # More work than the run can take, so jobs always wait behind the limit.
    fq.enqueue_many(Q, [{"payload": n} for n in range(limit * (span_ms // window_ms) + 2 * limit)])
    # Claims of up to 32 jobs: a window's slots go in a few claims, so little latency queues up behind
    # the queue's lock (docs/reference/semantics.md §9 "Rate limits", "How close to the limit").
    procs = [
        workers(f"--queue={Q}", f"--worker-id=r{n}", "--concurrency=32", "--poll-interval=50", "--reaper-interval=60000")
        for n in range(processes)
    ]
    # Until a claim past the span: every claim inside it has committed (the queue's claims run
    # one after another under its lock, each reading the clock after the one before committed).
    wait_until(lambda: (got := _instants()) and got[-1] >= got[0] + span_ms, timeout=seconds + 60, what="the run")
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0
    instants = _instants()
    assert most_in_a_window(instants, window_ms) <= limit, "a window held more claims than the rate limit"
    admitted = sum(1 for t in instants if t < instants[0] + span_ms)
    allowed = limit * span_ms // window_ms
    print(f"{admitted} of {allowed} claims admitted in {span_ms} ms; busiest window {most_in_a_window(instants, window_ms)}")
    assert 0.98 * allowed <= admitted <= allowed, f"{admitted} claims in {span_ms} ms, limit {allowed}"


def test_two_processes_hold_50_per_second_and_use_it(workers):
    _run(workers, limit=50, window_ms=1000, seconds=3, processes=2)


@pytest.mark.slow
def test_four_processes_hold_100_per_second_for_20_seconds(workers):
    _run(workers, limit=100, window_ms=1000, seconds=20, processes=4)


def test_a_worker_held_by_the_rate_limit_sleeps_until_the_next_slot(monkeypatch):
    """No spinning: with a 10 ms poll a worker would claim ~150 times in 1.5 s; it claims when the slot frees."""
    from django_fq import services
    from django_fq.worker import Worker

    fq.configure(Q, rate_limit=1, rate_window_ms=1500)
    ids = [fq.enqueue(Q, {"n": n}).id for n in range(3)]
    calls: list[int] = []
    real = services.claim

    def counted(*args, **kwargs):
        got = real(*args, **kwargs)
        calls.append(len(got))
        return got

    monkeypatch.setattr(services, "claim", counted)
    Worker([Q], handlers={Q: lambda job: None}, poll_interval_ms=10, max_poll_interval_ms=10, reaper=False, max_jobs=2).run()
    first, second = sorted(fq.get(Q, i).claimed_at for i in ids if fq.get(Q, i).state == "succeeded")
    assert second - first >= 1500
    assert sum(calls) == 2 and len(calls) <= 6, calls
