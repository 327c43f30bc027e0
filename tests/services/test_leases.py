"""Leases and receipts (docs/reference/semantics.md §5, §9): deadlines, ack, nack, extend, release, invalid receipts."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import (
    InvalidDelay,
    InvalidJson,
    InvalidReceipt,
    PayloadTooLarge,
    ReceiptCancelled,
    VisibilityOutOfRange,
)
from django_fq.types import SettleResult

from .helpers import claim_one, rows, snapshot

pytestmark = pytest.mark.django_db

DAY = 86_400_000

#: Every verb that presents a receipt, called with harmless arguments.
OPS = {
    "ack": lambda q, r: fq.ack(q, r, result={"ok": True}),
    "nack": lambda q, r: fq.nack(q, r, error="boom"),
    "extend": lambda q, r: fq.extend(q, r, visibility_ms=1000),
    "release": lambda q, r: fq.release(q, r),
    "progress": lambda q, r: fq.report_progress(q, r, 50, "half"),
}


def _totals(q):
    s = fq.stats(q)
    return s.totals, s.wait_ms_sum, s.wait_count, s.run_ms_sum, s.run_count


# --- the exact-deadline rule ---------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(OPS))
def test_receipt_works_one_ms_before_the_deadline(q, frozen, op):
    fq.enqueue(q, {})
    job = claim_one(q, visibility_ms=1000)
    assert job.deadline == frozen.now + 1000
    frozen.set(job.deadline - 1)
    OPS[op](q, job.receipt)
    info = fq.get(q, job.id)
    expected = {"ack": "succeeded", "nack": "scheduled", "extend": "running", "release": "ready", "progress": "running"}[op]
    assert info.state == expected


@pytest.mark.parametrize("op", sorted(OPS))
def test_receipt_fails_at_the_exact_deadline_and_changes_nothing(q, frozen, op):
    fq.enqueue(q, {})
    job = claim_one(q, visibility_ms=1000)
    frozen.set(job.deadline)
    before, totals = snapshot(q, job.id), _totals(q)
    with pytest.raises(InvalidReceipt) as err:
        OPS[op](q, job.receipt)
    assert not isinstance(err.value, ReceiptCancelled)
    assert err.value.code == "invalid_receipt"
    assert job.receipt not in str(err.value)
    assert snapshot(q, job.id) == before
    assert _totals(q) == totals


def test_claim_never_takes_a_live_lease_and_takes_it_at_the_deadline(q, frozen):
    fq.configure(q, backoff_ms=0)
    fq.enqueue(q, {})
    first = claim_one(q, visibility_ms=1000)
    frozen.set(first.deadline - 1)
    assert fq.claim(q, count=10) == []
    frozen.set(first.deadline)
    second = claim_one(q)
    assert (second.id, second.attempts) == (first.id, 2)
    with pytest.raises(InvalidReceipt):
        fq.ack(q, first.receipt)
    fq.ack(q, second.receipt)
    assert fq.get(q, first.id).state == "succeeded"


def test_extended_lease_follows_the_same_rule(q, frozen):
    fq.enqueue(q, {})
    fq.enqueue(q, {})
    a, b = fq.claim(q, count=2, visibility_ms=1000)
    frozen.advance(600)
    new_a = fq.extend(q, a.receipt, visibility_ms=1000)
    new_b = fq.extend(q, b.receipt, visibility_ms=1000)
    assert new_a == new_b == frozen.now + 1000
    frozen.set(new_a - 1)
    fq.ack(q, a.receipt)
    frozen.set(new_b)
    with pytest.raises(InvalidReceipt):
        fq.ack(q, b.receipt)


# --- ack ------------------------------------------------------------------------------------


@pytest.mark.parametrize("result", [{"sent": True, "ids": [1, 2]}, "text ✓", 0, [], None])
def test_ack_stores_the_result(q, frozen, result):
    fq.enqueue(q, {})
    job = claim_one(q)
    frozen.advance(40)
    res = fq.ack(q, job.receipt, result=result)
    assert res == SettleResult(id=job.id, state="succeeded", run_at=None, replay=False)
    info = fq.get(q, job.id)
    assert info.state == "succeeded"
    assert info.result == result
    assert info.finished_at == frozen.now
    assert info.lease_deadline is None
    assert rows(q)["leases"] == 0


def test_ack_with_a_bad_result_changes_nothing(q, settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 100
    fq.enqueue(q, {})
    job = claim_one(q)
    before = snapshot(q, job.id)
    with pytest.raises(InvalidJson):
        fq.ack(q, job.receipt, result={"x": float("nan")})
    with pytest.raises(PayloadTooLarge) as err:
        fq.ack(q, job.receipt, result="x" * 99)  # 101 bytes with the quotes
    assert err.value.field == "result"
    assert snapshot(q, job.id) == before
    fq.ack(q, job.receipt, result="x" * 98)  # exactly 100 bytes
    assert fq.get(q, job.id).result == "x" * 98


def test_ack_replay_returns_the_recorded_outcome_and_changes_nothing(q):
    fq.enqueue(q, {})
    job = claim_one(q)
    first = fq.ack(q, job.receipt, result="first")
    assert first.replay is False
    before, totals = snapshot(q, job.id), _totals(q)
    again = fq.ack(q, job.receipt, result="first")
    assert again == SettleResult(id=job.id, state="succeeded", run_at=None, replay=True)
    assert snapshot(q, job.id) == before
    # An ack with another result is not the same settle: at most a replay, never a change.
    try:
        other = fq.ack(q, job.receipt, result="second")
    except InvalidReceipt:
        pass
    else:
        assert other.replay is True
    assert snapshot(q, job.id) == before
    assert fq.get(q, job.id).result == "first"
    assert _totals(q) == totals
    assert fq.stats(q).totals["acked"] == 1
    # Any other use of the settled receipt is invalid.
    for op in ("nack", "extend", "release"):
        with pytest.raises(InvalidReceipt):
            OPS[op](q, job.receipt)
    assert snapshot(q, job.id) == before


def test_nack_replay(q, frozen):
    fq.enqueue(q, {})
    job = claim_one(q)
    first = fq.nack(q, job.receipt, error="e1")
    before, totals = snapshot(q, job.id), _totals(q)
    frozen.advance(10)
    again = fq.nack(q, job.receipt, error="e1")
    assert again.replay is True
    assert (again.id, again.state, again.run_at) == (first.id, first.state, first.run_at)
    assert snapshot(q, job.id) == before
    assert _totals(q) == totals
    with pytest.raises(InvalidReceipt):
        fq.ack(q, job.receipt)
    with pytest.raises(InvalidReceipt):
        fq.release(q, job.receipt)


def test_release_replay(q):
    fq.enqueue(q, {})
    job = claim_one(q)
    first = fq.release(q, job.receipt)
    before = snapshot(q, job.id)
    again = fq.release(q, job.receipt)
    assert again.replay is True and (again.state, again.run_at) == (first.state, first.run_at)
    assert snapshot(q, job.id) == before
    assert fq.stats(q).totals["released"] == 1
    with pytest.raises(InvalidReceipt):
        fq.ack(q, job.receipt)


# --- nack -------------------------------------------------------------------------------------


def test_nack_default_backoff_sequence_and_cap(q, frozen):
    fq.configure(q, backoff_ms=1000, max_backoff_ms=5000, max_attempts=10)
    fq.enqueue(q, {})
    for attempt, delay in enumerate([1000, 2000, 4000, 5000, 5000, 5000], start=1):
        job = claim_one(q)
        assert job.attempts == attempt
        nacked_at = frozen.now
        res = fq.nack(q, job.receipt, error=f"failure {attempt}")
        assert res == SettleResult(id=job.id, state="scheduled", run_at=nacked_at + delay, replay=False)
        info = fq.get(q, job.id)
        assert (info.state, info.run_at, info.attempts) == ("scheduled", nacked_at + delay, attempt)
        assert info.last_error == f"failure {attempt}"
        assert info.errors[-1]["kind"] == "nack"
        assert info.errors[-1]["attempt"] == attempt
        assert info.errors[-1]["error"] == f"failure {attempt}"
        frozen.set(res.run_at - 1)
        assert fq.claim(q) == []
        frozen.set(res.run_at)
    assert len(fq.get(q, job.id).errors) == 6
    assert fq.stats(q).totals["nacked"] == 6


def test_backoff_counts_from_the_nack(q, frozen):
    fq.configure(q, backoff_ms=1000)
    fq.enqueue(q, {})
    job = claim_one(q, visibility_ms=60_000)
    frozen.advance(30_000)
    assert fq.nack(q, job.receipt).run_at == frozen.now + 1000


def test_zero_backoff_makes_the_job_ready_at_once(q, frozen):
    fq.configure(q, backoff_ms=0, max_backoff_ms=0)
    fq.enqueue(q, {})
    res = fq.nack(q, claim_one(q).receipt)
    assert (res.state, res.run_at) == ("ready", frozen.now)
    assert claim_one(q).attempts == 2


def test_backoff_exponent_is_clamped(q, frozen):
    fq.configure(q, backoff_ms=1, max_backoff_ms=30 * DAY, max_attempts=1000)
    fq.enqueue(q, {})
    for _ in range(69):
        fq.nack(q, claim_one(q).receipt, delay_ms=0)
    job = claim_one(q)
    assert job.attempts == 70
    res = fq.nack(q, job.receipt)  # 1 * 2**69 would not fit in 64 bits
    assert res.run_at == frozen.now + 30 * DAY
    assert fq.get(q, job.id).run_at == frozen.now + 30 * DAY


def test_nack_delay_overrides_the_backoff(q, frozen):
    fq.configure(q, backoff_ms=1000)
    fq.enqueue_many(q, [{"payload": n} for n in range(3)])
    a, b, c = fq.claim(q, count=3)
    assert fq.nack(q, a.receipt, delay_ms=0) == SettleResult(a.id, "ready", frozen.now, False)
    assert fq.nack(q, b.receipt, delay_ms=12_345).run_at == frozen.now + 12_345
    assert fq.nack(q, c.receipt, delay_ms=30 * DAY).run_at == frozen.now + 30 * DAY
    assert fq.get(q, a.id).state == "ready"
    assert fq.get(q, c.id).state == "scheduled"


@pytest.mark.parametrize("delay", [-1, 30 * DAY + 1, 1.5, "100", True])
def test_nack_delay_bounds(q, delay):
    fq.enqueue(q, {})
    job = claim_one(q)
    before = snapshot(q, job.id)
    with pytest.raises(InvalidDelay) as err:
        fq.nack(q, job.receipt, delay_ms=delay)
    assert err.value.field == "delay_ms"
    assert snapshot(q, job.id) == before
    fq.ack(q, job.receipt)  # the receipt still works


def test_dead_after_max_attempts_and_dead_wins_over_delay(q):
    fq.configure(q, max_attempts=3)
    job_id = fq.enqueue(q, {}).id
    for _ in range(2):
        assert fq.nack(q, claim_one(q).receipt, delay_ms=0).state == "ready"
    last = claim_one(q)
    assert last.attempts == 3
    res = fq.nack(q, last.receipt, delay_ms=60_000, error="final")
    assert res == SettleResult(id=job_id, state="dead", run_at=None, replay=False)
    info = fq.get(q, job_id)
    assert (info.state, info.attempts, info.last_error) == ("dead", 3, "final")
    assert [e["attempt"] for e in info.errors] == [1, 2, 3]
    assert fq.claim(q) == []
    stats = fq.stats(q)
    assert stats.counts["dead"] == 1
    assert stats.totals["dead"] == 1 and stats.totals["nacked"] == 3


def test_single_attempt_job_dies_on_its_first_nack(q):
    job_id = fq.enqueue(q, {}, max_attempts=1).id
    assert fq.nack(q, claim_one(q).receipt, error="x").state == "dead"
    assert fq.get(q, job_id).attempts == 1


def test_permanent_nack_is_dead_at_once(q):
    job_id = fq.enqueue(q, {}).id
    res = fq.nack(q, claim_one(q).receipt, error="bad input", permanent=True)
    assert res.state == "dead"
    info = fq.get(q, job_id)
    assert (info.state, info.attempts, info.max_attempts) == ("dead", 1, 25)


def test_error_text_is_capped_at_64_kib(q):
    fq.enqueue(q, {})
    fq.nack(q, claim_one(q).receipt, error="é" * 100_000, delay_ms=0)
    info = fq.get(q, claim_one(q).id)
    assert len(info.last_error.encode("utf-8")) <= 64 * 1024
    assert len(info.errors[0]["error"].encode("utf-8")) <= 64 * 1024
    assert info.last_error.startswith("é" * 1000)


def test_error_history_keeps_the_last_100_entries(q):
    fq.configure(q, max_attempts=1000)
    job_id = fq.enqueue(q, {}).id
    for n in range(105):
        fq.nack(q, claim_one(q).receipt, delay_ms=0, error=f"e{n}")
    errors = fq.get(q, job_id).errors
    assert len(errors) == 100
    assert errors[0]["error"] == "e5" and errors[-1]["error"] == "e104"


# --- extend ---------------------------------------------------------------------------------


def test_extend_returns_db_now_plus_visibility(q, frozen):
    fq.enqueue(q, {})
    job = claim_one(q, visibility_ms=1000)
    frozen.advance(700)
    deadline = fq.extend(q, job.receipt, visibility_ms=5000)
    assert deadline == frozen.now + 5000
    assert fq.get(q, job.id).lease_deadline == deadline
    frozen.set(job.deadline + 1000)  # past the original deadline: still ours
    assert fq.claim(q) == []
    fq.ack(q, job.receipt)


def test_extend_can_shorten_the_lease(q, frozen):
    fq.enqueue(q, {})
    job = claim_one(q, visibility_ms=60_000)
    assert fq.extend(q, job.receipt, visibility_ms=1) == frozen.now + 1
    frozen.advance(1)
    with pytest.raises(InvalidReceipt):
        fq.ack(q, job.receipt)


@pytest.mark.parametrize("vis", [0, DAY + 1, -1, 2.5, None])
def test_extend_bounds_rejected(q, vis):
    fq.enqueue(q, {})
    job = claim_one(q)
    before = snapshot(q, job.id)
    with pytest.raises(VisibilityOutOfRange):
        fq.extend(q, job.receipt, visibility_ms=vis)
    assert snapshot(q, job.id) == before


@pytest.mark.parametrize("vis", [1, DAY])
def test_extend_bounds_accepted(q, frozen, vis):
    fq.enqueue(q, {})
    job = claim_one(q)
    assert fq.extend(q, job.receipt, visibility_ms=vis) == frozen.now + vis


def test_extend_is_capped_by_the_jobs_timeout(q, frozen):
    fq.enqueue(q, "a", timeout_ms=5000)
    fq.enqueue(q, "b", timeout_ms=5000)
    claimed_at = frozen.now
    a = claim_one(q, visibility_ms=1000)
    assert a.deadline == claimed_at + 1000
    b = claim_one(q, visibility_ms=60_000)  # the claim itself is capped too
    assert b.deadline == claimed_at + 5000
    frozen.advance(800)
    assert fq.extend(q, a.receipt, visibility_ms=60_000) == claimed_at + 5000
    assert fq.get(q, a.id).lease_deadline == claimed_at + 5000


def test_extend_counts_nothing(q):
    fq.enqueue(q, {})
    job = claim_one(q)
    totals = _totals(q)
    fq.extend(q, job.receipt, visibility_ms=1000)
    assert _totals(q) == totals
    assert fq.get(q, job.id).attempts == 1


# --- release --------------------------------------------------------------------------------


def test_release_gives_the_attempt_back_and_makes_the_job_ready_now(q, frozen):
    fq.configure(q, backoff_ms=60_000)
    fq.enqueue(q, "first")
    fq.enqueue(q, "second")
    job = claim_one(q, visibility_ms=60_000)
    assert job.attempts == 1
    frozen.advance(100)
    res = fq.release(q, job.receipt, error="shutdown")
    assert res == SettleResult(id=job.id, state="ready", run_at=frozen.now, replay=False)
    info = fq.get(q, job.id)
    assert (info.state, info.attempts, info.run_at, info.lease_deadline) == ("ready", 0, frozen.now, None)
    assert info.last_error == "shutdown"
    assert info.errors[-1]["kind"] == "release" and info.errors[-1]["error"] == "shutdown"
    stats = fq.stats(q)
    assert stats.totals["released"] == 1
    assert stats.totals["nacked"] == 0 and stats.totals["dead"] == 0
    again = claim_one(q)  # keeps its place in line, and the next claim is attempt 1 again
    assert (again.id, again.attempts) == (job.id, 1)


def test_release_never_kills_a_job_on_its_last_attempt(q):
    job_id = fq.enqueue(q, {}, max_attempts=1).id
    for _ in range(3):
        assert fq.release(q, claim_one(q).receipt).state == "ready"
    assert fq.get(q, job_id).attempts == 0
    assert fq.nack(q, claim_one(q).receipt).state == "dead"


# --- invalid receipts -----------------------------------------------------------------------


def _parts(receipt):
    prefix, job_id, generation, secret = receipt.split(".")
    return prefix, job_id, int(generation), secret


def _bad_receipts(receipt):
    prefix, job_id, generation, secret = _parts(receipt)
    other_secret = ("B" if secret[0] != "B" else "C") + secret[1:]
    return {
        "forged": f"{prefix}.{job_id}.{generation}.{'A' * 43}",
        "one char changed": f"{prefix}.{job_id}.{generation}.{other_secret}",
        "next generation": f"{prefix}.{job_id}.{generation + 1}.{secret}",
        "truncated": receipt[:-1],
        "half": receipt[: len(receipt) // 2],
        "extended": receipt + "A",
        "empty": "",
        "garbage": "not a receipt",
        "wrong prefix": "fq2" + receipt[3:],
        "other job": f"{prefix}.{'0' * 32}.{generation}.{secret}",
        "huge": receipt * 100,
        "none": None,
        "int": 12345,
    }


@pytest.mark.parametrize("op", sorted(OPS))
def test_forged_malformed_and_truncated_receipts_change_nothing(q, op):
    fq.enqueue(q, {"x": 1})
    job = claim_one(q)
    before, totals = snapshot(q, job.id), _totals(q)
    for name, bad in _bad_receipts(job.receipt).items():
        with pytest.raises(InvalidReceipt) as err:
            OPS[op](q, bad)
        assert type(err.value) is InvalidReceipt, name
        assert job.receipt not in str(err.value)
        assert snapshot(q, job.id) == before, name
        assert _totals(q) == totals, name
    fq.ack(q, job.receipt)  # the real receipt still works


@pytest.mark.parametrize("op", sorted(OPS))
def test_receipt_of_another_queue_is_invalid(q, op):
    fq.enqueue(q, "mine")
    fq.enqueue("other", "theirs")
    mine = claim_one(q)
    theirs = claim_one("other")
    before_mine, before_theirs = snapshot(q, mine.id), snapshot("other", theirs.id)
    with pytest.raises(InvalidReceipt):
        OPS[op](q, theirs.receipt)
    with pytest.raises(InvalidReceipt):
        OPS[op]("other", mine.receipt)
    assert snapshot(q, mine.id) == before_mine
    assert snapshot("other", theirs.id) == before_theirs
    fq.ack(q, mine.receipt)
    fq.ack("other", theirs.receipt)


@pytest.mark.parametrize("op", sorted(OPS))
def test_older_generation_receipt_is_invalid(q, frozen, op):
    fq.configure(q, backoff_ms=0)
    fq.enqueue(q, {})
    old = claim_one(q, visibility_ms=1000)
    frozen.set(old.deadline)
    assert fq.reap(q).expired == 1
    new = claim_one(q, visibility_ms=60_000)
    assert new.id == old.id and new.attempts == 2
    assert _parts(new.receipt)[2] > _parts(old.receipt)[2]
    before, totals = snapshot(q, new.id), _totals(q)
    with pytest.raises(InvalidReceipt) as err:
        OPS[op](q, old.receipt)
    assert type(err.value) is InvalidReceipt
    assert snapshot(q, new.id) == before
    assert _totals(q) == totals
    fq.ack(q, new.receipt)
    assert fq.get(q, new.id).state == "succeeded"


def test_receipt_of_a_job_released_and_claimed_again_is_invalid(q):
    fq.enqueue(q, {})
    old = claim_one(q)
    first = fq.release(q, old.receipt)
    new = claim_one(q)
    before, totals = snapshot(q, new.id), _totals(q)
    for op in ("ack", "nack", "extend"):
        with pytest.raises(InvalidReceipt):
            OPS[op](q, old.receipt)
    # Repeating the very release it made may be answered as a replay, but never acts.
    try:
        again = fq.release(q, old.receipt)
    except InvalidReceipt:
        pass
    else:
        assert again.replay is True and again.run_at == first.run_at
    assert snapshot(q, new.id) == before
    assert _totals(q) == totals
    fq.ack(q, new.receipt)


@pytest.mark.parametrize("op", sorted(OPS))
def test_receipt_of_a_cancelled_running_job_raises_cancelled(q, op):
    fq.enqueue(q, {})
    job = claim_one(q)
    fq.cancel(q, job.id)
    before, totals = snapshot(q, job.id), _totals(q)
    with pytest.raises(ReceiptCancelled) as err:
        OPS[op](q, job.receipt)
    assert isinstance(err.value, InvalidReceipt)
    assert err.value.code == "cancelled"
    assert err.value.status == 409
    assert snapshot(q, job.id) == before
    assert before["state"] == "cancelled"
    assert _totals(q) == totals


def test_claimed_job_repr_hides_the_receipt(q):
    fq.enqueue(q, {})
    job = claim_one(q)
    assert job.receipt not in repr(job)
    assert "fq1." not in repr(job)
