"""Queue time to live (docs/reference/semantics.md §9 "Queue time to live").

A queue with ``ttl_ms`` is deleted by ``prune()`` once it has been empty and
idle that long by the database clock (moved here with the ``clock``
fixture, inside the SQL). What keeps it: an unfinished or dead job, a live
idempotency token, a pause, and any activity younger than its time to live.
"""

from __future__ import annotations

import importlib
import io
import json
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from django_fq import services as fq
from django_fq.exceptions import InvalidPolicy, QueueNotFound
from django_fq.models import Queue
from tests.threads import elsewhere

from .helpers import claim_one

pytestmark = pytest.mark.django_db

MINUTE = 60_000
DAY = 24 * 60 * MINUTE


def exists(q: str) -> bool:
    return Queue.objects.filter(name=q).exists()


def expire(q: str) -> bool:
    """Run a prune pass; True when it deleted ``q``."""
    before = exists(q)
    result = fq.prune()
    gone = before and not exists(q)
    assert result.queues >= int(gone)
    return gone


@pytest.mark.parametrize("bad", [-1, 365 * DAY + 1, True, "60000", 1.5])
def test_ttl_ms_is_a_policy_field_with_bounds(q, bad):
    fq.configure(q, ttl_ms=10 * MINUTE)
    with pytest.raises(InvalidPolicy) as info:
        fq.configure(q, ttl_ms=bad)
    assert info.value.field == "ttl_ms"
    assert fq.policy(q).ttl_ms == 10 * MINUTE  # nothing written


def test_a_new_queue_has_no_ttl_and_is_kept_forever(q, clock):
    fq.configure(q, max_attempts=3)
    assert fq.policy(q).ttl_ms == 0
    clock.advance(365 * DAY)
    assert not expire(q)


def test_an_empty_queue_is_deleted_exactly_when_idle_for_its_ttl(q, clock):
    fq.configure(q, ttl_ms=10 * MINUTE)  # configure is the last activity
    clock.advance(10 * MINUTE - 1000)
    assert not expire(q)
    clock.advance(1000)
    assert expire(q)
    with pytest.raises(QueueNotFound):
        fq.policy(q)


def test_the_last_finished_job_counts_as_activity(q, clock):
    fq.configure(q, ttl_ms=10 * MINUTE)
    fq.enqueue(q, {})
    clock.advance(8 * MINUTE)
    fq.ack(q, claim_one(q).receipt)  # the job's last state change: 8 minutes in
    clock.advance(9 * MINUTE)
    assert not expire(q)
    clock.advance(MINUTE)
    assert expire(q)


@pytest.mark.parametrize("state", ["ready", "scheduled", "running", "dead"])
def test_a_queue_holding_an_unfinished_or_dead_job_is_kept(q, clock, state):
    fq.configure(q, ttl_ms=MINUTE, max_attempts=1)
    job = fq.enqueue(q, {}, delay_ms=DAY if state == "scheduled" else 0).id
    if state in ("running", "dead"):
        claimed = claim_one(q)
        if state == "dead":
            fq.nack(q, claimed.receipt, error="gave up")
    clock.advance(2 * MINUTE) if state != "running" else None
    assert fq.get(q, job).state == state
    clock.advance(2 * MINUTE) if state == "running" else None  # the lease expires: still not finished
    assert not expire(q)
    assert fq.get(q, job).state in (state, "dead")  # a reaped lease: dead (1 attempt), kept still


def test_a_paused_queue_is_kept(q, clock):
    fq.configure(q, ttl_ms=MINUTE)
    fq.pause(q)
    clock.advance(DAY)
    assert not expire(q)
    fq.resume(q)
    assert expire(q)  # resume is not activity: the pause is the only thing that kept it


def test_a_live_idempotency_token_keeps_the_queue_until_it_expires(q, clock):
    fq.configure(q, ttl_ms=MINUTE, idempotency_retention_ms=30 * MINUTE)
    job = fq.enqueue(q, {}, idempotency="once").id
    fq.ack(q, claim_one(q).receipt)
    clock.advance(29 * MINUTE)
    assert not expire(q)  # deleting the token would let "once" make a second job
    assert fq.enqueue(q, {}, idempotency="once").id == job
    clock.advance(MINUTE)
    assert expire(q)


def test_pruning_the_finished_jobs_does_not_make_the_queue_look_idle_since_its_creation(q, clock, settings):
    settings.FQ_FINISHED_RETENTION_MS = MINUTE
    fq.configure(q, ttl_ms=DAY)
    clock.advance(2 * DAY)  # the queue is old now
    fq.enqueue(q, {})
    fq.ack(q, claim_one(q).receipt)
    clock.advance(2 * MINUTE)
    result = fq.prune()  # the job goes (1 minute retention); its time is recorded first
    assert result.jobs == 1 and result.queues == 0 and exists(q)
    clock.advance(DAY - 3 * MINUTE)
    assert not expire(q)
    clock.advance(MINUTE)
    assert expire(q)


def test_fq_queue_ttl_ms_is_the_ttl_of_queues_created_from_then_on(settings, clock):
    settings.FQ_QUEUE_TTL_MS = 5 * MINUTE
    fq.enqueue("ttl.typo", {"to": "a@example.com"})  # a typo made this queue
    assert fq.policy("ttl.typo").ttl_ms == 5 * MINUTE
    fq.cancel("ttl.typo", fq.jobs("ttl.typo", state="ready").jobs[0].id)
    clock.advance(5 * MINUTE)
    assert expire("ttl.typo")
    fq.configure("ttl.kept", ttl_ms=0)  # opting out
    clock.advance(DAY)
    assert not expire("ttl.kept")


def test_a_recreated_queue_starts_afresh(q, clock):
    fq.configure(q, ttl_ms=MINUTE, max_attempts=7)
    clock.advance(MINUTE)
    assert expire(q)
    fq.enqueue(q, {})
    assert fq.policy(q).max_attempts == 25 and fq.policy(q).ttl_ms == 0
    assert fq.stats(q).totals["enqueued"] == 1  # the counters went with the old queue


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_flight_while_the_queue_expires_keeps_it_and_its_job(q, clock, monkeypatch):
    """The pass has judged the queue expired from committed rows; the enqueue commits before it deletes."""
    queues = importlib.import_module("django_fq.services.queues")  # the module: services.queues is the verb

    fq.configure(q, ttl_ms=MINUTE)
    clock.advance(MINUTE)
    enqueued, judged, release = threading.Event(), threading.Event(), threading.Event()
    out: dict = {}
    real_activity = queues._activity

    def activity_then_signal(ids):
        rows = real_activity(ids)
        if not judged.is_set():
            assert any(expired for *_, expired in rows)  # the job is not committed yet
            judged.set()
        return rows

    monkeypatch.setattr(queues, "_activity", activity_then_signal)

    def producer():
        try:
            with transaction.atomic():
                out["job"] = fq.enqueue(q, {"late": True}).id
                enqueued.set()
                assert release.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert enqueued.wait(60)
        pruner = threading.Thread(target=lambda: out.setdefault("prune", elsewhere(fq.prune)))
        pruner.start()
        assert judged.wait(60)
        if connection.vendor == "postgresql":
            assert elsewhere(_wait_for_a_lock_wait), "prune did not wait for the enqueue's lock"
        release.set()  # the enqueue commits while the pass waits for (or is about to take) the queue row
        pruner.join(60)
        assert not pruner.is_alive()
    finally:
        release.set()
        thread.join(60)
    assert out["prune"].queues == 0
    assert exists(q) and fq.get(q, out["job"]).state == "ready"


def _wait_for_a_lock_wait() -> bool:
    with connection.cursor() as cur:
        for _ in range(600):
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            if cur.fetchone()[0]:
                return True
            time.sleep(0.1)  # polling for the event: the state is in another session
    return False


def test_the_cli_sets_and_shows_ttl_ms_and_refuses_a_bad_one(q):
    out = io.StringIO()
    call_command("fq", "config", q, "--ttl", "120000", "--json", stdout=out)
    assert json.loads(out.getvalue())["ttl_ms"] == 120_000
    assert fq.policy(q).ttl_ms == 120_000
    err = io.StringIO()
    with pytest.raises(SystemExit) as info:
        call_command("fq", "config", q, "--ttl", "-5", "--json", stdout=io.StringIO(), stderr=err)
    assert info.value.code == 1
    assert json.loads(err.getvalue())["field"] == "ttl_ms"
    assert fq.policy(q).ttl_ms == 120_000


def test_prune_reports_the_queues_it_deleted_on_the_cli(q, clock):
    fq.configure(q, ttl_ms=MINUTE)
    clock.advance(MINUTE)
    out = io.StringIO()
    call_command("fq", "prune", "--json", stdout=out)
    assert json.loads(out.getvalue())["queues"] == 1
    assert not exists(q)
