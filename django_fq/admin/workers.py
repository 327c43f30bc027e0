"""The admin's Workers page: the worker registry, read only (docs/admin.md "Workers").

One row per worker process and database (:class:`~django_fq.models.WorkerProcess`,
written by the workers themselves: :mod:`django_fq.worker.presence`). Whether a
worker is live or gone is decided in the page's one query against the database
clock: gone once its heartbeat is older than
:data:`~django_fq.services.workers.STALE_BEATS` of its own intervals. Nothing
can be added, changed or deleted here; a gone row is deleted by the reaper's
prune an hour later. Rows hold no receipt, payload or result.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import BigIntegerField, Case, ExpressionWrapper, F, Value, When
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from .. import db
from ..services.workers import STALE_BEATS
from . import display
from .records import ReadOnlyAdmin

#: Queue names shown in a row of the list; the detail page shows them all.
LISTED_QUEUES = 8


class StateFilter(admin.SimpleListFilter):
    """``?state=live`` or ``?state=gone`` (decided in SQL on the database clock); another value shows every row."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return (("live", "live"), ("gone", "gone"))

    def queryset(self, request, queryset):
        if self.value() in ("live", "gone"):
            return queryset.filter(is_live=self.value() == "live")
        return queryset


class WorkerAdmin(ReadOnlyAdmin):
    """Live and gone worker processes: host, pid, queues, concurrency, jobs running, heartbeat, version."""

    list_display = (
        "worker_id", "state", "host", "pid", "queue_list", "concurrency", "running", "pool", "version", "started",
        "heartbeat",
    )  # fmt: skip
    list_filter = (StateFilter,)
    search_fields = ("worker_id", "host")
    exact_search = ("worker_id", "host")
    search_help_text = "Exact worker id or host."
    # "state" is the StateFilter's parameter (live/gone), not a column.
    url_lookups = {"state": display.EXACT, "host": display.EXACT, "pool": display.EXACT, "version": display.EXACT}
    ordering = ("host", "pid", "worker_id")
    show_full_result_count = False
    fields = (
        "worker_id", "state", "host", "pid", "all_queues", "concurrency", "running", "pool", "version", "started",
        "heartbeat", "heartbeat_ms",
    )  # fmt: skip
    readonly_fields = fields

    def get_queryset(self, request):
        now = db.DbNow()
        return (
            super()
            .get_queryset(request)
            .annotate(
                is_live=Case(
                    When(heartbeat_at__gte=now - F("heartbeat_ms") * Value(STALE_BEATS), then=Value(True)),
                    default=Value(False),
                ),
                age_ms=ExpressionWrapper(now - F("heartbeat_at"), output_field=BigIntegerField()),
            )
        )

    @admin.display(description="state", ordering="heartbeat_at")
    def state(self, obj):
        if getattr(obj, "is_live", False):
            return mark_safe('<span class="fq-worker-live">live</span>')  # constant markup
        return format_html(
            '<span class="fq-alert fq-worker-gone" title="no heartbeat for {} intervals of {} ms">gone</span>',
            STALE_BEATS,
            obj.heartbeat_ms,
        )

    @admin.display(description="queues")
    def queue_list(self, obj):
        names = [q for q in obj.queues.split(",") if q]
        shown = ", ".join(names[:LISTED_QUEUES])
        more = len(names) - LISTED_QUEUES
        return format_html('{} <span class="fq-raw">+{} more</span>', shown, more) if more > 0 else shown

    @admin.display(description="queues")
    def all_queues(self, obj):
        return ", ".join(q for q in obj.queues.split(",") if q)

    @admin.display(description="started (UTC)", ordering="started_at")
    def started(self, obj):
        return display.instant_short(obj.started_at)

    @admin.display(description="last heartbeat (UTC)", ordering="heartbeat_at")
    def heartbeat(self, obj):
        age = getattr(obj, "age_ms", None)
        when = display.instant_short(obj.heartbeat_at)
        if age is None:
            return when
        return format_html('{} <span class="fq-raw">({} s ago)</span>', when, f"{max(0, age) / 1000:.1f}")
