"""Admin for batches: a read-only list and detail with a progress bar and links to the member jobs.

Nothing here writes a batch: batches are created, filled, sealed and
cancelled through :mod:`django_fq.batches` (Python, ``manage.py fq batch``,
REST). The progress bar is an HTML ``<progress>`` element: no script.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import conf
from ..models import BatchMember, Job
from ..services._base import reported_state
from . import display
from .records import ReadOnlyAdmin

#: Members listed on a batch's page (the first ones, in enqueue order); the rest through the job list.
MEMBERS_SHOWN = 200


def _progress(obj):
    done = obj.succeeded + obj.dead + obj.cancelled
    percent = 100.0 * done / obj.total if obj.total else 100.0
    return format_html(
        '<progress class="fq-progress" value="{}" max="{}"></progress> {}/{} ({}%)',
        done, obj.total or 1, done, obj.total, f"{percent:.1f}",
    )  # fmt: skip


class BatchAdmin(ReadOnlyAdmin):
    """Batches: state, progress (done / total), counts, callback job; a batch's page lists its members."""

    list_display = ("uid", "queue", "state", "progress_bar", "succeeded", "dead", "cancelled", "callback", "created")
    list_filter = (("queue", display.QueueFilter), "state")
    list_select_related = ("queue",)
    search_fields = ("uid", "callback_job")
    exact_search = ("uid", "callback_job")
    search_help_text = "Exact batch id, or the id of its callback job."
    url_lookups = {
        "queue": display.EXACT_OR_IN,
        "queue__id": display.EXACT_OR_IN,
        "state": display.EXACT,
        "uid": display.EXACT,
    }
    ordering = ("-id",)
    show_full_result_count = False
    fields = (
        "uid", "queue", "state", "progress_bar", "total", "succeeded", "dead", "cancelled",
        "callback", "created", "sealed", "finished", "member_jobs",
    )  # fmt: skip
    readonly_fields = fields

    @admin.display(description="progress")
    def progress_bar(self, obj):
        return _progress(obj)

    @admin.display(description="callback job")
    def callback(self, obj):
        if obj.callback_queue is None:
            return "-"
        if obj.callback_job is None:
            return format_html('{} <span class="fq-raw">(not yet)</span>', obj.callback_queue)
        seq = Job.objects.using(conf.database()).filter(uid=obj.callback_job).values_list("seq", flat=True).first()
        if seq is None:
            return format_html('{} <span class="fq-raw">(pruned)</span>', obj.callback_job)
        return format_html('<a href="{}">{}</a>', reverse("admin:django_fq_job_change", args=[seq]), obj.callback_job)

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, obj):
        return display.instant_short(obj.created_at)

    @admin.display(description="sealed (UTC)")
    def sealed(self, obj):
        return display.instant_short(obj.sealed_at)

    @admin.display(description="finished (UTC)")
    def finished(self, obj):
        return display.instant_short(obj.finished_at)

    @admin.display(description=f"members (the first {MEMBERS_SHOWN})")
    def member_jobs(self, obj):
        rows = (
            BatchMember.objects.using(conf.database())
            .filter(batch_id=obj.id)
            .annotate(reported=reported_state("job__"))
            .order_by("job_id")
            .values_list("job_id", "job__uid", "reported")[:MEMBERS_SHOWN]
        )
        items = [(reverse("admin:django_fq_job_change", args=[seq]), uid, state, state) for seq, uid, state in rows]
        if not items:
            return "none"
        return format_html(
            '<ul class="fq-members">{}</ul>',
            format_html_join("", '<li><a href="{}">{}</a> <span class="fq-state fq-state-{}">{}</span></li>', items),
        )
