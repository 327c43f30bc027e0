"""C13 — Times are instants.

``at`` accepts epoch milliseconds or an aware datetime (any zone), never a
naive one while ``USE_TZ`` is on; a job is not claimable before its instant
and is claimable from it on. The database clock keeps moving while a test
runs, so the boundary tests never depend on how fast a step is: each
assertion holds for whatever database time the claim actually ran at,
bracketed by fresh readings of the database clock.
"""

from __future__ import annotations

import calendar
import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from django_fq import db
from django_fq import services as fq
from django_fq.exceptions import InvalidTime, QueueNotFound

from .procs import set_offset_for

pytestmark = pytest.mark.django_db

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _utc(ms: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ms)


def test_c13_naive_datetime_is_rejected_with_an_error_naming_at(settings):
    assert settings.USE_TZ
    naive = dt.datetime.now() + dt.timedelta(hours=1)
    with pytest.raises(InvalidTime) as caught:
        fq.enqueue("c13-naive", {"n": 1}, at=naive)
    err = caught.value
    assert err.field == "at" and err.code == "invalid_time" and err.status == 400
    assert "at" in err.message.split() and "aware" in err.message
    with pytest.raises(QueueNotFound):  # nothing stored, not even the queue
        fq.policy("c13-naive")

    fq.enqueue("c13-naive", {"n": 0})
    before = fq.stats("c13-naive")
    with pytest.raises(InvalidTime) as caught:
        fq.enqueue_many("c13-naive", [{"payload": 1}, {"payload": 2, "at": naive}])
    assert caught.value.field == "items[1].at"
    assert fq.stats("c13-naive") == before


@pytest.mark.parametrize(
    "zone",
    [
        ZoneInfo("America/New_York"),
        ZoneInfo("Asia/Kolkata"),
        ZoneInfo("Australia/Lord_Howe"),
        dt.timezone(dt.timedelta(hours=-9, minutes=-30)),
        dt.UTC,
    ],
    ids=str,
)
def test_c13_aware_datetime_in_any_zone_is_stored_as_its_utc_instant(zone):
    queue = "c13-zones"
    instant = db.db_now_ms() + 86_400_000 + 123  # a day ahead, with milliseconds
    local = _utc(instant).astimezone(zone)
    assert local.tzinfo is zone
    job = fq.enqueue(queue, {"zone": str(zone)}, at=local).id
    info = fq.get(queue, job)
    assert info.run_at == instant
    assert info.state == "scheduled"

    same = fq.enqueue(queue, {"epoch": True}, at=instant).id  # epoch ms name the same instant
    assert fq.get(queue, same).run_at == instant


def test_c13_ambiguous_local_time_follows_fold():
    """01:30 on 2025-11-02 happened twice in New York; ``fold`` picks which instant."""
    zone = ZoneInfo("America/New_York")
    first = dt.datetime(2025, 11, 2, 1, 30, tzinfo=zone, fold=0)  # still EDT (UTC-4)
    second = dt.datetime(2025, 11, 2, 1, 30, tzinfo=zone, fold=1)  # EST (UTC-5)
    a = fq.enqueue("c13-fold", {"fold": 0}, at=first).id
    b = fq.enqueue("c13-fold", {"fold": 1}, at=second).id
    assert fq.get("c13-fold", a).run_at == calendar.timegm((2025, 11, 2, 5, 30, 0)) * 1000
    assert fq.get("c13-fold", b).run_at == calendar.timegm((2025, 11, 2, 6, 30, 0)) * 1000


def test_c13_not_claimable_one_ms_before_the_instant_claimable_at_it(clock):
    queue = "c13-edge"
    at = db.db_now_ms() + 10_000
    job = fq.enqueue(queue, {"n": 1}, at=_utc(at)).id
    assert fq.get(queue, job).run_at == at

    # Move the database clock to 1 ms before the instant and try to claim.
    set_offset_for(clock, at - 1)
    early = fq.claim(queue, visibility_ms=60_000)
    after = db.db_now_ms()
    if after <= at - 1:  # the claim certainly ran before the instant
        assert early == []
    for j in early:  # whenever it ran: a claim never hands the job out before its instant
        assert j.claimed_at >= at

    if not early:
        set_offset_for(clock, at)  # from here on the database's now is >= at
        [j] = fq.claim(queue, visibility_ms=60_000)
        assert j.id == job and j.claimed_at >= at
        assert j.claimed_at <= db.db_now_ms()


def test_c13_claim_takes_exactly_the_jobs_due_at_its_instant(clock):
    """Jobs due 1 ms apart: one claim takes exactly those with run_at <= the claim's now.

    The job due at the claim's instant is taken; the one due 1 ms later is
    not (it is 1 ms before its instant). On SQLite the claim is one
    statement, so its recorded ``claimed_at`` is the instant it compared
    with; on PostgreSQL that instant lies between a reading taken just before
    the claim and ``claimed_at``.
    """
    span = 200
    for attempt in range(10):
        queue = f"c13-ms-{attempt}"
        start = db.db_now_ms() + 10_000
        items = [{"payload": {"i": i}, "at": start + i} for i in range(span)]
        ids = [r.id for r in fq.enqueue_many(queue, items)]
        set_offset_for(clock, start + span // 2)
        before = db.db_now_ms()
        claimed = fq.claim(queue, count=1000, visibility_ms=60_000)
        taken = {j.id for j in claimed}
        due = [start + i for i, job in enumerate(ids) if job in taken]
        # Always: a prefix in run_at order, nothing taken before its instant,
        # everything due when the claim began taken.
        assert ids[: len(taken)] == [j for j in ids if j in taken]
        for j in claimed:
            assert fq.get(queue, j.id).run_at <= j.claimed_at
        assert all(j in taken for i, j in enumerate(ids) if start + i <= before)
        if not 0 < len(taken) < span:
            continue  # the claim ran outside the window (a very slow step); try again
        last_due, claimed_at = max(due), claimed[0].claimed_at
        assert before <= last_due <= claimed_at
        if connection.vendor == "sqlite":
            assert last_due == claimed_at  # taken at its very instant; the next (1 ms later) not
        unclaimed = fq.get(queue, ids[len(taken)])
        assert unclaimed.run_at == last_due + 1 and unclaimed.state in ("scheduled", "ready")
        return
    pytest.fail("no claim ran inside the 200 ms window in 10 tries")
