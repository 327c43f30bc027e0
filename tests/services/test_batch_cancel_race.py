"""``batches.cancel`` racing the acks of its members, from real threads (docs/reference/semantics.md §9 "Batches").

The cancel is set-based (500 members per transaction, ``Store.cancel_unfinished``);
two threads ack running members while a third cancels the batch. Every member
ends exactly one way: an ack that returned is a succeeded member, an ack that
raised ``ReceiptCancelled`` a cancelled one; the batch's counts and the queue's
counters agree with the members, nothing is left running, and the callback is
never enqueued (the batch was cancelled before its last member finished).
"""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from django_fq import batches
from django_fq import services as fq
from django_fq.exceptions import ReceiptCancelled
from django_fq.models import Job
from django_fq.storage.dependencies import DependencySql

pytestmark = pytest.mark.django_db(transaction=True)

Q = "tests:race-members"
CALLBACK = "tests:race-callback"
N = 240


@pytest.mark.parametrize("chunk", [500, 16])
def test_cancel_racing_acks_leaves_each_member_one_way_and_no_callback(monkeypatch, chunk):
    monkeypatch.setattr(batches, "CANCEL_CHUNK", chunk)
    fq.configure(Q, max_attempts=1)
    b = batches.create(Q, callback=(CALLBACK, "done"))
    ids = [r.id for r in batches.add(b.id, [{"payload": {"i": i}} for i in range(N)])]
    batches.seal(b.id)
    leased = fq.claim(Q, count=N, worker="racer")
    assert len(leased) == N
    before = fq.stats(Q).totals
    go = threading.Event()
    # The ackers take the first eighth of their jobs freely, then wait until the cancel's first chunk
    # has begun: on a backend whose writers queue up (SQLite) the acks could otherwise all land before
    # the canceller's first statement, and no race would be run.
    cancel_began = threading.Event()
    real_cancel_unfinished = DependencySql.cancel_unfinished

    def cancel_unfinished(self, *args, **kwargs):
        cancel_began.set()
        return real_cancel_unfinished(self, *args, **kwargs)

    monkeypatch.setattr(DependencySql, "cancel_unfinished", cancel_unfinished)
    outcome: dict[str, str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def acker(jobs):
        try:
            go.wait(30)
            for n, job in enumerate(jobs):
                if n == len(jobs) // 8:
                    cancel_began.wait(60)
                try:
                    fq.ack(Q, job.receipt, result={"i": job.id})
                    got = "acked"
                except ReceiptCancelled:
                    got = "cancelled"
                with lock:
                    outcome[job.id] = got
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    reported: dict = {}

    def canceller():
        try:
            go.wait(30)
            reported["info"] = batches.cancel(b.id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    # Two ackers from both ends, so the cancel's chunks meet acks in their middle and at their edges.
    threads = [
        threading.Thread(target=acker, args=(leased[: N // 2],)),
        threading.Thread(target=acker, args=(list(reversed(leased[N // 2 :])),)),
        threading.Thread(target=canceller),
    ]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors
    assert set(outcome) == set(ids)
    states = dict(Job.objects.filter(uid__in=ids).values_list("uid", "state"))
    for uid in ids:
        want = "succeeded" if outcome[uid] == "acked" else "cancelled"
        assert states[uid] == want, (uid, outcome[uid], states[uid])
    acked = sum(o == "acked" for o in outcome.values())
    cancelled = N - acked
    info = batches.get(b.id)
    assert info.state == "cancelled"
    assert (info.succeeded, info.cancelled, info.dead) == (acked, cancelled, 0)
    assert cancelled > 0, "the cancel came after every ack: no race was run"
    # Only the cancel cancels: what it reported is every cancelled member (an ack after it only fails).
    assert reported["info"].cancelled == cancelled and reported["info"].succeeded <= acked
    after = fq.stats(Q)
    assert after.counts["running"] == 0
    assert after.totals["acked"] - before["acked"] == acked
    assert after.totals["cancelled"] - before["cancelled"] == cancelled
    # A receipt of a member reported cancelled never acks afterwards.
    for job in leased:
        if outcome[job.id] == "cancelled":
            with pytest.raises(ReceiptCancelled):
                fq.ack(Q, job.receipt)
            break
    assert not Job.objects.filter(queue__name=CALLBACK).exists()
    assert all(json.loads(j.metadata or "{}").get("batch") is None for j in Job.objects.filter(queue__name=Q))
