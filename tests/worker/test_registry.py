"""The worker registry with real ``fq_worker`` processes (issue 19; docs/admin.md "Workers").

A worker registers before it claims (its row is there when its start line
is), moves its heartbeat once per ``FQ_WORKER_HEARTBEAT_MS``, deletes its
row on a SIGTERM shutdown, and a SIGKILLed worker is reported gone once its
heartbeat is ``STALE_BEATS`` intervals old (database clock), then pruned
``GONE_KEEP_MS`` later. The children beat every 200 ms
(``FQ_CHILD_WORKER_HEARTBEAT_MS``), so the tests wait for events, not sleeps.
"""

from __future__ import annotations

import re
import signal
import socket

import pytest
from django.test import override_settings

import django_fq
from django_fq import services as fq
from django_fq.services.workers import GONE_KEEP_MS, STALE_BEATS

from .helpers import touch, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

BEAT_MS = 200
ENV = {"FQ_CHILD_WORKER_HEARTBEAT_MS": str(BEAT_MS)}


def worker_id_of(proc) -> str:
    line = proc.wait_for(r"worker\.start")
    return re.search(r"worker=(\S+)", line).group(1)


def row(worker_id: str):
    return next((w for w in fq.workers() if w.worker_id == worker_id), None)


def test_a_worker_is_listed_with_its_facts_beats_and_is_deleted_at_sigterm(workers, events, gate):
    proc = workers("--queue=t.ctl", "--queue=t.ctl.a", "--concurrency=3", env=ENV)
    wid = worker_id_of(proc)
    first = row(wid)  # registered before the start line
    assert first is not None, fq.workers()
    assert (first.pid, first.host, first.concurrency) == (proc.pid, socket.gethostname(), 3)
    assert first.queues == ["t.ctl", "t.ctl.a"]
    assert (first.pool, first.version, first.heartbeat_ms, first.state) == (
        "threads",
        django_fq.__version__,
        BEAT_MS,
        "live",
    )
    assert first.started_at <= first.heartbeat_at
    assert fq.workers(queue="t.ctl.a")[0].worker_id == wid
    assert fq.workers(queue="t.ctl.b") == []

    job = fq.enqueue("t.ctl", {"events": events.path, "gate": str(gate)}).id
    events.wait_for("start", job)
    # The next beats record the running job and move the heartbeat (the database clock's).
    busy = wait_until(lambda: (w := row(wid)) is not None and w.running == 1 and w.heartbeat_at > first.heartbeat_at and w,
                      what="a heartbeat with the running job")  # fmt: skip
    assert busy.state == "live" and busy.started_at == first.started_at
    touch(gate)
    wait_until(lambda: fq.stats("t.ctl").counts["succeeded"] == 1, what="the job to succeed")
    later = wait_until(lambda: (w := row(wid)) is not None and w.running == 0 and w, what="a beat after the job")
    assert later.heartbeat_at > busy.heartbeat_at

    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stderr
    assert row(wid) is None
    assert fq.workers() == []


def test_a_sigkilled_worker_is_gone_after_three_beats_then_pruned_an_hour_later(workers):
    proc = workers("--queue=t.ok", "--concurrency=2", env=ENV)
    wid = worker_id_of(proc)
    wait_until(lambda: (w := row(wid)) is not None and w.heartbeat_at > w.started_at + 1, what="a first heartbeat")
    proc.kill()
    last = row(wid)
    assert last is not None
    gone = wait_until(
        lambda: (w := row(wid)) is not None and w.state == "gone" and w, what="the killed worker to be gone"
    )
    # Gone only once its last heartbeat is STALE_BEATS intervals old (database clock), and it stayed at that beat.
    assert gone.age_ms > STALE_BEATS * BEAT_MS
    assert gone.heartbeat_at == wait_until(lambda: row(wid)).heartbeat_at
    assert [w.worker_id for w in fq.workers(state="gone")] == [wid]
    assert fq.workers(state="live") == []

    assert fq.prune_workers() == 0  # gone, but not for an hour yet: kept, shown as gone
    assert row(wid) is not None
    with override_settings(FQ_TEST_CLOCK_OFFSET_MS=GONE_KEEP_MS + STALE_BEATS * BEAT_MS):
        assert fq.prune().workers == 1
    assert row(wid) is None


def test_a_live_worker_is_never_pruned_and_registers_again_when_its_row_went(workers):
    proc = workers("--queue=t.ok", env=ENV)
    wid = worker_id_of(proc)
    assert fq.prune_workers() == 0
    from django_fq.models import WorkerProcess

    WorkerProcess.objects.filter(worker_id=wid).delete()  # as a prune after a long partition would
    back = wait_until(lambda: row(wid), what="the worker to register again")
    assert back.pid == proc.pid and back.state == "live"
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stderr
    assert row(wid) is None


def test_supervised_children_register_each_and_go_with_the_supervisor(workers):
    proc = workers("--queue=t.ok", "--processes=2", "--worker-id=sup", env=ENV)
    found = wait_until(lambda: len(ws := fq.workers()) == 2 and ws, timeout=60, what="two children registered")
    assert sorted(w.worker_id for w in found) == ["sup-0", "sup-1"]
    assert proc.pid not in {w.pid for w in found}  # the supervisor runs no jobs: it has no row
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stderr
    assert fq.workers() == []


def test_no_row_with_heartbeat_0(workers):
    proc = workers("--queue=t.ok", "--burst", env={"FQ_CHILD_WORKER_HEARTBEAT_MS": "0"})
    worker_id_of(proc)
    assert fq.workers() == []
    assert proc.wait(60) == 0, proc.stderr


def test_a_beat_keeps_only_its_own_processs_row_alive():
    """Process A's beat never keeps alive the row of B that took over its worker id (B then died)."""
    from django.db import connection

    from django_fq import db, storage

    from ..worker_rows import add_worker

    add_worker("shared-id", host="host-a", pid=111)
    add_worker("shared-id", host="host-b", pid=222, gone=True)  # B took the id over, then stopped beating
    store = storage.for_connection(connection)
    now = db.now_sql(connection)
    assert not store.beat_worker(connection, now=now, worker_id="shared-id", host="host-a", pid=111, running=7)
    (b,) = [w for w in fq.workers() if w.worker_id == "shared-id"]
    assert (b.host, b.pid, b.state, b.running) == ("host-b", 222, "gone", 1)
    assert store.beat_worker(connection, now=now, worker_id="shared-id", host="host-b", pid=222, running=3)
    assert row("shared-id").state == "live"
