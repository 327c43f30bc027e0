"""The chaos checker itself (fast tier): quiet on a clean history, and it catches each broken invariant.

A short, real history is made in-process (enqueue, claim, run, ack; an
expired lease whose job runs again; an extend), checked clean, then one
fact at a time is falsified in the audit or the tables — as a buggy engine
would have written it — and the checker must name exactly that violation.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_fq import services as fq

from . import invariants

pytestmark = pytest.mark.django_db(transaction=True)

Q = "chaos.check"


def _run(job, *, told=False):
    started = invariants.now_ms()
    invariants.record_run(job.id, job.claimed_at, job.attempts, started, lambda _end: told, tag="test", pid=1)


def _sql(sql, params=()):
    with connection.cursor() as cur:
        cur.execute(sql, list(params))
        return cur.fetchall() if cur.description else None


@pytest.fixture
def history():
    """Three jobs: A acked on its first lease; B expired once (its run recorded), then acked; C extended, then acked."""
    invariants.install()
    try:
        fq.configure(Q, backoff_ms=0, visibility_ms=60_000)
        a, b, c = (r.id for r in fq.enqueue_many(Q, [{"payload": n} for n in range(3)]))
        claimed = {j.id: j for j in fq.claim(Q, count=2, visibility_ms=60_000)}
        # C's lease is shorter than its extend, so the extend moves the deadline even when it runs in the
        # same database millisecond as the claim (an unchanged deadline records no extend).
        claimed.update({j.id: j for j in fq.claim(Q, count=1, visibility_ms=30_000)})
        assert set(claimed) == {a, b, c}
        _run(claimed[a])
        fq.ack(Q, claimed[a].receipt)
        assert fq.extend(Q, claimed[c].receipt, visibility_ms=60_000) > claimed[c].deadline
        _run(claimed[c])
        fq.ack(Q, claimed[c].receipt)
        # B: a short second lease... first make its lease short by releasing and reclaiming briefly.
        fq.release(Q, claimed[b].receipt)
        first = fq.claim(Q, count=1, visibility_ms=30)[0]
        _run(first)  # finished, but never acked: the lease runs out
        while invariants.now_ms() < first.deadline:  # wait for the database clock to pass it
            time.sleep(0.005)
        fq.reap(Q)
        second = fq.claim(Q, count=1, visibility_ms=60_000)[0]
        assert second.id == b and second.attempts == 2
        _run(second)
        fq.ack(Q, second.receipt)
        yield {"a": a, "b": b, "c": c}
    finally:
        invariants.uninstall()


def _kinds(**kw):
    return dict(invariants.check([Q], visibility_ms=60_000, **kw).by_kind)


def test_a_clean_history_passes_with_its_figures(history):
    report = invariants.check([Q], visibility_ms=60_000)
    assert report.ok, report.describe()
    assert (report.jobs, report.succeeded, report.lost, report.overlaps) == (3, 3, 0, 0)
    assert report.leases == 5  # a, c, b (released), b (expired), b
    assert report.duplicates == 1  # B's first recorded run, whose lease expired
    assert report.extends == 1


def test_an_ack_at_the_deadline_is_caught(history):
    _sql("UPDATE fqchaos_settle SET checked_at = (SELECT e.deadline FROM fqchaos_lease_end e "
         "WHERE e.receipt_hash = fqchaos_settle.receipt_hash) WHERE op = 'ack'")
    assert _kinds() == {"late_settle": 3}


def test_an_expiry_before_the_deadline_is_caught(history):
    _sql("UPDATE fqchaos_settle SET checked_at = checked_at - 1000 WHERE op = 'expire'")
    assert _kinds() == {"early_expiry": 1}


def test_an_extend_of_an_expired_lease_is_caught(history):
    _sql("UPDATE fqchaos_extend SET new_deadline = old_deadline + 60000")
    assert _kinds() == {"late_extend": 1}


def test_two_live_leases_at_once_are_caught(history):
    # As if B's expired lease (generation 2) had still been live, with a later deadline, when generation 3
    # was granted: the expiry came before the deadline, the leases overlap, and generation 3 ran meanwhile.
    _sql("UPDATE fqchaos_lease_end SET deadline = deadline + 600000 WHERE generation = 2")
    assert _kinds() == {"early_expiry": 1, "lease_overlap": 1, "overlap": 1}


def test_a_run_past_its_lease_without_being_told_is_caught(history):
    b = history["b"]
    # B's first run (generation 2) "went on" until after generation 3 was granted.
    _sql("UPDATE fqchaos_run SET run_end = run_end + 600000 WHERE job_uid = %s AND attempt = 1", [b])
    assert _kinds() == {"overlap_not_told": 1}
    _sql("UPDATE fqchaos_run SET told = %s WHERE job_uid = %s AND attempt = 1", [True, b])
    report = invariants.check([Q], visibility_ms=60_000)
    assert report.ok and report.zombie_overlaps == 1


def test_a_lease_run_twice_and_an_ack_without_a_run_are_caught(history):
    a, c = history["a"], history["c"]
    _sql("INSERT INTO fqchaos_run SELECT * FROM fqchaos_run WHERE job_uid = %s", [a])
    _sql("UPDATE fqchaos_effect SET runs = 2 WHERE job_uid = %s", [a])
    _sql("DELETE FROM fqchaos_run WHERE job_uid = %s", [c])
    _sql("DELETE FROM fqchaos_effect WHERE job_uid = %s", [c])
    assert _kinds() == {"double_run": 1, "acked_without_run": 2}


def test_wrong_attempts_and_a_lost_job_are_caught(history):
    _sql("UPDATE django_fq_job SET attempts = attempts + 1 WHERE uid = %s", [history["a"]])
    assert _kinds() == {"attempts": 1}
    _sql("UPDATE django_fq_job SET attempts = attempts - 1 WHERE uid = %s", [history["a"]])
    fq.enqueue(Q, {"late": True})
    assert _kinds() == {"not_drained": 1}
    assert _kinds(drained=False) == {}
    _sql("DROP TRIGGER IF EXISTS fqchaos_job_del ON django_fq_job" if connection.vendor == "postgresql"
         else "DROP TRIGGER IF EXISTS fqchaos_job_del")
    _sql("DELETE FROM django_fq_job WHERE uid = %s", [history["c"]])  # gone without a trace, as a lost job would be
    report = invariants.check([Q], visibility_ms=60_000, drained=False)
    assert report.lost == 1 and report.by_kind["job_vanished"] == 1


def test_a_token_answered_with_two_jobs_is_caught(history):
    records = [
        {"queue": Q, "id": history["a"], "created": True, "token": "t1"},
        {"queue": Q, "id": history["b"], "created": True, "token": "t1"},
        {"queue": Q, "id": "f" * 32, "created": True, "token": None},
    ]
    report = invariants.check([Q], visibility_ms=60_000, producers=records)
    assert dict(report.by_kind) == {"token_ids": 1, "token_created": 1, "enqueued_missing": 1}
    assert report.lost == 1


# --- withdrawn jobs against pruned ones (the rule in invariants' docstring, "Withdrawn jobs") -------------


@pytest.fixture
def audit():
    """The audit alone, on an empty queue ``Q``."""
    invariants.install()
    try:
        fq.configure(Q, backoff_ms=0, visibility_ms=60_000)
        yield
    finally:
        invariants.uninstall()


def _mariadb() -> bool:
    return connection.vendor == "mysql" and connection.mysql_is_mariadb


def _enqueue_in_another_connection(**kw):
    """``fq.enqueue(Q, …)`` committed by a thread with its own connection; returns its result."""
    out = {}

    def run():
        try:
            out["result"] = fq.enqueue(Q, {"other": True}, **kw)
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out["result"]


def _withdraw_for_real():
    """Make MariaDB's store withdraw a job the way it does under load; return (holder, results, withdrawn uid).

    The batch reads the active keys in a REPEATABLE READ snapshot taken
    before another connection commits a job holding key ``k``, so it inserts
    its own ``k`` job, meets the unique index, and deletes that job again in
    the same transaction (``MysqlStore._insert_keys_sorted``), as a producer
    racing another does between its read and its insert.
    """
    with transaction.atomic():
        _sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # before the transaction's first statement
        _sql("SELECT COUNT(*) FROM django_fq_job")  # InnoDB takes the snapshot at the first plain read
        holder = _enqueue_in_another_connection(unique_key="k")
        results = fq.enqueue_many(Q, [{"payload": 1, "unique_key": "k"}, {"payload": 2, "unique_key": "k2"}])
    gone = _sql("SELECT uid, state FROM fqchaos_job_gone WHERE queue_id = (SELECT id FROM django_fq_queue WHERE name = %s)", [Q])
    assert len(gone) == 1 and gone[0][1] == "queued", gone  # the store really inserted and deleted it
    assert results[0].id == holder.id and not results[0].created and results[1].created
    return holder, results, gone[0][0]


def _records(results):
    return [{"queue": Q, "id": r.id, "created": r.created, "token": None} for r in results]


@pytest.mark.skipif("not _mariadb()", reason="only MariaDB's store inserts a job it may delete again")
def test_a_job_withdrawn_by_its_own_enqueue_transaction_is_no_job(audit):
    holder, results, withdrawn = _withdraw_for_real()
    records = _records([holder, *results])
    report = invariants.check([Q], visibility_ms=60_000, drained=False, producers=records)
    assert report.ok, report.describe()
    assert (report.withdrawn, report.jobs, report.pruned, report.lost) == (1, 2, 0, 0)
    # The rule cannot be used to hide a lost job: had the enqueue returned the withdrawn job's id
    # as created, that id names no job.
    lie = [*records, {"queue": Q, "id": withdrawn, "created": True, "token": None}]
    report = invariants.check([Q], visibility_ms=60_000, drained=False, producers=lie)
    assert dict(report.by_kind) == {"enqueued_missing": 1} and report.lost == 1
    # Nor a job someone had claimed: with a lease logged for it, it is an unfinished job deleted
    # (and an ungranted lease, a claim the totals do not know, a job the totals never counted).
    (seq,) = _sql("SELECT seq FROM fqchaos_job WHERE uid = %s", [withdrawn])[0]
    _sql("INSERT INTO fqchaos_lease VALUES (%s, (SELECT id FROM django_fq_queue WHERE name = %s), 1, %s, 1, 2, NULL, 'w', 1)",
         [seq, Q, "h" * 64])
    assert _kinds(drained=False) == {"pruned_unfinished": 1, "lease_vanished": 1, "claimed": 1, "accounting": 1}


def test_a_queued_job_deleted_after_its_enqueue_committed_is_caught(audit):
    # Deleted by the very connection that enqueued it, but in the next transaction: a prune, never a withdrawal.
    kept, pruned = fq.enqueue(Q, {"n": 1}), fq.enqueue(Q, {"n": 2})
    _sql("DELETE FROM django_fq_job WHERE uid = %s", [pruned.id])
    report = invariants.check([Q], visibility_ms=60_000, drained=False, producers=_records([kept, pruned]))
    assert dict(report.by_kind) == {"pruned_unfinished": 1} and report.withdrawn == 0


def test_a_job_deleted_by_the_transaction_that_counted_it_is_caught(audit):
    # One transaction enqueues (counting the job in totals.enqueued, returning its id) and deletes it.
    # MariaDB: a withdrawal by the rule, but not one the engine may make: the totals and the producer
    # both know a job that never was. Elsewhere the transaction is not logged: an unfinished job deleted.
    with transaction.atomic():
        r = fq.enqueue(Q, {"n": 1})
        _sql("DELETE FROM django_fq_job WHERE uid = %s", [r.id])
    report = invariants.check([Q], visibility_ms=60_000, drained=False, producers=_records([r]))
    if _mariadb():
        assert dict(report.by_kind) == {"accounting": 1, "enqueued_missing": 1} and report.withdrawn == 1
    else:
        assert dict(report.by_kind) == {"pruned_unfinished": 1} and report.withdrawn == 0
