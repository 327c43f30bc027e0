"""The history charts of the dashboard and the queue page, and their JSON (docs/admin.md "History").

The numbers come from :func:`django_fq.services.history.history_series`
(per-minute rows the workers write; docs/reference/history.md); this module
turns them into the geometry of two inline SVG charts drawn on the server:
throughput (enqueued, succeeded, failed, dead per bucket) and times (median
and p95 of wait and run time, on a log scale). No JavaScript, no external
file but ``django_fq/history.css``.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import JsonResponse

from ..exceptions import FqError, InvalidArgument
from ..services.history import SPANS, history_series
from . import display
from .dashboard import _nice_step

#: What the span selector offers: ``span → label``.
SPAN_LABELS = {"hour": "last hour", "day": "last day", "week": "last week"}
#: Throughput series: key, label, CSS class (the class also sets a dash pattern: not colour alone).
THROUGHPUT = (
    ("enqueued", "jobs enqueued", "fq-h-enqueued"),
    ("succeeded", "jobs succeeded", "fq-h-succeeded"),
    # Every failed attempt, a dead job's last one too: the last-hour chart's "failed attempts".
    ("failed", "failed attempts", "fq-h-failed"),
    ("dead", "jobs gone dead", "fq-h-dead"),
)
#: Time series: (timing key, quantile), label, CSS class.
TIMES = (
    (("wait_ms", "median"), "wait median", "fq-h-wait"),
    (("wait_ms", "p95"), "wait p95", "fq-h-wait fq-h-p95"),
    (("run_ms", "median"), "run median", "fq-h-run"),
    (("run_ms", "p95"), "run p95", "fq-h-run fq-h-p95"),
)
#: Gridlines of the time chart (ms, label), a log scale.
TIME_TICKS = (
    (1, "1 ms"), (10, "10 ms"), (100, "100 ms"), (1_000, "1 s"), (10_000, "10 s"), (60_000, "1 min"),
    (600_000, "10 min"), (3_600_000, "1 h"), (36_000_000, "10 h"), (86_400_000, "1 d"),
)  # fmt: skip

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 28, 12, 30


def span_of(raw: object) -> str:
    """The span a request asks for (``hour`` when none); raises InvalidArgument (field ``span``) for another."""
    if raw in (None, ""):
        return "hour"
    if not isinstance(raw, str) or raw not in SPANS:
        raise InvalidArgument(f"span must be one of: {', '.join(SPANS)}", field="span")
    return raw


def _label(series: dict, i: int) -> str:
    at = display.utc(series["start"] + i * series["step_ms"])
    return at.strftime("%H:%M") if series["span"] != "week" else at.strftime("%a %H:%M")


def _x(i: float, n: int) -> float:
    return round(LEFT + (i + 0.5) * (WIDTH - LEFT - RIGHT) / n, 2)


def _paths(values: list[float | None], n: int, y) -> str:
    """An SVG path through the points that have a value; a gap where one has none.

    A point alone (no value on either side) is drawn as a short level stroke, 4 units
    wide: a path of one point draws nothing.
    """
    runs: list[list[tuple[float, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((_x(i, n), y(v)))
    out = []
    for run in runs:
        if len(run) == 1:
            ((x, at),) = run
            out.append(f"M{round(x - 2, 2)} {at} L{round(x + 2, 2)} {at}")
        elif run:
            out.append(" ".join(f"{'M' if k == 0 else 'L'}{x} {at}" for k, (x, at) in enumerate(run)))
    return " ".join(out)


def _ticks(series: dict) -> list[dict]:
    n = len(series["buckets"])
    every = {"hour": 10, "day": 16, "week": 24}[series["span"]]
    return [
        {"x": round(LEFT + i * (WIDTH - LEFT - RIGHT) / n, 2), "label": _label(series, i)}
        for i in range(0, n + 1, every)
    ]


def _frame(series: dict) -> dict:
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right_x": WIDTH - RIGHT, "top": TOP,
            "base": HEIGHT - BOTTOM, "label_y": HEIGHT - BOTTOM + 18, "ticks": _ticks(series)}  # fmt: skip


def throughput_chart(series: dict) -> dict:
    """Geometry of the throughput chart: one line per series, a linear y axis with 4 round gridlines."""
    buckets = series["buckets"]
    n = len(buckets)
    frame = _frame(series)
    plot_h = frame["base"] - TOP
    peak = max([b[key] for b in buckets for key, _, _ in THROUGHPUT] + [0])
    step = _nice_step(-(-peak // 4))
    ymax = step * 4

    def y(v: float) -> float:
        return round(frame["base"] - v / ymax * plot_h, 2)

    # Zero is a value here (a quiet minute), but a span with no job at all draws no line.
    lines = [
        {
            "label": label,
            "css": css,
            "total": series["totals"][key],
            "d": _paths([b[key] for b in buckets], n, y) if peak else "",
        }
        for key, label, css in THROUGHPUT
    ]
    grid = [{"y": y(step * k), "value": step * k} for k in range(5)]
    return {
        **frame,
        "id": "fq-h-throughput",
        "lines": lines,
        "grid": grid,
        "empty": peak == 0,
        "none": "no jobs in this span",
    }


def times_chart(series: dict) -> dict:
    """Geometry of the time chart: median and p95 of wait and run time per bucket, log-scale y axis."""
    buckets = series["buckets"]
    n = len(buckets)
    frame = _frame(series)
    plot_h = frame["base"] - TOP
    values = [b[t][q] for b in buckets for (t, q), _, _ in TIMES if b[t][q] is not None]
    lo = min([1.0, *values]) if values else 1.0
    hi = max([1_000.0, *values]) if values else 1_000.0
    lo_log, hi_log = math.floor(math.log10(max(lo, 1.0))), math.ceil(math.log10(hi))
    hi_log = max(hi_log, lo_log + 1)

    def y(v: float) -> float:
        scaled = (math.log10(max(v, 10.0**lo_log)) - lo_log) / (hi_log - lo_log)
        return round(frame["base"] - scaled * plot_h, 2)

    lines = [
        {"label": label, "css": css, "total": series["totals"][t][q], "d": _paths([b[t][q] for b in buckets], n, y)}
        for (t, q), label, css in TIMES
    ]
    grid = [{"y": y(ms), "value": text} for ms, text in TIME_TICKS if 10.0**lo_log <= ms <= 10.0**hi_log]
    return {
        **frame,
        "id": "fq-h-times",
        "lines": lines,
        "grid": grid,
        "empty": not values,
        "none": "no attempts in this span",
    }


def rows(series: dict) -> list[dict]:
    """The table behind the charts (the buckets with anything in them), for screen readers and copy-paste."""
    out = []
    for i, b in enumerate(series["buckets"]):
        if not (
            b["enqueued"] or b["succeeded"] or b["failed"] or b["dead"] or b["wait_ms"]["count"] or b["run_ms"]["count"]
        ):
            continue
        out.append(
            {
                "label": f"{_label(series, i)}–{_label(series, i + 1)}",
                **{k: b[k] for k in ("enqueued", "succeeded", "failed", "dead")},
                "wait": (display.duration(b["wait_ms"]["median"]), display.duration(b["wait_ms"]["p95"])),
                "run": (display.duration(b["run_ms"]["median"]), display.duration(b["run_ms"]["p95"])),
            }
        )
    return out


def context(queue: str | None, span_raw: object) -> dict[str, Any]:
    """Everything ``admin/django_fq/dashboard_history.html`` shows, or an ``error`` (a bad span or queue).

    Never raises for what a URL can carry: a bad ``span`` or ``queue`` gives
    ``{"error": message, "field": name}`` and the page shows it.
    """
    base: dict[str, Any] = {"spans": list(SPAN_LABELS.items()), "queue": queue or "", "span": "hour"}
    try:
        span = span_of(span_raw)
        base["span"] = span
        series = history_series(queue, span)
    except FqError as exc:
        return {**base, "error": exc.message, "field": exc.field}
    return {
        **base,
        "span_label": SPAN_LABELS[span],
        "step": display.duration(series["step_ms"]),
        "start": display.instant(series["start"]),
        "end": display.instant(series["end"]),
        "totals": series["totals"],
        "charts": _titled(series, queue, throughput_chart(series), times_chart(series)),
        "rows": rows(series),
    }


def _titled(series: dict, queue: str | None, throughput: dict, times: dict) -> list[dict]:
    """The two charts with their heading, SVG title and description (the description: the span's totals)."""
    step, span = display.duration(series["step_ms"]), SPAN_LABELS[series["span"]]
    where = f" in {queue}" if queue else ""
    t = series["totals"]
    wait = (display.duration(t["wait_ms"]["median"]), display.duration(t["wait_ms"]["p95"]))
    run = (display.duration(t["run_ms"]["median"]), display.duration(t["run_ms"]["p95"]))
    throughput.update(
        heading=f"Throughput per {step}",
        title=f"Jobs per {step}{where}, {span}",
        desc=", ".join(f"{line['label']} {line['total']}" for line in throughput["lines"])
        + ' in total; the table "Numbers per bucket" below has every value.',
        note="A failed attempt counts whether its job is retried or goes dead; a job that goes dead counts "
        "once more, in jobs gone dead.",
        counts=True,
    )
    times.update(
        heading=f"Wait and run time (median, p95) per {step}",
        title=f"Wait and run time per {step}{where}, {span} (log scale)",
        desc=f"Over the span: wait median {wait[0]}, p95 {wait[1]}; run median {run[0]}, p95 {run[1]}.",
        note=f"over the span: wait {wait[0]} / {wait[1]}, run {run[0]} / {run[1]} (median / p95)",
        counts=False,
    )
    return [throughput, times]


def json_view(model_admin, request):
    """``GET …/django_fq/queue/history.json?queue=&span=``: :func:`history_series` as JSON (view permission).

    400 with ``{"error", "field"}`` for a bad ``span`` or ``queue`` name, 404
    for an unknown queue; never a 500 for what the URL carries.
    """
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    queue = request.GET.get("queue") or None
    try:
        series = history_series(queue, span_of(request.GET.get("span")))
    except FqError as exc:
        status = 404 if exc.code == "queue_not_found" else 400
        return JsonResponse({"error": exc.message, "field": exc.field}, status=status)
    return JsonResponse(series)
