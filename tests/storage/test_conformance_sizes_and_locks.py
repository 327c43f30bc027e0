"""Statement sizes, server-side history appends and unique-key lookups of the Store: the same assertions on every backend.

Where backends differ, what the store returns decides the expectation: a
``statement_budget`` of ``None`` (no limit), a ``history_append_sql`` of
``None`` (the history is written whole), ``supports_row_locks``.
"""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections, transaction
from django.db.models import JSONField
from django.db.models.expressions import RawSQL

from django_fq import services as fq
from django_fq import storage
from django_fq.models import Job, Queue
from django_fq.services._base import append_history, history_entry
from django_fq.storage.base import split_by_bytes

pytestmark = pytest.mark.django_db(transaction=True)


def _store():
    return storage.for_connection(connection)


def test_split_by_bytes_keeps_order_and_puts_an_oversized_item_alone():
    assert split_by_bytes([], [], 10) == []
    assert split_by_bytes(["a", "b"], [5, 50], None) == [["a", "b"]]
    assert split_by_bytes(list("abcde"), [4, 4, 4, 30, 1], 10) == [["a", "b"], ["c"], ["d"], ["e"]]


def test_the_statement_budget_is_none_or_a_positive_byte_count_read_once_per_connection():
    budget = _store().statement_budget(connection)
    assert budget is None or budget > 1024 * 1024
    assert _store().statement_budget(connection) == budget


def test_an_ack_batch_cut_by_a_small_budget_records_every_result(monkeypatch):
    """However the store cuts the batch, each job gets its own result (docs/reference/semantics.md §9),
    and no statement carries more results than the budget allows: one ~2 KiB result each here."""
    store_class = type(_store())
    monkeypatch.setattr(store_class, "statement_budget", lambda self, conn: 3000)
    # The store method that carries the results: the one-statement ack, or the ack under lease locks.
    carrier = "ack_matching" if store_class.supports_one_statement_ack else "mark_acked"
    calls = []
    original = getattr(store_class, carrier)

    def counted(self, conn, **kwargs):
        calls.append(kwargs)
        return original(self, conn, **kwargs)

    monkeypatch.setattr(store_class, carrier, counted)
    fq.enqueue_many("cf:acks", [{"payload": n} for n in range(7)])
    jobs = fq.claim("cf:acks", count=7)
    results = [{"n": j.payload, "pad": "y" * 1000} for j in jobs]
    settled = fq.ack_many("cf:acks", [(j.receipt, r) for j, r in zip(jobs, results, strict=True)])
    assert [s.state for s in settled] == ["succeeded"] * 7
    for job, result in zip(jobs, results, strict=True):
        assert fq.get("cf:acks", job.id).result == result
    assert len(calls) == 7, f"{carrier} carried more than one result per statement"
    # The replays of the same batch are judged per run as well, and answer as replays.
    again = fq.ack_many("cf:acks", [(j.receipt, r) for j, r in zip(jobs, results, strict=True)])
    assert [s.replay for s in again] == [True] * 7


def test_an_ack_batch_as_large_as_the_completers_settles_each_job_with_its_own_result():
    """The completer's largest batch in one ``ack_many``: every job acked with its result, counters exact,
    each receipt then a replay (docs/reference/semantics.md §9). On PostgreSQL this is one statement whose
    parts carry each request's result with the lease it ends (no CTE joined to another)."""
    from django_fq.worker.completer import ACK_BATCH

    fq.enqueue_many("cf:bigack", [{"payload": n} for n in range(ACK_BATCH)])
    jobs = fq.claim("cf:bigack", count=ACK_BATCH)
    assert len(jobs) == ACK_BATCH
    # In reverse: the request order differs from the leases' (job) order the statement locks in.
    pairs = [(j.receipt, {"n": j.payload}) for j in reversed(jobs)]
    settled = fq.ack_many("cf:bigack", pairs)
    assert [s.id for s in settled] == [j.id for j in reversed(jobs)]
    assert {s.state for s in settled} == {"succeeded"} and not any(s.replay for s in settled)
    for job in jobs:
        assert fq.get("cf:bigack", job.id).result == {"n": job.payload}
    stats = fq.stats("cf:bigack")
    assert stats.totals["acked"] == ACK_BATCH and stats.totals["claimed"] == ACK_BATCH
    assert Job.objects.filter(queue__name="cf:bigack", state="succeeded").count() == ACK_BATCH
    assert fq.ack_many("cf:bigack", pairs[:3]) == [
        type(s)(id=s.id, state="succeeded", run_at=None, replay=True) for s in settled[:3]
    ]


@pytest.mark.parametrize("start", [0, 2, 3])
def test_a_history_append_keeps_the_newest_entries(start):
    """``history_append_sql`` (or the list written whole where it is None) appends one entry and keeps
    ``keep``, from a history of at most ``keep`` (django-fq's writes and imports never store more)."""
    keep = 3
    job = fq.enqueue("cf:hist", 1)
    old = [history_entry(n, n, "nack", f"e{n}\x01") for n in range(start)]
    Job.objects.filter(uid=job.id).update(errors=old)
    entry = history_entry(99, 99, "expired", 'new "\x01" \\ é')
    sql = _store().history_append_sql("errors", keep)
    value = append_history(old, entry, keep) if sql is None else RawSQL(sql, [json.dumps(entry)], output_field=JSONField())
    Job.objects.filter(uid=job.id).update(errors=value)
    assert Job.objects.get(uid=job.id).errors == ([*old, entry])[-keep:]


def test_a_unique_key_lookup_leaves_the_holder_unlocked():
    """An enqueue coalescing in an open transaction must not hold the job it found
    (docs/reference/semantics.md §9: it must not block the queue): another connection
    still locks the holder, skipping locked rows."""
    store = _store()
    if not store.supports_row_locks:
        pytest.skip("no row locks on this backend: nothing to hold")
    held = fq.enqueue("cf:key", 1, unique_key="k")
    qid = Queue.objects.get(name="cf:key").id
    seen: dict = {}

    def lock_elsewhere():
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(f"SELECT uid FROM django_fq_job WHERE uid = %s{store.skip_locked_sql}", [held.id])
                seen["rows"] = [tuple(r) for r in cur.fetchall()]
        finally:
            connections.close_all()

    with transaction.atomic():
        assert store.active_jobs_by_key(connection, qid, ["k", "other"]) == {"k": held.id}
        thread = threading.Thread(target=lock_elsewhere)
        thread.start()
        thread.join(60)
    assert not thread.is_alive()
    assert seen["rows"] == [(held.id,)]
