"""Numbers behind the admin's queue pages and the dashboard chart.

* :func:`count_annotations` — job counts per reported state as correlated
  subqueries, so a page of queues gets all its counts from the one query that
  lists them.
* :func:`counter_totals` — the totals and timing sums of many queues, summed
  over their counter shards in one grouped query.
* :func:`activity` — jobs finished and failed attempts of the last hour in
  one-minute buckets, and :func:`chart` — the geometry of the inline SVG that
  shows them.

Where the chart's numbers come from (also in ``docs/admin.md``):

* *finished*: succeeded jobs, bucketed by ``finished_at`` (the ack's database
  time). They stay in the table until pruned (7 days by default), so the last
  hour is complete unless ``FQ_FINISHED_RETENTION_MS`` is below one hour.
* *failed attempts*: entries of the jobs' error history of kind ``nack``,
  ``expired`` (lease ran out) or ``timeout``, bucketed by their ``at`` time.
  An entry at time *t* implies the job's ``changed_at`` ≥ *t*, so only jobs
  changed within the hour that have a history are looked at, newest first, and
  at most :data:`FAILURE_SCAN_LIMIT` of them (the chart says when it was cut).
  A dead job's last failure is one of them: the history's ``failed`` counts
  the same attempts (docs/reference/history.md), and its ``dead`` the jobs.
  The database expands the histories and counts the entries per minute: no
  error text is read into Python (a history can hold megabytes of them).
  Counters are not used: they are running totals, not time series.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from .. import db, storage
from ..models import QUEUED_STATES, Job, Queue, QueueCounter, Stored
from ..services._base import manager
from ..types import STATE_NAMES, TIMING_NAMES, TOTAL_NAMES
from . import display

MINUTE_MS = 60_000
#: One-minute buckets shown by the chart: the last hour.
BUCKETS = 60
#: History kinds that count as a failed attempt (``release`` and ``cancel`` do not).
FAILURE_KINDS = frozenset({"nack", "expired", "timeout"})
#: Most queues listed in the dashboard's table (the busiest ones; the queue list has them all).
DASHBOARD_QUEUES = 50
#: Most jobs whose error history one dashboard view counts (in SQL).
FAILURE_SCAN_LIMIT = 20_000


class CappedCount(BigIntegerField):
    """A count that stops past :data:`~.display.COUNT_CAP`: read back as :class:`~.display.AtLeast` beyond it."""

    def from_db_value(self, value, expression, connection):
        if value is not None and value > display.COUNT_CAP:
            return display.AtLeast(value)
        return value


def capped_count(jobs: QuerySet, *, within: QuerySet | None = None, cap: int | None = None) -> Case:
    """The number of rows of ``jobs`` (correlated with ``OuterRef`` as the caller likes), at most ``cap + 1``.

    Correlated subqueries: is there a ``cap + 1``-th row (one index range
    read up to that entry), and only when not, ``COUNT(*)`` of the rows. So a
    state that holds most of a million-job table costs the page ``cap``
    index entries, not a million, on every database (``cap``: default
    :data:`~.display.COUNT_CAP`) (no derived table, which
    MariaDB cannot correlate). ``within``: a superset of ``jobs`` that an
    index alone answers; when it holds at most ``cap`` rows, ``jobs`` is
    counted at once, without first looking for its ``cap + 1``-th row (for
    conditions the index does not hold, such as ``run_at``, which reads
    table rows). Read back through :class:`CappedCount`.
    """
    cap = display.COUNT_CAP if cap is None else cap
    # COUNT(*) as a plain function, not an aggregate: no GROUP BY, so one row correlated or not.
    rows = Func(template="COUNT(*)", output_field=BigIntegerField())
    exact = Coalesce(
        Subquery(jobs.order_by().annotate(n=rows).values("n"), output_field=BigIntegerField()),
        Value(0),
        output_field=BigIntegerField(),
    )
    beyond = When(Exists(jobs.order_by().values("seq")[cap : cap + 1]), then=Value(cap + 1))
    whens = [beyond]
    if within is not None:
        whens.insert(0, When(~Exists(within.order_by().values("seq")[cap : cap + 1]), then=exact))
    return Case(*whens, default=exact, output_field=CappedCount())


def count_annotations() -> dict:
    """``n_<state>`` annotations for a queue queryset: its number of jobs in each reported state, capped.

    Each is correlated subqueries on the job table (its ``queue, state``
    index, :func:`capped_count`), so the page's one query computes the
    counts of the listed queues only, and the paginator's ``COUNT(*)`` over
    queues does not touch jobs. A count past :data:`~.display.COUNT_CAP` reads
    "more than 10,000" (:class:`~.display.AtLeast`), as the job list's own count
    does: an exact count of a queue's succeeded jobs would read every one of
    them on every page load. ``scheduled`` and ``ready`` compare ``run_at`` with
    the database clock (:class:`~django_fq.db.DbNow`), exactly as the services do.
    """
    return _counts(Job.objects.order_by().filter(queue_id=OuterRef("pk")))


def _counts(jobs: QuerySet) -> dict:
    """``n_<state>``: :func:`capped_count` of ``jobs`` in each reported state (database clock for scheduled/ready)."""
    now = db.DbNow()
    queued = jobs.filter(state__in=QUEUED_STATES)
    split = {
        "scheduled": queued.filter(run_at__gt=now),
        "ready": queued.filter(run_at__lte=now),
    }
    out = {}
    for state in STATE_NAMES:
        if state in split:
            out[f"n_{state}"] = capped_count(split[state], within=queued)
        else:
            out[f"n_{state}"] = capped_count(jobs.filter(state=state))
    return out


def busiest_queue_ids(limit: int) -> list[int]:
    """Ids of at most ``limit`` queues: those with the most unfinished jobs, then the others, ties by name.

    *Unfinished* is waiting, scheduled, ready, running or dead: what an operator looks
    at. One query of a fixed size whatever the number of queues: the queue table
    ordered by a correlated count of each queue's unfinished jobs, ``LIMIT limit``.
    (A list of every queue's id in an ``IN`` grew with the queues, past SQLite's
    variable limit and MariaDB's packet size at tens of thousands of them.) Each
    count is an index range of the ``queue, state`` index (``queue_id = the
    queue's``, the unfinished states), so only those jobs' index entries are read.
    """
    unfinished = (
        manager(Job)
        .filter(queue_id=OuterRef("pk"), state__in=("waiting", "queued", "held", "running", "dead"))
        .order_by()
        .values("queue_id")
        .annotate(n=Count("*"))
        .values("n")
    )
    return list(
        manager(Queue)
        .annotate(unfinished=Coalesce(Subquery(unfinished, output_field=BigIntegerField()), Value(0)))
        .order_by("-unfinished", "name")
        .values_list("pk", flat=True)[:limit]
    )


def all_counts() -> dict[str, int]:
    """Jobs of every queue in each reported state, each capped like the table's (database clock).

    One query of :func:`capped_count` subqueries over the ``queue, state``
    index of every queue (``queue_id IN (…)``, the index's first column: a
    scan of the whole table would read every job).
    """
    ids = list(manager(Queue).values_list("pk", flat=True))
    if not ids:
        return dict.fromkeys(STATE_NAMES, 0)
    counts = _counts(manager(Job).order_by().filter(queue_id__in=ids))
    row = manager(Queue).order_by().filter(pk=ids[0]).values(**counts)[0]
    return {s: row[f"n_{s}"] or 0 for s in STATE_NAMES}


def counts_of(queue: Queue) -> dict[str, int]:
    """The ``n_<state>`` annotations of a queue row as ``{state: count}`` (:class:`~.display.AtLeast` when capped)."""
    return {s: getattr(queue, f"n_{s}", 0) or 0 for s in STATE_NAMES}


def totals_row(t: dict[str, int]) -> dict:
    """The dashboard's totals cells of one queue from its :func:`counter_totals` entry ``t``.

    ``enqueued``, ``acked`` and ``failed`` (nacks + expired leases + timeouts) as
    ints; ``avg_wait`` and ``avg_run`` as short durations (an em dash when nothing
    was measured).
    """
    return {
        "enqueued": t.get("enqueued", 0),
        "acked": t.get("acked", 0),
        "failed": t.get("nacked", 0) + t.get("expired", 0) + t.get("timed_out", 0),
        "avg_wait": display.average(t.get("wait_ms_sum", 0), t.get("wait_count", 0)),
        "avg_run": display.average(t.get("run_ms_sum", 0), t.get("run_count", 0)),
    }


def counter_totals(queue_ids) -> dict[int, dict[str, int]]:
    """``{queue_id: {total or timing name: value}}`` for ``queue_ids``, in one query.

    Every name of ``TOTAL_NAMES`` and ``TIMING_NAMES`` is present (0 when a
    queue has no counter rows yet).
    """
    names = TOTAL_NAMES + TIMING_NAMES
    ids = list(queue_ids)
    out = {qid: dict.fromkeys(names, 0) for qid in ids}
    if not ids:
        return out
    rows = (
        manager(QueueCounter)
        .filter(queue_id__in=ids)
        .order_by()
        .values("queue_id")
        .annotate(**{f"s_{n}": Sum(n) for n in names})
    )
    for row in rows:
        out[row["queue_id"]] = {n: int(row[f"s_{n}"] or 0) for n in names}
    return out


@dataclass(frozen=True)
class Activity:
    """Per-minute numbers of the last hour: bucket ``i`` covers ``[start + i min, start + (i+1) min)``."""

    start: int
    end: int
    now: int
    finished: list[int]
    failures: list[int]
    #: True when more than FAILURE_SCAN_LIMIT jobs had to be read for failures.
    partial: bool


def activity(queue_id: int | None = None) -> Activity:
    """Jobs finished and failed attempts per minute over the last hour (database clock).

    The last bucket is the current, still running minute. ``queue_id``
    restricts the numbers to one queue.
    """
    now = db.db_now_ms()
    end = (now // MINUTE_MS + 1) * MINUTE_MS
    start = end - BUCKETS * MINUTE_MS
    jobs = manager(Job).order_by()
    if queue_id is not None:
        jobs = jobs.filter(queue_id=queue_id)

    finished = [0] * BUCKETS
    bucket = ExpressionWrapper(
        (F("finished_at") - Value(start)) / Value(MINUTE_MS), output_field=BigIntegerField()
    )
    rows = (
        jobs.filter(state="succeeded", finished_at__gte=start, finished_at__lt=end)
        .annotate(bucket=bucket)
        .values("bucket")
        .annotate(n=Count("*"))
    )
    for row in rows:
        if 0 <= row["bucket"] < BUCKETS:
            finished[row["bucket"]] += row["n"]

    failures, partial = _failures(start, end, queue_id)
    return Activity(start, end, now, finished, failures, partial=partial)


def _failures(start: int, end: int, queue_id: int | None) -> tuple[list[int], bool]:
    """Failed attempts per minute in ``[start, end)`` (epoch ms), and whether the scan was cut.

    Counted by the database (``Store.failure_buckets`` in django_fq.storage): the history entries are
    expanded in SQL (``jsonb_array_elements`` on PostgreSQL, ``json_each`` on SQLite) and only
    ``(bucket, count)`` pairs come back, so no error text reaches Python
    whatever the size of the histories.
    """
    conn = db.connection()
    found, partial = storage.for_connection(conn).failure_buckets(
        conn,
        job_table=Job._meta.db_table,
        start=start,
        end=end,
        queue_id=queue_id,
        kinds=sorted(FAILURE_KINDS),
        # Every queue and stored state, when no queue is chosen: index ranges on last change.
        queue_ids=None if queue_id is not None else list(manager(Queue).values_list("pk", flat=True)),
        states=[s.value for s in Stored],
        bucket_ms=MINUTE_MS,
        scan_limit=FAILURE_SCAN_LIMIT,
    )
    failures = [0] * BUCKETS
    for bucket, n in found:
        if 0 <= bucket < BUCKETS:
            failures[bucket] += n
    return failures, partial


def _nice_step(value: int) -> int:
    """The smallest 1, 2 or 5 × 10^k that is at least ``value`` (and at least 1)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if step * m >= value:
                return step * m
        step *= 10


def chart(act: Activity, *, width: int = 760, height: int = 240) -> dict:
    """Geometry of the activity chart: bars, grid lines and labels, in SVG user units.

    Two bars per minute, finished (left) and failed attempts (right), on one
    shared y axis with four grid lines at round numbers.
    """
    left, right, top, bottom = 48, 24, 12, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([*act.finished, *act.failures, 0])
    step = _nice_step(-(-peak // 4))  # ceil(peak / 4), rounded up to a nice number
    ymax = step * 4
    slot = plot_w / BUCKETS
    bar_w = round(slot * 0.38, 2)
    base = top + plot_h

    def label(i: int) -> str:
        return display.utc(act.start + i * MINUTE_MS).strftime("%H:%M")

    bars = []
    for i in range(BUCKETS):
        x0 = left + i * slot + slot * 0.1
        for series, values, offset, noun in (
            ("finished", act.finished, 0.0, "jobs succeeded"),
            ("failed", act.failures, bar_w, "failed attempts"),
        ):
            v = values[i]
            if not v:
                continue
            h = max(v / ymax * plot_h, 1.0)
            bars.append(
                {
                    "series": series,
                    "x": round(x0 + offset, 2),
                    "y": round(base - h, 2),
                    "w": bar_w,
                    "h": round(h, 2),
                    "title": f"{label(i)}–{label(i + 1)} UTC: {v} {noun}",
                }
            )
    grid = [{"y": round(base - k * plot_h / 4, 2), "value": step * k} for k in range(5)]
    ticks = [{"x": round(left + i * slot, 2), "label": label(i)} for i in range(0, BUCKETS + 1, 10)]
    minutes = [
        {"label": f"{label(i)}–{label(i + 1)}", "finished": act.finished[i], "failed": act.failures[i]}
        for i in range(BUCKETS)
        if act.finished[i] or act.failures[i]
    ]
    return {
        "width": width,
        "height": height,
        "left": left,
        "right_x": width - right,
        "top": top,
        "base": base,
        "label_y": base + 18,
        "bars": bars,
        "grid": grid,
        "ticks": ticks,
        "minutes": minutes,
        "total_finished": sum(act.finished),
        "total_failed": sum(act.failures),
        "start": display.instant(act.start),
        "end": display.instant(act.end),
        "partial": act.partial,
    }
