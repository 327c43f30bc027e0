"""Per-minute history (docs/reference/history.md): counts of real claims, acks, nacks and deads,
median/p95 within the stated bin error, buckets per span, pruning, hostile arguments."""

from __future__ import annotations

import math

import pytest
from django.db import transaction

from django_fq import db as fqdb
from django_fq import services as fq
from django_fq import storage
from django_fq.exceptions import InvalidArgument, InvalidQueueName, QueueNotFound
from django_fq.models import Queue, QueueMinute
from django_fq.services import history

# Committed transactions: the history is tallied when the work commits.
pytestmark = pytest.mark.django_db(transaction=True)

MIN = 60_000


def exact_quantile(values: list[int], p: float) -> int:
    """Nearest rank, the definition the history's bins approximate."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


def assert_near(reported: float | None, exact: int) -> None:
    assert reported is not None
    if exact == 0:
        assert reported == 0
    else:
        assert abs(reported - exact) / exact <= history.ERROR_BOUND + 1e-9, (reported, exact)


def test_bins_hold_their_values_and_quantiles_are_within_the_bound():
    assert pytest.approx(0.0905, abs=1e-4) == history.ERROR_BOUND
    for ms in [0, 1, 2, 3, 5, 7, 10, 99, 100, 101, 1000, 4095, 4096, 65_537, 10**9, 2**32 - 1]:
        low, high = history.bin_edges(history.bin_of(ms))
        assert low <= ms < high, ms
    assert history.bin_of(2**32) == history.bin_of(10**15) == history.BINS - 1
    values = [3, 8, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765, 10946]
    bins: dict[int, int] = {}
    for v in values:
        bins[history.bin_of(v)] = bins.get(history.bin_of(v), 0) + 1
    for p in (0.5, 0.95):
        assert_near(history.quantile(bins, p), exact_quantile(values, p))
    assert history.quantile({}, 0.5) is None


def bucket_at(series: dict, instant: int) -> dict:
    step = series["step_ms"]
    (found,) = [b for b in series["buckets"] if b["start"] <= instant < b["start"] + step]
    return found


def test_a_minute_counts_the_real_claims_acks_nacks_and_deads(q, frozen):
    fq.configure(q, max_attempts=2, backoff_ms=0)
    frozen.set(frozen.now - frozen.now % MIN + 1_000)  # one minute holds every event below
    start = frozen.now
    fq.enqueue_many(q, [{"payload": n} for n in range(10)])
    waits, runs = [], []
    claimed = []
    for step in (0, 7, 130, 2_000):  # claims after different waits (ms since the enqueue)
        frozen.set(start + step)
        got = fq.claim(q, count=2)
        claimed += got
        waits += [step] * len(got)
    assert len(claimed) == 8
    frozen.set(start + 5_000)
    for job in claimed[:5]:  # run times 5000 − the claim
        fq.ack(q, job.receipt)
        runs.append(start + 5_000 - job.claimed_at)
    fq.nack(q, claimed[5].receipt)  # failed, retried
    fq.nack(q, claimed[6].receipt, permanent=True)  # a failed attempt, and a job gone dead
    fq.nack(q, claimed[7].receipt)  # failed, retried
    fq.enqueue(q, "one more")

    series = fq_history(q, "hour")
    minute = bucket_at(series, start)
    assert (minute["enqueued"], minute["succeeded"], minute["failed"], minute["dead"]) == (11, 5, 3, 1)
    assert minute["wait_ms"]["count"] == 8 and minute["run_ms"]["count"] == 5
    for name, p in (("median", 0.5), ("p95", 0.95)):
        assert_near(minute["wait_ms"][name], exact_quantile(waits, p))
        assert_near(minute["run_ms"][name], exact_quantile(runs, p))
    assert series["totals"]["enqueued"] == 11 and series["totals"]["run_ms"]["count"] == 5
    # Every other minute of the hour is empty, and the window ends with the minute of now.
    assert sum(b["enqueued"] for b in series["buckets"]) == 11
    assert series["buckets"][-1]["start"] <= frozen.now < series["end"] == series["buckets"][-1]["start"] + MIN
    assert len(series["buckets"]) == 60


def fq_history(queue, span):
    return history.history_series(queue, span)


def test_minutes_are_kept_apart_and_day_and_week_sum_them(q, frozen):
    frozen.set(frozen.now - frozen.now % (3600 * 1000) + 5_000)  # at the start of an hour
    first = frozen.now
    fq.enqueue(q, 1)
    frozen.advance(MIN)
    fq.enqueue_many(q, [{"payload": n} for n in range(3)])
    hour = fq_history(q, "hour")
    assert bucket_at(hour, first)["enqueued"] == 1
    assert bucket_at(hour, first + MIN)["enqueued"] == 3
    for span, step, n in (("day", 15 * MIN, 96), ("week", 60 * MIN, 168)):
        series = fq_history(q, span)
        assert (series["step_ms"], len(series["buckets"])) == (step, n)
        assert bucket_at(series, first)["enqueued"] == 4
        assert series["totals"]["enqueued"] == 4
    every = fq_history(None, "hour")
    assert every["queue"] is None and every["totals"]["enqueued"] == 4


def test_every_queue_sums_the_queues(q, frozen):
    fq.enqueue(q, 1)
    fq.enqueue("tests:other", 2)
    assert fq_history(q, "hour")["totals"]["enqueued"] == 1
    assert fq_history("tests:other", "hour")["totals"]["enqueued"] == 1
    assert fq_history(None, "hour")["totals"]["enqueued"] == 2


def test_a_rolled_back_enqueue_counts_nothing(q):
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        fq.enqueue(q, "gone")
        raise Undo
    with transaction.atomic():
        fq.enqueue(q, "kept")
        history.flush()  # inside the transaction: nothing tallied yet
        assert not QueueMinute.objects.exists()
    assert fq_history(q, "hour")["totals"]["enqueued"] == 1


def test_the_minute_is_written_once_over_and_a_second_writer_adds(q, frozen):
    frozen.set(frozen.now - frozen.now % MIN + 1_000)
    at = frozen.now
    fq.enqueue(q, 1)
    assert history.flush() == 1
    fq.enqueue(q, 2)  # the same minute, a second write: added to the row
    history.flush()
    row = QueueMinute.objects.get(kind=history.THROUGHPUT)
    assert (row.minute, row.enqueued) == (at - at % MIN, 2)


def add_rows(queue_id: int, minutes: list[int]) -> None:
    conn = fqdb.connection()
    store = storage.for_connection(conn)
    store.add_minutes(conn, [(queue_id, m, history.THROUGHPUT, 0, 1, 0, 0, 0, 0) for m in sorted(minutes)])
    store.add_minutes(conn, [(queue_id, m, history.WAIT, 3, 0, 0, 0, 0, 2) for m in sorted(minutes)])


def test_prune_removes_the_old_minutes_only_and_is_bounded(q, settings):
    settings.FQ_HISTORY_RETENTION_MS = 8 * 24 * 3600 * 1000
    qid = Queue.objects.get(name=q).id
    now = fqdb.db_now_ms()
    now -= now % MIN
    old = [now - settings.FQ_HISTORY_RETENTION_MS - (i + 1) * MIN for i in range(5)]
    kept = [now - settings.FQ_HISTORY_RETENTION_MS + 2 * MIN, now - MIN, now]
    add_rows(qid, old + kept)
    assert fq.prune(limit=4).history == 4  # bounded by the limit
    assert fq.prune().history == 6
    assert sorted(set(QueueMinute.objects.values_list("minute", flat=True))) == kept
    assert QueueMinute.objects.count() == 2 * len(kept)
    assert fq.prune().history == 0


def test_a_deleted_queue_takes_its_history(q):
    fq.enqueue(q, 1)
    history.flush()
    assert QueueMinute.objects.exists()
    fq.delete_queue(q)
    assert not QueueMinute.objects.exists()


@pytest.mark.parametrize("span", ["year", "", None, 3, "HOUR", "hour; DROP TABLE x"])
def test_a_hostile_span_is_refused_by_name(q, span):
    with pytest.raises(InvalidArgument) as err:
        fq_history(q, span)
    assert err.value.field == "span"


@pytest.mark.parametrize("queue", ["", "a b", "x" * 201, 42, ["q"], "q'--"])
def test_a_hostile_queue_is_refused_by_name(db, queue):
    with pytest.raises(InvalidQueueName) as err:
        fq_history(queue, "hour")
    assert err.value.field == "queue"


def test_an_unknown_queue_is_not_found(db):
    with pytest.raises(QueueNotFound) as err:
        fq_history("tests:missing", "hour")
    assert err.value.field == "queue"


def test_an_empty_history_has_every_bucket_and_no_quantile(q):
    series = fq_history(q, "week")
    assert len(series["buckets"]) == 168
    assert series["totals"] == {
        "enqueued": 0, "succeeded": 0, "failed": 0, "dead": 0,
        "wait_ms": {"count": 0, "median": None, "p95": None}, "run_ms": {"count": 0, "median": None, "p95": None},
    }  # fmt: skip


def test_a_flush_while_other_threads_tally_never_raises(q):
    """Other threads add minutes while one flushes (every minute boundary): the flush reads the keys under the lock.

    With the keys read unlocked, ``dict changed size during iteration`` came out of
    the enqueue or ack that happened to flush, after its commit.
    """
    import sys
    import threading
    import time

    # Minutes from ten days ahead, one per key: none is due, so no add writes anything.
    base = int(time.time() * 1000) + 10 * 86_400_000
    tally = history.Tally()
    for n in range(20_000):
        tally.add("default", n, base + MIN * n, (1, 0, 0, 0), (), ())
    stop, errors = threading.Event(), []

    def add():
        n = 20_000
        while not stop.is_set():
            n += 1
            tally.add("default", n, base + MIN * n, (1, 0, 0, 0), (), ())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    adder = threading.Thread(target=add, daemon=True)
    adder.start()
    try:
        # Inside the test's transaction the flush stops after reading the keys (the write waits):
        # exactly the part that raced.
        with transaction.atomic():
            for _ in range(200):
                try:
                    assert tally.flush() == 0
                except RuntimeError as exc:
                    errors.append(exc)
                    break
    finally:
        stop.set()
        adder.join(10)
        sys.setswitchinterval(old)
    assert errors == []


def test_an_error_in_the_tally_never_reaches_the_enqueue(q, monkeypatch):
    """The events are counted after the commit: a failing tally is logged, the enqueue still answers."""

    def broken(*args, **kwargs):
        raise RuntimeError("tally broken")

    monkeypatch.setattr(history.TALLY, "add", broken)
    job = fq.enqueue(q, {"n": 1})
    assert fq.get(q, job.id).state == "ready"
