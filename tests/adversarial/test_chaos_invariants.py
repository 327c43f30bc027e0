"""Every verb at once on one queue from 8 threads, then the books must balance (docs/reference/semantics.md §6, §9 "Invariants").

Threads enqueue (tokens, unique keys, bulk), claim with tiny leases, ack / ack_many
/ nack / release / extend random receipts (live, expired, settled or stale),
cancel / retry / requeue random jobs, reap, fold counters and flip the queue's
concurrency limit. Afterwards (no prune ran): every enqueued job is in exactly
one state and the counts match the totals; the internal running sums match the
rows; leases exist exactly for running jobs; every token names a real job; and
no receipt settles anything any more.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connections
from django.db.models import Sum

from django_fq import services as fq
from django_fq.exceptions import FqError, InvalidReceipt
from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter

pytestmark = pytest.mark.django_db(transaction=True)

Q = "adv.chaos"
SECONDS = 1.5
MIN_OPS = 80  # per thread: about 100 enqueues and 70 claims over the 8 threads


def chaos(seed: int, stop_at: float, receipts: list, lock: threading.Lock, errors: list) -> None:
    rng = random.Random(seed)
    ops = ["enqueue"] * 3 + ["bulk", "claim", "claim", "ack", "ack", "ack_many", "nack", "release", "extend",
           "cancel", "retry", "requeue", "reap", "fold", "configure"]  # fmt: skip

    def token():
        return rng.choice([None, f"t{rng.randint(0, 25)}"])

    def key():
        return rng.choice([None, None, f"k{rng.randint(0, 8)}"])

    def some_receipt():
        with lock:
            return rng.choice(receipts) if receipts else "fq1.bogus"

    def some_job():
        ids = list(Job.objects.filter(queue__name=Q).values_list("uid", flat=True)[:300])
        return rng.choice(ids) if ids else "0" * 32

    done = 0
    try:
        # At least SECONDS and MIN_OPS operations per thread, so a slow machine still races enough.
        while (time.monotonic() < stop_at or done < MIN_OPS) and time.monotonic() < stop_at + 60:
            done += 1
            op = rng.choice(ops)
            try:
                if op == "enqueue":
                    fq.enqueue(Q, {"r": rng.random()}, idempotency=token(), unique_key=key(),
                               timeout_ms=rng.choice([None, None, 30]), priority=rng.randint(-2, 2))  # fmt: skip
                elif op == "bulk":
                    fq.enqueue_many(Q, [{"payload": n, "idempotency": token(), "unique_key": key()} for n in range(rng.randint(1, 6))])
                elif op == "claim":
                    got = fq.claim(Q, count=rng.randint(1, 5), visibility_ms=rng.choice([5, 20, 60, 2000]))
                    with lock:
                        receipts.extend(job.receipt for job in got)
                elif op == "ack":
                    fq.ack(Q, some_receipt(), result={"ok": 1})
                elif op == "ack_many":
                    fq.ack_many(Q, [(some_receipt(), {"ok": 1}) for _ in range(rng.randint(1, 4))])
                elif op == "nack":
                    fq.nack(Q, some_receipt(), error="boom", delay_ms=rng.choice([None, 0, 10]), permanent=rng.random() < 0.1)
                elif op == "release":
                    fq.release(Q, some_receipt())
                elif op == "extend":
                    fq.extend(Q, some_receipt(), visibility_ms=rng.choice([5, 50]))
                elif op in ("cancel", "retry", "requeue"):
                    getattr(fq, op)(Q, some_job())
                elif op == "reap":
                    fq.reap(Q if rng.random() < 0.5 else None)
                elif op == "fold":
                    fq.fold_counters()
                elif op == "configure":
                    fq.configure(Q, concurrency=rng.choice([0, 0, 3]))
            except FqError:
                pass
    except BaseException as exc:
        errors.append(exc)
    finally:
        connections.close_all()


def test_books_balance_after_every_verb_races_every_other(clock):
    fq.configure(Q, max_attempts=3, backoff_ms=0, visibility_ms=50)
    receipts: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + SECONDS
    threads = [threading.Thread(target=chaos, args=(n, stop_at, receipts, lock, errors)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [], [repr(e) for e in errors]

    clock.advance(10 * 60_000)  # every lease and timeout has run out
    fq.reap()
    assert fq.reap().expired == 0

    stats = fq.stats(Q)
    counts, totals = stats.counts, stats.totals
    assert totals["enqueued"] > 50 and totals["claimed"] > 50, totals  # the chaos did happen
    # Every enqueued job ends in exactly one state, matching stats.
    assert sum(counts.values()) == totals["enqueued"] == Job.objects.filter(queue__name=Q).count()
    assert counts["running"] == 0
    assert counts["succeeded"] == totals["acked"] == stats.run_count
    assert counts["cancelled"] == totals["cancelled"]
    assert stats.wait_count == totals["claimed"]
    assert counts["dead"] + totals["retried"] <= totals["dead"]
    assert totals["claimed"] >= totals["acked"] + totals["nacked"] + totals["released"] + totals["expired"] + totals["timed_out"]
    # Internal running sums (queue-full checks) match the rows.
    qid = Queue.objects.get(name=Q).id
    sums = QueueCounter.objects.filter(queue_id=qid).aggregate(active=Sum("active"), tokens=Sum("token_rows"))
    assert sums["active"] == counts["scheduled"] + counts["ready"] + counts["running"]
    assert sums["tokens"] == IdempotencyToken.objects.filter(queue_id=qid).count()
    assert Lease.objects.filter(queue_id=qid).count() == 0
    # Every token names a job that exists (nothing was pruned).
    uids = set(Job.objects.filter(queue_id=qid).values_list("uid", flat=True))
    assert set(IdempotencyToken.objects.filter(queue_id=qid).values_list("job_uid", flat=True)) <= uids
    # At most one active job per unique key.
    keys = list(Job.objects.filter(queue_id=qid, state__in=["queued", "running"]).exclude(unique_key=None).values_list("unique_key", flat=True))
    assert len(keys) == len(set(keys))
    # No receipt settles anything now: each ack is refused or only replays a recorded ack.
    for receipt in set(receipts):
        try:
            assert fq.ack(Q, receipt, result={"ok": 1}).replay is True
        except InvalidReceipt:
            pass
    assert fq.stats(Q).totals == totals


def test_prune_racing_acks_loses_no_ack_and_no_count():
    """Acks from 4 threads while prune(retention_ms=0) deletes what they finish, in a loop."""
    q = "adv.prune.acks"
    fq.enqueue_many(q, [{"payload": n} for n in range(240)])
    claimed = fq.claim(q, count=240, visibility_ms=600_000)
    assert len(claimed) == 240
    done = threading.Event()
    errors: list[BaseException] = []
    pruned = []

    def acker(part):
        try:
            for job in part:
                fq.ack(q, job.receipt, result={"n": job.payload})
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def pruner():
        try:
            while not done.is_set():
                pruned.append(fq.prune(retention_ms=0).jobs)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    ackers = [threading.Thread(target=acker, args=(claimed[i::4],)) for i in range(4)]
    prune_thread = threading.Thread(target=pruner)
    prune_thread.start()
    for t in ackers:
        t.start()
    for t in ackers:
        t.join(60)
    done.set()
    prune_thread.join(60)
    assert errors == [], [repr(e) for e in errors]
    stats = fq.stats(q)
    assert stats.totals["acked"] == stats.run_count == 240
    assert stats.counts["succeeded"] + sum(pruned) == 240
    assert sum(stats.counts.values()) == stats.counts["succeeded"]
    assert Lease.objects.filter(queue__name=q).count() == 0
