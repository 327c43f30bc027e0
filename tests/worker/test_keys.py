"""Per-key concurrency with real ``fq_worker`` processes (docs/reference/semantics.md §9 "Per-key limits").

Four worker processes serve ``t.keys`` with ``key_concurrency=1``; the handler
(``tests/testapp/fq_handlers.py``) records each run's start and end read from
the database clock. No two runs of one key may overlap, while runs of other
keys do; and a kill storm (``kill -9`` of workers mid-run) loses no job and
leaks no key slot.
"""

from __future__ import annotations

import itertools
import signal
from collections import Counter

import pytest

from django_fq import services as fq
from django_fq.models import ConcurrencyKey, Job, Queue

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.keys"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")
KEYS = 50


def _enqueue(events, per_key: int, sleep_ms: int) -> list[str]:
    items = [
        {"payload": {"key": f"c{k}", "sleep_ms": sleep_ms, "events": events.path}, "concurrency_key": f"c{k}"}
        for _ in range(per_key)
        for k in range(KEYS)
    ]
    return [r.id for r in fq.enqueue_many(Q, items)]


def _succeeded() -> int:
    return Job.objects.filter(queue__name=Q, state="succeeded").count()


def _overlaps(runs: list[dict]) -> list[tuple]:
    """Pairs of runs of one key whose [start, end] intervals (database clock, ms) overlap."""
    bad = []
    by_key: dict[str, list[dict]] = {}
    for r in runs:
        by_key.setdefault(r["key"], []).append(r)
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r["start"])
        for a, b in itertools.pairwise(rs):
            if b["start"] < a["end"]:
                bad.append((key, a["id"], b["id"]))
    return bad


def _most_at_once(runs: list[dict]) -> int:
    """The largest number of runs in progress at one instant, over all keys."""
    points = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs], key=lambda p: (p[0], p[1]))
    now = most = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def _stop(procs) -> None:
    for p in procs:
        p.wait_for(r"worker\.start ", timeout=60)  # it handles SIGTERM from then on
        p.signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr


def _no_slot_leaked() -> None:
    qid = Queue.objects.get(name=Q).id
    active = Counter(
        Job.objects.filter(queue_id=qid, state__in=("queued", "running")).values_list("concurrency_key", flat=True)
    )
    assert {k: n for k, n in ConcurrencyKey.objects.filter(queue_id=qid).values_list("key", "admitted") if n} == dict(
        active
    )


def test_four_processes_never_run_two_jobs_of_one_key_and_other_keys_flow(workers, events):
    fq.configure(Q, key_concurrency=1)
    procs = [workers("--queue", Q, "--concurrency", "3", *FAST) for _ in range(4)]
    for p in procs:
        p.wait_for(r"worker\.start ", timeout=60)  # all four claim from the start
    ids = _enqueue(events, per_key=4, sleep_ms=30)
    wait_until(lambda: _succeeded() == len(ids), timeout=240, what="every job to succeed")
    _stop(procs)
    runs = events.of("run")
    assert sorted({r["id"] for r in runs}) == sorted(ids)
    assert _overlaps(runs) == []
    assert _most_at_once(runs) >= 2  # jobs of other keys ran meanwhile
    assert len({r["pid"] for r in runs}) >= 2  # the limit held across processes
    _no_slot_leaked()


@pytest.mark.slow
def test_a_kill_storm_with_keys_loses_nothing_and_leaks_no_slot(workers, events):
    fq.configure(Q, key_concurrency=1, backoff_ms=0, max_attempts=1000, visibility_ms=2000)
    ids = _enqueue(events, per_key=6, sleep_ms=40)
    procs = [workers("--queue", Q, "--concurrency", "3", *FAST) for _ in range(4)]
    for n in range(8):  # kill -9 one worker mid-run, as soon as more work got done, and start a new one
        target = min(len(ids) - 1, _succeeded() + 15)
        wait_until(lambda target=target: _succeeded() >= target, timeout=120, what=f"progress before kill {n}")
        victim = procs.pop(n % len(procs))
        victim.kill()  # kill -9: no release, no settle; its leases expire
        procs.append(workers("--queue", Q, "--concurrency", "3", *FAST))
    wait_until(lambda: _succeeded() == len(ids), timeout=240, what="every job to succeed after the storm")
    # Every key can run again: one more job per key, all done.
    more = _enqueue(events, per_key=1, sleep_ms=0)
    wait_until(lambda: _succeeded() == len(ids) + len(more), timeout=120, what="a job of every key after the storm")
    _stop(procs)
    assert Job.objects.filter(queue__name=Q).exclude(state="succeeded").count() == 0
    assert _overlaps(events.of("run")) == []
    _no_slot_leaked()
    assert not ConcurrencyKey.objects.filter(queue__name=Q, admitted__gt=0).exists()
