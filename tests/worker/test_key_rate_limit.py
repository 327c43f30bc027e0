"""A per-key rate limit across real worker processes (docs/reference/semantics.md §9 "Per-key limits").

Four ``fq_worker`` processes serve ``t.keyrate`` with ``key_rate_limit=5`` per 1000 ms over 20
keys that always have work waiting. The claim instants are the ones the database recorded
(``claimed_at``, database clock): no key has more than 5 in any window, and the keys' tokens are
used as they free (at least 90 % of what the limit allows over the run).
"""

from __future__ import annotations

import signal
from collections import defaultdict

import pytest

from django_fq import services as fq
from django_fq.models import Job, Queue
from tests.services.helpers import most_in_a_window

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.keyrate"
KEYS, LIMIT, WINDOW_MS, SECONDS = 20, 5, 1000, 3


def _instants() -> dict[str, list[int]]:
    qid = Queue.objects.get(name=Q).id
    found: dict[str, list[int]] = defaultdict(list)
    rows = Job.objects.filter(queue_id=qid, claimed_at__isnull=False).values_list("concurrency_key", "claimed_at")
    for key, at in rows:
        found[key].append(at)
    return {k: sorted(v) for k, v in found.items()}


def _past_the_span(span_ms: int) -> bool:
    got = _instants()
    if len(got) < KEYS:
        return False
    start = min(v[0] for v in got.values())
    return all(v[-1] >= start + span_ms for v in got.values())


def test_four_processes_hold_each_keys_rate_and_use_it(workers):
    fq.configure(Q, key_rate_limit=LIMIT, rate_window_ms=WINDOW_MS)
    span_ms = SECONDS * 1000
    procs = [
        workers(f"--queue={Q}", f"--worker-id=kr{n}", "--concurrency=32", "--poll-interval=10",
                "--max-poll-interval=50", "--reaper-interval=50")
        for n in range(4)
    ]  # fmt: skip
    for proc in procs:
        proc.wait_for(r"worker\.start ", timeout=60)  # all four claim from the first window on
    per_key = LIMIT * (span_ms // WINDOW_MS) + 2 * LIMIT  # more than the run can take: every key always waits
    fq.enqueue_many(Q, [{"payload": n, "concurrency_key": f"c{n % KEYS}"} for n in range(per_key * KEYS)])
    # Until every key has a claim past the span: every claim inside it has committed by then.
    wait_until(lambda: _past_the_span(span_ms), timeout=SECONDS + 90, what="the run")
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.stderr
    instants = _instants()
    start = min(v[0] for v in instants.values())
    busiest = {k: most_in_a_window(v, WINDOW_MS) for k, v in instants.items()}
    assert max(busiest.values()) <= LIMIT, busiest
    admitted = sum(1 for v in instants.values() for t in v if t < start + span_ms)
    allowed = KEYS * LIMIT * span_ms // WINDOW_MS
    print(f"{admitted} of {allowed} keyed claims admitted in {span_ms} ms over {KEYS} keys")
    assert 0.9 * allowed <= admitted <= allowed, f"{admitted} claims in {span_ms} ms, limit {allowed}"
