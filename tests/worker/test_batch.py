"""Batch handlers (docs/how-to/batch-handlers.md, django_fq/worker/batch.py) against real ``fq_worker`` processes.

The handlers are in tests/testapp/fq_handlers_batch.py. Leases and receipts are
per job as for one-job handlers (docs/reference/semantics.md#s5), a worker
killed outright loses no job of its batch (docs/reference/semantics.md#s7).
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.models import Lease

from .helpers import touch, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.batch"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def _batches(events) -> list[dict]:
    return events.of("batch")


def test_every_job_is_acked_one_claim_per_batch_and_results_stored(workers, events):
    ids = [r.id for r in fq.enqueue_many(Q, [{"payload": {"events": events.path, "n": n}} for n in range(120)])]
    worker = workers(f"--queue={Q}", "--burst", *FAST)
    assert worker.wait(timeout=60) == 0, worker.stderr
    calls = _batches(events)
    # 120 ready jobs, batches of 50: 50, 50 and the 20 left (a batch larger than the ready count).
    assert [len(c["ids"]) for c in calls] == [50, 50, 20]
    assert sorted(i for c in calls for i in c["ids"]) == sorted(ids)
    assert worker.count(r"worker\.claim .*queue=t\.batch ") == 3
    assert fq.stats(Q).counts["succeeded"] == 120
    for n in (0, 77, 119):
        assert fq.get(Q, ids[n]).result == {"n": n, "attempt": 1}


def test_a_batch_is_only_as_large_as_the_ready_count(workers, events):
    ids = [fq.enqueue(Q, {"events": events.path, "n": n}).id for n in range(7)]
    worker = workers(f"--queue={Q}", "--burst", *FAST)
    assert worker.wait(timeout=60) == 0, worker.stderr
    assert [sorted(c["ids"]) for c in _batches(events)] == [sorted(ids)]
    assert all(fq.get(Q, i).state == "succeeded" for i in ids)


def test_partial_failure_is_retried_with_attempts_counted_and_the_rest_acked(workers, events):
    fq.configure(Q, max_attempts=3, backoff_ms=0, max_backoff_ms=0)
    items = [{"payload": {"events": events.path, "n": n, "fail_until": 2 if n % 3 == 0 else 0}} for n in range(30)]
    items.append({"payload": {"events": events.path, "n": 30, "dead": True}})
    ids = [r.id for r in fq.enqueue_many(Q, items)]
    worker = workers(f"--queue={Q}", "--burst", *FAST)
    assert worker.wait(timeout=60) == 0, worker.stderr
    for n, job_id in enumerate(ids[:30]):
        info = fq.get(Q, job_id)
        assert info.state == "succeeded", (n, info.state)
        if n % 3 == 0:  # failed once, then succeeded on its second attempt
            assert info.attempts == 2 and info.result == {"n": n, "attempt": 2}
            assert len(info.errors) == 1 and f"item {n} failed on attempt 1" in info.errors[0]["error"]
        else:
            assert info.attempts == 1 and info.errors == []
    dead = fq.get(Q, ids[30])
    assert dead.state == "dead" and dead.attempts == 1 and "can never be processed" in dead.last_error
    totals = fq.stats(Q).totals
    assert totals["acked"] == 30 and totals["nacked"] == 11  # 10 retried + 1 made dead


def test_an_exception_fails_every_job_of_the_batch(workers, events):
    queue = "t.batch.raise"
    fq.configure(queue, max_attempts=2, backoff_ms=0, max_backoff_ms=0)
    ids = [r.id for r in fq.enqueue_many(queue, [{"payload": {"events": events.path, "n": n}} for n in range(4)])]
    worker = workers(f"--queue={queue}", "--burst", *FAST)
    assert worker.wait(timeout=60) == 0, worker.stderr
    for job_id in ids:
        info = fq.get(queue, job_id)
        assert (info.state, info.attempts) == ("dead", 2)
        assert "RuntimeError: the whole batch of" in info.last_error
    calls = _batches(events)
    # The first call had all four; their retries become ready one nack at a time, so they may come in smaller batches.
    assert len(calls[0]["ids"]) == 4
    assert sorted(i for c in calls for i in c["ids"]) == sorted(ids * 2)


def test_a_lost_lease_drops_only_that_jobs_settle(workers, events, gate):
    ids = [fq.enqueue(Q, {"events": events.path, "n": n, "gate": str(gate)}).id for n in range(5)]
    worker = workers(f"--queue={Q}", "--visibility=60000", *FAST)
    events.wait_for("start")
    fq.cancel(Q, ids[2])  # its lease ends now; the batch still runs
    touch(gate)
    wait_until(lambda: fq.stats(Q).counts["succeeded"] == 4, what="the other four acked")
    assert fq.get(Q, ids[2]).state == "cancelled"
    assert all(fq.get(Q, i).state == "succeeded" for i in ids if i != ids[2])
    assert fq.stats(Q).totals["acked"] == 4
    worker.wait_for(rf"job\.(cancelled|lease_lost|not_settled) job={ids[2]}")


def test_each_job_of_a_batch_has_its_own_receipt(workers, events, gate):
    ids = [fq.enqueue(Q, {"events": events.path, "n": n, "gate": str(gate)}).id for n in range(10)]
    workers(f"--queue={Q}", "--visibility=60000", *FAST)
    events.wait_for("start")
    leases = list(Lease.objects.filter(job__uid__in=ids).values_list("receipt_hash", "generation"))
    assert len(leases) == 10
    assert len({h for h, _ in leases}) == 10  # one receipt per job, none shared by the batch
    touch(gate)
    wait_until(lambda: fq.stats(Q).counts["succeeded"] == 10, what="the batch acked")


def test_a_worker_killed_mid_batch_loses_no_job(workers, events, gate):
    ids = [fq.enqueue(Q, {"events": events.path, "n": n, "gate": str(gate)}).id for n in range(6)]
    first = workers(f"--queue={Q}", "--visibility=1500", "--no-reaper", *FAST)
    events.wait_for("start")
    first.kill()  # kill -9 in the middle of the batch: no settle, no release
    assert all(fq.get(Q, i).state == "running" for i in ids)
    touch(gate)
    second = workers(f"--queue={Q}", "--visibility=60000", *FAST)
    wait_until(lambda: fq.stats(Q).counts["succeeded"] == 6, timeout=60, what="the batch run again after the lease")
    for job_id in ids:
        info = fq.get(Q, job_id)
        assert info.attempts == 2 and info.result["attempt"] == 2
        assert [e["kind"] for e in info.errors] == ["expired"]
    assert second.alive()


def test_the_heartbeat_extends_every_lease_of_a_batch_that_outlives_its_visibility(workers, events, gate):
    ids = [fq.enqueue(Q, {"events": events.path, "n": n, "gate": str(gate)}).id for n in range(5)]
    worker = workers(f"--queue={Q}", "--visibility=1000", *FAST)  # a beat every third of a second
    events.wait_for("start")
    first = dict(Lease.objects.filter(job__uid__in=ids).values_list("job__uid", "deadline"))
    assert len(first) == 5

    def all_extended_past_their_first_deadline():
        now = dict(Lease.objects.filter(job__uid__in=ids).values_list("job__uid", "deadline"))
        return len(now) == 5 and all(now[i] >= first[i] + 1000 for i in ids)

    wait_until(all_extended_past_their_first_deadline, timeout=30, what="every lease of the batch extended")
    touch(gate)
    wait_until(lambda: fq.stats(Q).counts["succeeded"] == 5, what="the batch acked")
    for job_id in ids:
        info = fq.get(Q, job_id)
        assert info.attempts == 1 and info.errors == []  # never expired, never run twice
    assert worker.count(r"job\.lease_lost") == 0
