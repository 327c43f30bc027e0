"""Enqueue (docs/reference/semantics.md §3, §4, §9): payloads, options, idempotency, unique keys, bulk, limits, transactions."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq import validation
from django_fq.db import db_now_ms
from django_fq.exceptions import (
    DelayAndAt,
    InvalidArgument,
    InvalidDelay,
    InvalidJson,
    InvalidTime,
    JobNotFound,
    PayloadTooLarge,
    QueueFull,
)
from django_fq.models import IdempotencyToken
from django_fq.types import EnqueueResult
from tests.listening import listening

from .helpers import QUEUE, claim_one, rows

pytestmark = pytest.mark.django_db

DAY = 86_400_000


# --- payloads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"to": "a@example.com", "n": 1, "ok": True, "none": None, "list": [1, 2.5, "x", [], {}]},
        {"unicode": "zażółć ✓ 日本 🎉", "escape": 'quote " backslash \\ tab \t newline \n'},
        {"nested": {"a": {"b": {"c": [1, {"d": [None]}]}}}},
        {"big": 2**70, "neg": -(2**63), "float": 0.1, "exp": 1e300, "small": -1.5e-300},
        [1, "two", 3.0],
        "just a string",
        12345,
        0,
        True,
        None,
        {},
        [],
    ],
)
def test_payload_json_round_trip(q, payload):
    job_id = fq.enqueue(q, payload).id
    assert fq.get(q, job_id).payload == payload
    assert claim_one(q).payload == payload


@pytest.mark.parametrize(
    "payload",
    [float("nan"), {"x": float("inf")}, [-float("inf")], {"s": "nul\x00byte"}, {"k\x00": 1}, "\ud800", {1, 2}, object()],
)
def test_payload_that_no_backend_stores_alike_is_rejected(q, payload):
    with pytest.raises(InvalidJson) as err:
        fq.enqueue(q, payload)
    assert err.value.field == "payload"
    assert rows(q)["jobs"] == 0


MIB = 1024 * 1024


def test_payload_of_exactly_the_limit_is_accepted_and_one_byte_more_is_not(q):
    exact = "x" * (MIB - 2)  # with its two quotes: exactly 1 MiB of compact JSON
    job_id = fq.enqueue(q, exact).id
    assert fq.get(q, job_id).payload == exact
    with pytest.raises(PayloadTooLarge) as err:
        fq.enqueue(q, exact + "x")
    assert err.value.field == "payload"
    assert err.value.status == 413
    # Size is counted in UTF-8 bytes of the compact encoding.
    with pytest.raises(PayloadTooLarge):
        fq.enqueue(q, "é" * (MIB // 2))
    fq.enqueue(q, {"k": "é" * ((MIB - 10) // 2)})
    with pytest.raises(PayloadTooLarge) as err:
        fq.enqueue_many(q, [{"payload": 1}, {"payload": exact + "x"}])
    assert err.value.field == "items[1].payload"
    assert rows(q)["jobs"] == 2


def test_payload_limit_setting_and_hard_cap(q, settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 100
    fq.enqueue(q, "x" * 98)
    with pytest.raises(PayloadTooLarge):
        fq.enqueue(q, "x" * 99)
    settings.FQ_MAX_PAYLOAD_BYTES = 64 * MIB  # never above the 32 MiB hard cap
    with pytest.raises(PayloadTooLarge):
        fq.enqueue(q, "x" * (32 * MIB - 1))
    assert rows(q)["jobs"] == 1


def test_job_id_is_32_hex_and_unique(q):
    ids = {fq.enqueue(q, n).id for n in range(50)}
    assert len(ids) == 50
    for job_id in ids:
        assert len(job_id) == 32
        int(job_id, 16)


def test_times_are_epoch_ms_of_the_database_clock(q):
    """enqueued_at / run_at / claimed_at / deadline are the database's epoch milliseconds."""
    t0 = db_now_ms()
    job_id = fq.enqueue(q, {}).id
    delayed = fq.enqueue(q, {}, delay_ms=60_000).id
    job = claim_one(q, visibility_ms=10_000)
    t1 = db_now_ms()
    info = fq.get(q, job_id)
    assert t0 <= info.enqueued_at <= t1
    assert info.run_at == info.enqueued_at
    assert t0 <= job.claimed_at <= t1
    assert job.deadline == job.claimed_at + 10_000
    later = fq.get(q, delayed)
    assert later.run_at == later.enqueued_at + 60_000
    assert t0 <= later.enqueued_at <= t1
    assert later.state == "scheduled"


# --- priority, delay, at -------------------------------------------------------------------


@pytest.mark.parametrize("prio", [-(2**31), -1, 0, 1, 2**31 - 1])
def test_priority_accepts_32_bit_range(q, prio):
    job_id = fq.enqueue(q, {}, priority=prio).id
    assert fq.get(q, job_id).priority == prio


@pytest.mark.parametrize("prio", [-(2**31) - 1, 2**31, "1", 1.0, True])
def test_priority_outside_32_bit_or_not_int_is_rejected(q, prio):
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue(q, {}, priority=prio)
    assert err.value.field == "priority"
    assert rows(q)["jobs"] == 0


def test_delay_sets_run_at_from_the_database_clock(q, frozen):
    job_id = fq.enqueue(q, {}, delay_ms=1234).id
    info = fq.get(q, job_id)
    assert info.enqueued_at == frozen.now
    assert info.run_at == frozen.now + 1234
    assert info.state == "scheduled"
    now_id = fq.enqueue(q, {}, delay_ms=0).id
    assert fq.get(q, now_id).run_at == frozen.now
    assert fq.get(q, now_id).state == "ready"


def test_delay_bounds_are_zero_to_ten_years(q, frozen):
    assert 3652 * DAY <= validation.MAX_DELAY_MS <= 3653 * DAY  # "10 years"
    longest = fq.enqueue(q, {}, delay_ms=validation.MAX_DELAY_MS).id
    assert fq.get(q, longest).run_at == frozen.now + validation.MAX_DELAY_MS
    for bad in (-1, validation.MAX_DELAY_MS + 1, 3654 * DAY, 1.5, "10", True):
        with pytest.raises(InvalidDelay) as err:
            fq.enqueue(q, {}, delay_ms=bad)
        assert err.value.field == "delay_ms"
    assert rows(q)["jobs"] == 1


def test_at_as_epoch_ms(q, frozen):
    at = frozen.now + 5000
    job_id = fq.enqueue(q, {}, at=at).id
    assert fq.get(q, job_id).run_at == at
    assert fq.get(q, job_id).state == "scheduled"
    frozen.set(at - 1)
    assert fq.claim(q) == []
    frozen.set(at)
    assert claim_one(q).id == job_id


def test_at_in_the_past_is_ready_now(q, frozen):
    job_id = fq.enqueue(q, {}, at=frozen.now - 60_000).id
    assert fq.get(q, job_id).state == "ready"
    assert claim_one(q).id == job_id


@pytest.mark.parametrize("tz", [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-8))])
def test_at_as_aware_datetime_is_the_right_instant(q, frozen, tz):
    at_ms = frozen.now + 7_000
    instant = dt.datetime.fromtimestamp(at_ms / 1000, tz=dt.UTC).astimezone(tz)
    assert int(instant.timestamp() * 1000) == at_ms
    job_id = fq.enqueue(q, {}, at=instant).id
    assert fq.get(q, job_id).run_at == at_ms
    frozen.set(at_ms - 1)
    assert fq.claim(q) == []
    frozen.set(at_ms)
    assert claim_one(q).id == job_id


def test_naive_datetime_is_rejected(q):
    with pytest.raises(InvalidTime) as err:
        fq.enqueue(q, {}, at=dt.datetime(2030, 1, 1, 12, 0))
    assert err.value.field == "at"
    assert rows(q)["jobs"] == 0


@pytest.mark.parametrize("bad", ["2030-01-01", 1.5, True, -1, [1]])
def test_at_of_wrong_type_is_rejected(q, bad):
    with pytest.raises(InvalidTime):
        fq.enqueue(q, {}, at=bad)
    assert rows(q)["jobs"] == 0


def test_delay_and_at_together_is_an_error(q, frozen):
    with pytest.raises(DelayAndAt):
        fq.enqueue(q, {}, delay_ms=10, at=frozen.now + 10)
    with pytest.raises(DelayAndAt):
        fq.enqueue(q, {}, delay_ms=0, at=frozen.now)
    assert rows(q)["jobs"] == 0


def test_at_beyond_ten_years_is_rejected(q, frozen):
    job_id = fq.enqueue(q, {}, at=frozen.now + validation.MAX_DELAY_MS).id
    assert fq.get(q, job_id).run_at == frozen.now + validation.MAX_DELAY_MS
    with pytest.raises(InvalidTime) as err:
        fq.enqueue(q, {}, at=frozen.now + validation.MAX_DELAY_MS + 1)
    assert err.value.field == "at"
    far = dt.datetime.now(dt.UTC) + dt.timedelta(days=3660)
    with pytest.raises(InvalidTime):
        fq.enqueue(q, {}, at=far)
    assert rows(q)["jobs"] == 1


# --- max_attempts and timeout ---------------------------------------------------------------


def test_max_attempts_is_copied_at_enqueue(q):
    fq.configure(q, max_attempts=3)
    first = fq.enqueue(q, {"n": 1}).id
    fq.configure(q, max_attempts=9)
    second = fq.enqueue(q, {"n": 2}).id
    explicit = fq.enqueue(q, {"n": 3}, max_attempts=1).id
    assert fq.get(q, first).max_attempts == 3
    assert fq.get(q, second).max_attempts == 9
    assert fq.get(q, explicit).max_attempts == 1
    # The copy governs death: the first job dies after 3 attempts although the policy now says 9.
    for attempt in (1, 2, 3):
        job = claim_one(q)  # FIFO: always the first job while it is ready
        assert (job.id, job.attempts, job.max_attempts) == (first, attempt, 3)
        fq.nack(q, job.receipt, delay_ms=0)
    assert fq.get(q, first).state == "dead"
    assert fq.get(q, first).attempts == 3
    assert claim_one(q).id == second


@pytest.mark.parametrize("bad", [0, 1001, -1, True, "3"])
def test_max_attempts_bounds(q, bad):
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue(q, {}, max_attempts=bad)
    assert err.value.field == "max_attempts"
    assert fq.get(q, fq.enqueue(q, {}, max_attempts=1000).id).max_attempts == 1000


def test_timeout_ms_defaults_to_policy_and_is_overridable(q):
    fq.configure(q, timeout_ms=60_000)
    a = fq.enqueue(q, {}).id
    b = fq.enqueue(q, {}, timeout_ms=0).id
    c = fq.enqueue(q, {}, timeout_ms=7 * DAY).id
    assert [fq.get(q, i).timeout_ms for i in (a, b, c)] == [60_000, 0, 7 * DAY]
    for bad in (-1, 7 * DAY + 1, "5"):
        with pytest.raises(InvalidArgument) as err:
            fq.enqueue(q, {}, timeout_ms=bad)
        assert err.value.field == "timeout_ms"
    assert rows(q)["jobs"] == 3


# --- idempotency -----------------------------------------------------------------------------


def test_duplicate_returns_original_and_keeps_first_payload_and_options(q, frozen):
    first = fq.enqueue(q, {"v": 1}, idempotency="tok", priority=5, max_attempts=2, unique_key="k1")
    assert first.created is True
    before = fq.get(q, first.id)
    again = fq.enqueue(q, {"v": 2}, idempotency="tok", priority=9, delay_ms=50_000, max_attempts=7, unique_key="k2", timeout_ms=5)
    assert again.id == first.id and again.created is False
    assert fq.get(q, first.id) == before
    assert before.payload == {"v": 1} and before.priority == 5 and before.max_attempts == 2
    assert rows(q)["jobs"] == 1
    totals = fq.stats(q).totals
    assert totals["enqueued"] == 1 and totals["deduplicated"] == 1


def test_tokens_are_per_queue(q):
    a = fq.enqueue(q, {}, idempotency="same")
    b = fq.enqueue("another", {}, idempotency="same")
    assert a.created and b.created and a.id != b.id


def _settle(q, job_id, how):
    if how == "cancel":
        fq.cancel(q, job_id)
        return
    job = claim_one(q)
    assert job.id == job_id
    if how == "ack":
        fq.ack(q, job.receipt)
    elif how == "dead":
        fq.nack(q, job.receipt, permanent=True)


@pytest.mark.parametrize("how,state", [("ack", "succeeded"), ("cancel", "cancelled"), ("dead", "dead")])
def test_token_survives_the_end_of_its_job(q, how, state):
    first = fq.enqueue(q, {"n": 1}, idempotency="tok").id
    _settle(q, first, how)
    assert fq.get(q, first).state == state
    again = fq.enqueue(q, {"n": 2}, idempotency="tok")
    assert again.id == first and again.created is False
    assert rows(q)["jobs"] == 1
    assert fq.claim(q) == []


def test_token_expires_by_time_only(q, frozen):
    fq.configure(q, idempotency_retention_ms=1000)
    first = fq.enqueue(q, {"n": 1}, idempotency="tok").id
    frozen.advance(999)
    dup = fq.enqueue(q, {"n": 2}, idempotency="tok")
    assert (dup.id, dup.created) == (first, False)
    frozen.advance(1)  # retention over: the token no longer deduplicates
    fresh = fq.enqueue(q, {"n": 3}, idempotency="tok")
    assert fresh.created is True and fresh.id != first
    assert fq.get(q, fresh.id).payload == {"n": 3}
    assert fq.get(q, first).payload == {"n": 1}


def test_per_enqueue_retention_overrides_the_policy(q, frozen):
    first = fq.enqueue(q, {}, idempotency="short", idempotency_retention_ms=10).id
    frozen.advance(10)
    assert fq.enqueue(q, {}, idempotency="short").id != first
    long = fq.enqueue(q, {}, idempotency="long", idempotency_retention_ms=30 * DAY).id
    frozen.advance(30 * DAY - 1)
    assert fq.enqueue(q, {}, idempotency="long").id == long
    for bad in (0, 30 * DAY + 1):
        with pytest.raises(InvalidArgument) as err:
            fq.enqueue(q, {}, idempotency="x", idempotency_retention_ms=bad)
        assert err.value.field == "idempotency_retention_ms"


def test_expired_token_not_yet_pruned_is_replaced(q, frozen):
    fq.configure(q, idempotency_retention_ms=1000)
    first = fq.enqueue(q, {"n": 1}, idempotency="tok").id
    frozen.advance(5000)
    assert IdempotencyToken.objects.filter(token="tok").count() == 1  # still stored
    second = fq.enqueue(q, {"n": 2}, idempotency="tok")
    assert second.created is True and second.id != first
    # The replaced token now points at the new job, with a fresh retention window.
    frozen.advance(999)
    again = fq.enqueue(q, {"n": 3}, idempotency="tok")
    assert (again.id, again.created) == (second.id, False)
    assert IdempotencyToken.objects.filter(token="tok").count() == 1


def test_token_returns_its_id_after_the_job_was_pruned(q):
    first = fq.enqueue(q, {"n": 1}, idempotency="tok").id
    fq.ack(q, claim_one(q).receipt)
    pruned = fq.prune(retention_ms=0)
    assert pruned.jobs == 1 and pruned.tokens == 0
    with pytest.raises(JobNotFound):
        fq.get(q, first)
    again = fq.enqueue(q, {"n": 2}, idempotency="tok")
    assert (again.id, again.created) == (first, False)
    assert rows(q)["jobs"] == 0


@pytest.mark.parametrize("bad", ["", "x" * 256, "nul\x00", 5, "\udc00"])
def test_bad_tokens_and_keys_are_rejected(q, bad):
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue(q, {}, idempotency=bad)
    assert err.value.field == "idempotency"
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue(q, {}, unique_key=bad)
    assert err.value.field == "unique_key"
    assert rows(q) == {"jobs": 0, "leases": 0, "tokens": 0}


# --- unique_key ------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["scheduled", "ready", "running"])
def test_unique_key_coalesces_while_active(q, state):
    first = fq.enqueue(q, {"v": 1}, unique_key="k", delay_ms=60_000 if state == "scheduled" else None).id
    if state == "running":
        claim_one(q)
    assert fq.get(q, first).state == state
    again = fq.enqueue(q, {"v": 2}, unique_key="k", priority=3)
    assert (again.id, again.created) == (first, False)
    assert fq.get(q, first).payload == {"v": 1}
    assert fq.get(q, first).priority == 0
    assert rows(q)["jobs"] == 1
    assert fq.stats(q).totals["deduplicated"] == 1


@pytest.mark.parametrize("how", ["ack", "dead", "cancel"])
def test_unique_key_is_free_once_the_job_finished(q, how):
    first = fq.enqueue(q, {"v": 1}, unique_key="k").id
    _settle(q, first, how)
    again = fq.enqueue(q, {"v": 2}, unique_key="k")
    assert again.created is True and again.id != first
    assert fq.get(q, again.id).payload == {"v": 2}
    # ... and the new job holds the key now.
    assert fq.enqueue(q, {"v": 3}, unique_key="k").id == again.id


def test_unique_key_frees_after_success_when_nacked_then_acked(q):
    first = fq.enqueue(q, {}, unique_key="k").id
    fq.nack(q, claim_one(q).receipt, delay_ms=0)
    assert fq.enqueue(q, {}, unique_key="k").id == first  # still active (ready again)
    fq.ack(q, claim_one(q).receipt)
    assert fq.enqueue(q, {}, unique_key="k").created is True


def test_unique_keys_are_per_queue(q):
    a = fq.enqueue(q, {}, unique_key="k")
    b = fq.enqueue("elsewhere", {}, unique_key="k")
    assert a.created and b.created


def test_token_checked_before_unique_key(q):
    holder = fq.enqueue(q, {"v": "holder"}, unique_key="k").id
    coalesced = fq.enqueue(q, {"v": "x"}, unique_key="k", idempotency="t")
    assert (coalesced.id, coalesced.created) == (holder, False)
    # The token now remembers the job it was coalesced onto, even after the key is free.
    fq.ack(q, claim_one(q).receipt)
    again = fq.enqueue(q, {"v": "y"}, unique_key="k", idempotency="t")
    assert (again.id, again.created) == (holder, False)
    assert rows(q)["jobs"] == 1


# --- enqueue_many ----------------------------------------------------------------------------


def test_enqueue_many_returns_results_in_input_order(q):
    items = [{"payload": {"n": n}, "priority": n % 3} for n in range(25)]
    results = fq.enqueue_many(q, items)
    assert len(results) == 25
    assert all(r.created for r in results)
    assert [fq.get(q, r.id).payload for r in results] == [{"n": n} for n in range(25)]
    assert [fq.get(q, r.id).priority for r in results] == [n % 3 for n in range(25)]
    assert fq.stats(q).totals["enqueued"] == 25


def test_enqueue_many_accepts_every_option(q, frozen):
    results = fq.enqueue_many(
        q,
        [
            {"payload": 1, "delay_ms": 500, "max_attempts": 4, "timeout_ms": 99},
            {"payload": 2, "at": frozen.now + 700, "idempotency": "t", "idempotency_retention_ms": 10},
            {"payload": 3, "unique_key": "u", "priority": -4},
        ],
    )
    a, b, c = (fq.get(q, r.id) for r in results)
    assert (a.run_at, a.max_attempts, a.timeout_ms) == (frozen.now + 500, 4, 99)
    assert (b.run_at, b.idempotency) == (frozen.now + 700, "t")
    assert (c.unique_key, c.priority, c.state) == ("u", -4, "ready")


def test_enqueue_many_of_nothing(q):
    assert fq.enqueue_many(q, []) == []
    assert rows(q)["jobs"] == 0


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"payload": {}, "priority": 2**31}, "items[2].priority"),
        ({"payload": float("nan")}, "items[2].payload"),
        ({"priority": 1}, "items[2].payload"),
        ({"payload": {}, "delay_ms": -1}, "items[2].delay_ms"),
        ({"payload": {}, "delay_ms": 1, "at": 1}, "items[2].delay_ms"),
        ({"payload": {}, "bogus": 1}, "items[2].bogus"),
        ("not a mapping", "items[2].payload"),
    ],
)
def test_enqueue_many_is_all_or_nothing(q, bad, field):
    fq.enqueue(q, {"pre": True}, idempotency="pre")
    items = [{"payload": {"n": 0}, "idempotency": "a"}, {"payload": {"n": 1}, "unique_key": "u"}, bad, {"payload": 3}]
    with pytest.raises(InvalidArgument) as err:
        fq.enqueue_many(q, items)
    assert err.value.field == field
    assert rows(q) == {"jobs": 1, "leases": 0, "tokens": 1}
    assert fq.stats(q).totals["enqueued"] == 1
    # Nothing of the failed batch was kept: its token and key are unused.
    assert fq.enqueue(q, {}, idempotency="a").created is True
    assert fq.enqueue(q, {}, unique_key="u").created is True


def test_enqueue_many_coalesces_duplicates_inside_the_batch_onto_the_first(q):
    existing = fq.enqueue(q, {"old": True}, idempotency="old").id
    results = fq.enqueue_many(
        q,
        [
            {"payload": "a", "idempotency": "t1"},
            {"payload": "b", "unique_key": "k1"},
            {"payload": "c", "idempotency": "t1"},
            {"payload": "d", "unique_key": "k1"},
            {"payload": "e", "idempotency": "old"},
            {"payload": "f"},
            {"payload": "g", "idempotency": "t1", "unique_key": "k1"},
        ],
    )
    assert [r.created for r in results] == [True, True, False, False, False, True, False]
    assert results[2].id == results[0].id
    assert results[3].id == results[1].id
    assert results[4].id == existing
    assert results[6].id == results[0].id
    assert fq.get(q, results[0].id).payload == "a"
    assert fq.get(q, results[1].id).payload == "b"
    assert rows(q)["jobs"] == 4
    totals = fq.stats(q).totals
    assert (totals["enqueued"], totals["deduplicated"]) == (4, 4)


def test_enqueue_many_unique_key_of_an_existing_active_job(q):
    holder = fq.enqueue(q, {"v": 0}, unique_key="k").id
    results = fq.enqueue_many(q, [{"payload": 1, "unique_key": "k"}, {"payload": 2, "unique_key": "k", "idempotency": "t"}])
    assert [(r.id, r.created) for r in results] == [(holder, False), (holder, False)]
    assert fq.enqueue(q, {}, idempotency="t").id == holder


# --- transactions ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rollback_of_the_callers_transaction_leaves_no_job_and_no_token():
    fq.configure(QUEUE)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        res = fq.enqueue(QUEUE, {"n": 1}, idempotency="tok", unique_key="key")
        fq.enqueue_many(QUEUE, [{"payload": 2, "idempotency": "tok2"}])
        assert fq.get(QUEUE, res.id).state == "ready"  # visible inside the transaction
        raise Boom

    assert rows(QUEUE) == {"jobs": 0, "leases": 0, "tokens": 0}
    with pytest.raises(JobNotFound):
        fq.get(QUEUE, res.id)
    assert fq.stats(QUEUE).totals["enqueued"] == 0
    assert fq.claim(QUEUE) == []
    # The token and key are free: the next enqueue creates a job.
    again = fq.enqueue(QUEUE, {"n": 1}, idempotency="tok", unique_key="key")
    assert again.created is True and again.id != res.id


@pytest.mark.django_db(transaction=True)
def test_commit_of_the_callers_transaction_keeps_the_job():
    fq.configure(QUEUE)
    with transaction.atomic():
        res = fq.enqueue(QUEUE, {"n": 1}, idempotency="tok")
    assert fq.get(QUEUE, res.id).state == "ready"
    assert rows(QUEUE)["tokens"] == 1


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_rollback_wakes_no_worker_and_commit_does():
    fq.configure(QUEUE)
    with listening() as listener:
        with pytest.raises(RuntimeError), transaction.atomic():
            fq.enqueue(QUEUE, {"n": 1})
            raise RuntimeError
        assert list(listener.notifies(timeout=0.3)) == []
        fq.enqueue(QUEUE, {"n": 2})
        got = next(listener.notifies(timeout=5), None)
        assert got is not None and got.payload == QUEUE


@pytest.mark.django_db(transaction=True)
def test_racing_producers_with_one_token_make_one_job():
    fq.configure(QUEUE)
    barrier = threading.Barrier(8)
    results, errors = [], []

    def produce(n):
        try:
            barrier.wait()
            results.append(fq.enqueue(QUEUE, {"n": n}, idempotency="race"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert rows(QUEUE)["jobs"] == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_bulk_enqueues_sharing_tokens_and_keys_do_not_deadlock():
    """Batches carrying the same tokens and keys in opposite orders: no error, one job per token."""
    fq.configure(QUEUE)
    tokens = [f"tok-{n:02d}" for n in range(15)]
    barrier = threading.Barrier(4)
    results, errors = [], []

    def producer(n):
        order = tokens if n % 2 else tokens[::-1]
        try:
            barrier.wait()
            for _ in range(5):
                batch = [{"payload": t, "idempotency": t, "unique_key": "k" + t} for t in order]
                results.append(fq.enqueue_many(QUEUE, batch))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert rows(QUEUE)["jobs"] == len(tokens)
    by_token = {}
    for batch in results:
        for res in batch:
            by_token.setdefault(fq.get(QUEUE, res.id).payload, set()).add(res.id)
    assert sorted(by_token) == tokens
    assert all(len(ids) == 1 for ids in by_token.values())
    assert sum(r.created for batch in results for r in batch) == len(tokens)


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_an_open_caller_transaction_does_not_block_the_queue():
    """A producer holding its transaction open after an enqueue must not stall other producers or workers."""
    fq.configure(QUEUE)
    enqueued, release = threading.Event(), threading.Event()

    def slow_producer():
        try:
            with transaction.atomic():
                fq.enqueue(QUEUE, {"slow": True}, idempotency="slow", unique_key="slow")
                enqueued.set()
                release.wait(20)
        finally:
            connection.close()

    outcome = {}

    def others():
        try:
            fq.enqueue(QUEUE, {"fast": True}, idempotency="fast", unique_key="fast")
            job = claim_one(QUEUE)
            fq.ack(QUEUE, job.receipt)
            fq.enqueue_many(QUEUE, [{"payload": n} for n in range(3)])
            outcome["stats"] = fq.stats(QUEUE)
            fq.fold_counters()
        except Exception as exc:  # pragma: no cover - reported below
            outcome["error"] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=slow_producer)
    holder.start()
    try:
        assert enqueued.wait(10)
        worker = threading.Thread(target=others)
        worker.start()
        worker.join(10)
        blocked = worker.is_alive()
    finally:
        release.set()
        holder.join()
    if blocked:
        worker.join()
    assert not blocked, "work on the queue waited for the producer's open transaction"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["stats"].totals["acked"] == 1


# --- limits ----------------------------------------------------------------------------------


def test_queue_full_fails_and_changes_nothing(q, settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = 3
    first = fq.enqueue(q, {"n": 0}, idempotency="t0").id
    fq.enqueue(q, {"n": 1}, delay_ms=60_000)  # scheduled jobs count
    claim_one(q)  # running jobs count
    fq.enqueue(q, {"n": 2}, unique_key="k")
    before_rows, before_totals = rows(q), fq.stats(q).totals

    with pytest.raises(QueueFull) as err:
        fq.enqueue(q, {"n": 3}, idempotency="t-new")
    assert err.value.code == "queue_full"
    with pytest.raises(QueueFull):
        fq.enqueue_many(q, [{"payload": 4}])
    assert rows(q) == before_rows
    assert fq.stats(q).totals == before_totals

    # A live token still returns its job, and a unique key still coalesces, on a full queue.
    assert fq.enqueue(q, {"n": 9}, idempotency="t0") == EnqueueResult(first, False)
    assert fq.enqueue(q, {"n": 9}, unique_key="k").created is False

    # Finished jobs do not count: settle one and there is room again.
    fq.cancel(q, first)
    res = fq.enqueue(q, {"n": 3}, idempotency="t-new")
    assert res.created is True


def test_enqueue_many_larger_than_the_room_left_is_rejected_whole(q, settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = 5
    fq.enqueue_many(q, [{"payload": n} for n in range(3)])
    with pytest.raises(QueueFull):
        fq.enqueue_many(q, [{"payload": n, "idempotency": f"t{n}"} for n in range(3)])
    assert rows(q) == {"jobs": 3, "leases": 0, "tokens": 0}
    assert len(fq.enqueue_many(q, [{"payload": n} for n in range(2)])) == 2


def test_token_limit(q, settings, frozen):
    settings.FQ_MAX_TOKENS_PER_QUEUE = 2
    fq.configure(q, idempotency_retention_ms=1000)
    a = fq.enqueue(q, {}, idempotency="a").id
    fq.enqueue(q, {}, idempotency="b")
    before_rows, before_totals = rows(q), fq.stats(q).totals
    with pytest.raises(QueueFull) as err:
        fq.enqueue(q, {}, idempotency="c")
    assert err.value.code == "queue_full"
    assert rows(q) == before_rows
    assert fq.stats(q).totals == before_totals
    # Live tokens still answer; enqueues without a token are not limited by tokens.
    assert fq.enqueue(q, {}, idempotency="a").id == a
    assert fq.enqueue(q, {}).created is True
    # An expired token is replaced in place (no new record), even at the limit.
    frozen.advance(1000)
    again = fq.enqueue(q, {}, idempotency="a")
    assert again.created is True and again.id != a
    # Pruning expired records makes room for new tokens.
    frozen.advance(1000)
    assert fq.prune().tokens == 2
    assert fq.enqueue(q, {}, idempotency="c").created is True
    assert fq.enqueue(q, {}, idempotency="d").created is True
