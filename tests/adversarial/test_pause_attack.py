"""Attacks on pause/resume (docs/reference/semantics.md §9 "Pause") and the ack cut by bytes.

Real threads against the real database. Each test named for a finding failed when it was
written; the others are attacks that held and stay as guards.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import DatabaseError, connection, connections

from django_fq import services as fq
from tests.threads import elsewhere

from .helpers import repeatable_read

Q = "atk-pause"


# --- a claim inside a caller's REPEATABLE READ transaction whose snapshot predates the pause ----


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_a_claim_in_a_snapshot_older_than_the_pause_takes_no_job():
    """§9: from the moment pause() returned, every claim that starts hands out no job. A claim in a
    caller's REPEATABLE READ transaction whose snapshot was taken before the pause read the flag
    from that old snapshot (PostgreSQL's one-statement claim) and took a job ready before it."""
    fq.configure(Q)
    job_id = fq.enqueue(Q, {"n": 1}).id
    taken: list = []
    if connection.vendor == "postgresql":
        # The snapshot cannot see the pause: the claim fails as a serialization failure (the
        # caller retries its transaction, and then sees the pause); no job is taken.
        with pytest.raises(DatabaseError) as info, repeatable_read():
            assert elsewhere(lambda: fq.pause(Q)).changed
            taken = fq.claim(Q, count=5)
        assert getattr(info.value.__cause__, "sqlstate", None) == "40001", info.value
    else:
        with repeatable_read():
            assert elsewhere(lambda: fq.pause(Q)).changed
            taken = fq.claim(Q, count=5)
    assert taken == [], f"a claim that started after pause() returned took {[j.id for j in taken]}"
    assert fq.get(Q, job_id).state == "ready"
    with repeatable_read():  # the caller's retry: a fresh snapshot sees the pause
        assert fq.claim(Q, count=5) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_a_claim_in_a_repeatable_read_transaction_still_claims_and_a_pause_waits_for_it():
    """The guard does not refuse a running queue, and the claim decides as of its own read: a pause()
    made meanwhile waits for the caller's transaction to commit (PostgreSQL: the share lock; MariaDB:
    the claim's locks), so it cannot return while that claim still holds a job it could take."""
    from .helpers import Background, wait_for_lock_waiter

    fq.configure(Q)
    job_id = fq.enqueue(Q, {"n": 1}).id
    with repeatable_read():
        assert [j.id for j in fq.claim(Q, count=5)] == [job_id]
        pausing = Background(lambda: fq.pause(Q)).start()
        if connection.vendor == "postgresql":
            wait_for_lock_waiter(1, thread=pausing)
            assert pausing.thread.is_alive(), "pause() returned while a claim's transaction was open"
    pausing.join()
    assert pausing.error is None and pausing.value.changed
    assert fq.get(Q, job_id).state == "running"


# --- claims racing a pause: none that starts after pause() returned takes a job ---------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [0, 50], ids=["unlimited", "limited"])
def test_no_claim_started_after_pause_returned_takes_a_job_and_none_takes_a_later_job(concurrency):
    """Four claimers loop while the main thread pauses, then enqueues "late" jobs. A claim whose
    start is after pause() returned must come back empty; no claim before the resume may take a
    late job; after the resume every job is claimed exactly once."""
    fq.configure(Q, concurrency=concurrency)
    fq.enqueue_many(Q, [{"payload": {"early": i}} for i in range(600)])
    log: list[tuple[float, list]] = []  # (start of the claim, ids it took)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer():
        try:
            while not stop.is_set():
                started = time.monotonic()
                jobs = fq.claim(Q, count=3, visibility_ms=600_000)
                with lock:
                    log.append((started, [j.id for j in jobs]))
                for j in jobs:  # settle, so a concurrency limit never runs out
                    fq.ack(Q, j.receipt)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sum(len(ids) for _, ids in list(log)) < 30:
        time.sleep(0.01)
    fq.pause(Q)
    returned = time.monotonic()
    late = {r.id for r in fq.enqueue_many(Q, [{"payload": {"late": i}} for i in range(20)])}
    # Let every claimer start several claims after the pause.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sum(1 for s, _ in list(log) if s > returned) < 40:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    after = [ids for s, ids in log if s > returned and ids]
    assert not after, f"claims that started after pause() returned took jobs: {after[:3]}"
    taken = [i for _, ids in log for i in ids]
    assert not late & set(taken), "a job enqueued after pause() returned was claimed before the resume"
    fq.resume(Q)
    rest = []
    while True:
        got = fq.claim(Q, count=100)
        if not got:
            break
        rest += [j.id for j in got]
        for j in got:
            fq.ack(Q, j.receipt)
    everything = taken + rest
    assert len(everything) == len(set(everything)) == 620, "a job was lost or handed out twice"


# --- pause and resume from many threads at once -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_pause_and_resume_from_many_threads_agree_with_the_row():
    """Eight threads pause and resume one queue at once: no error escapes (lock waits are retried),
    the changed answers alternate (as many resumes that changed as pauses, give or take the final
    state), and the row's paused_at agrees with its flag. A pause that lost the race to another
    pause answered ``paused=False`` (the flag as read before its UPDATE): the CLI then printed
    "queue not paused" for a pause."""
    fq.configure(Q)
    from django_fq.models import Queue

    results: list = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def flip(n):
        try:
            go.wait(10)
            for i in range(15):
                pausing = (i + n) % 2 == 0
                res = (fq.pause if pausing else fq.resume)(Q)
                with lock:
                    results.append((pausing, res))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=flip, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    paused = sum(1 for _, r in results if r.changed and r.paused)
    resumed = sum(1 for _, r in results if r.changed and not r.paused)
    row = Queue.objects.get(name=Q)
    assert paused - resumed == (1 if row.paused else 0)
    assert (row.paused_at is not None) == row.paused
    for pausing, r in results:
        # A pause answers paused (changed or not), a resume running: never the state it undid.
        assert r.paused is pausing and (r.paused_at is not None) == r.paused, (pausing, r)


# --- odd queue names ---------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name", ["a\x00b", "\x00", "q" * 201, "é", "ключ", "q\n", " q", "q/..", "", "\ud800"],
    ids=["nul", "only-nul", "201-chars", "accent", "cyrillic", "newline", "space", "slash", "empty", "surrogate"],
)
def test_pause_and_resume_refuse_odd_names_by_field_and_create_nothing(name):
    from django_fq.exceptions import InvalidQueueName
    from django_fq.models import Queue

    before = Queue.objects.count()
    for verb in (fq.pause, fq.resume):
        with pytest.raises(InvalidQueueName) as info:
            verb(name)
        assert info.value.field == "queue"
    assert Queue.objects.count() == before


@pytest.mark.django_db
def test_a_200_character_name_pauses():
    name = "q" * 200
    fq.configure(name)
    assert fq.pause(name).changed and fq.claim(name) == []


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["a%00b", "%00", "q" * 201, "%C3%A9", "q%0A", "%ED%A0%80", "%FF"])
def test_the_rest_pause_of_an_odd_name_is_a_400_not_a_500(settings, raw):
    from tests.api.conftest import client_as

    settings.ROOT_URLCONF = "tests.api.urls"
    manager = client_as("manage")
    for verb in ("pause", "resume"):
        r = manager.post(f"/api/fq/queues/{raw}/{verb}/", content_type="application/json")
        assert r.status_code in (400, 404), (raw, verb, r.status_code, r.content[:200])
        assert r.json()["code"] in ("invalid_queue_name", "not_found", "queue_not_found")


# --- a long poll that began before the pause -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_begun_before_the_pause_takes_no_later_job_until_the_resume():
    """The long poll is waiting when the pause comes; the enqueue after it wakes the poll (NOTIFY on
    PostgreSQL, this process's waiters elsewhere), which must find nothing and wait on; the resume
    must then hand it the job well before its wait runs out."""
    fq.configure(Q)
    out: dict = {}
    begun = threading.Event()

    def poll():
        try:
            begun.set()
            started = time.monotonic()
            out["jobs"] = fq.claim(Q, wait_ms=15_000)
            out["took"] = time.monotonic() - started
        finally:
            connections.close_all()

    thread = threading.Thread(target=poll)
    thread.start()
    begun.wait(10)
    fq.pause(Q)
    job_id = fq.enqueue(Q, {"late": 1}).id
    # The poll looked at least once after the enqueue (LONG_POLL_INTERVAL_S at most apart).
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and thread.is_alive():
        assert fq.get(Q, job_id).state == "ready", "the long poll took a job of a paused queue"
        time.sleep(0.05)
    assert thread.is_alive(), f"the long poll returned while paused: {out}"
    fq.resume(Q)
    thread.join(20)
    assert [j.id for j in out["jobs"]] == [job_id] and out["took"] < 14


# --- ack_many with replayed, forged and duplicate receipts across the byte-cut runs -----------


@pytest.mark.django_db(transaction=True)
def test_ack_many_across_runs_settles_each_job_once_and_judges_the_rest(monkeypatch):
    """A statement budget so small that every ack is a run of its own (PostgreSQL: the cut; elsewhere
    the same call without one): a receipt repeated with the same result in a later run is a replay,
    with another result invalid; a forged one and one of an acked job invalid; counters count each
    job once."""
    from django_fq import storage
    from django_fq.exceptions import InvalidReceipt
    from django_fq.services import leases

    fq.configure(Q)
    for i in range(6):
        fq.enqueue(Q, {"i": i})
    jobs = fq.claim(Q, count=6, visibility_ms=600_000)
    old = jobs[5]
    assert fq.ack(Q, old.receipt).state == "succeeded"
    store = type(storage.for_connection(connection))
    monkeypatch.setattr(store, "statement_budget", lambda self, conn: leases._ACK_ROW_BYTES + 40)
    statements = []
    if store.supports_one_statement_ack:
        real = store.ack_matching
        monkeypatch.setattr(store, "ack_matching", lambda self, conn, **kw: statements.append(1) or real(self, conn, **kw))
    forged = jobs[0].receipt[:-4] + ("AAAA" if not jobs[0].receipt.endswith("AAAA") else "BBBB")
    acks = [
        (jobs[0].receipt, {"r": 0}),
        (jobs[1].receipt, {"r": 1}),
        (forged, {"r": 0}),
        (jobs[0].receipt, {"r": 0}),  # same result: a replay
        (jobs[1].receipt, {"r": "other"}),  # another result: invalid
        (jobs[2].receipt, None),
        (old.receipt, {"x": 1}),  # acked before with no result: invalid
        (jobs[3].receipt, {"r": 3}),
        (jobs[2].receipt, None),  # a replay
        (12345, None),  # not a receipt at all
    ]
    out = fq.ack_many(Q, acks)
    kinds = [("replay" if r.replay else r.state) if not isinstance(r, InvalidReceipt) else "invalid" for r in out]
    assert kinds == [
        "succeeded", "succeeded", "invalid", "replay", "invalid", "succeeded", "invalid", "succeeded", "replay",
        "invalid",
    ]  # fmt: skip
    if store.supports_one_statement_ack:
        assert len(statements) >= 8, "the budget did not cut the batch into runs"
    assert fq.get(Q, jobs[0].id).result == {"r": 0} and fq.get(Q, jobs[1].id).result == {"r": 1}
    stats = fq.stats(Q)
    assert stats.totals["acked"] == 5 and stats.counts["running"] == 1 and stats.counts["succeeded"] == 5


# --- export and import of a paused queue -------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_queue_restored_from_its_backup_is_still_paused():
    """A backup taken while a queue is paused (a downstream service down, say) restored into an empty
    database made the queue run again: the queue line had no pause, and the workers took its jobs."""
    import io

    from django_fq import backup

    fq.configure(Q)
    job_id = fq.enqueue(Q, {"n": 1}).id
    at = fq.pause(Q).paused_at
    out = io.StringIO()
    backup.export_jsonl(out, [Q])
    fq.delete_queue(Q)
    backup.import_jsonl(io.StringIO(out.getvalue()))
    stats = fq.stats(Q)
    assert (stats.paused, stats.paused_at) == (True, at)
    assert fq.claim(Q) == [], "the restored queue hands out jobs although it was paused"
    fq.resume(Q)
    assert [j.id for j in fq.claim(Q)] == [job_id]


@pytest.mark.django_db
def test_an_import_keeps_the_pause_of_an_existing_queue_and_refuses_a_bad_pause_by_field():
    import io
    import json

    from django_fq import backup
    from django_fq.exceptions import InvalidBackup

    fq.configure(Q)
    out = io.StringIO()
    backup.export_jsonl(out, [Q])
    header, queue_line = out.getvalue().splitlines()[:2]
    assert json.loads(queue_line)["paused"] is False and json.loads(queue_line)["paused_at"] is None
    fq.pause(Q)
    backup.import_jsonl(io.StringIO(out.getvalue()))  # the queue exists: it keeps its own pause
    assert fq.stats(Q).paused is True

    base = json.loads(queue_line)
    base["name"] = "atk-pause-new"
    for changes, field in (({"paused": "yes"}, "paused"), ({"paused": False, "paused_at": 5}, "paused_at"),
                           ({"paused": True, "paused_at": -1}, "paused_at")):  # fmt: skip
        text = "\n".join([header, json.dumps({**base, **changes})]) + "\n"
        with pytest.raises(InvalidBackup) as info:
            backup.import_jsonl(io.StringIO(text))
        assert (info.value.line, info.value.field) == (2, field)
    # An older file without the keys restores a running queue; paused without an instant: now.
    old = {k: v for k, v in base.items() if k not in ("paused", "paused_at")}
    backup.import_jsonl(io.StringIO("\n".join([header, json.dumps(old)]) + "\n"))
    assert fq.stats("atk-pause-new").paused is False
    fq.delete_queue("atk-pause-new")
    backup.import_jsonl(io.StringIO("\n".join([header, json.dumps({**old, "paused": True})]) + "\n"))
    stats = fq.stats("atk-pause-new")
    assert stats.paused is True and stats.paused_at is not None
