"""Periodic jobs: cron schedules in ``settings.FQ_SCHEDULE`` turned into enqueues.

A schedule maps an entry name to a cron expression and what to enqueue::

    FQ_SCHEDULE = {
        "nightly-report": {
            "cron": "30 2 * * *",            # minute hour day-of-month month day-of-week, or @daily …
            "queue": "reports",
            "payload": {"kind": "daily"},    # any JSON value (default: null)
            "timezone": "Europe/Paris",      # default: settings.TIME_ZONE (UTC when unset)
            "priority": 0,                   # optional enqueue options
            "max_attempts": 3,
            "timeout_ms": 600_000,
            "catch_up": 1,                   # missed ticks to enqueue after downtime (1-100)
            "grace_ms": 3_600_000,           # optional: a tick later than this is dropped
            "overlap": "skip",               # or "allow" (default "skip", see below)
        },
    }

:func:`run_due` enqueues every tick that is due. It keeps no state of its own:
each tick is enqueued with the idempotency token ``cron:<name>:<tick epoch ms>``
so any number of processes may call it at the same time and each tick still
becomes exactly one job. The rules (which ticks are due, DST, the token's
retention) are explained in ``docs/periodic.md``; in short:

* "now" is the database clock (:func:`django_fq.db.db_now_ms`), never Python's.
* Due ticks are the ``catch_up`` most recent ticks at or before now (default 1:
  after downtime only the latest missed tick runs), each only while it is
  younger than its lateness window: the time until the ``catch_up``-th tick
  after it, at most ``grace_ms`` and at most 30 days − 1 hour.
* The token is kept for that window's upper bound plus one hour, so it outlives
  every moment at which the tick could still be due.
* ``overlap``: with ``"skip"`` (the default) a tick is skipped while the job of
  an earlier tick of the entry is still scheduled (waiting for a retry), ready
  or running; the enqueue carries the unique key ``cron:<name>``, so the
  check and the enqueue are one step and the skipped tick's token points at
  the job that was still active. ``"allow"`` enqueues every tick.

The job's payload is an envelope::

    {"schedule": "nightly-report", "tick": 1743296400000,
     "tick_iso": "2025-03-30T03:00:00+02:00", "payload": {"kind": "daily"}}

The system check :func:`check_schedule` validates the setting
(ids ``django_fq.E010`` – ``django_fq.E014``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter
from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning

from . import conf, db, routing, validation
from .exceptions import FqError, ScheduleError

logger = logging.getLogger("django_fq.scheduler")

SETTING = "FQ_SCHEDULE"
#: Keys an entry of ``FQ_SCHEDULE`` may hold.
ENTRY_KEYS = frozenset(
    {
        "cron",
        "queue",
        "payload",
        "timezone",
        "priority",
        "max_attempts",
        "timeout_ms",
        "catch_up",
        "grace_ms",
        "overlap",
    }
)
#: Values of an entry's ``overlap`` key; the first is the default.
OVERLAP_POLICIES = ("skip", "allow")
#: Largest ``catch_up``: how many missed ticks one entry may enqueue after downtime.
MAX_CATCH_UP = 100
#: Idempotency retention can be at most 30 days (docs/reference/semantics.md §2).
MAX_RETENTION_MS = 30 * validation.DAY_MS
#: Slack added to a tick's token retention beyond the last moment the tick can be due.
RETENTION_MARGIN_MS = validation.HOUR_MS
#: A tick is never enqueued later than this after its time (so its token, kept
#: this long plus the margin, always covers it).
MAX_LATENESS_MS = MAX_RETENTION_MS - RETENTION_MARGIN_MS
#: Bounds of the enqueue options an entry may carry (same as ``enqueue``).
_MAX_ATTEMPTS = (1, 1000)
_TIMEOUT_MS = (0, 7 * validation.DAY_MS)

#: The ``@`` shorthands, spelled out (so the wildcard test below sees real fields).
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Check ids.
E_CRON = "django_fq.E010"
E_QUEUE = "django_fq.E011"
E_TIMEZONE = "django_fq.E012"
E_PAYLOAD = "django_fq.E013"
E_ENTRY = "django_fq.E014"
W_CATCH_UP_SKIPPED = "django_fq.W014"


@dataclass(frozen=True)
class Entry:
    """One validated entry of ``FQ_SCHEDULE``."""

    name: str
    cron: str  # five fields (macros expanded)
    queue: str
    payload: object
    timezone: str
    priority: int
    max_attempts: int | None
    timeout_ms: int | None
    catch_up: int
    grace_ms: int | None
    overlap: str = OVERLAP_POLICIES[0]

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def fixed_time(self) -> bool:
        """True when neither the minute nor the hour field is a wildcard (``*``, ``*/n``).

        Such an entry names wall-clock times, so a time repeated when clocks go
        back runs only once; a wildcard entry follows real time and runs in
        both passes (the rule of the classic cron daemons).
        """
        minute, hour = self.cron.split()[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def token(self, tick_ms: int) -> str:
        """The idempotency token of this entry's tick at ``tick_ms``."""
        return f"cron:{self.name}:{tick_ms}"

    @property
    def unique_key(self) -> str | None:
        """The unique key of this entry's jobs: ``cron:<name>`` when ``overlap`` is ``"skip"``, else ``None``.

        While a job holding it is scheduled, ready or running, the next tick's
        enqueue coalesces onto that job (docs/periodic.md "Overlapping runs").
        """
        return f"cron:{self.name}" if self.overlap == "skip" else None


# --- reading and validating the setting ---------------------------------------------------------


def raw_schedule():
    """The ``FQ_SCHEDULE`` setting as configured (default: empty)."""
    return getattr(settings, SETTING, None) or {}


def parse_entry(name, raw) -> Entry:
    """Validate one entry; return it as an :class:`Entry` or raise :class:`ScheduleError` (first problem)."""
    problems = _problems(name, raw)
    if problems:
        raise ScheduleError(*problems[0])
    return _build(name, raw)


def entries() -> list[Entry]:
    """The valid entries of ``FQ_SCHEDULE``; invalid ones are logged (once per process) and left out."""
    schedule = raw_schedule()
    if not isinstance(schedule, Mapping):
        _warn_once(f"{SETTING} must be a dict of entries; ignoring it")
        return []
    out = []
    for name, raw in schedule.items():
        try:
            out.append(parse_entry(name, raw))
        except ScheduleError as exc:
            _warn_once(f"{SETTING}[{name!r}] ignored: {exc.message} ({exc.check_id})")
    return out


@register()
def check_schedule(app_configs=None, **kwargs):
    """System check of ``FQ_SCHEDULE``.

    ===============  ==========================================================
    id               meaning
    ===============  ==========================================================
    django_fq.E010   cron expression missing, malformed or never matching
    django_fq.E011   queue name missing or invalid
    django_fq.E012   unknown time zone
    django_fq.E013   payload not a JSON document (or larger than allowed)
    django_fq.E014   setting or entry malformed: not a dict, bad entry name,
                     unknown key, option out of range
    django_fq.W014   ``catch_up`` above 1 with ``overlap`` "skip": the missed
                     ticks after the first are skipped, as the first is still
                     ready when they are enqueued
    ===============  ==========================================================
    """
    schedule = raw_schedule()
    if not isinstance(schedule, Mapping):
        return [Error(f"{SETTING} must be a dict mapping entry names to entries.", id=E_ENTRY)]
    errors: list[CheckMessage] = []
    for name, raw in schedule.items():
        problems = _problems(name, raw)
        for check_id, message in problems:
            errors.append(Error(f"{SETTING}[{name!r}]: {message}", id=check_id, obj=SETTING))
        if not problems and (raw.get("catch_up") or 1) > 1 and raw.get("overlap", OVERLAP_POLICIES[0]) == "skip":
            errors.append(
                CheckWarning(
                    f"{SETTING}[{name!r}]: catch_up {raw['catch_up']} has no effect with overlap 'skip': "
                    "after downtime the oldest missed tick is enqueued and the later ones are skipped "
                    "while it waits",
                    hint="Set 'overlap': 'allow' to run every missed tick, or drop catch_up.",
                    id=W_CATCH_UP_SKIPPED,
                    obj=SETTING,
                )
            )
    return errors


def _problems(name, raw) -> list[tuple[str, str]]:
    """Every problem of one entry as ``(check id, message)``."""
    if not isinstance(name, str) or not validation.QUEUE_NAME.fullmatch(name):
        return [(E_ENTRY, "entry names are 1-200 characters from A-Z a-z 0-9 : . _ -")]
    if not isinstance(raw, Mapping):
        return [(E_ENTRY, "an entry must be a dict with at least 'cron' and 'queue'")]
    out = []
    for key in sorted(set(map(str, raw)) - ENTRY_KEYS):
        out.append((E_ENTRY, f"unknown key {key!r} (allowed: {', '.join(sorted(ENTRY_KEYS))})"))
    cron = raw.get("cron")
    problem = _cron_problem(cron)
    if problem:
        out.append((E_CRON, problem))
    queue = raw.get("queue")
    if not isinstance(queue, str) or not validation.QUEUE_NAME.fullmatch(queue):
        out.append((E_QUEUE, f"queue {queue!r} is not a queue name (1-200 characters from A-Z a-z 0-9 : . _ -)"))
    zone = raw.get("timezone")
    zone_problem = _zone_problem(zone) if zone is not None else None
    if zone_problem:
        out.append((E_TIMEZONE, zone_problem))
    elif zone is None and _zone_problem(_default_zone()):
        out.append((E_TIMEZONE, f"TIME_ZONE {_default_zone()!r} is not a known time zone"))
    try:
        # Measured as delivered: inside the envelope, with the widest tick values.
        sample = {"schedule": name, "tick": 9_999_999_999_999, "tick_iso": "x" * 25, "payload": raw.get("payload")}
        validation.json_text(sample, "payload")
    except FqError as exc:
        out.append((E_PAYLOAD, str(exc)))
    for key, lo, hi in (
        ("priority", validation.MIN_PRIORITY, validation.MAX_PRIORITY),
        ("max_attempts", *_MAX_ATTEMPTS),
        ("timeout_ms", *_TIMEOUT_MS),
        ("catch_up", 1, MAX_CATCH_UP),
        ("grace_ms", 1, MAX_LATENESS_MS),
    ):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            out.append((E_ENTRY, f"{key} must be an integer from {lo} to {hi}"))
    overlap = raw.get("overlap", OVERLAP_POLICIES[0])
    if overlap not in OVERLAP_POLICIES:
        out.append((E_ENTRY, f"overlap {overlap!r} must be one of {', '.join(map(repr, OVERLAP_POLICIES))}"))
    return out


def _cron_problem(cron) -> str | None:
    if not isinstance(cron, str) or not cron.strip():
        return "'cron' is required: five fields (minute hour day-of-month month day-of-week) or an @ shorthand"
    text = _expand(cron)
    if text is None:
        return f"cron {cron!r}: unknown shorthand (known: {', '.join(sorted(MACROS))})"
    if len(text.split()) != 5:
        return f"cron {cron!r} must have exactly five fields (minute hour day-of-month month day-of-week)"
    try:
        if not croniter.is_valid(text):
            raise CroniterBadCronError(text)
        croniter(text, dt.datetime(2000, 1, 1, tzinfo=dt.UTC)).get_next(float)
    except CroniterBadDateError:
        return f"cron {cron!r} never matches a date"
    except (CroniterError, ValueError, KeyError, TypeError):
        return f"cron {cron!r} is not a valid cron expression"
    return None


def _expand(cron: str) -> str | None:
    text = " ".join(cron.split())
    if text.startswith("@"):
        return MACROS.get(text.lower())
    return text


def _default_zone() -> str:
    return getattr(settings, "TIME_ZONE", None) or "UTC"


def _zone_problem(zone) -> str | None:
    if not isinstance(zone, str) or not zone:
        return f"timezone {zone!r} must be an IANA time zone name such as 'Europe/Paris'"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"timezone {zone!r} is not a known IANA time zone"
    return None


def _build(name: str, raw: Mapping) -> Entry:
    cron = _expand(raw["cron"])
    if cron is None:  # _problems() refuses unknown macros before we get here
        raise ScheduleError(E_CRON, f"cron {raw['cron']!r} is not a known macro")
    return Entry(
        name=name,
        cron=cron,
        queue=raw["queue"],
        payload=raw.get("payload"),
        timezone=raw.get("timezone") or _default_zone(),
        priority=raw.get("priority") or 0,
        max_attempts=raw.get("max_attempts"),
        timeout_ms=raw.get("timeout_ms"),
        catch_up=raw.get("catch_up") or 1,
        grace_ms=raw.get("grace_ms"),
        overlap=raw.get("overlap", OVERLAP_POLICIES[0]),
    )


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.error(message)


# --- tick arithmetic (pure; no database) --------------------------------------------------------


def _is_second_pass(entry: Entry, zone: ZoneInfo, tick_ms: int) -> bool:
    """True for a fixed-time entry's tick in the repeated hour after clocks went back (its second pass)."""
    if not entry.fixed_time:
        return False
    local = dt.datetime.fromtimestamp(tick_ms / 1000, zone)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _walk(entry: Entry, start_ms: int, count: int, backward: bool) -> list[int]:
    """``count`` ticks strictly after ``start_ms`` (or strictly before it, newest first).

    croniter walks real time in the entry's zone. Two things are corrected
    here so that every entry follows the rule of docs/periodic.md ("Time and
    time zones"), wildcard or not: a tick whose wall time falls in a gap
    (clocks went forward) fires once at the first instant after the gap,
    and a tick croniter moved to some other wall time is dropped (its
    replacement is that gap tick).
    """
    zone = entry.zone
    start = dt.datetime.fromtimestamp(start_ms / 1000, zone)
    it = croniter(entry.cron, start)
    step = it.get_prev if backward else it.get_next
    out: list[int] = []
    seen = {start_ms}
    prev = start_ms
    while len(out) < count:
        try:
            tick = round(step(float) * 1000)
        except CroniterBadDateError:  # no further match (only odd dates near the ends of time)
            break
        lo, hi = (tick, prev) if backward else (prev, tick)
        candidates = _gap_ticks(entry, zone, lo, hi)
        if _offset(zone, lo) != _offset(zone, hi) and not _matches(entry, zone, tick):
            pass  # croniter shifted a tick out of a gap: the gap tick stands for it
        elif not _is_second_pass(entry, zone, tick):
            candidates.append(tick)
        for t in sorted(candidates, reverse=backward):
            if t not in seen:
                seen.add(t)
                out.append(t)
        prev = tick
    return out[:count]


#: Longest gap a clock change can open: a day (Samoa skipped 30 December 2011).
_MAX_GAP_S = 86_400


def _offset(zone: ZoneInfo, ms: int) -> dt.timedelta:
    return dt.datetime.fromtimestamp(ms / 1000, zone).utcoffset() or dt.timedelta(0)


def _wall(zone: ZoneInfo, ms: int) -> dt.datetime:
    """The naive local wall time at instant ``ms``."""
    return dt.datetime.fromtimestamp(ms / 1000, zone).replace(tzinfo=None)


def _matches(entry: Entry, zone: ZoneInfo, tick_ms: int) -> bool:
    """True when the wall time of ``tick_ms`` is a time the cron expression names."""
    wall = _wall(zone, tick_ms)
    return croniter(entry.cron, wall - dt.timedelta(seconds=1)).get_next(dt.datetime) == wall


def _exists(zone: ZoneInfo, wall: dt.datetime) -> bool:
    """True when the naive local ``wall`` time happens in ``zone`` (it is not in a gap)."""
    instant = wall.replace(tzinfo=zone).timestamp()
    return dt.datetime.fromtimestamp(instant, zone).replace(tzinfo=None) == wall


def _gap_ticks(entry: Entry, zone: ZoneInfo, lo_ms: int, hi_ms: int) -> list[int]:
    """Instants in ``(lo_ms, hi_ms]`` that stand for ticks whose wall time fell in a gap.

    croniter walked from ``lo_ms`` straight to ``hi_ms``, so any wall time
    the cron names between the two readings that does not exist lies in a
    gap (clocks went forward). Its tick fires at the first instant after
    that gap: the instant the clocks changed. Several such wall times in one
    gap give one instant.
    """
    out: list[int] = []
    if hi_ms - lo_ms < _MAX_GAP_S * 1000 and _offset(zone, lo_ms) == _offset(zone, hi_ms):
        return out  # the common case: no clock change in between (two within a day never happen)
    end = _wall(zone, hi_ms)
    cursor = _wall(zone, lo_ms)
    while True:
        named = croniter(entry.cron, cursor).get_next(dt.datetime)
        if named >= end:
            return out
        if _exists(zone, named):
            cursor = named
            continue
        # Read with the offset before the change, ``named`` is an instant just after it; the change
        # itself is less than a day before that: find its first second by bisection.
        after_s = int(named.replace(tzinfo=zone).timestamp())
        a, b = after_s - _MAX_GAP_S, after_s
        before = _offset(zone, a * 1000)
        while b - a > 1:
            mid = (a + b) // 2
            if _offset(zone, mid * 1000) == before:
                a = mid
            else:
                b = mid
        change_ms = b * 1000
        if lo_ms < change_ms <= hi_ms and change_ms not in out:
            out.append(change_ms)
        cursor = max(named, _wall(zone, change_ms) - dt.timedelta(seconds=1))  # on past the gap


def ticks_between(entry: Entry, after_ms: int, until_ms: int) -> list[int]:
    """Every tick of ``entry`` in ``(after_ms, until_ms]``, oldest first (for inspection and tests)."""
    out: list[int] = []
    cursor = after_ms
    while True:
        batch = _walk(entry, cursor, 64, backward=False)
        for tick in batch:
            if tick > until_ms:
                return out
            out.append(tick)
        if len(batch) < 64:
            return out
        cursor = batch[-1]


def due_ticks(entry: Entry, now_ms: int) -> list[int]:
    """The ticks of ``entry`` due at ``now_ms``, oldest first.

    Candidates are the ``catch_up`` most recent ticks at or before now. A
    candidate stays due while ``now - tick`` is below its lateness window:
    the time from the tick to the ``catch_up``-th tick after it, capped by
    ``grace_ms`` and by :data:`MAX_LATENESS_MS`.
    """
    n = entry.catch_up
    before = _walk(entry, now_ms + 1, n, backward=True)[::-1]  # ticks <= now, oldest first
    after = _walk(entry, now_ms, n, backward=False)  # ticks > now
    seq = before + after
    due = []
    for i, tick in enumerate(before):
        follower = seq[i + n] if i + n < len(seq) else None
        window = MAX_LATENESS_MS if follower is None else min(follower - tick, MAX_LATENESS_MS)
        if entry.grace_ms is not None:
            window = min(window, entry.grace_ms)
        if now_ms - tick < window:
            due.append(tick)
    return due


def retention_ms(entry: Entry, tick_ms: int) -> int:
    """How long the token of the tick at ``tick_ms`` is kept.

    It covers the longest lateness window the tick could have under any
    ``catch_up`` and ``grace_ms`` (so editing those settings never re-opens an
    enqueued tick), plus :data:`RETENTION_MARGIN_MS` for the time between
    reading the clock and writing the token; never more than 30 days.
    """
    later = _walk(entry, tick_ms, MAX_CATCH_UP, backward=False)
    span = MAX_LATENESS_MS if len(later) < MAX_CATCH_UP else min(later[-1] - tick_ms, MAX_LATENESS_MS)
    return span + RETENTION_MARGIN_MS


def envelope(entry: Entry, tick_ms: int) -> dict:
    """The payload of the job for ``entry``'s tick at ``tick_ms``."""
    local = dt.datetime.fromtimestamp(tick_ms / 1000, entry.zone)
    return {"schedule": entry.name, "tick": tick_ms, "tick_iso": local.isoformat(), "payload": entry.payload}


# --- enqueueing ---------------------------------------------------------------------------------


def run_due(now_ms: int | None = None) -> int:
    """Enqueue every due tick of every valid entry of ``FQ_SCHEDULE``; return the number of jobs created.

    ``now_ms`` defaults to the database clock. Safe to call from any number of
    processes at once, as often as wanted: ticks whose token is already live
    are skipped with a read, and the token makes concurrent enqueues of one
    tick produce one job. An entry whose enqueue fails with a django-fq error
    (queue full, …) is logged and the others go on; database errors propagate.

    With ``FQ_QUEUE_DATABASES``, each entry is ticked on its queue's database by
    that database's clock; inside :func:`django_fq.routing.using` ``(alias)`` only the
    entries whose queue is on ``alias`` are ticked, and no other database is read. A
    worker's reaper thread of one alias calls it so: a database that is down delays
    only its own entries' ticks.
    """
    schedule = entries()
    if schedule and routing.enabled():
        return _run_due_routed(schedule, now_ms)
    if not schedule:
        return 0
    if now_ms is None:
        now_ms = db.db_now_ms()
    created = 0
    for entry in schedule:
        try:
            created += _run_entry(entry, now_ms)
        except FqError as exc:
            logger.error("schedule %s: enqueue into %s failed: %s", entry.name, entry.queue, exc)
    return created


def _run_due_routed(schedule: list[Entry], now_ms: int | None) -> int:
    """:func:`run_due` with ``FQ_QUEUE_DATABASES``: each entry on its queue's database, by that database's clock.

    Inside :func:`django_fq.routing.using` (a worker's reaper of one alias) only
    the entries whose queue is on that alias run.
    """
    here = routing.current()
    clocks: dict[str, int] = {}
    created = 0
    for entry in schedule:
        alias = routing.alias_for(entry.queue)
        if here is not None and alias != here:
            continue
        with routing.using(alias):
            try:
                if alias not in clocks:
                    clocks[alias] = now_ms if now_ms is not None else db.db_now_ms()
                created += _run_entry(entry, clocks[alias])
            except FqError as exc:
                logger.error("schedule %s: enqueue into %s failed: %s", entry.name, entry.queue, exc)
    return created


def _run_entry(entry: Entry, now_ms: int) -> int:
    from . import services

    ticks = due_ticks(entry, now_ms)
    if not ticks:
        return 0
    live = _live_tokens(entry.queue, [entry.token(t) for t in ticks])
    created = 0
    for tick in ticks:
        token = entry.token(tick)
        if token in live:
            continue
        result = services.enqueue(
            entry.queue,
            envelope(entry, tick),
            priority=entry.priority,
            max_attempts=entry.max_attempts,
            timeout_ms=entry.timeout_ms,
            idempotency=token,
            idempotency_retention_ms=retention_ms(entry, tick),
            unique_key=entry.unique_key,
        )
        if result.created:
            created += 1
            logger.info("schedule %s: tick %s enqueued into %s as job %s", entry.name, tick, entry.queue, result.id)
        elif entry.unique_key is not None:
            # The token was live (another process enqueued this tick) or the key coalesced onto an
            # earlier tick's active job: either way this tick has its one outcome, recorded by the token.
            logger.info(
                "schedule %s: tick %s skipped: job %s of the entry is still scheduled, ready or running",
                entry.name,
                tick,
                result.id,
            )
    return created


def _live_tokens(queue: str, tokens: list[str]) -> set[str]:
    """Which of ``tokens`` are live in ``queue`` now (a read; no lock, no write)."""
    from .models import IdempotencyToken

    rows = IdempotencyToken.objects.using(conf.database()).filter(
        queue__name=queue, token__in=tokens, expires_at__gt=db.DbNow()
    )
    return set(rows.values_list("token", flat=True))


def next_run_ms(now_ms: int | None = None) -> int | None:
    """The earliest tick after now (database clock) over all valid entries; ``None`` without a schedule.

    A worker may use it to sleep until the next tick instead of polling.
    """
    schedule = entries()
    if not schedule:
        return None
    if now_ms is None:
        now_ms = db.db_now_ms()
    upcoming = [t for e in schedule for t in _walk(e, now_ms, 1, backward=False)]
    return min(upcoming) if upcoming else None
