"""Per-minute history of each queue: throughput, wait and run time (docs/reference/history.md).

Writing: the processes that enqueue, claim and settle tally what they did in
memory, per database alias, queue and minute (the minute of the database
clock the statement read), and write each minute with one upsert
(:meth:`~django_fq.storage.base.Store.add_minutes`) once it is over: the
first event after its end, the worker's reaper pass, the worker's shutdown or
a read of the history (:func:`flush`). Nothing is added to the statements of
the claim and the settles, so the history costs no round trip on the hot
path. A tally is taken after the transaction that did the work commits
(``on_commit`` inside a transaction): a rolled-back or retried transaction
counts nothing. A process that dies loses its unwritten minutes (at most the
current one, plus the one that just ended).

Reading: :func:`history_series` sums the rows into 1-minute (last hour),
15-minute (last day) or 1-hour (last week) buckets, and takes the median
and p95 of the wait and run times from the summed histogram bins.

Bins (times in whole milliseconds): bin 0 holds 0 ms; bin ``k`` (1 – 128)
holds ``[2**((k-1)/4), 2**(k/4))`` ms; bin 129 holds 2**32 ms (49.7 days) and
more. A quantile is reported as its bin's geometric middle
``2**((2k-1)/8)`` (0 for bin 0, the lower edge for bin 129), so it is
within 9.05 % (``2**(1/8) - 1``) of the exact value (nearest rank).
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
from collections.abc import Collection
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import F, Sum
from django.db.models.functions import Mod

from .. import conf, db, routing, storage, validation
from ..exceptions import InvalidArgument, QueueNotFound
from ..models import Queue, QueueMinute
from ._base import manager

log = logging.getLogger("django_fq.history")

MINUTE_MS = 60_000
#: ``kind`` of a :class:`~django_fq.models.QueueMinute` row.
THROUGHPUT, WAIT, RUN = 0, 1, 2
#: Histogram bins per minute: 0 ms, 128 quarter-octaves from 1 ms, and 2**32 ms and more.
BINS = 130
#: Bins per doubling of the time.
PER_OCTAVE = 4
#: The largest relative error of a reported median or p95 (half a bin, geometrically).
ERROR_BOUND = 2 ** (1 / (2 * PER_OCTAVE)) - 1
#: A minute is written this long (ms) after its end, so that settles committing at its end are in it.
GRACE_MS = 2_000
#: Rows per upsert statement.
FLUSH_ROWS = 500
#: The spans :func:`history_series` shows: ``span → (bucket ms, buckets)``.
SPANS = {"hour": (MINUTE_MS, 60), "day": (15 * MINUTE_MS, 96), "week": (60 * MINUTE_MS, 168)}
#: Quantiles reported per bucket.
QUANTILES = (("median", 0.5), ("p95", 0.95))


def bin_of(ms: int) -> int:
    """The histogram bin of a time of ``ms`` milliseconds (see the module's docstring)."""
    if ms < 1:
        return 0
    return min(BINS - 1, int(math.log2(ms) * PER_OCTAVE) + 1)


#: ``bin_of`` of 0 … 16,383 ms, looked up: the tally's per-job cost is an index, not a logarithm.
_SMALL_BINS = [bin_of(ms) for ms in range(16_384)]


def bin_edges(k: int) -> tuple[float, float]:
    """Bin ``k``'s ``[low, high)`` in ms (high is ``inf`` for the last bin)."""
    if k == 0:
        return (0.0, 1.0)
    if k == BINS - 1:
        return (2.0 ** ((k - 1) / PER_OCTAVE), math.inf)
    return (2.0 ** ((k - 1) / PER_OCTAVE), 2.0 ** (k / PER_OCTAVE))


def bin_value(k: int) -> float:
    """The time reported for bin ``k`` (ms): its geometric middle (0 for bin 0, the low edge for the last)."""
    low, high = bin_edges(k)
    if k == 0:
        return 0.0
    if math.isinf(high):
        return low
    return math.sqrt(low * high)


def quantile(bins: dict[int, int], p: float) -> float | None:
    """The ``p`` quantile (0 < p ≤ 1, nearest rank) of a histogram ``{bin: count}``, as :func:`bin_value`; None when empty."""
    total = sum(bins.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(p * total))
    seen = 0
    for k in sorted(bins):
        seen += bins[k]
        if seen >= rank:
            return bin_value(k)
    return bin_value(max(bins))  # pragma: no cover - the loop reaches the rank


# --- writing ---------------------------------------------------------------------------------


class _Minute:
    """What one process did in one queue's minute, not yet written."""

    __slots__ = ("counts", "wait", "run")

    def __init__(self) -> None:
        self.counts = [0, 0, 0, 0]  # enqueued, succeeded, failed, dead
        self.wait: dict[int, int] = {}
        self.run: dict[int, int] = {}


class Tally:
    """The process's unwritten minutes, ``{(alias, queue_id, minute): _Minute}``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int | str, int], _Minute] = {}
        self._offset_ms = 0.0  # database clock − local clock, from the newest event
        self._due_at = math.inf  # local ms at which the oldest pending minute is written

    def add(self, alias: str, queue_id: int | str, at_ms: int, counts: tuple[int, int, int, int], waits, runs) -> None:
        """Count one event set at ``at_ms`` (database clock); writes the minutes that are over."""
        minute = at_ms - at_ms % MINUTE_MS
        local = time.time() * 1000
        with self._lock:
            self._offset_ms = at_ms - local
            key = (alias, queue_id, minute)
            m = self._pending.get(key)
            if m is None:
                m = self._pending[key] = _Minute()
                self._due_at = min(self._due_at, minute + MINUTE_MS + GRACE_MS - self._offset_ms)
            c = m.counts
            c[0] += counts[0]
            c[1] += counts[1]
            c[2] += counts[2]
            c[3] += counts[3]
            small = _SMALL_BINS
            for ms, hist in ((waits, m.wait), (runs, m.run)):
                for v in ms:
                    k = small[v] if 0 <= v < 16_384 else bin_of(v)
                    hist[k] = hist.get(k, 0) + 1
            due = local >= self._due_at
        if due:
            # Only this event's database: an enqueue never waits on another database's locks.
            self.flush(only_over=True, aliases={alias})

    def take(self, *, only_over: bool, aliases=None) -> dict[tuple[str, int | str, int], _Minute]:
        """Remove and return the pending minutes (only those over, with ``only_over``) of ``aliases`` (all: None)."""
        with self._lock:
            now = time.time() * 1000 + self._offset_ms
            taken = {
                k: m
                for k, m in self._pending.items()
                if (not only_over or k[2] + MINUTE_MS + GRACE_MS <= now) and (aliases is None or k[0] in aliases)
            }
            for k in taken:
                del self._pending[k]
            left = [k[2] for k in self._pending]
            self._due_at = min(left) + MINUTE_MS + GRACE_MS - self._offset_ms if left else math.inf
        return taken

    def flush(self, *, only_over: bool = False, aliases: set[str] | None = None, exclude: Collection[str] = ()) -> int:
        """Write the pending minutes (only those over, with ``only_over``; of ``aliases``, all: None, but not of ``exclude``); the rows written.

        An alias whose connection in this thread is inside a transaction is
        left for later (the rows would join, and share the fate of, that
        transaction). A write that fails is logged and its minutes dropped:
        the history is a view, never a reason for a claim or settle to fail.
        """
        with self._lock:  # other threads add keys meanwhile
            pending = {k[0] for k in self._pending}
        free = {
            a
            for a in pending
            if (aliases is None or a in aliases) and a not in exclude and not connections[a].in_atomic_block
        }
        if not free:
            return 0
        taken = self.take(only_over=only_over, aliases=free)
        by_alias: dict[str, list[tuple[int, ...]]] = {}
        for alias in {k[0] for k in taken}:
            mine = {k: m for k, m in taken.items() if k[0] == alias}
            by_alias[alias] = _rows(alias, mine)
        written = 0
        for alias, rows in by_alias.items():
            conn = connections[alias]
            for i in range(0, len(rows), FLUSH_ROWS):
                chunk = rows[i : i + FLUSH_ROWS]
                try:
                    with routing.using(alias):
                        db.retrying(storage.for_connection(conn).add_minutes, conn, chunk, atomic=False)
                    written += len(chunk)
                except DatabaseError as exc:
                    log.warning("history: %d row(s) of alias %s not written: %s", len(chunk), alias, type(exc).__name__)
        return written

    def discard(self) -> None:
        """Forget every pending minute (tests: between test databases)."""
        with self._lock:
            self._pending.clear()
            self._due_at = math.inf


def _rows(alias: str, taken: dict[tuple[str, int | str, int], _Minute]) -> list[tuple[int, ...]]:
    """The upsert rows of one alias's minutes, sorted by key; a queue named, not numbered, is looked up (one query)."""
    names = {k[1] for k in taken if isinstance(k[1], str)}
    ids = dict(Queue.objects.using(alias).filter(name__in=names).values_list("name", "id")) if names else {}
    merged: dict[tuple[int, int], _Minute] = {}
    for (_alias, ref, minute), m in taken.items():
        queue_id = ids.get(ref) if isinstance(ref, str) else ref
        if queue_id is None:
            continue  # deleted since
        into = merged.get((queue_id, minute))
        if into is None:
            merged[(queue_id, minute)] = m
            continue
        into.counts = [a + b for a, b in zip(into.counts, m.counts, strict=True)]
        for mine, theirs in ((into.wait, m.wait), (into.run, m.run)):
            for k, n in theirs.items():
                mine[k] = mine.get(k, 0) + n
    rows: list[tuple[int, ...]] = []
    for (queue_id, minute), m in merged.items():
        if any(m.counts):
            rows.append((queue_id, minute, THROUGHPUT, 0, *m.counts, 0))
        rows += [(queue_id, minute, WAIT, k, 0, 0, 0, 0, n) for k, n in m.wait.items()]
        rows += [(queue_id, minute, RUN, k, 0, 0, 0, 0, n) for k, n in m.run.items()]
    rows.sort()
    return rows


#: This process's tally.
TALLY = Tally()


def note(
    conn,
    queue_id: int | str,
    at_ms: int,
    *,
    enqueued: int = 0,
    succeeded: int = 0,
    failed: int = 0,
    dead: int = 0,
    waits=(),
    runs=(),
) -> None:
    """Count events of queue ``queue_id`` at ``at_ms`` (epoch ms, database clock) once ``conn``'s transaction commits.

    ``queue_id`` may be the queue's name where the caller has no id (looked up when the minute is written).

    ``waits`` / ``runs``: the wait / run times (ms) of the attempts concerned.
    Outside a transaction the events are counted at once. Never raises for a
    database error (see :meth:`Tally.flush`).
    """
    counts = (enqueued, succeeded, failed, dead)
    if conn.in_atomic_block:
        transaction.on_commit(lambda: _add(conn.alias, queue_id, at_ms, counts, waits, runs), using=conn.alias)
    else:
        _add(conn.alias, queue_id, at_ms, counts, waits, runs)


def _add(alias: str, queue_id: int | str, at_ms: int, counts: tuple[int, int, int, int], waits, runs) -> None:
    """:meth:`Tally.add`, after the caller's commit: whatever goes wrong is logged, never raised.

    The jobs are committed by then; an error here would tell the caller its enqueue or
    settle failed (and a retry would enqueue again). The first tally of a process also
    registers the write of what is left at its exit (a short script's last minute).
    """
    global _exit_registered
    try:
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_flush_at_exit)
        TALLY.add(alias, queue_id, at_ms, counts, waits, runs)
    except Exception:
        log.exception("history: events of queue %s not counted", queue_id)


_exit_registered = False


def _flush_at_exit() -> None:
    """At interpreter exit: write every pending minute (``manage.py fq enqueue`` ends long before its minute does)."""
    try:
        TALLY.flush()
    except Exception:
        log.warning("history: minutes not written at exit", exc_info=True)


def flush() -> int:
    """Write every minute this process has tallied and not written yet (in every alias); the rows written.

    The worker calls it at shutdown; :func:`history_series` before it reads.
    """
    return TALLY.flush()


def flush_due(aliases: Collection[str] | None = None, *, exclude: Collection[str] = ()) -> int:
    """Write the minutes this process tallied that are over; the rows written (the worker's reaper calls it each pass).

    ``aliases``: the database aliases whose minutes to write (``None``: every alias),
    less those in ``exclude``. A worker whose queues are on several aliases has one
    reaper thread per alias: each writes its own alias's (``aliases={alias}``), and
    the first also those of every alias no served queue is on (``exclude=`` the other
    served aliases), so a database that does not answer delays no other's writes.
    A write that fails is logged, not raised (see :meth:`Tally.flush`).
    """
    return TALLY.flush(only_over=True, aliases=None if aliases is None else set(aliases), exclude=exclude)


def prune_history(*, limit: int) -> int:
    """Delete at most ``limit`` history rows (current alias) older than ``FQ_HISTORY_RETENTION_MS`` (database clock).

    In transactions of 1000 rows, through the ``minute`` index. Returns the
    number of rows deleted.
    """
    retention = int(conf.get("FQ_HISTORY_RETENTION_MS"))
    cut = db.db_now_ms() - retention
    deleted = 0
    rows = manager(QueueMinute)
    while deleted < limit:
        ids = list(
            rows.filter(minute__lt=cut).order_by("minute").values_list("id", flat=True)[: min(1000, limit - deleted)]
        )
        if not ids:
            break
        n = db.retrying(lambda ids=ids: manager(QueueMinute).filter(id__in=ids).delete()[0])
        deleted += n
        if len(ids) < 1000:
            break
    return deleted


# --- reading ---------------------------------------------------------------------------------


def _check_span(span: object) -> tuple[int, int]:
    if not isinstance(span, str) or span not in SPANS:
        raise InvalidArgument(f"span must be one of: {', '.join(SPANS)}", field="span")
    return SPANS[span]


def _sums(
    queue_id: int | None, start: int, step: int
) -> tuple[dict[int, list[int]], dict[int, dict[int, dict[int, int]]]]:
    """Throughput ``{bucket: [enq, succ, fail, dead]}`` and bins ``{bucket: {kind: {bin: n}}}`` from ``start`` (current alias)."""
    rows = manager(QueueMinute).filter(minute__gte=start)
    if queue_id is not None:
        rows = rows.filter(queue_id=queue_id)
    rows = rows.annotate(b=F("minute") - Mod("minute", step)) if step != MINUTE_MS else rows.annotate(b=F("minute"))
    counts: dict[int, list[int]] = {}
    for r in (
        rows.filter(kind=THROUGHPUT)
        .values("b")
        .annotate(e=Sum("enqueued"), s=Sum("succeeded"), f=Sum("failed"), d=Sum("dead"))
        .order_by()
    ):
        counts[int(r["b"])] = [int(r["e"] or 0), int(r["s"] or 0), int(r["f"] or 0), int(r["d"] or 0)]
    bins: dict[int, dict[int, dict[int, int]]] = {}
    for r in rows.filter(kind__in=(WAIT, RUN)).values("b", "kind", "bin").annotate(total=Sum("n")).order_by():
        bins.setdefault(int(r["b"]), {}).setdefault(r["kind"], {})[r["bin"]] = int(r["total"] or 0)
    return counts, bins


def _timing(bins: dict[int, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"count": sum(bins.values())}
    for name, p in QUANTILES:
        v = quantile(bins, p)
        out[name] = None if v is None else round(v, 2)
    return out


@routing.every_alias(lambda answers: _merge([a for _alias, a in answers]))
def _raw(queue: str | None, span: str) -> dict[str, Any]:
    step, n = SPANS[span]
    queue_id = None
    if queue is not None:
        found = manager(Queue).filter(name=queue).values_list("id", flat=True).first()
        if found is None:
            raise QueueNotFound(f"no such queue: {queue}", field="queue")
        queue_id = found
    now = db.db_now_ms()
    last = now - now % step
    start = last - (n - 1) * step
    counts, bins = _sums(queue_id, start, step)
    return {"now": now, "start": start, "counts": counts, "bins": bins}


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One alias's sums, or the sums of every alias (their clocks: the first alias's window)."""
    out = {"now": parts[0]["now"], "start": parts[0]["start"], "counts": {}, "bins": {}}
    for part in parts:
        for b, c in part["counts"].items():
            have = out["counts"].setdefault(b, [0, 0, 0, 0])
            for i in range(4):
                have[i] += c[i]
        for b, kinds in part["bins"].items():
            for kind, hist in kinds.items():
                mine = out["bins"].setdefault(b, {}).setdefault(kind, {})
                for k, v in hist.items():
                    mine[k] = mine.get(k, 0) + v
    return out


def history_series(queue: str | None = None, span: str = "hour") -> dict[str, Any]:
    """The history of queue ``queue`` (every queue: None) over the last ``span``: ``hour``, ``day`` or ``week``.

    Buckets of 1 minute (hour: 60), 15 minutes (day: 96) or 1 hour (week:
    168), oldest first; the last is the one the database clock is in. Returns
    ``{"queue", "span", "step_ms", "start", "end", "now", "buckets": [...],
    "totals": {...}}``, times in epoch ms (database clock); each bucket is
    ``{"start", "enqueued", "succeeded", "failed", "dead", "wait_ms",
    "run_ms"}`` and ``totals`` the same over the whole span (no ``start``).
    ``enqueued``: jobs created; ``succeeded``: attempts acked; ``failed``:
    every failed attempt (nack, lease expiry, timeout), whether its job is
    retried or goes dead; ``dead``: jobs that went dead (so a job failing once
    and then for good adds 2 to ``failed`` and 1 to ``dead``). ``wait_ms`` /
    ``run_ms`` are ``{"count", "median", "p95"}``: the wait (claim − the
    later of enqueue and ``run_at``) of the attempts claimed, and the run time
    (ack − claim) of the attempts acked, in ms, within
    :data:`ERROR_BOUND` (9.05 %) of the exact quantile; ``None`` without
    attempts. This process's unwritten minutes are written first.

    Raises :class:`~django_fq.exceptions.InvalidArgument` (field ``span``)
    for another span, :class:`~django_fq.exceptions.InvalidQueueName` for a
    malformed queue name, :class:`~django_fq.exceptions.QueueNotFound` (field
    ``queue``) for an unknown one.
    """
    step, n = _check_span(span)
    if queue is not None:
        validation.queue_name(queue)
    flush()
    raw = _raw(queue, span)
    buckets = []
    whole = [0, 0, 0, 0]
    whole_bins: dict[int, dict[int, int]] = {WAIT: {}, RUN: {}}
    for i in range(n):
        b = raw["start"] + i * step
        c = raw["counts"].get(b, [0, 0, 0, 0])
        kinds = raw["bins"].get(b, {})
        for j in range(4):
            whole[j] += c[j]
        for kind in (WAIT, RUN):
            for k, v in kinds.get(kind, {}).items():
                whole_bins[kind][k] = whole_bins[kind].get(k, 0) + v
        buckets.append(
            {
                "start": b,
                "enqueued": c[0],
                "succeeded": c[1],
                "failed": c[2],
                "dead": c[3],
                "wait_ms": _timing(kinds.get(WAIT, {})),
                "run_ms": _timing(kinds.get(RUN, {})),
            }
        )
    return {
        "queue": queue,
        "span": span,
        "step_ms": step,
        "start": raw["start"],
        "end": raw["start"] + n * step,
        "now": raw["now"],
        "buckets": buckets,
        "totals": {
            "enqueued": whole[0],
            "succeeded": whole[1],
            "failed": whole[2],
            "dead": whole[3],
            "wait_ms": _timing(whole_bins[WAIT]),
            "run_ms": _timing(whole_bins[RUN]),
        },
    }
