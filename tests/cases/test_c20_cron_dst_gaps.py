"""C20 — wildcard cron entries across a spring-forward gap (docs/periodic.md, "Time and time zones").

The rule, for fixed-time and wildcard entries alike: a tick whose wall time
does not exist (clocks went forward) fires once, at the first instant after
the gap; several skipped ticks of one entry, and a tick that exists at that
instant anyway, are one tick. When clocks go back, a fixed-time entry fires
once and a wildcard entry follows real time (both passes).

Pure tick arithmetic: no database.
"""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from django_fq import scheduler


def entry(cron: str, zone: str) -> scheduler.Entry:
    return scheduler.parse_entry("c20", {"cron": cron, "queue": "c20", "timezone": zone})


def at(zone: str, wall: str, fold: int = 0) -> int:
    return round(dt.datetime.fromisoformat(wall).replace(tzinfo=ZoneInfo(zone), fold=fold).timestamp() * 1000)


def walls(zone: str, ticks: list[int]) -> list[str]:
    """Each tick as local ``HH:MM+HHMM`` (the offset tells the two passes of a repeated hour apart)."""
    return [dt.datetime.fromtimestamp(t / 1000, ZoneInfo(zone)).strftime("%H:%M%z") for t in ticks]


PARIS, LORD_HOWE, SANTIAGO = "Europe/Paris", "Australia/Lord_Howe", "America/Santiago"

CASES = [
    # Paris, 2025-03-30: 02:00 -> 03:00 (one hour skipped).
    (PARIS, "* * * * *", "2025-03-30T01:58", "2025-03-30T03:02", ["01:59+0100", "03:00+0200", "03:01+0200", "03:02+0200"]),
    (PARIS, "30 * * * *", "2025-03-30T01:00", "2025-03-30T04:00", ["01:30+0100", "03:00+0200", "03:30+0200"]),
    (PARIS, "0 * * * *", "2025-03-30T00:30", "2025-03-30T04:00", ["01:00+0100", "03:00+0200", "04:00+0200"]),
    (PARIS, "30 2 * * *", "2025-03-30T00:00", "2025-03-30T23:59", ["03:00+0200"]),
    # A whole hour of wall times on one date a year, all in this year's gap: one tick, at 03:00.
    (PARIS, "* 2 30 3 *", "2025-01-01T00:00", "2025-12-31T00:00", ["03:00+0200"]),
    # Lord Howe Island, 2025-10-05: 02:00 -> 02:30 (half an hour skipped).
    (LORD_HOWE, "* * * * *", "2025-10-05T01:58", "2025-10-05T02:32", ["01:59+1030", "02:30+1100", "02:31+1100", "02:32+1100"]),
    (LORD_HOWE, "30 * * * *", "2025-10-05T01:00", "2025-10-05T04:00", ["01:30+1030", "02:30+1100", "03:30+1100"]),
    (LORD_HOWE, "0 * * * *", "2025-10-05T00:30", "2025-10-05T04:00", ["01:00+1030", "02:30+1100", "03:00+1100", "04:00+1100"]),
    (LORD_HOWE, "30 2 * * *", "2025-10-05T00:00", "2025-10-05T23:59", ["02:30+1100"]),
    (LORD_HOWE, "15 2 * * *", "2025-10-05T00:00", "2025-10-05T23:59", ["02:30+1100"]),
    # Santiago, 2025-09-07: 00:00 -> 01:00 (the shift at midnight skips the start of the day).
    (SANTIAGO, "* * * * *", "2025-09-06T23:58", "2025-09-07T01:02", ["23:59-0400", "01:00-0300", "01:01-0300", "01:02-0300"]),
    (SANTIAGO, "30 * * * *", "2025-09-06T23:00", "2025-09-07T02:00", ["23:30-0400", "01:00-0300", "01:30-0300"]),
    (SANTIAGO, "0 * * * *", "2025-09-06T22:30", "2025-09-07T02:00", ["23:00-0400", "01:00-0300", "02:00-0300"]),
    (SANTIAGO, "30 2 * * *", "2025-09-07T00:30", "2025-09-07T23:59", ["02:30-0300"]),
    (SANTIAGO, "30 0 * * *", "2025-09-06T12:00", "2025-09-07T23:59", ["01:00-0300"]),
    # Paris, 2025-10-26: 03:00 -> 02:00 (02:00-02:59 twice): wildcards both passes, fixed times once.
    (PARIS, "0 * * * *", "2025-10-26T00:30", "2025-10-26T04:00",
     ["01:00+0200", "02:00+0200", "02:00+0100", "03:00+0100", "04:00+0100"]),
    (PARIS, "30 * * * *", "2025-10-26T01:00", "2025-10-26T03:45",
     ["01:30+0200", "02:30+0200", "02:30+0100", "03:30+0100"]),
    (PARIS, "30 2 * * *", "2025-10-26T00:00", "2025-10-26T23:59", ["02:30+0200"]),
]


@pytest.mark.parametrize("zone, cron, after, until, expected", CASES, ids=[f"{c[0]}|{c[1]}|{c[2][:10]}" for c in CASES])
def test_c20_every_entry_fires_by_the_documented_dst_rule(zone, cron, after, until, expected):
    e = entry(cron, zone)
    ticks = scheduler.ticks_between(e, at(zone, after), at(zone, until))
    assert walls(zone, ticks) == expected
    # The backward walk (what due_ticks uses) finds the very same ticks, one by one.
    for tick in ticks:
        assert scheduler._walk(e, tick + 1, 1, backward=True) == [tick]
        assert tick in scheduler.due_ticks(e, tick)


def test_c20_a_wildcard_minute_entry_fires_every_real_minute_through_the_autumn_hour():
    zone = PARIS
    ticks = scheduler.ticks_between(entry("* * * * *", zone), at(zone, "2025-10-26T01:59"), at(zone, "2025-10-26T03:00"))
    assert len(ticks) == 121  # 02:00-02:59 twice, and 03:00
    assert all(b - a == 60_000 for a, b in itertools.pairwise(ticks))


def test_c20_the_gap_tick_is_enqueued_once_whatever_the_catch_up():
    """Ticks skipped by the gap collapse into one instant: with catch_up 5 it is still one tick."""
    zone = PARIS
    e = scheduler.parse_entry("c20", {"cron": "*/10 * * * *", "queue": "c20", "timezone": zone, "catch_up": 5})
    gap_end = at(zone, "2025-03-30T03:00")
    due = scheduler.due_ticks(e, gap_end)
    assert walls(zone, due) == ["01:20+0100", "01:30+0100", "01:40+0100", "01:50+0100", "03:00+0200"]
