"""Periodic jobs (``django_fq.scheduler``): cron ticks enqueued exactly once.

"Now" is the database clock throughout: the tests move it to fixed instants
(some in the past, around the 2025 DST changes of Europe/Paris) with the
``clock`` fixture, which shifts it inside the SQL expression. Python's own
clock is never consulted, so a tick found in a job proves the scheduler read
the database clock.
"""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core import checks
from django.db import connection, connections

from django_fq import db as fqdb
from django_fq import scheduler
from django_fq import services as fq
from django_fq.models import IdempotencyToken, Job

ROOT = Path(__file__).resolve().parent.parent
PARIS = ZoneInfo("Europe/Paris")
UTC = dt.UTC
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR

SCHEDULE_IDS = {"django_fq.E010", "django_fq.E011", "django_fq.E012", "django_fq.E013", "django_fq.E014"}


def ms(y, mo, d, h=0, mi=0, s=0, tz=UTC, fold=0) -> int:
    """Epoch milliseconds of a wall-clock time in ``tz``."""
    return int(dt.datetime(y, mo, d, h, mi, s, tzinfo=tz, fold=fold).timestamp() * 1000)


def iso(tick_ms: int, tz=PARIS) -> str:
    return dt.datetime.fromtimestamp(tick_ms / 1000, tz).isoformat()


def travel(clock, instant_ms: int) -> None:
    """Move the database clock so that it reads ``instant_ms`` now."""
    clock.advance(instant_ms - fqdb.db_now_ms())


def entry(name="e", **raw) -> scheduler.Entry:
    raw.setdefault("queue", "cron.q")
    return scheduler.parse_entry(name, raw)


def jobs(queue: str) -> list[dict]:
    """Payloads of the queue's jobs in enqueue order."""
    rows = Job.objects.filter(queue__name=queue).order_by("seq").values_list("payload", flat=True)
    return [json.loads(p) for p in rows]


def ticks(queue: str) -> list[int]:
    return [p["tick"] for p in jobs(queue)]


# --- tick arithmetic: time zones and DST (no database) -------------------------------------------


def test_daily_0230_paris_on_spring_forward_day_runs_once_at_0300():
    """02:30 does not exist on 2025-03-30 in Paris: that day's tick is the first instant after the gap."""
    e = entry(cron="30 2 * * *", timezone="Europe/Paris")
    got = scheduler.ticks_between(e, ms(2025, 3, 28, 12, tz=PARIS), ms(2025, 4, 1, 12, tz=PARIS))
    assert [iso(t) for t in got] == [
        "2025-03-29T02:30:00+01:00",
        "2025-03-30T03:00:00+02:00",
        "2025-03-31T02:30:00+02:00",
        "2025-04-01T02:30:00+02:00",
    ]
    # One tick per calendar day: the gap neither drops nor doubles the job.
    assert got[1] - got[0] == 23 * HOUR + 30 * MINUTE
    assert got[2] - got[1] == 23 * HOUR + 30 * MINUTE


def test_daily_0230_paris_on_fall_back_day_runs_once():
    """02:30 happens twice on 2025-10-26 in Paris; a fixed-time entry runs at the first one only."""
    e = entry(cron="30 2 * * *", timezone="Europe/Paris")
    got = scheduler.ticks_between(e, ms(2025, 10, 24, 12, tz=PARIS), ms(2025, 10, 28, 12, tz=PARIS))
    assert [iso(t) for t in got] == [
        "2025-10-25T02:30:00+02:00",
        "2025-10-26T02:30:00+02:00",
        "2025-10-27T02:30:00+01:00",
        "2025-10-28T02:30:00+01:00",
    ]
    assert got[2] - got[1] == 25 * HOUR


def test_wildcard_entry_follows_real_time_through_fall_back():
    """A */30 entry keeps running every 30 real minutes through the repeated hour (both passes)."""
    e = entry(cron="*/30 * * * *", timezone="Europe/Paris")
    start = ms(2025, 10, 26, 1, 0, tz=PARIS)  # 01:00 CEST = 23:00Z
    end = ms(2025, 10, 26, 4, 0, tz=PARIS)  # 04:00 CET = 03:00Z: four real hours later
    got = scheduler.ticks_between(e, start, end)
    assert end - start == 4 * HOUR
    assert len(got) == 8
    assert all(b - a == 30 * MINUTE for a, b in itertools.pairwise([start, *got]))
    assert [iso(t) for t in got].count("2025-10-26T02:30:00+02:00") == 1
    assert [iso(t) for t in got].count("2025-10-26T02:30:00+01:00") == 1


def test_wildcard_entry_follows_real_time_through_spring_forward():
    e = entry(cron="*/30 * * * *", timezone="Europe/Paris")
    start = ms(2025, 3, 30, 1, 0, tz=PARIS)  # 01:00 CET
    end = ms(2025, 3, 30, 4, 0, tz=PARIS)  # 04:00 CEST: two real hours later
    got = scheduler.ticks_between(e, start, end)
    assert [iso(t) for t in got] == [
        "2025-03-30T01:30:00+01:00",
        "2025-03-30T03:00:00+02:00",
        "2025-03-30T03:30:00+02:00",
        "2025-03-30T04:00:00+02:00",
    ]


def test_time_zone_defaults_to_settings_time_zone(settings):
    settings.TIME_ZONE = "America/New_York"
    e = entry(cron="0 9 * * *")
    assert e.timezone == "America/New_York"
    (tick,) = scheduler.ticks_between(e, ms(2025, 7, 1, 12), ms(2025, 7, 2, 12))
    assert tick == ms(2025, 7, 1, 9, tz=ZoneInfo("America/New_York")) == ms(2025, 7, 1, 13)


def test_shorthands_are_spelled_out():
    assert entry(cron="@daily").cron == "0 0 * * *"
    assert entry(cron="@hourly").cron == "0 * * * *"
    e = entry(cron=" @weekly ", timezone="UTC")
    assert scheduler.ticks_between(e, ms(2025, 1, 1), ms(2025, 1, 15)) == [ms(2025, 1, 5), ms(2025, 1, 12)]


def test_due_ticks_include_a_tick_at_exactly_now():
    e = entry(cron="*/5 * * * *", timezone="UTC")
    tick = ms(2025, 5, 5, 10, 5)
    assert scheduler.due_ticks(e, tick) == [tick]
    assert scheduler.due_ticks(e, tick - 1) == [tick - 5 * MINUTE]
    assert scheduler.due_ticks(entry(cron="*/5 * * * *", timezone="UTC", catch_up=3), tick) == [
        tick - 10 * MINUTE,
        tick - 5 * MINUTE,
        tick,
    ]


# --- run_due against the database -------------------------------------------------------------


@pytest.mark.django_db
def test_tick_enqueued_once_however_often_run_due_is_called(settings, clock):
    settings.FQ_SCHEDULE = {"every5": {"overlap": "allow", "cron": "*/5 * * * *", "queue": "cron.a", "timezone": "UTC"}}
    travel(clock, ms(2025, 5, 5, 10, 2, 30))

    assert scheduler.run_due() == 1
    for _ in range(5):
        assert scheduler.run_due() == 0
    assert ticks("cron.a") == [ms(2025, 5, 5, 10, 0)]

    clock.advance(5 * MINUTE)  # 10:07:30
    assert scheduler.run_due() == 1
    assert scheduler.run_due() == 0
    assert ticks("cron.a") == [ms(2025, 5, 5, 10, 0), ms(2025, 5, 5, 10, 5)]
    # Nothing was deduplicated by a write: ticks already enqueued are skipped by a read.
    assert fq.stats("cron.a").totals["deduplicated"] == 0


@pytest.mark.django_db
def test_now_comes_from_the_database_clock(settings, clock):
    """The DB clock is moved to 2024 (Python's clock is elsewhere): the tick follows the DB clock."""
    settings.FQ_SCHEDULE = {"midnight": {"overlap": "allow", "cron": "@daily", "queue": "cron.db", "timezone": "UTC"}}
    travel(clock, ms(2024, 2, 29, 0, 0, 40))
    assert scheduler.run_due() == 1
    assert ticks("cron.db") == [ms(2024, 2, 29)]
    assert scheduler.next_run_ms() == ms(2024, 3, 1)


@pytest.mark.django_db
def test_job_payload_envelope_and_options(settings, clock):
    settings.FQ_SCHEDULE = {
        "report": {
            "cron": "30 2 * * *",
            "queue": "cron.reports",
            "timezone": "Europe/Paris",
            "payload": {"kind": "daily", "n": [1, 2]},
            "priority": 7,
            "max_attempts": 3,
            "timeout_ms": 60_000,
        }
    }
    travel(clock, ms(2025, 6, 1, 2, 31, tz=PARIS))
    assert scheduler.run_due() == 1
    (row,) = Job.objects.filter(queue__name="cron.reports")
    job = fq.get("cron.reports", row.uid)
    tick = ms(2025, 6, 1, 2, 30, tz=PARIS)
    assert job.payload == {
        "schedule": "report",
        "tick": tick,
        "tick_iso": "2025-06-01T02:30:00+02:00",
        "payload": {"kind": "daily", "n": [1, 2]},
    }
    assert (job.priority, job.max_attempts, row.timeout_ms) == (7, 3, 60_000)
    assert row.idempotency == f"cron:report:{tick}"
    assert job.state == "ready"  # runs now, not at the (past) tick time


@pytest.mark.django_db
def test_token_retention_covers_the_due_window(settings, clock):
    settings.FQ_SCHEDULE = {
        "every5": {"overlap": "allow", "cron": "*/5 * * * *", "queue": "cron.ret", "timezone": "UTC"}
    }
    travel(clock, ms(2025, 5, 5, 10, 0, 1))
    assert scheduler.run_due() == 1
    token = IdempotencyToken.objects.get(queue__name="cron.ret")
    assert token.token == f"cron:every5:{ms(2025, 5, 5, 10, 0)}"
    # The longest window (catch_up 100: 100 ticks of 5 min) plus one hour of margin.
    assert token.expires_at - token.created_at == 100 * 5 * MINUTE + HOUR


@pytest.mark.django_db
def test_missed_ticks_only_the_latest_runs_by_default(settings, clock):
    settings.FQ_SCHEDULE = {
        "every5": {"overlap": "allow", "cron": "*/5 * * * *", "queue": "cron.miss", "timezone": "UTC"}
    }
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 1

    clock.advance(32 * MINUTE)  # down from 10:00:10 to 10:32:10: ticks 10:05 … 10:30 were missed
    assert scheduler.run_due() == 1
    assert scheduler.run_due() == 0
    assert ticks("cron.miss") == [ms(2025, 5, 5, 10, 0), ms(2025, 5, 5, 10, 30)]


@pytest.mark.django_db
def test_missed_ticks_catch_up_enqueues_the_n_most_recent_in_order(settings, clock):
    settings.FQ_SCHEDULE = {
        "every5": {"overlap": "allow", "cron": "*/5 * * * *", "queue": "cron.catch", "timezone": "UTC", "catch_up": 3}
    }
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 3  # the schedule is new: the 3 most recent ticks
    assert ticks("cron.catch") == [ms(2025, 5, 5, 9, 50), ms(2025, 5, 5, 9, 55), ms(2025, 5, 5, 10, 0)]

    clock.advance(5 * MINUTE)  # regular operation: only the new tick
    assert scheduler.run_due() == 1

    clock.advance(27 * MINUTE)  # 10:32:10 — missed 10:10 … 10:30
    assert scheduler.run_due() == 3
    assert scheduler.run_due() == 0
    assert ticks("cron.catch")[-3:] == [ms(2025, 5, 5, 10, 20), ms(2025, 5, 5, 10, 25), ms(2025, 5, 5, 10, 30)]
    assert len(ticks("cron.catch")) == len(set(ticks("cron.catch"))) == 7


@pytest.mark.django_db
def test_grace_ms_drops_a_tick_that_is_too_late(settings, clock):
    settings.FQ_SCHEDULE = {
        "late": {"overlap": "allow", "cron": "0 6 * * *", "queue": "cron.grace", "timezone": "UTC", "grace_ms": HOUR},
        "lenient": {"overlap": "allow", "cron": "0 6 * * *", "queue": "cron.grace2", "timezone": "UTC"},
    }
    travel(clock, ms(2025, 5, 5, 9))  # three hours after the 06:00 tick
    assert scheduler.run_due() == 1
    assert ticks("cron.grace") == []
    assert ticks("cron.grace2") == [ms(2025, 5, 5, 6)]

    travel(clock, ms(2025, 5, 6, 6, 30))  # within the hour of grace
    assert scheduler.run_due() == 2
    assert ticks("cron.grace") == [ms(2025, 5, 6, 6)]


@pytest.mark.django_db
def test_tick_is_never_enqueued_again_after_its_token_expires(settings, clock):
    """A yearly tick: due for 30 days − 1 h, token kept 30 days from enqueue — no second job."""
    settings.FQ_SCHEDULE = {"yearly": {"overlap": "allow", "cron": "@yearly", "queue": "cron.year", "timezone": "UTC"}}
    travel(clock, ms(2025, 1, 1, 0, 0, 30))
    assert scheduler.run_due() == 1

    travel(clock, ms(2025, 1, 30, 22))  # still within its lateness window: the token dedups
    assert scheduler.run_due() == 0
    travel(clock, ms(2025, 1, 31, 2))  # token expired (kept 30 days: to 31 Jan 00:00:30), tick no longer due
    assert not IdempotencyToken.objects.filter(queue__name="cron.year", expires_at__gt=fqdb.db_now_ms()).exists()
    assert scheduler.run_due() == 0
    travel(clock, ms(2025, 6, 1))
    assert scheduler.run_due() == 0
    assert ticks("cron.year") == [ms(2025, 1, 1)]


@pytest.mark.django_db
def test_tick_older_than_thirty_days_is_dropped(settings, clock):
    settings.FQ_SCHEDULE = {
        "monthly": {"overlap": "allow", "cron": "0 0 1 * *", "queue": "cron.month", "timezone": "UTC"}
    }
    travel(clock, ms(2025, 8, 31, 12))  # 30.5 days after 1 August: too late
    assert scheduler.run_due() == 0
    travel(clock, ms(2025, 9, 1, 0, 0, 5))
    assert scheduler.run_due() == 1
    assert ticks("cron.month") == [ms(2025, 9, 1)]


@pytest.mark.django_db
def test_dst_spring_forward_daily_0230_paris_runs_once_at_0300(settings, clock):
    settings.FQ_SCHEDULE = {
        "night": {"overlap": "allow", "cron": "30 2 * * *", "queue": "cron.dst", "timezone": "Europe/Paris"}
    }
    travel(clock, ms(2025, 3, 30, 1, 59, tz=PARIS))
    assert scheduler.run_due() == 1  # the previous night's tick (new schedule)
    assert [p["tick_iso"] for p in jobs("cron.dst")] == ["2025-03-29T02:30:00+01:00"]

    travel(clock, ms(2025, 3, 30, 3, 0, 5, tz=PARIS))  # five seconds after the jump 02:00 → 03:00
    assert scheduler.run_due() == 1
    travel(clock, ms(2025, 3, 30, 3, 45, tz=PARIS))
    assert scheduler.run_due() == 0
    travel(clock, ms(2025, 3, 31, 2, 30, 1, tz=PARIS))
    assert scheduler.run_due() == 1
    assert [p["tick_iso"] for p in jobs("cron.dst")] == [
        "2025-03-29T02:30:00+01:00",
        "2025-03-30T03:00:00+02:00",
        "2025-03-31T02:30:00+02:00",
    ]


@pytest.mark.django_db
def test_dst_fall_back_daily_0230_paris_runs_once(settings, clock):
    settings.FQ_SCHEDULE = {
        "night": {"overlap": "allow", "cron": "30 2 * * *", "queue": "cron.fall", "timezone": "Europe/Paris"}
    }
    travel(clock, ms(2025, 10, 26, 2, 31, tz=PARIS, fold=0))  # first pass, CEST
    assert scheduler.run_due() == 1
    travel(clock, ms(2025, 10, 26, 2, 31, tz=PARIS, fold=1))  # same wall time an hour later, CET
    assert scheduler.run_due() == 0
    travel(clock, ms(2025, 10, 27, 2, 31, tz=PARIS))
    assert scheduler.run_due() == 1
    assert [p["tick_iso"] for p in jobs("cron.fall")] == ["2025-10-26T02:30:00+02:00", "2025-10-27T02:30:00+01:00"]


@pytest.mark.django_db
def test_run_due_skips_invalid_entries_and_runs_valid_ones(settings, clock):
    settings.FQ_SCHEDULE = {
        "broken": {"overlap": "allow", "cron": "not a cron", "queue": "cron.bad"},
        "fine": {"overlap": "allow", "cron": "* * * * *", "queue": "cron.ok", "timezone": "UTC"},
    }
    travel(clock, ms(2025, 5, 5, 10, 0, 5))
    assert scheduler.run_due() == 1
    assert ticks("cron.ok") == [ms(2025, 5, 5, 10, 0)]
    assert not Job.objects.filter(queue__name="cron.bad").exists()


@pytest.mark.django_db
def test_no_schedule_does_nothing(settings):
    settings.FQ_SCHEDULE = {}
    assert scheduler.run_due() == 0
    assert scheduler.next_run_ms() is None
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_next_run_ms_is_the_earliest_upcoming_tick(settings, clock):
    settings.FQ_SCHEDULE = {
        "a": {"overlap": "allow", "cron": "0 * * * *", "queue": "cron.n", "timezone": "UTC"},
        "b": {"overlap": "allow", "cron": "45 10 * * *", "queue": "cron.n", "timezone": "UTC"},
    }
    travel(clock, ms(2025, 5, 5, 10, 20))
    assert scheduler.next_run_ms() == ms(2025, 5, 5, 10, 45)
    assert scheduler.next_run_ms(ms(2025, 5, 5, 10, 50)) == ms(2025, 5, 5, 11)


# --- the system check -------------------------------------------------------------------------


def schedule_errors() -> list[checks.CheckMessage]:
    # Only this app's schedule check: the full registry also runs model checks,
    # which query the database on Django 6.
    return [m for m in scheduler.check_schedule(None) if m.id in SCHEDULE_IDS]


def test_system_check_accepts_a_valid_schedule(settings):
    settings.FQ_SCHEDULE = {
        "a": {"cron": "*/5 * * * *", "queue": "reports", "payload": {"x": 1}, "timezone": "Europe/Paris"},
        "b": {"cron": "@daily", "queue": "q:b", "priority": -3, "max_attempts": 2, "catch_up": 5, "grace_ms": 1000},
    }
    assert schedule_errors() == []


@pytest.mark.parametrize(
    ("raw", "check_id"),
    [
        ({"cron": "61 * * * *", "queue": "q"}, "django_fq.E010"),
        ({"cron": "not a cron", "queue": "q"}, "django_fq.E010"),
        ({"cron": "0 0 30 2 *", "queue": "q"}, "django_fq.E010"),  # never matches
        ({"cron": "*/5 * * * * *", "queue": "q"}, "django_fq.E010"),  # six fields
        ({"cron": "@reboot", "queue": "q"}, "django_fq.E010"),
        ({"queue": "q"}, "django_fq.E010"),
        ({"cron": "* * * * *", "queue": "bad queue!"}, "django_fq.E011"),
        ({"cron": "* * * * *"}, "django_fq.E011"),
        ({"cron": "* * * * *", "queue": "q", "timezone": "Mars/Olympus_Mons"}, "django_fq.E012"),
        ({"cron": "* * * * *", "queue": "q", "payload": {"when": dt.date(2025, 1, 1)}}, "django_fq.E013"),
        ({"cron": "* * * * *", "queue": "q", "payload": float("nan")}, "django_fq.E013"),
        ({"cron": "* * * * *", "queue": "q", "every": 5}, "django_fq.E014"),
        ({"cron": "* * * * *", "queue": "q", "catch_up": 0}, "django_fq.E014"),
        ({"cron": "* * * * *", "queue": "q", "max_attempts": 1001}, "django_fq.E014"),
        ({"cron": "* * * * *", "queue": "q", "grace_ms": 31 * DAY}, "django_fq.E014"),
        ("* * * * *", "django_fq.E014"),
    ],
)
def test_system_check_reports_an_invalid_entry(settings, raw, check_id):
    settings.FQ_SCHEDULE = {"fine": {"cron": "* * * * *", "queue": "q"}, "entry": raw}
    errors = schedule_errors()
    assert [e.id for e in errors] == [check_id], errors
    assert "FQ_SCHEDULE['entry']" in errors[0].msg
    with pytest.raises(scheduler.ScheduleError) as info:
        scheduler.parse_entry("entry", raw)
    assert info.value.check_id == check_id


def test_system_check_reports_bad_entry_names_and_a_non_dict_setting(settings):
    settings.FQ_SCHEDULE = {"bad name!": {"cron": "* * * * *", "queue": "q"}}
    assert [e.id for e in schedule_errors()] == ["django_fq.E014"]
    settings.FQ_SCHEDULE = [("a", {"cron": "* * * * *", "queue": "q"})]
    assert [e.id for e in schedule_errors()] == ["django_fq.E014"]


def test_system_check_payload_too_large(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 100
    settings.FQ_SCHEDULE = {"big": {"cron": "* * * * *", "queue": "q", "payload": "x" * 100}}
    assert [e.id for e in schedule_errors()] == ["django_fq.E013"]


@pytest.mark.django_db
def test_manage_py_check_fails_on_an_invalid_schedule(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.FQ_SCHEDULE = {"x": {"cron": "* * * *", "queue": "q"}}
    with pytest.raises(SystemCheckError, match=r"django_fq\.E010"):
        call_command("check")


# --- concurrency: several workers call run_due at the same time ---------------------------------

#: Several entries with catch-up so one round has many ticks to race on.
RACE_SCHEDULE = {
    "m1": {"overlap": "allow", "cron": "* * * * *", "queue": "cron.race1", "timezone": "UTC", "catch_up": 10},
    "m5": {"overlap": "allow", "cron": "*/5 * * * *", "queue": "cron.race1", "timezone": "UTC", "catch_up": 6},
    "h1": {"overlap": "allow", "cron": "0 * * * *", "queue": "cron.race2", "timezone": "Europe/Paris", "catch_up": 4},
    "d1": {"overlap": "allow", "cron": "30 2 * * *", "queue": "cron.race2", "timezone": "Europe/Paris", "catch_up": 2},
}
#: 10:02:05 UTC: the due set stays the same for the next 55 seconds.
RACE_NOW = ms(2025, 5, 5, 10, 2, 5)


def expected_race_jobs() -> set[tuple[str, int]]:
    out = set()
    for name, raw in RACE_SCHEDULE.items():
        out |= {(name, t) for t in scheduler.due_ticks(scheduler.parse_entry(name, raw), RACE_NOW)}
    return out


def assert_each_tick_once(expected: set[tuple[str, int]]) -> None:
    payloads = jobs("cron.race1") + jobs("cron.race2")
    seen = collections.Counter((p["schedule"], p["tick"]) for p in payloads)
    assert set(seen) == expected
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1]


CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import django
    django.setup()
    from django.conf import settings
    settings.FQ_SCHEDULE = json.loads(os.environ["FQ_CHILD_SCHEDULE"])
    from django_fq import scheduler
    from django_fq import db
    db.db_now_ms()  # connect before the start signal
    ready, go = sys.argv[1], sys.argv[2]
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no start signal")
        time.sleep(0.001)
    created = sum(scheduler.run_due() for _ in range(5))
    print(json.dumps({"created": created}))
    """
)


@pytest.mark.django_db(transaction=True)
def test_three_processes_calling_run_due_at_once_enqueue_each_tick_once(settings, clock, tmp_path):
    travel(clock, RACE_NOW)
    expected = expected_race_jobs()
    assert len(expected) == 10 + 6 + 4 + 2
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.worker_settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        FQ_CHILD_DB_NAME=str(connection.settings_dict["NAME"]),
        FQ_CHILD_CLOCK_OFFSET_MS=str(settings.FQ_TEST_CLOCK_OFFSET_MS),
        FQ_CHILD_SCHEDULE=json.dumps(RACE_SCHEDULE),
    )
    go = tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(r), str(go)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in readies
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(r.exists() for r in readies):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            assert time.monotonic() < deadline, "children did not start"
            time.sleep(0.01)
        go.touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    created = [json.loads(out)["created"] for out, _ in outputs]

    assert sum(created) == len(expected)
    assert_each_tick_once(expected)
    settings.FQ_SCHEDULE = RACE_SCHEDULE
    assert scheduler.run_due() == 0


@pytest.mark.django_db(transaction=True)
def test_three_threads_calling_run_due_at_once_enqueue_each_tick_once(settings, clock):
    settings.FQ_SCHEDULE = RACE_SCHEDULE
    travel(clock, RACE_NOW)
    expected = expected_race_jobs()
    created = run_due_in_threads(3, rounds=5)
    assert sum(created) == len(expected)
    assert_each_tick_once(expected)


def run_due_in_threads(n: int, *, rounds: int = 1) -> list[int]:
    """``n`` threads, each with its own connection, call ``run_due`` ``rounds`` times at once; jobs created by each."""
    barrier = threading.Barrier(n)
    created: list[int] = []
    errors: list[BaseException] = []

    def worker():
        try:
            fqdb.db_now_ms()  # own connection, opened before the race
            barrier.wait(timeout=30)
            created.append(sum(scheduler.run_due() for _ in range(rounds)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return created


# --- overlap: skip a tick while an earlier tick's job is still active ----------------------------


def settle_all(queue: str, how: str) -> None:
    """Claim every ready job of ``queue`` and settle it: ``ack``, ``nack`` (retry later), ``dead`` or ``hold``."""
    for job in fq.claim(queue, count=100):
        if how == "ack":
            fq.ack(queue, job.receipt)
        elif how == "nack":
            fq.nack(queue, job.receipt, delay_ms=HOUR, error="try later")
        elif how == "dead":
            fq.nack(queue, job.receipt, error="gave up")  # max_attempts 1: dead at once


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("how", "state"),
    [("leave", "ready"), ("hold", "running"), ("nack", "scheduled")],
)
def test_overlap_skip_is_the_default_while_the_last_job_is_active(settings, clock, how, state):
    settings.FQ_SCHEDULE = {"every5": {"cron": "*/5 * * * *", "queue": "cron.ov", "timezone": "UTC"}}
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 1
    (first,) = Job.objects.filter(queue__name="cron.ov").values_list("uid", flat=True)
    if how != "leave":
        settle_all("cron.ov", how)
    assert fq.get("cron.ov", first).state == state

    clock.advance(5 * MINUTE)  # 10:05:10: the next tick is due, the 10:00 job is still active
    assert scheduler.run_due() == 0
    assert ticks("cron.ov") == [ms(2025, 5, 5, 10, 0)]
    # The skipped tick's token names the job that was still active: the tick has its one outcome.
    skipped = IdempotencyToken.objects.get(token=f"cron:every5:{ms(2025, 5, 5, 10, 5)}")
    assert skipped.job_uid == first


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["ack", "dead"])
def test_overlap_skip_enqueues_the_next_tick_once_the_last_job_finished(settings, clock, how):
    settings.FQ_SCHEDULE = {
        "every5": {"cron": "*/5 * * * *", "queue": "cron.fin", "timezone": "UTC", "max_attempts": 1}
    }
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 1
    clock.advance(5 * MINUTE)
    assert scheduler.run_due() == 0  # 10:05 skipped: the 10:00 job is still ready
    settle_all("cron.fin", how)
    # 10:05 stays skipped though its job has now finished (its token is live) ...
    assert scheduler.run_due() == 0
    clock.advance(5 * MINUTE)
    # ... and 10:10 runs.
    assert scheduler.run_due() == 1
    assert ticks("cron.fin") == [ms(2025, 5, 5, 10, 0), ms(2025, 5, 5, 10, 10)]


@pytest.mark.django_db
def test_overlap_allow_enqueues_every_tick_while_jobs_are_active(settings, clock):
    settings.FQ_SCHEDULE = {
        "every5": {"cron": "*/5 * * * *", "queue": "cron.allow", "timezone": "UTC", "overlap": "allow"}
    }
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 1
    settle_all("cron.allow", "hold")
    clock.advance(5 * MINUTE)
    assert scheduler.run_due() == 1
    assert ticks("cron.allow") == [ms(2025, 5, 5, 10, 0), ms(2025, 5, 5, 10, 5)]
    assert Job.objects.filter(queue__name="cron.allow", unique_key__isnull=False).count() == 0


@pytest.mark.django_db
def test_overlap_skip_leaves_other_entries_and_other_unique_keys_alone(settings, clock):
    settings.FQ_SCHEDULE = {
        "a": {"cron": "*/5 * * * *", "queue": "cron.two", "timezone": "UTC"},
        "b": {"cron": "*/5 * * * *", "queue": "cron.two", "timezone": "UTC"},
    }
    fq.enqueue("cron.two", {"user": True}, unique_key="cron:c")  # a key no entry uses
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 2  # one per entry: each entry has its own key
    clock.advance(5 * MINUTE)
    assert scheduler.run_due() == 0
    keys = sorted(Job.objects.filter(queue__name="cron.two").values_list("unique_key", flat=True))
    assert keys == ["cron:a", "cron:b", "cron:c"]


@pytest.mark.django_db(transaction=True)
def test_overlap_skip_three_threads_at_once_make_one_job(settings, clock):
    settings.FQ_SCHEDULE = {"m": {"cron": "* * * * *", "queue": "cron.skiprace", "timezone": "UTC"}}
    travel(clock, ms(2025, 5, 5, 10, 0, 5))
    results = run_due_in_threads(3)
    assert sum(results) == 1
    assert len(ticks("cron.skiprace")) == 1
    clock.advance(MINUTE)  # the next tick races onto the still-ready job: skipped by all three
    assert scheduler.run_due() == 0


def test_overlap_must_be_skip_or_allow(settings):
    settings.FQ_SCHEDULE = {"x": {"cron": "* * * * *", "queue": "q", "overlap": "sometimes"}}
    errors = schedule_errors()
    assert [e.id for e in errors] == ["django_fq.E014"]
    assert "overlap 'sometimes'" in errors[0].msg
    with pytest.raises(scheduler.ScheduleError, match="overlap"):
        scheduler.parse_entry("x", {"cron": "* * * * *", "queue": "q", "overlap": True})


def test_catch_up_with_overlap_skip_is_warned_about(settings):
    settings.FQ_SCHEDULE = {
        "skip": {"cron": "* * * * *", "queue": "q", "catch_up": 3},
        "allow": {"cron": "* * * * *", "queue": "q", "catch_up": 3, "overlap": "allow"},
        "one": {"cron": "* * * * *", "queue": "q"},
    }
    warnings = [m for m in scheduler.check_schedule(None) if m.id == "django_fq.W014"]
    assert len(warnings) == 1
    assert "FQ_SCHEDULE['skip']" in warnings[0].msg and warnings[0].level == checks.WARNING


@pytest.mark.django_db
def test_catch_up_with_overlap_skip_enqueues_only_the_oldest_missed_tick(settings, clock):
    settings.FQ_SCHEDULE = {"every5": {"cron": "*/5 * * * *", "queue": "cron.cu", "timezone": "UTC", "catch_up": 3}}
    travel(clock, ms(2025, 5, 5, 10, 0, 10))
    assert scheduler.run_due() == 1
    assert ticks("cron.cu") == [ms(2025, 5, 5, 9, 50)]
