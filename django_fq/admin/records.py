"""Read-only admins for leases and idempotency tokens.

Both are bookkeeping rows the services own: nobody may add, change or delete
them here. A lease's ``receipt_hash`` is never a field of these pages.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Case, OuterRef, Subquery, Value, When
from django.urls import reverse
from django.utils.html import format_html

from .. import conf, db
from ..models import Job
from . import display


class ReadOnlyAdmin(display.FqModelAdmin):
    """View permission only, whatever the user's other permissions."""

    class Media:
        css = {"all": ("django_fq/admin.css",)}

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).using(conf.database())


def _job_link(seq: int, label: str):
    url = reverse("admin:django_fq_job_change", args=[seq])
    return format_html('<a href="{}">{}</a>', url, label)


class LeaseAdmin(ReadOnlyAdmin):
    """Live leases: which job, which worker, until when. Never the receipt or its hash."""

    list_display = ("job_id_link", "queue", "generation", "claimed", "deadline_at", "timeout_cap", "worker")
    list_filter = (("queue", display.QueueFilter),)
    list_select_related = ("job", "queue")
    search_fields = ("job__uid", "worker")
    exact_search = ("job__uid", "worker")
    search_help_text = "Exact job id, or a worker id."
    url_lookups = {
        "queue": display.EXACT_OR_IN,
        "queue__id": display.EXACT_OR_IN,
        "job": display.EXACT,
        "job__uid": display.EXACT,
        "worker": display.EXACT,
    }
    ordering = ("deadline",)
    show_full_result_count = False
    fields = ("job_id_link", "queue", "generation", "claimed", "deadline_at", "timeout_cap", "worker")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).only(
            "job_id", "job__uid", "queue_id", "queue__name", "generation", "claimed_at", "deadline", "timeout_at", "worker"
        )

    @admin.display(description="job", ordering="job__uid")
    def job_id_link(self, obj):
        return _job_link(obj.job_id, obj.job.uid)

    @admin.display(description="claimed at (UTC)", ordering="claimed_at")
    def claimed(self, obj):
        return display.instant_short(obj.claimed_at)

    @admin.display(description="deadline (UTC)", ordering="deadline")
    def deadline_at(self, obj):
        return display.instant_short(obj.deadline)

    @admin.display(description="timeout at (UTC)", ordering="timeout_at")
    def timeout_cap(self, obj):
        return display.instant_short(obj.timeout_at)


class IdempotencyTokenAdmin(ReadOnlyAdmin):
    """Idempotency tokens: which job a token maps to, and until when it deduplicates."""

    list_display = ("token", "queue", "job_link", "created", "expires", "live")
    list_filter = (("queue", display.QueueFilter),)
    list_select_related = ("queue",)
    search_fields = ("token", "job_uid")
    exact_search = ("token", "job_uid")
    search_help_text = "Exact token or job id."
    url_lookups = {
        "queue": display.EXACT_OR_IN,
        "queue__id": display.EXACT_OR_IN,
        "token": display.EXACT,
        "job_uid": display.EXACT,
    }
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("token", "queue", "job_link", "created", "expires", "live")
    readonly_fields = fields

    def get_queryset(self, request):
        now = db.DbNow()
        job_seq = Job.objects.using(conf.database()).filter(uid=OuterRef("job_uid")).values("seq")[:1]
        return super().get_queryset(request).annotate(
            is_live=Case(When(expires_at__gt=now, then=Value(True)), default=Value(False)),
            job_seq=Subquery(job_seq),
        )

    @admin.display(description="job")
    def job_link(self, obj):
        seq = getattr(obj, "job_seq", None)
        if seq is None:
            return format_html("{} <span class=\"fq-raw\">(pruned)</span>", obj.job_uid)
        return _job_link(seq, obj.job_uid)

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, obj):
        return display.instant_short(obj.created_at)

    @admin.display(description="expires (UTC)", ordering="expires_at")
    def expires(self, obj):
        return display.instant_short(obj.expires_at)

    @admin.display(description="deduplicating", boolean=True)
    def live(self, obj):
        return bool(getattr(obj, "is_live", False))
