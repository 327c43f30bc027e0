"""Conformance of the enqueue, queue, counter and maintenance methods of the Store (docs/explanation/storage.md).

Each test calls the store of the test database directly
(``storage.for_connection(connection)``) and runs unchanged on every
database leg. The clock is passed as SQL text, so a test states the instant
of each call exactly (``_at(t)``) and every time comparison still happens in
SQL. Rules: docs/reference/semantics.md §9 (idempotency tokens, unique keys,
queue-full limit, FIFO).
"""

from __future__ import annotations

import secrets
import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from django_fq import db, storage
from django_fq import services as fq
from django_fq.exceptions import InvalidArgument, QueueFull, TooManyQueues
from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter
from django_fq.services import _base
from django_fq.services.enqueue import parse_options
from django_fq.storage import base

pytestmark = pytest.mark.django_db(transaction=True)

T0 = 1_800_000_000_000  # an instant (epoch ms) the tests pass as the database clock


def _store():
    return storage.for_connection(connection)


def _at(t: int) -> str:
    """Clock SQL that reads ``t`` (code-written text: an integer literal)."""
    return f"({t:d})"


def _queue(name: str = "conf:q") -> int:
    fq.configure(name)
    return Queue.objects.get(name=name).id


def _uid() -> str:
    return secrets.token_hex(16)


def _row(uid: str, *, key: str | None = None, token: str | None = None, delay_ms: int = 0, at: int | None = None):
    return (uid, 0, at, delay_ms, 3, 0, '{"n":1}', 7, key, token)


def _take(queue_id: int, t: int, token: str, uid: str, retention_ms: int = 1000):
    with db.write_atomic():
        return _store().take_tokens(connection, now=_at(t), queue_id=queue_id, rows=[(token, uid, retention_ms)])


def _insert(queue_id: int, rows, t: int = T0) -> dict[str, int]:
    with db.write_atomic():
        return _store().insert_jobs(connection, now=_at(t), queue_id=queue_id, rows=rows)


def test_the_store_names_the_models_tables():
    names = (base.QUEUE_TABLE, base.JOB_TABLE, base.LEASE_TABLE, base.TOKEN_TABLE, base.COUNTER_TABLE)
    assert names == tuple(m._meta.db_table for m in (Queue, Job, Lease, IdempotencyToken, QueueCounter))


# --- idempotency tokens ------------------------------------------------------------------------


def test_a_new_token_names_the_callers_job_and_counts_as_added():
    qid = _queue()
    first = _uid()
    assert _take(qid, T0, "tok", first) == ({"tok": first}, 1)
    token = IdempotencyToken.objects.get(queue_id=qid, token="tok")
    assert (token.job_uid, token.created_at, token.expires_at) == (first, T0, T0 + 1000)


def test_a_token_replayed_within_its_retention_names_the_first_job_and_changes_nothing():
    qid = _queue()
    first = _uid()
    _take(qid, T0, "tok", first)
    # Live strictly before expires_at: the last millisecond of the retention still replays.
    assert _take(qid, T0 + 999, "tok", _uid()) == ({"tok": first}, 0)
    token = IdempotencyToken.objects.get(queue_id=qid, token="tok")
    assert (token.job_uid, token.created_at, token.expires_at) == (first, T0, T0 + 1000)


def test_an_expired_token_is_taken_over_without_counting_a_new_row():
    qid = _queue()
    _take(qid, T0, "tok", _uid())
    second = _uid()
    assert _take(qid, T0 + 1000, "tok", second, retention_ms=50) == ({"tok": second}, 0)
    token = IdempotencyToken.objects.get(queue_id=qid, token="tok")
    assert (token.job_uid, token.created_at, token.expires_at) == (second, T0 + 1000, T0 + 1050)
    assert IdempotencyToken.objects.filter(queue_id=qid).count() == 1


def test_tokens_differing_only_in_case_or_trailing_space_are_different_tokens():
    qid = _queue()
    uids = [_uid() for _ in range(3)]
    with db.write_atomic():
        named, added = _store().take_tokens(
            connection, now=_at(T0), queue_id=qid, rows=[("A", uids[0], 10), ("a", uids[1], 10), ("a ", uids[2], 10)]
        )
    assert (named, added) == ({"A": uids[0], "a": uids[1], "a ": uids[2]}, 3)


def test_a_batch_of_tokens_mixes_new_live_and_expired_ones():
    qid = _queue()
    live, old = _uid(), _uid()
    _take(qid, T0, "live", live, retention_ms=10_000)
    _take(qid, T0, "old", old, retention_ms=10)
    mine = {t: _uid() for t in ("live", "new", "old")}
    with db.write_atomic():
        named, added = _store().take_tokens(
            connection, now=_at(T0 + 100), queue_id=qid, rows=[(t, mine[t], 100) for t in sorted(mine)]
        )
    assert named == {"live": live, "new": mine["new"], "old": mine["old"]}
    assert added == 1


def test_a_token_outlives_its_jobs_end():
    qid = _queue()
    uid = _uid()
    _take(qid, T0, "tok", uid, retention_ms=60_000)
    assert _insert(qid, [_row(uid, token="tok")]) == {uid: T0}
    for state in ("running", "succeeded", "cancelled", "dead"):
        Job.objects.filter(uid=uid).update(state=state)
        assert _take(qid, T0 + 1, "tok", _uid()) == ({"tok": uid}, 0), state
    Job.objects.filter(uid=uid).delete()  # pruned: the token still names it
    assert _take(qid, T0 + 2, "tok", _uid()) == ({"tok": uid}, 0)


def test_point_token_renames_the_job_of_a_token():
    qid = _queue()
    _take(qid, T0, "tok", _uid())
    other = _uid()
    with db.write_atomic():
        _store().point_token(connection, qid, "tok", other)
    assert IdempotencyToken.objects.get(queue_id=qid, token="tok").job_uid == other


def _race(n: int, work):
    """Run ``work(i)`` in ``n`` real threads released together; their results and errors."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def run(i):
        try:
            barrier.wait(30)
            results[i] = work(i)
        except Exception as exc:  # pragma: no cover - reported by the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


def test_producers_racing_one_token_leave_exactly_one_owner():
    qid = _queue()
    uids = [_uid() for _ in range(6)]

    def work(i):
        def claim():
            named, added = _store().take_tokens(
                db.connection(), now=db.now_sql(), queue_id=qid, rows=[("race", uids[i], 60_000)]
            )
            return named["race"], added

        return db.retrying(claim)

    results, errors = _race(len(uids), work)
    assert errors == []
    assert len({named for named, _ in results}) == 1
    (winner,) = {named for named, _ in results}
    assert winner in uids
    assert sum(added for _, added in results) == 1
    assert list(IdempotencyToken.objects.filter(queue_id=qid).values_list("job_uid", flat=True)) == [winner]


def test_producers_racing_one_token_through_enqueue_make_one_job():
    _queue("conf:race")
    results, errors = _race(6, lambda i: fq.enqueue("conf:race", {"i": i}, idempotency="race"))
    assert errors == []
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert Job.objects.filter(queue__name="conf:race").count() == 1


# --- jobs and unique keys ----------------------------------------------------------------------


def test_inserted_jobs_keep_the_input_order_and_one_enqueue_instant():
    qid = _queue()
    uids = [_uid() for _ in range(30)]
    rows = [_row(u, delay_ms=i) for i, u in enumerate(uids)]
    assert _insert(qid, rows) == dict.fromkeys(uids, T0)
    got = list(Job.objects.filter(queue_id=qid).order_by("seq").values_list("uid", "run_at", "enqueued_at", "state"))
    assert got == [(u, T0 + i, T0, "queued") for i, u in enumerate(uids)]


def test_an_absolute_at_is_the_run_at():
    qid = _queue()
    uid = _uid()
    _insert(qid, [_row(uid, at=T0 + 12_345, delay_ms=99)])
    assert Job.objects.get(uid=uid).run_at == T0 + 12_345


def test_a_bulk_insert_is_all_or_nothing_with_its_transaction():
    qid = _queue()
    with pytest.raises(RuntimeError), db.write_atomic():
        _store().insert_jobs(connection, now=_at(T0), queue_id=qid, rows=[_row(_uid()) for _ in range(10)])
        raise RuntimeError("the caller fails after the insert")
    assert Job.objects.filter(queue_id=qid).count() == 0


def test_bulk_enqueue_is_all_or_nothing_and_in_input_order():
    _queue("conf:bulk")
    out = fq.enqueue_many("conf:bulk", [{"payload": i} for i in range(20)])
    assert [j.uid for j in Job.objects.filter(queue__name="conf:bulk").order_by("seq")] == [r.id for r in out]
    with pytest.raises(InvalidArgument):  # one invalid item fails the whole batch
        fq.enqueue_many("conf:bulk", [{"payload": 1}, {"payload": 2, "priority": "x"}])
    assert Job.objects.filter(queue__name="conf:bulk").count() == 20


def test_a_unique_key_held_by_an_active_job_skips_the_row():
    qid = _queue()
    first = _uid()
    assert _insert(qid, [_row(first, key="k")]) == {first: T0}
    store = _store()
    with db.write_atomic():
        assert store.active_jobs_by_key(connection, qid, ["k", "other"]) == {"k": first}
    second, third = _uid(), _uid()
    # The held key is skipped; the rest of the batch is written.
    assert _insert(qid, [_row(second, key="k"), _row(third, key="free")]) == {third: T0}
    assert Job.objects.filter(queue_id=qid, unique_key="k").count() == 1


def test_keyed_rows_keep_the_input_order_their_keys_and_skip_only_the_held_key():
    """Keys out of sorted order, a held one among them and rows without a key: FIFO by input order still."""
    qid = _queue()
    held = _uid()
    _insert(qid, [_row(held, key="m")])
    uids = [_uid() for _ in range(5)]
    keys = ["z", None, "m", "a", None]
    assert _insert(qid, [_row(u, key=k) for u, k in zip(uids, keys, strict=True)]) == {
        u: T0 for u, k in zip(uids, keys, strict=True) if k != "m"
    }
    got = list(Job.objects.filter(queue_id=qid).order_by("seq").values_list("uid", "unique_key"))
    assert got == [(held, "m")] + [(u, k) for u, k in zip(uids, keys, strict=True) if k != "m"]
    with db.write_atomic():
        assert _store().active_jobs_by_key(connection, qid, ["a", "m", "z"]) == {"a": uids[3], "m": held, "z": uids[0]}


def test_holders_of_refused_keys_are_found_the_same_way():
    """``refused=True`` (asked after an insert was refused) answers like the first lookup."""
    qid = _queue()
    held = _uid()
    _insert(qid, [_row(held, key="k")])
    with db.write_atomic():
        assert _store().active_jobs_by_key(connection, qid, ["k"], refused=True) == {"k": held}
        assert _store().active_jobs_by_key(connection, qid, ["free"], refused=True) == {}


@pytest.mark.parametrize("final", ["succeeded", "dead", "cancelled"])
def test_a_unique_key_is_free_once_its_job_finished(final):
    qid = _queue()
    first = _uid()
    _insert(qid, [_row(first, key="k")])
    Job.objects.filter(uid=first).update(state="running")
    with db.write_atomic():
        assert _store().active_jobs_by_key(connection, qid, ["k"]) == {"k": first}
    Job.objects.filter(uid=first).update(state=final)
    with db.write_atomic():
        assert _store().active_jobs_by_key(connection, qid, ["k"]) == {}
    second = _uid()
    assert _insert(qid, [_row(second, key="k")]) == {second: T0}


def test_unique_keys_are_per_queue_and_case_sensitive():
    a, b = _queue("conf:a"), _queue("conf:b")
    uids = [_uid() for _ in range(3)]
    assert _insert(a, [_row(uids[0], key="K"), _row(uids[1], key="k")]) == dict.fromkeys(uids[:2], T0)
    assert _insert(b, [_row(uids[2], key="K")]) == {uids[2]: T0}


def test_lock_unique_keys_inside_a_write_transaction():
    qid = _queue()
    with db.write_atomic():
        _store().lock_unique_keys(connection, qid, ["a", "b", "c"])
        _store().lock_unique_keys(connection, qid, ["a", "b"])  # again in the same transaction: no wait


def test_producers_racing_one_new_unique_key_make_one_job():
    _queue("conf:key")
    results, errors = _race(6, lambda i: fq.enqueue("conf:key", {"i": i}, unique_key="one"))
    assert errors == []
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert Job.objects.filter(queue__name="conf:key").count() == 1


# --- the queue-full rule -----------------------------------------------------------------------


def test_queue_full_changes_nothing(settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = 3
    qid = _queue("conf:full")
    fq.enqueue_many("conf:full", [{"payload": i} for i in range(2)])
    before = list(Job.objects.filter(queue_id=qid).values_list("uid", flat=True))
    sums = _base.counter_sums(connection, qid)
    for items in ([{"payload": 1}, {"payload": 2}], [{"payload": 1, "idempotency": "t"}, {"payload": 2}]):
        with pytest.raises(QueueFull) as err:
            fq.enqueue_many("conf:full", items)
        assert err.value.field == "queue"
        assert "2 of 3" in str(err.value)
    assert list(Job.objects.filter(queue_id=qid).values_list("uid", flat=True)) == before
    assert not IdempotencyToken.objects.filter(queue_id=qid).exists()
    assert _base.counter_sums(connection, qid) == sums
    fq.enqueue("conf:full", 3)  # exactly the limit fits


def test_queue_full_in_the_one_statement_enqueue_writes_nothing():
    store = _store()
    if not store.supports_one_statement_enqueue:
        pytest.skip("this store has no one-statement enqueue")
    qid = _queue("conf:one")
    items = [parse_options({"payload": i}) for i in range(3)]
    done, found = store.enqueue_plain(connection, "conf:one", items, now=db.now_sql(), max_jobs=2, channel="x")
    assert (done, found) == (None, True)
    done, found = store.enqueue_plain(connection, "conf:none", items, now=db.now_sql(), max_jobs=9, channel="x")
    assert (done, found) == (None, False)
    assert Job.objects.filter(queue_id=qid).count() == 0
    done, found = store.enqueue_plain(connection, "conf:one", items, now=db.now_sql(), max_jobs=3, channel="x")
    assert found and [r.id for r in done] == list(Job.objects.filter(queue_id=qid).order_by("seq").values_list("uid", flat=True))
    assert _base.counter_sums(connection, qid, ("enqueued", "active")) == {"enqueued": 3, "active": 3}


def test_queue_overflow_names_the_first_limit_passed(settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = 2
    settings.FQ_MAX_TOKENS_PER_QUEUE = 1
    qid = _queue()
    with db.write_atomic():
        _base.add_counters(connection, qid, active=1, token_rows=1)
        assert _base.queue_overflow(connection, qid, jobs=1) is None
        assert _base.queue_overflow(connection, qid, jobs=2) == ("FQ_MAX_JOBS_PER_QUEUE", 2, 1, 2)
        assert _base.queue_overflow(connection, qid, tokens=1) == ("FQ_MAX_TOKENS_PER_QUEUE", 1, 1, 1)
        assert _base.queue_overflow(connection, qid) is None


# --- counters ----------------------------------------------------------------------------------


def test_counters_add_up_over_shards_and_fold_into_one():
    qid = _queue()
    store = _store()
    with db.write_atomic():
        store.add_counters(connection, qid, {"enqueued": 2, "active": 2})
        store.add_counters(connection, qid, {"acked": 1, "active": -1})
    QueueCounter.objects.create(queue_id=qid, enqueued=5)  # a second shard, as a busy moment leaves
    QueueCounter.objects.create(queue_id=qid, enqueued=1, token_rows=3)
    assert store.counter_sums(connection, qid, ("enqueued", "active", "acked", "token_rows")) == {
        "enqueued": 8,
        "active": 1,
        "acked": 1,
        "token_rows": 3,
    }
    assert qid in store.queues_with_shards(connection)
    with db.write_atomic():
        assert store.fold_shards(connection, qid, _base.COUNTER_NAMES) == 2
    assert QueueCounter.objects.filter(queue_id=qid).count() == 1
    assert qid not in store.queues_with_shards(connection)
    assert store.counter_sums(connection, qid, ("enqueued", "active", "acked", "token_rows"))["enqueued"] == 8


def test_a_shard_another_transaction_holds_is_passed_over():
    store = _store()
    if not store.supports_skip_locked:
        pytest.skip("this store's writers hold the whole database: nothing to pass over")
    qid = _queue()
    with db.write_atomic():
        store.add_counters(connection, qid, {"enqueued": 1})
    held, done, errors = threading.Event(), threading.Event(), []

    def holder():
        try:
            with db.write_atomic():
                store.add_counters(db.connection(), qid, {"enqueued": 1})  # holds the one shard
                held.set()
                done.wait(30)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            held.set()
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        with db.write_atomic():
            store.add_counters(connection, qid, {"enqueued": 1})  # a new shard, no wait
        assert QueueCounter.objects.filter(queue_id=qid).count() == 2
    finally:
        done.set()
        thread.join(30)
    assert not errors
    assert store.counter_sums(connection, qid, ("enqueued",)) == {"enqueued": 3}


# --- maintenance -------------------------------------------------------------------------------


def test_prune_jobs_takes_finished_jobs_past_retention_only_up_to_its_limit():
    qid = _queue()
    uids = [_uid() for _ in range(6)]
    _insert(qid, [_row(u) for u in uids])
    finished = {uids[0]: ("succeeded", T0), uids[1]: ("cancelled", T0), uids[2]: ("succeeded", T0 + 600)}
    finished |= {uids[3]: ("dead", T0), uids[4]: ("succeeded", T0)}
    for uid, (state, at) in finished.items():
        Job.objects.filter(uid=uid).update(state=state, finished_at=at)
    store = _store()
    with db.write_atomic():
        assert store.prune_jobs(connection, now=_at(T0 + 1000), retention_ms=500, limit=2) == 2
    with db.write_atomic():
        assert store.prune_jobs(connection, now=_at(T0 + 1000), retention_ms=500, limit=10) == 1
    with db.write_atomic():
        assert store.prune_jobs(connection, now=_at(T0 + 1000), retention_ms=500, limit=10) == 0
    left = set(Job.objects.filter(queue_id=qid).values_list("uid", flat=True))
    assert left == {uids[2], uids[3], uids[5]}  # too recent, dead, queued


def test_prune_tokens_takes_expired_tokens_and_names_their_queues():
    a, b = _queue("conf:a"), _queue("conf:b")
    _take(a, T0, "x", _uid(), retention_ms=10)
    _take(a, T0, "y", _uid(), retention_ms=10)
    _take(b, T0, "x", _uid(), retention_ms=10)
    _take(b, T0, "live", _uid(), retention_ms=10_000)
    store = _store()
    with db.write_atomic():
        assert sorted(store.prune_tokens(connection, now=_at(T0 + 9), limit=10)) == []
    with db.write_atomic():
        assert sorted(store.prune_tokens(connection, now=_at(T0 + 10), limit=10)) == sorted([a, a, b])
    assert list(IdempotencyToken.objects.values_list("token", flat=True)) == ["live"]


def test_delete_queue_rows_removes_the_queue_and_all_its_rows_only():
    keep, gone = _queue("conf:keep"), _queue("conf:gone")
    for name, qid in (("conf:keep", keep), ("conf:gone", gone)):
        _insert(qid, [_row(_uid())])
        _take(qid, T0, "t", _uid())
        with db.write_atomic():
            _base.add_counters(connection, qid, enqueued=1)
        fq.enqueue(name, "running")
        assert fq.claim(name, count=1, visibility_ms=60_000)  # a lease, whose job it references
    with db.write_atomic():
        assert _store().lock_queue_row(connection, base.QUEUE_TABLE, gone, exclusive=True)
        _store().delete_queue_rows(connection, gone)
    for model in (Job, Lease, IdempotencyToken, QueueCounter):
        assert not model.objects.filter(queue_id=gone).exists(), model
        assert model.objects.filter(queue_id=keep).exists(), model
    assert list(Queue.objects.values_list("name", flat=True)) == ["conf:keep"]


def test_clock_plus_reads_the_clock_given():
    assert _store().clock_plus(connection, _at(T0), 5) == T0 + 5
    now = db.db_now_ms()
    assert _store().clock_plus(connection, db.now_sql(), 0) >= now


# --- queue creation ----------------------------------------------------------------------------


def test_the_queue_creation_lock_leaves_nothing_behind():
    with db.write_atomic():
        _store().lock_queue_creation(connection, 0x66710001)
        _store().lock_queue_creation(connection, 0x66710001)  # again in the same transaction: no wait
    assert not Job.objects.exists()


def test_concurrent_creators_never_pass_max_queues(settings):
    settings.FQ_MAX_QUEUES = 3
    fq.configure("conf:first")

    def work(i):
        try:
            fq.configure(f"conf:new-{i}")
            return True
        except TooManyQueues:
            return False

    results, errors = _race(6, work)
    assert errors == []
    assert sum(results) == 2
    assert Queue.objects.count() == 3
    assert not Job.objects.exists()


def test_an_insert_of_a_duplicate_active_key_is_an_integrity_error_the_store_absorbs():
    """Two active jobs never share a key, even written past the store (the unique index)."""
    qid = _queue()
    _insert(qid, [_row(_uid(), key="k")])
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(
            uid=_uid(), queue_id=qid, run_at=0, enqueued_at=0, changed_at=0, max_attempts=1, payload="1",
            payload_size=1, unique_key="k",
        )  # fmt: skip


def test_batches_with_the_same_unique_keys_in_opposite_orders_all_finish():
    """Inserting the same keys in opposite orders may deadlock where keys have no lock of their own: retried."""
    _queue("conf:order")
    keys = [f"k{n:02d}" for n in range(12)]

    def work(i):
        out = []
        for _ in range(4):
            order = keys if i % 2 else keys[::-1]
            out.append(fq.enqueue_many("conf:order", [{"payload": k, "unique_key": k} for k in order]))
        return out

    results, errors = _race(4, work)
    assert errors == []
    assert Job.objects.filter(queue__name="conf:order").count() == len(keys)
    ids = {}
    for batches in results:
        for batch in batches:
            for res in batch:
                ids.setdefault(Job.objects.get(uid=res.id).unique_key, set()).add(res.id)
    assert sorted(ids) == keys and all(len(v) == 1 for v in ids.values())


def _in_a_stale_snapshot(queue: str, before, write_elsewhere, then):
    """Run ``then()`` in a caller's REPEATABLE READ transaction whose snapshot predates ``write_elsewhere()``."""
    with connection.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    with transaction.atomic():
        before()  # the first read takes the snapshot
        thread = threading.Thread(target=lambda: (write_elsewhere(), connections.close_all()))
        thread.start()
        thread.join(30)
        return then()


@pytest.mark.mysql_only
def test_a_token_committed_after_the_callers_snapshot_is_replayed_not_duplicated():
    _queue("conf:rr")
    first = {}
    replay = _in_a_stale_snapshot(
        "conf:rr",
        before=lambda: list(Job.objects.filter(queue__name="conf:rr")),
        write_elsewhere=lambda: first.update(r=fq.enqueue("conf:rr", 1, idempotency="t")),
        then=lambda: fq.enqueue("conf:rr", 2, idempotency="t"),
    )
    assert first["r"].created and not replay.created
    assert replay.id == first["r"].id
    assert Job.objects.filter(queue__name="conf:rr").count() == 1


@pytest.mark.mysql_only
def test_a_unique_key_committed_after_the_callers_snapshot_coalesces():
    _queue("conf:rr")
    first = {}
    again = _in_a_stale_snapshot(
        "conf:rr",
        before=lambda: list(Job.objects.filter(queue__name="conf:rr")),
        write_elsewhere=lambda: first.update(r=fq.enqueue("conf:rr", 1, unique_key="k")),
        then=lambda: fq.enqueue("conf:rr", 2, unique_key="k"),
    )
    assert first["r"].created and not again.created
    assert again.id == first["r"].id
    assert Job.objects.filter(queue__name="conf:rr").count() == 1


def test_count_queues_counts_every_committed_queue():
    _queue("conf:a")
    _queue("conf:b")
    with db.write_atomic():
        _store().lock_queue_creation(connection, 0x66710001)
        assert _store().count_queues(connection) == 2


@pytest.mark.mysql_only
def test_max_queues_holds_for_a_caller_whose_snapshot_predates_another_creation(settings):
    settings.FQ_MAX_QUEUES = 2
    _queue("conf:a")
    with pytest.raises(TooManyQueues):
        _in_a_stale_snapshot(
            "conf:c",
            before=lambda: list(Queue.objects.all()),
            write_elsewhere=lambda: fq.configure("conf:b"),
            then=lambda: fq.enqueue("conf:c", 1),
        )
    assert sorted(Queue.objects.values_list("name", flat=True)) == ["conf:a", "conf:b"]
