"""The lease methods of the Store (claim, settle, expiry), called directly: the same assertions on every backend.

Rows are written with the ORM, so these tests depend on no service but the
store method under test. Where backends differ, a capability flag of the
store decides the expectation (docs/explanation/storage.md). Concurrency is
tested with real threads, each on its own connection.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from django_fq import db, storage
from django_fq import services as fq
from django_fq.conf import CLAIM_PAYLOAD_CAP_BYTES
from django_fq.exceptions import InvalidReceipt
from django_fq.models import Job, Lease, Queue, QueueCounter
from django_fq.storage import base
from tests.threads import in_threads

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 60


def _store():
    return storage.for_connection(connection)


def _now() -> int:
    return db.db_now_ms()


@pytest.fixture
def frozen(monkeypatch):
    """The database clock stands at one instant (a constant in the SQL), moved by ``frozen.set(t)``."""

    class Frozen:
        now = _now()

        def set(self, t: int) -> None:
            self.now = t

    clock = Frozen()
    monkeypatch.setattr(db, "now_sql", lambda conn=None: f"({clock.now:d})")
    return clock


def _queue(name: str, **fields) -> int:
    return Queue.objects.create(name=name, created_at=_now(), **fields).id


def _jobs(queue_id: int, n: int = 1, *, size: int = 2, priority: int = 0, run_at: int | None = None) -> list[str]:
    """Insert ``n`` queued jobs; return their uids in insertion (seq) order."""
    t = _now() if run_at is None else run_at
    uids = [uuid.uuid4().hex for _ in range(n)]
    Job.objects.bulk_create(
        Job(uid=u, queue_id=queue_id, priority=priority, run_at=t, enqueued_at=t, changed_at=t, max_attempts=5,
            payload="{}", payload_size=size)
        for u in uids
    )
    return uids


def _seq(uid: str) -> int:
    return Job.objects.get(uid=uid).seq


def _take(queue_id: int, count: int = 1, *, concurrency: int = 0, cap: int = CLAIM_PAYLOAD_CAP_BYTES, worker="w"):
    conn = db.connection()
    return db.retrying(
        lambda: storage.for_connection(conn).take_jobs(
            conn, queue_id=queue_id, count=count, concurrency=concurrency, worker=worker, cap=cap
        )
    )


def _lease(conn, row: dict, queue_id: int, deadline: int, receipt_hash: str = "h" * 64) -> None:
    """Write the lease of a job ``take_jobs`` returned (the services' neutral INSERT)."""
    with conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO {Lease._meta.db_table} (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, "
            "timeout_at, worker) VALUES (%s, %s, %s, %s, %s, %s, NULL, 'w')",
            [row["seq"], queue_id, row["generation"], receipt_hash, row["claimed_at"], deadline],
        )


def _leased(queue_id: int, n: int = 1, *, deadline: int) -> list[dict]:
    """Take ``n`` jobs and lease them until ``deadline``; return the taken rows."""
    rows = []

    def apply():
        conn = db.connection()
        rows[:] = storage.for_connection(conn).take_jobs(
            conn, queue_id=queue_id, count=n, concurrency=0, worker="w", cap=CLAIM_PAYLOAD_CAP_BYTES
        )
        for r in rows:
            _lease(conn, r, queue_id, deadline)

    db.retrying(apply)
    assert len(rows) == n
    return rows


def _in_threads(n: int, target) -> list:
    return in_threads(n, target, timeout_s=TIMEOUT)


# --- the interface ----------------------------------------------------------------------------


def test_table_names_are_the_models():
    assert (Queue._meta.db_table, Job._meta.db_table, Lease._meta.db_table, QueueCounter._meta.db_table) == base.TABLES


def test_lease_flags_are_declared():
    store = _store()
    for flag in ("supports_one_statement_claim", "supports_one_statement_ack"):
        assert isinstance(getattr(store, flag), bool), flag


# --- take_jobs ---------------------------------------------------------------------------------


def test_take_jobs_marks_jobs_running_in_claim_order_at_one_instant():
    qid = _queue("cf:order")
    low = _jobs(qid, 2)
    high = _jobs(qid, 1, priority=5)
    before = _now()
    rows = _take(qid, 3, worker="w-7")
    after = _now()
    assert set(rows[0]) == set(base.TAKEN_COLUMNS)
    rows.sort(key=lambda r: (-r["priority"], r["seq"]))
    assert [r["uid"] for r in rows] == high + low  # priority first, then enqueue order
    assert {r["claimed_at"] for r in rows} == {rows[0]["claimed_at"]}  # one instant
    assert before <= rows[0]["claimed_at"] <= after
    assert all(r["attempts"] == 1 and r["generation"] == 1 for r in rows)
    stored = Job.objects.filter(queue_id=qid)
    assert {(j.state, j.worker, j.changed_at) for j in stored} == {("running", "w-7", rows[0]["claimed_at"])}
    assert _take(qid, 3) == []  # nothing eligible is left


def test_take_jobs_takes_the_highest_priority_first_when_count_is_short():
    qid = _queue("cf:short")
    _jobs(qid, 3)
    [top] = _jobs(qid, 1, priority=1)
    assert [r["uid"] for r in _take(qid, 1)] == [top]


def test_take_jobs_leaves_jobs_not_yet_due(frozen):
    qid = _queue("cf:due")
    [due] = _jobs(qid, run_at=frozen.now)  # run_at == now: eligible
    _jobs(qid, run_at=frozen.now + 1)
    [row] = _take(qid, 5)
    assert (row["uid"], row["claimed_at"]) == (due, frozen.now)


@pytest.mark.parametrize("count", [1, 7, 1000])
def test_take_jobs_count(count):
    qid = _queue(f"cf:count{count}")
    _jobs(qid, 1001 if count == 1000 else count + 3)
    assert len(_take(qid, count)) == count


def test_take_jobs_payload_cap_is_inclusive_and_stops_at_the_first_job_over_it():
    qid = _queue("cf:cap")
    a, b, c, d = (_jobs(qid, 1, size=s)[0] for s in (60, 40, 1, 1))
    rows = _take(qid, 10, cap=100)
    assert sorted(r["uid"] for r in rows) == sorted([a, b])  # 60 + 40 = 100: within; c would pass it
    assert sorted(r["uid"] for r in _take(qid, 10, cap=100)) == sorted([c, d])


def test_take_jobs_respects_the_concurrency_limit_and_its_live_leases():
    qid = _queue("cf:limit", concurrency=2)
    _jobs(qid, 5)
    _leased(qid, 1, deadline=_now() + 60_000)
    assert len(_take(qid, 5, concurrency=2)) == 1  # one of two slots is held


def test_concurrency_limit_is_counted_across_threads():
    """Six claimers at once under a limit of 3: exactly 3 jobs are taken, whatever the interleaving."""
    qid = _queue("cf:limit-threads", concurrency=3)
    _jobs(qid, 10)
    start = threading.Barrier(6, timeout=TIMEOUT)
    deadline = _now() + 600_000

    def claimer(i):
        start.wait()
        taken: list = []

        def apply():
            conn = db.connection()
            taken[:] = storage.for_connection(conn).take_jobs(
                conn, queue_id=qid, count=2, concurrency=3, worker=f"t{i}", cap=CLAIM_PAYLOAD_CAP_BYTES
            )
            for r in taken:
                _lease(conn, r, qid, deadline)

        db.retrying(apply)
        return len(taken)

    assert sum(_in_threads(6, claimer)) == 3
    assert Lease.objects.filter(queue_id=qid).count() == 3
    assert Job.objects.filter(queue_id=qid, state="running").count() == 3


def test_twenty_threads_claiming_one_job_get_it_exactly_once():
    """Case C05 with fewer rounds: one ready job, 20 threads take at once, exactly one gets it, every round."""
    qid = _queue("cf:c05")
    rounds, n = 10, 20
    start = threading.Barrier(n + 1, timeout=TIMEOUT)
    end = threading.Barrier(n + 1, timeout=TIMEOUT)
    got: list[list[str]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def claimer(i):
        for r in range(rounds):
            start.wait()
            try:
                rows = _take(qid, 1, worker=f"t{i}")
                with lock:
                    got[r].extend(row["uid"] for row in rows)
            finally:
                end.wait()

    threads_done: list = []
    runner = threading.Thread(target=lambda: threads_done.append(_in_threads(n, claimer)))
    runner.start()
    expected = []
    for _ in range(rounds):
        expected.append(_jobs(qid)[0])
        start.wait()
        end.wait()
    runner.join(TIMEOUT)
    assert threads_done, "the claimers did not finish"
    assert got == [[uid] for uid in expected]
    assert set(Job.objects.filter(queue_id=qid).values_list("attempts", flat=True)) == {1}


# --- lock_leases ---------------------------------------------------------------------------------


def test_lock_leases_judges_the_deadline_exactly(frozen):
    qid = _queue("cf:exact")
    _jobs(qid, 2)
    at, after = _leased(qid, 2, deadline=frozen.now)
    Lease.objects.filter(job_id=after["seq"]).update(deadline=frozen.now + 1)
    found = {}

    def apply():
        conn = db.connection()
        found.update((r["uid"], r) for r in storage.for_connection(conn).lock_leases(conn, qid, [at["uid"], after["uid"]]))

    db.retrying(apply)
    assert found[at["uid"]]["live"] == 0  # at its deadline a lease has expired
    assert found[after["uid"]]["live"] == 1  # one ms before it, it is still held
    assert {r["now"] for r in found.values()} == {frozen.now}
    row = found[after["uid"]]
    assert {k: row[k] for k in ("job_id", "generation", "receipt_hash", "deadline", "timeout_at", "worker")} == {
        "job_id": after["seq"], "generation": 1, "receipt_hash": "h" * 64, "deadline": frozen.now + 1,
        "timeout_at": None, "worker": "w",
    }
    assert row["claimed_at"] == after["claimed_at"]


def test_lock_leases_finds_only_leases_of_the_queue_and_uids_given():
    qid, other = _queue("cf:mine"), _queue("cf:other")
    _jobs(qid)
    [mine] = _leased(qid, 1, deadline=_now() + 60_000)
    _jobs(other)
    [theirs] = _leased(other, 1, deadline=_now() + 60_000)
    [unleased] = _jobs(qid)
    found = []

    def apply():
        conn = db.connection()
        uids = [mine["uid"], theirs["uid"], unleased, "0" * 32]
        found[:] = storage.for_connection(conn).lock_leases(conn, qid, uids)

    db.retrying(apply)
    assert [r["uid"] for r in found] == [mine["uid"]]


@pytest.mark.parametrize("first", ["reaper", "settle"])
def test_a_late_settle_and_the_reaper_never_both_win(first):
    """Case C02 on the store: whoever holds the lease first decides; the other finds nothing to end."""
    qid = _queue(f"cf:c02-{first}")
    _jobs(qid)
    [row] = _leased(qid, 1, deadline=_now() - 1)  # expired already
    store = _store()
    held, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def reaper():
        def apply():
            conn = db.connection()
            outcome["reaped"] = storage.for_connection(conn).end_expired_leases(conn, queue_id=qid, limit=10)
            if first == "reaper":
                held.set()
                assert release.wait(TIMEOUT)

        db.retrying(apply)

    def settle():
        def apply():
            conn = db.connection()
            found = storage.for_connection(conn).lock_leases(conn, qid, [row["uid"]])
            if found:  # the settle owns the lease: it ends it (as an ack would)
                with conn.cursor() as cur:
                    cur.execute(f"DELETE FROM {Lease._meta.db_table} WHERE job_id = %s", [row["seq"]])
            outcome["settled"] = found
            if first == "settle":
                held.set()
                assert release.wait(TIMEOUT)

        db.retrying(apply)

    holder, other = (reaper, settle) if first == "reaper" else (settle, reaper)

    def both(i):
        if i == 0:
            holder()
            return
        assert held.wait(TIMEOUT)
        if first == "settle" and store.supports_row_locks:
            other()  # the reaper passes over the lease the settle holds, at once
            release.set()
        else:
            # A settle waits for the reaper's lock; with one writer at a time, the other side
            # runs after the holder commits. Either way it finds the lease gone.
            release.set()
            other()

    _in_threads(2, both)
    reaped, settled = outcome["reaped"], outcome["settled"]
    assert len(reaped) + len(settled) == 1, outcome  # exactly one side won
    assert (len(reaped) == 1) is (first == "reaper")
    assert not Lease.objects.filter(job_id=row["seq"]).exists()


# --- end_expired_leases ----------------------------------------------------------------------------


def test_end_expired_leases_at_the_deadline_soonest_first_within_the_limit(frozen):
    qid, other = _queue("cf:reap"), _queue("cf:reap-other")
    _jobs(qid, 4)
    _jobs(other, 1)
    rows = _leased(qid, 4, deadline=frozen.now)
    [theirs] = _leased(other, 1, deadline=frozen.now - 5)
    deadlines = [frozen.now - 3, frozen.now - 1, frozen.now, frozen.now + 1]
    for r, d in zip(rows, deadlines, strict=True):
        Lease.objects.filter(job_id=r["seq"]).update(deadline=d)
    ended: list = []

    def reap(**kwargs):
        def apply():
            conn = db.connection()
            ended[:] = storage.for_connection(conn).end_expired_leases(conn, **kwargs)

        db.retrying(apply)
        return ended

    first = reap(queue_id=qid, limit=2)
    assert {r["job_id"] for r in first} == {rows[0]["seq"], rows[1]["seq"]}  # the two soonest
    assert set(first[0]) == {*base.LEASE_COLUMNS, "queue_id", "now"}
    assert {(r["queue_id"], r["now"]) for r in first} == {(qid, frozen.now)}
    assert [r["job_id"] for r in reap(queue_id=qid, limit=10)] == [rows[2]["seq"]]  # at its deadline: expired
    assert Lease.objects.filter(queue_id=qid).count() == 1  # the one still before its deadline
    assert [r["job_id"] for r in reap(queue_id=None, limit=10)] == [theirs["seq"]]


def test_end_expired_leases_passes_over_a_lease_another_transaction_holds():
    qid = _queue("cf:reap-held")
    _jobs(qid)
    [row] = _leased(qid, 1, deadline=_now() - 1)
    store = _store()
    if not store.supports_row_locks:
        pytest.skip("one writer at a time: a held lease cannot meet a reaper")
    held, release = threading.Event(), threading.Event()

    def hold(i):
        if i == 0:
            def apply():
                conn = db.connection()
                assert storage.for_connection(conn).lock_leases(conn, qid, [row["uid"]])
                held.set()
                assert release.wait(TIMEOUT)

            db.retrying(apply)
            return None
        assert held.wait(TIMEOUT)
        try:
            with db.write_atomic() as conn:
                return storage.for_connection(conn).end_expired_leases(conn, queue_id=qid, limit=10)
        finally:
            release.set()

    assert _in_threads(2, hold)[1] == []
    assert Lease.objects.filter(job_id=row["seq"]).exists()


# --- mark_acked ---------------------------------------------------------------------------------------


def test_mark_acked_records_the_result_and_the_settle():
    qid = _queue("cf:acked")
    _jobs(qid, 2)
    a, b = _leased(qid, 2, deadline=_now() + 60_000)
    now = _now()

    def apply():
        conn = db.connection()
        Lease.objects.filter(queue_id=qid).delete()
        storage.for_connection(conn).mark_acked(
            conn, now=now, acks=[(a["seq"], '{"ok":1}', "x" * 64, "d1"), (b["seq"], None, "y" * 64, "d2")]
        )

    db.retrying(apply)
    got = {j.seq: j for j in Job.objects.filter(queue_id=qid)}
    assert (got[a["seq"]].result, got[b["seq"]].result) == ('{"ok":1}', None)
    for seq, h, d in ((a["seq"], "x" * 64, "d1"), (b["seq"], "y" * 64, "d2")):
        j = got[seq]
        assert (j.state, j.settled_hash, j.settled_args, j.settled_op) == ("succeeded", h, d, "ack")
        assert (j.finished_at, j.changed_at) == (now, now)
        assert fq_outcome(j.settled_outcome) == {"state": "succeeded", "run_at": None}


def fq_outcome(value):
    import json

    return json.loads(value) if isinstance(value, str) else value


# --- through the services: receipts judged on what the store returns ------------------------------------


def test_stale_receipt_of_an_older_generation_and_a_replayed_settle():
    qid = _queue("cf:receipts", backoff_ms=0)
    [uid] = _jobs(qid)
    [first] = fq.claim("cf:receipts")
    fq.release("cf:receipts", first.receipt)
    [second] = fq.claim("cf:receipts")
    assert second.id == uid and second.receipt != first.receipt
    with pytest.raises(InvalidReceipt):
        fq.ack("cf:receipts", first.receipt)  # the lease of generation 1 is over
    done = fq.ack("cf:receipts", second.receipt, result={"n": 1})
    assert (done.state, done.replay) == ("succeeded", False)
    again = fq.ack("cf:receipts", second.receipt, result={"n": 1})
    assert (again.state, again.replay) == ("succeeded", True)
    with pytest.raises(InvalidReceipt):
        fq.ack("cf:receipts", second.receipt, result={"n": 2})  # not the same ack: no replay
    assert Job.objects.get(uid=uid).result == '{"n":1}'


# --- pause: set_paused, and every claim method reads the flag -----------------------------------


def _set_paused(queue_id: int, paused: bool) -> bool:
    conn = db.connection()
    return db.retrying(
        lambda: storage.for_connection(conn).set_paused(conn, now=db.now_sql(conn), queue_id=queue_id, paused=paused)
    )


def test_set_paused_stamps_the_clock_and_writes_only_a_change(frozen):
    qid = _queue("cf:pause")
    assert _set_paused(qid, True) is True
    assert Queue.objects.filter(id=qid).values_list("paused", "paused_at").get() == (True, frozen.now)
    frozen.set(frozen.now + 5)
    assert _set_paused(qid, True) is False  # already paused: the first instant stays
    assert Queue.objects.get(id=qid).paused_at == frozen.now - 5
    assert _set_paused(qid, False) is True
    assert Queue.objects.filter(id=qid).values_list("paused", "paused_at").get() == (False, None)
    assert _set_paused(qid, False) is False
    assert _set_paused(qid + 10_000, True) is False  # no such queue: nothing written


@pytest.mark.parametrize("concurrency", [0, 2])
def test_take_jobs_takes_nothing_from_a_paused_queue(concurrency):
    qid = _queue(f"cf:paused{concurrency}", concurrency=concurrency)
    [uid] = _jobs(qid, 1)
    _set_paused(qid, True)
    assert _take(qid, 5, concurrency=concurrency) == []
    assert Job.objects.get(uid=uid).state == "queued"
    _set_paused(qid, False)
    assert [r["uid"] for r in _take(qid, 5, concurrency=concurrency)] == [uid]


def test_claim_statement_picks_nothing_from_a_paused_queue():
    store = _store()
    if not store.supports_one_statement_claim:
        pytest.skip("this store claims through take_jobs")
    qid = _queue("cf:paused-stmt")
    _jobs(qid, 2)
    _set_paused(qid, True)

    def claim():
        return store.claim_statement(
            connection, queue_name="cf:paused-stmt", count=5, visibility_ms=None, worker="", after_reap=False,
            cap=CLAIM_PAYLOAD_CAP_BYTES, hashes=["a" * 64] * 5, relaxed=False,
        )

    [row] = claim()  # the queue's facts, claimed through this statement (vis set), and no job
    assert row[0] == qid and row[4] is not None and row[5] is None
    _set_paused(qid, False)
    assert len([r for r in claim() if r[5] is not None]) == 2


# --- claim_statement (where the claim is one statement) -------------------------------------------------


def test_claim_statement_of_a_missing_queue_returns_no_row():
    store = _store()
    if not store.supports_one_statement_claim:
        pytest.skip("this store claims through take_jobs")
    rows = store.claim_statement(
        connection, queue_name="cf:none", count=1, visibility_ms=None, worker="", after_reap=False,
        cap=CLAIM_PAYLOAD_CAP_BYTES, hashes=["a" * 64], relaxed=False,
    )
    assert rows == []


def _facts(name: str):
    return _store().claim_facts(connection, name)


def test_claim_facts_say_whether_a_claim_would_find_a_job_or_an_expired_lease(frozen):
    """Where offered: the queue's id and default lease length, and the two reasons a claim has work."""
    if _facts("cf:facts-probe") is None:
        pytest.skip("this store offers no claim facts: its claim looks in its transaction")
    assert _facts("cf:facts-none") == ()  # no such queue
    qid = _queue("cf:facts", visibility_ms=4321)
    assert _facts("cf:facts") == (qid, 4321, False, False)
    _jobs(qid, run_at=frozen.now + 1)  # not yet due
    assert _facts("cf:facts") == (qid, 4321, False, False)
    frozen.set(frozen.now + 1)  # due now: run_at == now is eligible
    assert _facts("cf:facts") == (qid, 4321, True, False)
    _leased(qid, 1, deadline=frozen.now + 10)
    assert _facts("cf:facts") == (qid, 4321, False, False)  # running, its lease live
    frozen.set(frozen.now + 10)  # the deadline is reached: the lease has expired
    assert _facts("cf:facts") == (qid, 4321, False, True)
    other = _queue("cf:facts-other")
    assert _facts("cf:facts-other") == (other, 30_000, False, False)  # another queue's job and lease count not
    _jobs(other, 1)
    assert _facts("cf:facts-other") == (other, 30_000, True, False)
    _set_paused(other, True)
    assert _facts("cf:facts-other") == (other, 30_000, False, False)  # paused: nothing to claim


def test_claim_facts_are_not_read_in_a_callers_transaction():
    """A caller's snapshot may be older than the newest commit: the claim then looks with its locking reads."""
    qid = _queue("cf:facts-atomic", backoff_ms=0)  # an expired attempt is due again at its deadline
    with transaction.atomic():
        assert _store().claim_facts(connection, "cf:facts-atomic") is None
    transaction.set_autocommit(False)  # an implicit transaction of the caller's
    try:
        assert _store().claim_facts(connection, "cf:facts-atomic") is None
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    # And the claim there still takes the job and handles an expired lease first.
    _jobs(qid, 2)
    _leased(qid, 1, deadline=_now() - 1)
    with transaction.atomic():
        jobs = fq.claim("cf:facts-atomic", count=5)
    assert len(jobs) == 2  # the free job and the one whose lease had expired
    assert Lease.objects.filter(queue_id=qid).count() == 2


def test_a_claim_of_a_queue_with_only_an_expired_lease_handles_it_and_takes_the_job():
    qid = _queue("cf:facts-expired", backoff_ms=0)
    _jobs(qid)
    [row] = _leased(qid, 1, deadline=_now() - 1)
    [job] = fq.claim("cf:facts-expired", count=5)
    assert (job.id, job.attempts) == (row["uid"], 2)
    assert fq.claim("cf:facts-expired") == []  # its new lease is live


# --- is_retryable and db.retrying ------------------------------------------------------------------------


def test_other_errors_are_not_retryable():
    assert _store().is_retryable(IntegrityError("UNIQUE constraint failed")) is False


def test_two_threads_taking_conflicting_locks_in_retrying_transactions_both_finish():
    """A deadlock (or lock wait timeout) in a transaction db.retrying owns is retried until both commit."""
    a, b = _queue("cf:lock-a"), _queue("cf:lock-b")
    store = _store()
    both_hold_first = threading.Barrier(2, timeout=TIMEOUT)
    attempts = [0, 0]
    table = Queue._meta.db_table

    def touch(conn, queue_id):
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {table} SET concurrency = concurrency WHERE id = %s", [queue_id])

    def worker(i):
        order = (a, b) if i == 0 else (b, a)

        def apply():
            conn = db.connection()
            attempts[i] += 1
            touch(conn, order[0])
            if store.supports_row_locks and attempts[i] == 1:
                both_hold_first.wait()  # each holds one row and now asks for the other's: a deadlock
            touch(conn, order[1])
            return i

        return db.retrying(apply)

    assert _in_threads(2, worker) == [0, 1]
    if store.supports_row_locks:
        assert sum(attempts) >= 3  # one of them was chosen as the victim and ran again


@pytest.mark.mysql_only
def test_mariadb_lock_wait_timeout_is_retried_in_a_retrying_transaction():
    """Error 1205 (the statement waited innodb_lock_wait_timeout) is retried like a deadlock (1213)."""
    from django.db import OperationalError

    store = _store()
    assert store.is_retryable(OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction"))
    assert not store.is_retryable(OperationalError(1062, "Duplicate entry 'x' for key 'fq_job_uid'"))
    qid = _queue("cf:timeout")
    table = Queue._meta.db_table
    held, retried = threading.Event(), threading.Event()
    attempts = []

    def run(i):
        if i == 0:
            with db.write_atomic() as conn, conn.cursor() as cur:
                cur.execute(f"UPDATE {table} SET concurrency = concurrency WHERE id = %s", [qid])
                held.set()
                assert retried.wait(TIMEOUT)  # hold the row until the other side timed out once
            return None
        assert held.wait(TIMEOUT)
        conn = db.connection()
        with conn.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")

        def apply():
            attempts.append(1)
            if len(attempts) > 1:
                retried.set()
            with conn.cursor() as cur:
                cur.execute(f"UPDATE {table} SET concurrency = 1 WHERE id = %s", [qid])
            return len(attempts)

        return db.retrying(apply)

    assert _in_threads(2, run)[1] >= 2
    assert Queue.objects.get(id=qid).concurrency == 1
