"""Pausing and resuming a queue (docs/reference/semantics.md §9 "Pause"): every claim refuses, nothing else stops."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_fq import db as fqdb
from django_fq import services as fq
from django_fq.exceptions import InvalidQueueName, QueueNotFound
from django_fq.models import Queue
from django_fq.types import PauseResult
from tests.threads import elsewhere

from .helpers import claim_one

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("concurrency", [0, 3], ids=["unlimited", "limited"])
def test_pause_then_claim_gets_nothing_and_resume_then_claim_gets_the_job(q, concurrency):
    fq.configure(q, concurrency=concurrency)
    job_id = fq.enqueue(q, {"n": 1}).id
    fq.pause(q)
    assert fq.claim(q, count=10) == []
    assert fq.get(q, job_id).state == "ready"
    assert fq.stats(q).totals["claimed"] == 0

    fq.resume(q)
    got = claim_one(q, count=10)
    assert got.id == job_id and got.attempts == 1


def test_a_claim_inside_the_callers_transaction_refuses_too(q):
    fq.enqueue(q, {})
    fq.pause(q)
    with transaction.atomic():
        assert fq.claim(q) == []
    fq.resume(q)
    with transaction.atomic():
        assert len(fq.claim(q)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_pause_committed_elsewhere_stops_the_next_claim_here(q):
    # Nothing is cached per process: a pause by another connection counts at once.
    fq.enqueue(q, {})
    fq.enqueue(q, {})
    assert len(fq.claim(q)) == 1
    elsewhere(lambda: fq.pause(q))
    assert fq.claim(q) == []
    elsewhere(lambda: fq.resume(q))
    assert len(fq.claim(q)) == 1


def test_pause_and_resume_report_what_they_did(q):
    before = fqdb.db_now_ms()
    first = fq.pause(q)
    after = fqdb.db_now_ms()
    assert first.queue == q and first.paused is True and first.changed is True
    assert before <= first.paused_at <= after

    # Pausing again: no error, nothing written, the first instant kept.
    assert fq.pause(q) == PauseResult(queue=q, paused=True, paused_at=first.paused_at, changed=False)
    assert Queue.objects.get(name=q).paused_at == first.paused_at

    assert fq.resume(q) == PauseResult(queue=q, paused=False, paused_at=None, changed=True)
    assert fq.resume(q) == PauseResult(queue=q, paused=False, paused_at=None, changed=False)
    row = Queue.objects.get(name=q)
    assert (row.paused, row.paused_at) == (False, None)


def test_stats_and_queues_show_the_pause(q):
    fq.enqueue(q, {})
    assert (fq.stats(q).paused, fq.stats(q).paused_at) == (False, None)
    at = fq.pause(q).paused_at
    stats = fq.stats(q)
    assert (stats.paused, stats.paused_at) == (True, at)
    assert stats.counts["ready"] == 1
    (info,) = [i for i in fq.queues() if i.name == q]
    assert (info.paused, info.paused_at) == (True, at)
    fq.resume(q)
    (info,) = [i for i in fq.queues() if i.name == q]
    assert (info.paused, info.paused_at) == (False, None)


def test_unknown_queue_and_bad_names_are_refused_and_create_nothing():
    for verb in (fq.pause, fq.resume):
        with pytest.raises(QueueNotFound) as err:
            verb("no-such-queue")
        assert err.value.code == "queue_not_found" and err.value.field == "queue"
        with pytest.raises(InvalidQueueName):
            verb("bad name!")
    assert not Queue.objects.filter(name="no-such-queue").exists()


def test_enqueue_into_a_paused_queue_works(q):
    fq.pause(q)
    one = fq.enqueue(q, {"a": 1})
    many = fq.enqueue_many(q, [{"payload": {"b": i}} for i in range(3)])
    assert one.created and all(r.created for r in many)
    assert fq.stats(q).counts["ready"] == 4
    assert fq.claim(q, count=10) == []
    fq.resume(q)
    assert len(fq.claim(q, count=10)) == 4


def test_running_jobs_settle_normally_while_paused(q):
    for i in range(4):
        fq.enqueue(q, {"i": i})
    held = fq.claim(q, count=4, visibility_ms=60_000)
    assert len(held) == 4
    fq.pause(q)

    deadline = fq.extend(q, held[0].receipt, visibility_ms=120_000)
    assert deadline > held[0].deadline
    fq.report_progress(q, held[0].receipt, 50, "half")
    assert fq.get(q, held[0].id).progress == 50
    assert fq.ack(q, held[0].receipt, result={"ok": 1}).state == "succeeded"
    assert fq.nack(q, held[1].receipt, delay_ms=0, error="boom").state == "ready"
    assert fq.release(q, held[2].receipt).state == "ready"
    acked = fq.ack_many(q, [(held[3].receipt, None)])
    assert acked[0].state == "succeeded"

    # The nacked and released jobs wait for the resume.
    assert fq.claim(q, count=10) == []
    fq.resume(q)
    assert sorted(j.id for j in fq.claim(q, count=10)) == sorted([held[1].id, held[2].id])


def test_the_reaper_still_expires_leases_of_a_paused_queue(q, frozen):
    fq.configure(q, backoff_ms=0)
    job_id = fq.enqueue(q, {}).id
    job = claim_one(q, visibility_ms=1000)
    fq.pause(q)
    frozen.set(job.deadline)
    assert fq.reap().expired == 1
    info = fq.get(q, job_id)
    assert (info.state, info.lease_deadline) == ("ready", None)
    assert fq.claim(q) == []
    fq.resume(q)
    assert claim_one(q).attempts == 2


def test_a_claim_of_a_paused_queue_still_ends_its_expired_leases(q, frozen):
    # The expiry step every claim runs first is not a claim: it goes on while paused.
    fq.configure(q, backoff_ms=0)
    job_id = fq.enqueue(q, {}).id
    job = claim_one(q, visibility_ms=1000)
    fq.pause(q)
    frozen.set(job.deadline)
    assert fq.claim(q) == []
    info = fq.get(q, job_id)
    assert info.state == "ready" and fq.stats(q).totals["expired"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_waits_while_paused_and_takes_the_job_once_resumed(q):
    job_id = fq.enqueue(q, {}).id
    fq.pause(q)
    assert fq.claim(q, wait_ms=300) == []  # waits its time out, returns none

    out: dict = {}
    started = threading.Event()

    def poll():
        started.set()
        try:
            out["jobs"] = fq.claim(q, wait_ms=15_000)
        finally:
            connections.close_all()

    thread = threading.Thread(target=poll)
    thread.start()
    started.wait(10)
    fq.resume(q)
    thread.join(20)
    assert not thread.is_alive()
    assert [j.id for j in out["jobs"]] == [job_id]
