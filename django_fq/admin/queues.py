"""Admin for queues: live counts, totals and times; policy through ``configure``; delete through ``delete_queue``.

Also serves the dashboard page (``admin:django_fq_dashboard``).
"""

from __future__ import annotations

from types import SimpleNamespace

import django
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from .. import conf, routing
from .. import services as fq
from ..exceptions import FqError
from ..models import IdempotencyToken, Lease, Queue
from ..services.queues import POLICY_BOUNDS
from ..types import STATE_NAMES, TIMING_NAMES, TOTAL_NAMES, QueuePolicy
from . import controls, dashboard, display, history, live
from .jobs import ACTION_LIMIT, NAMED_FAILURES

#: The policy fields, in the order of docs/reference/semantics.md §2.
POLICY = tuple(QueuePolicy.__dataclass_fields__)

_MEANING = {
    "concurrency": "most jobs of this queue running at once, across all workers; 0 = unlimited",
    "max_attempts": "copied onto each job at enqueue (changing it affects future jobs only)",
    "backoff_ms": "base of the exponential retry delay, in ms",
    "max_backoff_ms": "cap of the retry delay, in ms; at least the backoff",
    "visibility_ms": "default lease length of a claim, in ms",
    "idempotency_retention_ms": "how long an idempotency token deduplicates, in ms",
    "timeout_ms": "a running job past this is failed with a timeout, in ms; 0 = none",
    "ttl_ms": "the queue is deleted once it has been empty and idle this long, in ms; 0 = never",
    "key_concurrency": "most jobs of one concurrency key running at once; 0 = unlimited",
    "rate_limit": "claims allowed in any window of the rate window, across all workers; 0 = no rate limit",
    "rate_window_ms": "the sliding window of the rate limit and of the per-key rate limit, in ms",
    "key_rate_limit": "claims of one concurrency key allowed in any window of the rate window; 0 = no per-key rate limit",
}


def _help(name: str) -> str:
    lo, hi = POLICY_BOUNDS[name]
    unit = "" if name in ("concurrency", "max_attempts", "key_concurrency", "rate_limit", "key_rate_limit") else f" ({display.duration(lo)} – {display.duration(hi)})"
    return f"{_MEANING[name]}. Allowed: {lo}–{hi}{unit}."


class _Trial(Exception):
    """Raised to roll back the trial ``configure`` of :meth:`QueuePolicyForm.clean`."""


class QueuePolicyForm(forms.ModelForm):
    """A queue's name (on add) and policy.

    Validation is the service's own: :meth:`clean` runs
    :func:`django_fq.services.configure` in a savepoint that is always rolled
    back, and puts any :class:`~django_fq.exceptions.FqError` on the field it
    names, with the service's message. The admin's save then calls
    ``configure`` for real.
    """

    class Meta:
        model = Queue
        fields = ("name", *POLICY)
        help_texts = {name: _help(name) for name in POLICY}

    def policy_changes(self) -> dict[str, int]:
        """The policy values to send to ``configure``: all on add, the changed ones on change."""
        adding = self.instance._state.adding
        return {
            f: self.cleaned_data[f]
            for f in POLICY
            if f in self.cleaned_data and self.cleaned_data[f] is not None and (adding or f in self.changed_data)
        }

    def queue_name(self) -> str | None:
        if not self.instance._state.adding:
            return self.instance.name
        return self.cleaned_data.get("name")

    def clean(self):
        data = super().clean()
        name = self.queue_name()
        if self.errors or not name:
            return data
        if self.instance._state.adding and routing.enabled() and routing.alias_for(name) != conf.database():
            # The page shows one database; a queue made here that the mapping sends elsewhere
            # would be left behind, served by no worker and seen by no verb.
            home = routing.alias_for(name)
            self.add_error(
                "name",
                f"queue {name} is on database {home!r} (FQ_QUEUE_DATABASES), but this page shows "
                f"{conf.database()!r}: add it from the queue list of database {home} (?fq_db={home})",
            )
            return data
        try:
            with transaction.atomic(using=conf.database()):
                fq.configure(name, **self.policy_changes())
                raise _Trial
        except _Trial:
            pass
        except FqError as exc:
            field = "name" if exc.field == "queue" else exc.field
            if field not in self.fields:
                field = None
            self.add_error(field, exc.message)
        return data


class QueueChangeList(ChangeList):
    """Adds the counter totals of the page's queues, read in one grouped query."""

    def get_results(self, request):
        super().get_results(request)
        totals = dashboard.counter_totals(q.pk for q in self.result_list)
        for q in self.result_list:
            q.fq_totals = totals.get(q.pk) or dict.fromkeys(TOTAL_NAMES, 0)
        controls.attach(self.model_admin, request, self.result_list)


#: States whose non-zero counts stand out (the admin's error colours, see django_fq/admin.css).
ALERT_STATES = frozenset({"dead"})


def _job_list_url(queue_id: int, state: str | None = None) -> str:
    url = reverse("admin:django_fq_job_changelist") + f"?queue__id__exact={queue_id}"
    return url + (f"&state={state}" if state else "")


def _count_column(state: str):
    @admin.display(description=state, ordering=f"n_{state}")
    def column(self, obj):
        n = getattr(obj, f"n_{state}", 0) or 0
        if not n:
            return "0"
        if state in ALERT_STATES:
            return format_html('<a class="fq-alert" href="{}">{}</a>', _job_list_url(obj.pk, state), n)
        return format_html('<a href="{}">{}</a>', _job_list_url(obj.pk, state), n)

    column.__name__ = f"count_{state}"
    return column


class QueueAdmin(display.FqModelAdmin):
    """Queues with their counts per state, totals, average wait and run time, and policy."""

    class Media:
        css = {"all": ("django_fq/admin.css",)}

    form = QueuePolicyForm
    list_display = (
        "name",
        "paused_column",
        *(f"count_{s}" for s in STATE_NAMES),
        "total_enqueued",
        "total_acked",
        "total_failed",
        "avg_wait",
        "avg_run",
    )
    list_filter = ("paused",)
    actions = ("pause_selected", "resume_selected")
    search_fields = ("name",)
    url_lookups = {"id": display.EXACT_OR_IN, "name": display.EXACT_OR_IN, "paused": display.EXACT}
    ordering = ("name",)
    list_per_page = 100
    show_full_result_count = False

    count_waiting = _count_column("waiting")
    count_scheduled = _count_column("scheduled")
    count_ready = _count_column("ready")
    count_running = _count_column("running")
    count_succeeded = _count_column("succeeded")
    count_dead = _count_column("dead")
    count_cancelled = _count_column("cancelled")

    # --- queryset ---------------------------------------------------------------------

    def get_queryset(self, request):
        return super().get_queryset(request).using(conf.database()).annotate(**dashboard.count_annotations())

    def get_changelist(self, request, **kwargs):
        return QueueChangeList

    def get_actions(self, request, action_location=None):
        # The generic bulk delete would bypass delete_queue; deleting goes through
        # the per-queue confirmation page instead. (``action_location``: Django 6.1+.)
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        actions.pop("delete_selected", None)
        return actions

    # --- pause and resume: bulk actions through the services ---------------------------------

    @admin.action(description="Pause selected queues", permissions=["change"])
    def pause_selected(self, request, queryset):
        self._pause(request, queryset, pause=True)

    @admin.action(description="Resume selected queues", permissions=["change"])
    def resume_selected(self, request, queryset):
        self._pause(request, queryset, pause=False)

    def _pause(self, request, queryset, *, pause: bool) -> None:
        """Call ``pause`` / ``resume`` for each selected queue; log each queue it changed in the admin's history."""
        verb, past = (fq.pause, "paused") if pause else (fq.resume, "resumed")
        rows = list(queryset.order_by("name").values_list("pk", "name")[: ACTION_LIMIT + 1])
        changed, unchanged, failed = 0, 0, []
        for pk, name in rows[:ACTION_LIMIT]:
            try:
                res = verb(name)
            except FqError as exc:
                failed.append((name, exc.message))
                continue
            if not res.changed:
                unchanged += 1
                continue
            changed += 1
            since = f" (since {display.instant(res.paused_at)})" if res.paused else ""
            self.log_change(request, Queue(pk=pk, name=name), f"{past.capitalize()} through the admin{since}.")
        if changed:
            self.message_user(request, f"{changed} queue{'s' if changed != 1 else ''} {past}.", messages.SUCCESS)
        if unchanged:
            already = "already paused" if pause else "not paused"
            self.message_user(request, f"{unchanged} queue{'s' if unchanged != 1 else ''} {already}: unchanged.", messages.INFO)
        for name, message in failed[:NAMED_FAILURES]:
            self.message_user(request, f"Queue {name} was not {past}: {message}", messages.ERROR)
        if len(failed) > NAMED_FAILURES:
            self.message_user(request, f"{len(failed) - NAMED_FAILURES} more queues were not {past}.", messages.ERROR)
        if len(rows) > ACTION_LIMIT:
            self.message_user(
                request,
                f"Only the first {ACTION_LIMIT} selected queues were handled; run the action again for the rest.",
                messages.WARNING,
            )

    # --- list columns -------------------------------------------------------------------

    def get_list_display(self, request):
        """The columns, and the controls in place (pause/resume, limits) for a user who may change queues."""
        shown = super().get_list_display(request)
        return (*shown, "queue_controls") if self.has_change_permission(request) else shown

    @admin.display(description="controls")
    def queue_controls(self, obj):
        return controls.column(obj)

    @admin.display(description="paused", ordering="paused")
    def paused_column(self, obj):
        if not obj.paused:
            return "no"
        return format_html('<span class="fq-paused" title="since {}">paused</span>', display.instant(obj.paused_at))

    def _total(self, obj, *names) -> int:
        t = getattr(obj, "fq_totals", None) or {}
        return sum(t.get(n, 0) for n in names)

    @admin.display(description="enqueued")
    def total_enqueued(self, obj):
        return self._total(obj, "enqueued")

    @admin.display(description="acked")
    def total_acked(self, obj):
        return self._total(obj, "acked")

    @admin.display(description="failed attempts")
    def total_failed(self, obj):
        n = self._total(obj, "nacked", "expired", "timed_out")
        return format_html('<span class="fq-alert">{}</span>', n) if n else "0"

    @admin.display(description="avg wait")
    def avg_wait(self, obj):
        t = getattr(obj, "fq_totals", None) or {}
        return format_html('<span class="fq-nowrap">{}</span>', display.average(t.get("wait_ms_sum", 0), t.get("wait_count", 0)))

    @admin.display(description="avg run")
    def avg_run(self, obj):
        t = getattr(obj, "fq_totals", None) or {}
        return format_html('<span class="fq-nowrap">{}</span>', display.average(t.get("run_ms_sum", 0), t.get("run_count", 0)))

    # --- change form --------------------------------------------------------------------

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [(None, {"fields": ["name"]}), ("Policy", {"fields": list(POLICY)})]
        return [
            (None, {"fields": ["name", "created", "pause_state"]}),
            ("Policy", {"fields": list(POLICY)}),
            ("Jobs and statistics", {"fields": ["state_counts", "all_totals", "times"]}),
        ]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("name", "created", "pause_state", "state_counts", "all_totals", "times")

    def _stats(self, obj):
        if not hasattr(obj, "_fq_stats"):
            # The page's own capped counts (get_queryset's count_annotations) and the counter sums:
            # fq.stats would count every succeeded job of a big queue on each view of the page.
            totals = dashboard.counter_totals([obj.pk])[obj.pk]
            obj._fq_stats = SimpleNamespace(
                counts=dashboard.counts_of(obj), totals=totals, **{n: totals[n] for n in TIMING_NAMES}
            )
        return obj._fq_stats

    @admin.display(description="created at")
    def created(self, obj):
        return display.instant_html(obj.created_at)

    @admin.display(description="claims")
    def pause_state(self, obj):
        if not obj.paused:
            return "running: claims take jobs"
        return format_html(
            '<span class="fq-paused">paused</span> since {}: claims hand out no job (use "Resume queue" above, or the "Resume selected queues" action of the list)',
            display.instant_html(obj.paused_at),
        )

    @admin.display(description="jobs by state")
    def state_counts(self, obj):
        counts = self._stats(obj).counts
        cells = format_html_join(
            "", '<td><a href="{}">{}</a></td>', ((_job_list_url(obj.pk, s), counts.get(s, 0)) for s in STATE_NAMES)
        )
        heads = format_html_join("", "<th>{}</th>", ((s,) for s in STATE_NAMES))
        return format_html('<table class="fq-mini"><tr>{}</tr><tr>{}</tr></table>', heads, cells)

    @admin.display(description="totals")
    def all_totals(self, obj):
        totals = self._stats(obj).totals
        heads = format_html_join("", "<th>{}</th>", ((n.replace("_", " "),) for n in TOTAL_NAMES))
        cells = format_html_join("", "<td>{}</td>", ((totals.get(n, 0),) for n in TOTAL_NAMES))
        return format_html('<table class="fq-mini"><tr>{}</tr><tr>{}</tr></table>', heads, cells)

    @admin.display(description="observed times")
    def times(self, obj):
        s = self._stats(obj)
        return format_html(
            "average wait {} over {} claims; average run {} over {} acks",
            display.average(s.wait_ms_sum, s.wait_count),
            s.wait_count,
            display.average(s.run_ms_sum, s.run_count),
            s.run_count,
        )

    def save_model(self, request, obj, form, change):
        """Apply the policy through ``configure`` (which also creates a new queue)."""
        name = form.queue_name()
        fq.configure(name, **form.policy_changes())
        fresh = Queue.objects.using(conf.database()).get(name=name)
        for field in Queue._meta.concrete_fields:
            setattr(obj, field.attname, getattr(fresh, field.attname))
        obj._state.adding = False
        obj._state.db = fresh._state.db

    # --- delete: a confirmation page, then delete_queue ------------------------------------

    def delete_model(self, request, obj):
        fq.delete_queue(obj.name)

    def delete_queryset(self, request, queryset):
        for name in queryset.values_list("name", flat=True):
            fq.delete_queue(name)

    def delete_view(self, request, object_id, extra_context=None):
        """Confirm with the numbers of what goes (jobs by state, leases, tokens), then call ``delete_queue``."""
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            # ModelAdmin's own helper for a missing object (private, so not in the stubs).
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        if not self.has_delete_permission(request, obj):
            raise PermissionDenied
        changelist = reverse("admin:django_fq_queue_changelist", current_app=self.admin_site.name)
        if request.method == "POST" and request.POST.get("post") == "yes":
            try:
                fq.delete_queue(obj.name)
            except FqError as exc:
                self.message_user(request, f"Queue {obj.name} was not deleted: {exc.message}", messages.ERROR)
            else:
                # The queue is gone by now, so the object itself (not a queryset) is logged.
                self.log_deletions(request, [obj])  # type: ignore[arg-type]
                self.message_user(request, f"Queue {obj.name} was deleted with all its jobs.", messages.SUCCESS)
            return HttpResponseRedirect(changelist)
        counts = dashboard.counts_of(obj)
        db_alias = conf.database()
        context = {
            **self.admin_site.each_context(request),
            "title": "Are you sure?",
            "subtitle": None,
            "object_name": str(self.opts.verbose_name),
            "object": obj,
            "escaped_object": str(obj),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "media": self.media,
            "is_popup": False,
            "to_field": None,
            "perms_lacking": None,
            "protected": None,
            "deleted_objects": [],
            "model_count": [],
            "fq_counts": [(s, counts[s]) for s in STATE_NAMES],
            "fq_jobs": sum(counts.values()),
            "fq_leases": Lease.objects.using(db_alias).filter(queue_id=obj.pk).count(),
            "fq_tokens": IdempotencyToken.objects.using(db_alias).filter(queue_id=obj.pk).count(),
            # Posted to a URL naming the database shown: the queue deleted is the one this page counted.
            "fq_form_url": display.pinned(request.path),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_fq/queue/delete_confirmation.html", context)

    # --- dashboard ----------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return super().change_view(request, object_id, form_url, controls.change_context(self, request, object_id, extra_context))

    def dashboard_live_view(self, request):
        """The dashboard's numbers as JSON, for its live updates (:func:`django_fq.admin.live.dashboard_data`)."""
        return live.dashboard_data(self, request)

    def pause_control_view(self, request, object_id):
        """POST: pause or resume one queue from its row or page (:func:`django_fq.admin.controls.pause_view`)."""
        return controls.pause_view(self, request, object_id)

    def limits_control_view(self, request, object_id):
        """POST: change one queue's limits from its row (:func:`django_fq.admin.controls.limits_view`)."""
        return controls.limits_view(self, request, object_id)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("dashboard/live/", wrap(self.dashboard_live_view), name="django_fq_dashboard_live"),
            path("<path:object_id>/pause-control/", wrap(self.pause_control_view), name="django_fq_queue_pause"),
            path("<path:object_id>/limits-control/", wrap(self.limits_control_view), name="django_fq_queue_limits"),
            path("dashboard/", self.admin_site.admin_view(self.dashboard_view), name="django_fq_dashboard"),
            path("history.json", self.admin_site.admin_view(self.history_json_view), name="django_fq_history"),
            *super().get_urls(),
        ]

    def history_json_view(self, request):
        """The history series as JSON (django_fq.admin.history.json_view; view permission)."""
        return history.json_view(self, request)

    def dashboard_view(self, request):
        """Counts of the busiest queues and the last hour's activity as an inline SVG chart (no JavaScript).

        With thousands of queues the page stays small: the table lists at most
        :data:`~django_fq.admin.dashboard.DASHBOARD_QUEUES` queues (those with the
        most unfinished jobs) and links to the queue list for the rest.
        """
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        db_alias = conf.database()
        shown = dashboard.busiest_queue_ids(dashboard.DASHBOARD_QUEUES)
        by_id = {q.pk: q for q in Queue.objects.using(db_alias).filter(pk__in=shown).annotate(**dashboard.count_annotations())}
        rows = [by_id[pk] for pk in shown if pk in by_id]
        n_queues = Queue.objects.using(db_alias).count()
        totals = dashboard.counter_totals(q.pk for q in rows)
        selected = None
        name = request.GET.get("queue") or ""
        if name and not display.has_nul(name):
            selected = next((q for q in rows if q.name == name), None) or (
                Queue.objects.using(db_alias).filter(name=name).only("id", "name").first()
            )
        act = dashboard.activity(selected.pk if selected is not None else None)
        table = []
        for q in rows:
            t = totals.get(q.pk, {})
            counts = dashboard.counts_of(q)
            table.append(
                {
                    "name": q.name,
                    "paused": q.paused,
                    "paused_at": display.instant(q.paused_at) if q.paused else "",
                    "url": reverse("admin:django_fq_queue_change", args=[q.pk], current_app=self.admin_site.name),
                    "cells": [(s, counts[s], _job_list_url(q.pk, s)) for s in STATE_NAMES],
                    **dashboard.totals_row(t),
                }
            )
        all_counts = dashboard.all_counts()
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "subtitle": None,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "queues": table,
            "n_queues": n_queues,
            "queue_list_url": reverse("admin:django_fq_queue_changelist", current_app=self.admin_site.name),
            "all_counts": [(s, all_counts[s]) for s in STATE_NAMES],
            "states": STATE_NAMES,
            "selected": selected.name if selected is not None else "",
            "unknown_queue": bool(name) and selected is None,
            "chart": dashboard.chart(act),
            "now": display.instant(act.now),
            **live.dashboard_live_context(self),
            # Django 6.1's admin styles an ``ol.breadcrumbs`` of ``li`` items; 5.2 to 6.0 a ``div``.
            "fq_breadcrumbs_list": django.VERSION >= (6, 1),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_fq/dashboard.html", context)
