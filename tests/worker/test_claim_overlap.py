"""The next claim overlaps the ack of the previous one, and never more jobs are leased than ``--concurrency``.

On a server database the completer acks at most half the worker's capacity per
``ack_many`` (``django_fq.worker.completer.ack_limit``), so slots free while the
rest of the hand is still being acked and the claim loop claims for them at once
(docs/performance.md#fourth-round-claim-and-ack-overlap). A slot frees only once its ack
committed: the leases held never exceed ``--concurrency`` (docs/reference/cli.md, ``fq_worker``).
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.db import connection

from django_fq import services as fq
from django_fq.worker import Worker
from django_fq.worker import completer as completer_module
from django_fq.worker.state import InHand

from .helpers import LeaseSampler, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def _embedded() -> bool:
    return connection.vendor == "sqlite"


def test_a_claim_goes_out_while_the_previous_ack_is_in_flight_and_the_hand_never_exceeds_concurrency(monkeypatch):
    q = "ov.inproc"
    fq.enqueue_many(q, [{"payload": i} for i in range(96)])
    spans: dict[str, list[tuple[float, float, int]]] = {"claim": [], "ack": []}
    lock = threading.Lock()
    real_claim, real_ack = fq.claim, fq.ack_many

    def claim(queue, *, count, **kwargs):
        started = time.monotonic()
        jobs = real_claim(queue, count=count, **kwargs)
        with lock:
            spans["claim"].append((started, time.monotonic(), len(jobs)))
        return jobs

    def ack_many(queue, pairs, **kwargs):
        started = time.monotonic()
        time.sleep(0.03)  # a slow round trip: the claim loop has time to claim meanwhile
        results = real_ack(queue, pairs, **kwargs)
        with lock:
            spans["ack"].append((started, time.monotonic(), len(pairs)))
        return results

    monkeypatch.setattr(fq, "claim", claim)
    monkeypatch.setattr(fq, "ack_many", ack_many)
    peak = {"held": 0}
    real_add = InHand.add

    def add(self, runnings, hand_to):
        real_add(self, runnings, hand_to)
        with self.lock:
            peak["held"] = max(peak["held"], len(self.jobs))

    monkeypatch.setattr(InHand, "add", add)

    worker = Worker([q], handlers={q: lambda job: None}, concurrency=8, burst=True, poll_interval_ms=5, reaper=False)
    stats = worker.run()

    assert stats.ok == 96 and fq.stats(q).counts["succeeded"] == 96
    assert peak["held"] == 8  # the hand was full, and never fuller than --concurrency
    sizes = [n for _s, _e, n in spans["ack"]]
    if _embedded():
        assert worker.completer.limit == completer_module.ACK_BATCH
        return
    assert worker.completer.limit == 4 and max(sizes) <= 4, sizes
    overlapping = [
        c for c in spans["claim"] if c[2] and any(a[0] < c[0] < a[1] for a in spans["ack"])
    ]  # a claim that started while an ack was in flight
    assert overlapping, spans


def test_a_real_worker_overlapping_claims_and_acks_never_holds_more_leases_than_its_concurrency(workers):
    q = "t.noop"
    fq.enqueue_many(q, [{"payload": i} for i in range(600)])
    with LeaseSampler(q, interval=0.002) as sampler:
        worker = workers(f"--queue={q}", "--concurrency=16", "--burst", *FAST)
        assert worker.wait(timeout=120) == 0, worker.stderr
    wait_until(lambda: fq.stats(q).counts["succeeded"] == 600, what="all 600 jobs")
    assert max(sampler.samples) <= 16, max(sampler.samples)
    assert max(sampler.running) <= 16
    asked = [int(n) for n in _claims(worker.stderr)]
    assert sum(int(g) for g in _claims(worker.stderr, "got")) == 600
    if not _embedded():
        # Claims for half the hand: made while the other half was being acked.
        assert asked.count(8) >= 10, asked


def _claims(text: str, field: str = "asked") -> list[str]:
    return re.findall(rf"worker\.claim .*?\b{field}=(\d+)", text)
