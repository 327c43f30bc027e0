"""Admin for jobs: a read-only list and detail, and repair through the service verbs.

Nothing here writes a job row itself. Retry, cancel and requeue call
:func:`django_fq.services.retry`, :func:`~django_fq.services.cancel` and
:func:`django_fq.services.jobs.requeue`, so the admin obeys the same rules and
shows the same error messages as the Python API, the CLI and the REST API.
Jobs are never added here, and deleted only as prune deletes them: finished ones
(docs/reference/semantics.md §9: cancel, then prune; :func:`django_fq.services.jobs.delete_finished`).

Receipts are never shown: the database has only their hashes (``Lease.
receipt_hash``, ``Job.settled_hash``) and a digest of the last settle's
arguments (``Job.settled_args``); none of them is a field of these pages.
"""

from __future__ import annotations

import django
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Exists, OuterRef
from django.db.models.functions import Left
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from .. import conf, db, storage, validation, workflows
from .. import services as fq
from ..exceptions import FqError
from ..models import QUEUED_STATES, Dependency, Job, Lease, Queue
from ..services._base import reported_state as reported_expression
from ..services.jobs import requeue
from ..types import STATE_NAMES, JobInfo
from . import bulk, controls, display, live, workflow
from . import search as job_search

#: Most jobs one bulk action handles; the message says when more were selected.
ACTION_LIMIT = 1000
#: Newest error history entries shown open on a job's page; older ones are folded away.
HISTORY_OPEN = 3
#: Failures named one by one in the message of a bulk action.
NAMED_FAILURES = 5
#: Columns never loaded for the list: large, or secret-adjacent (hashes of receipts).
LIST_DEFERRED = ("payload", "result", "errors", "last_error", "settled_hash", "settled_op", "settled_args", "settled_outcome")

#: The repair verbs: name -> (service function, button label, past tense, states it applies to).
VERBS = {
    # One style: a verb and its object, sentence case (as the admin's own "Save and add another").
    "retry": (fq.retry, "Retry job", "retried", ("dead",)),
    "requeue": (requeue, "Requeue job now", "requeued", ("scheduled",)),
    "cancel": (fq.cancel, "Cancel job", "cancelled", ("waiting", "scheduled", "ready", "running", "dead")),
}


def reported_state(qs, state: str):
    """``qs`` restricted to jobs whose reported state is ``state`` (database clock for scheduled/ready).

    With ``queue_id IN (every queue)``: the ``queue, state`` index's first
    column, so a rare state is found through the index, not by reading the
    table (PostgreSQL 15 cannot skip that column).
    """
    qs = qs.filter(queue_id__in=list(Queue.objects.using(conf.database()).values_list("pk", flat=True)))
    if state == "scheduled":
        return qs.filter(state__in=QUEUED_STATES, run_at__gt=db.DbNow())
    if state == "ready":
        return qs.filter(state__in=QUEUED_STATES, run_at__lte=db.DbNow())
    return qs.filter(state=state)


class StateFilter(admin.SimpleListFilter):
    """Filter by reported state: scheduled/ready are told apart by the database clock."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [(s, s) for s in STATE_NAMES]

    def queryset(self, request, queryset):
        value = self.value()
        if value in STATE_NAMES:
            return reported_state(queryset, value)
        return queryset


class TagFilter(admin.SimpleListFilter):
    """Filter by a tag of the jobs' metadata (``?tag=``): the tags of the newest tagged jobs, and the one asked for.

    The condition is the services' (``Store.filter_tag``: an escaped LIKE on
    the tags column, case-sensitive); a value that is not a valid tag filters
    nothing in and is not offered.
    """

    title = "tag"
    parameter_name = "tag"
    #: Newest tagged jobs whose tags are offered as choices.
    SAMPLE = 200

    def lookups(self, request, model_admin):
        tags: dict[str, None] = {}
        current = self.value()
        if current and validation.TAG.fullmatch(current):
            tags[current] = None
        rows = (
            Job.objects.using(conf.database())
            .filter(tags__isnull=False)
            .order_by("-seq")
            .values_list("tags", flat=True)[: self.SAMPLE]
        )
        for text in rows:
            for tag in (text or "").strip("|").split("|"):
                if tag:
                    tags.setdefault(tag, None)
        return [(t, t) for t in sorted(tags)[:100]]

    def has_output(self) -> bool:
        return True  # applied even with nothing to offer: a bad ?tag= must filter everything out

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        if not validation.TAG.fullmatch(value):
            return queryset.none()
        return storage.for_connection(db.connection()).filter_tag(queryset, value)


class JobAdmin(display.FqModelAdmin):
    """Jobs: list filtered by queue and state, exact search, read-only detail, repair actions."""

    class Media:
        css = {"all": ("django_fq/admin.css",)}

    list_display = (
        "uid", "queue", "state_badge", "priority", "attempts_of", "enqueued", "runs_at", "worker", "tag_list",
        "progress_bar", "error_head", "workflow_link",
    )  # fmt: skip
    list_filter = (("queue", display.QueueFilter), StateFilter, TagFilter)
    list_select_related = ("queue",)
    search_fields = ("uid", "idempotency", "unique_key", "concurrency_key")
    exact_search = ("uid", "idempotency", "unique_key", "concurrency_key")
    search_help_text = "Exact job id, idempotency token, unique key or concurrency key (more filters in \"Search jobs\")."
    # What a job-list URL may filter on: the list's own filters (queue, reported state) and exact ids.
    # Never payloads, results or errors (no contains/regex scans over every job), nor digests.
    url_lookups = {
        "queue": display.EXACT_OR_IN,
        "queue__id": display.EXACT_OR_IN,
        "queue__name": display.EXACT_OR_IN,
        "state": display.EXACT,
        "tag": display.EXACT,  # TagFilter's own parameter (an escaped LIKE on the tags column)
        "uid": display.EXACT_OR_IN,
        "worker": display.EXACT,
        "unique_key": display.EXACT,
        "idempotency": display.EXACT,
        "concurrency_key": display.EXACT,
    }
    ordering = ("-seq",)
    list_per_page = 50
    show_full_result_count = False
    actions = ("retry_selected", "requeue_selected", "cancel_selected", "delete_finished_jobs")
    fieldsets = (
        # The id is the page's title; it is not repeated as a field.
        (None, {"fields": ("queue", "state_badge", "priority", "attempts_of", "snoozes", "timeout", "unique_key", "idempotency", "concurrency_key")}),
        ("Times (database clock, UTC)", {"fields": ("enqueued_at_at", "run_at_at", "claimed_at_at", "changed_at_at", "finished_at_at")}),
        ("Lease", {"fields": ("lease_deadline", "lease_worker", "lease_generation")}),
        ("Dependencies", {"fields": ("depends_on_links", "dependents_links")}),
        ("Metadata", {"fields": ("tag_list", "metadata_pretty")}),
        ("Progress", {"fields": ("progress_full", "progress_at_at")}),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Result", {"fields": ("result_pretty",)}),
        ("Errors", {"fields": ("last_error_text", "error_history")}),
    )
    readonly_fields = tuple(str(f) for _, opts in fieldsets for f in opts["fields"])

    # --- queryset, search -------------------------------------------------------------

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .using(conf.database())
            .select_related("queue")
            .annotate(reported=reported_expression())
        )

    def get_changelist(self, request, **kwargs):
        return JobChangeList

    def get_ordering(self, request):
        """A search of one queue and one stored state lists by last change, newest first: the index's own order.

        Other lists keep the newest job first (by ``seq``): the primary key's
        backward scan stops after one page when matches are common, and the
        planner takes ``fq_job_state_changed`` when they are rare.
        """
        found = search_of(request)[1]
        if found is not None and found.index_ordered:
            return ("-changed_at", "-seq")
        return super().get_ordering(request)

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        return CappedPaginator(queryset, per_page, orphans, allow_empty_first_page)

    def changelist_view(self, request, extra_context=None):
        form, found = search_of(request)
        extra_context = dict(extra_context or {})
        can_repair = self.has_change_permission(request)
        bulk_links = []
        if can_repair and found is not None:
            query = request.GET.urlencode()
            info = self.opts.app_label, self.opts.model_name
            bulk_links = [
                {"verb": v, "label": label, "url": reverse("admin:{}_{}_bulk".format(*info), args=[v], current_app=self.admin_site.name) + "?" + query}
                for v, (_, label, _, _) in bulk.VERBS.items()
            ]
        extra_context.update(
            fq_search_form=form,
            fq_search=found,
            fq_search_open=form.is_active(),
            fq_search_errors=bulk.job_errors(form) if form.is_active() and found is None else [],
            fq_bulk_links=bulk_links,
            fq_candidates=job_search.CANDIDATES,
            **live.list_context(self, request),
        )
        return super().changelist_view(request, extra_context)

    def live_view(self, request):
        """The list's live numbers as JSON (:func:`django_fq.admin.live.job_list_data`)."""
        return live.job_list_data(self, request)

    def delete_finished_view(self, request, object_id):
        """Confirm, then delete one succeeded or cancelled job (:func:`django_fq.admin.controls.delete_job_view`)."""
        return controls.delete_job_view(self, request, object_id)

    def bulk_view(self, request, verb):
        """Apply ``verb`` to every job the list's search matches, in batches (:mod:`django_fq.admin.bulk`)."""
        return bulk.bulk_view(self, request, verb)

    # --- permissions: read-only rows; "change" means the right to repair -----------------

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    # --- list columns -------------------------------------------------------------------

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        state = getattr(obj, "reported", None) or obj.state
        return format_html('<span class="fq-state fq-state-{}">{}</span>', state, state)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_of(self, obj):
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description="enqueued (UTC)", ordering="enqueued_at")
    def enqueued(self, obj):
        return display.instant_short(obj.enqueued_at)

    @admin.display(description="run at (UTC)", ordering="run_at")
    def runs_at(self, obj):
        return display.instant_short(obj.run_at)

    @admin.display(description="last error")
    def error_head(self, obj):
        text = getattr(obj, "error_start", None)
        if text is None:
            text = obj.last_error
        text = (text or "").splitlines()[0] if text else ""
        return text[:100] + ("…" if len(text) > 100 else "") if text else ""

    @admin.display(description="workflow")
    def workflow_link(self, obj):
        """A link to the job's workflow graph when it has dependencies or dependents."""
        if not (obj.has_dependents or getattr(obj, "has_upstream", False)):
            return ""
        return format_html('<a href="{}" class="fq-workflow-link">graph</a>', self._workflow_url(obj.pk))

    def _workflow_url(self, pk) -> str:
        return reverse("admin:django_fq_job_workflow", args=[pk], current_app=self.admin_site.name)

    @admin.display(description="progress")
    def progress_bar(self, obj):
        """The last progress report (running jobs: how far they are; finished ones: how far they got)."""
        return _progress_html(obj, width=40)

    # --- detail fields ------------------------------------------------------------------

    @admin.display(description="last report")
    def progress_full(self, obj):
        return _progress_html(obj, width=200) if obj.progress is not None else "none"

    @admin.display(description="reported at")
    def progress_at_at(self, obj):
        return display.instant_html(obj.progress_at)

    @admin.display(description="timeout")
    def timeout(self, obj):
        return display.duration(obj.timeout_ms) if obj.timeout_ms else "none"

    @admin.display(description="enqueued at")
    def enqueued_at_at(self, obj):
        return display.instant_html(obj.enqueued_at)

    @admin.display(description="run at")
    def run_at_at(self, obj):
        return display.instant_html(obj.run_at)

    @admin.display(description="claimed at")
    def claimed_at_at(self, obj):
        return display.instant_html(obj.claimed_at)

    @admin.display(description="last change")
    def changed_at_at(self, obj):
        return display.instant_html(obj.changed_at)

    @admin.display(description="finished at")
    def finished_at_at(self, obj):
        return display.instant_html(obj.finished_at)

    def _lease(self, obj):
        if not hasattr(obj, "_fq_lease"):
            obj._fq_lease = (
                Lease.objects.using(conf.database())
                .filter(job_id=obj.pk)
                .only("deadline", "worker", "generation", "claimed_at")
                .first()
            )
        return obj._fq_lease

    @admin.display(description="lease deadline")
    def lease_deadline(self, obj):
        lease = self._lease(obj)
        if lease is None:
            return "no live lease"
        return display.instant_html(lease.deadline)

    @admin.display(description="worker")
    def lease_worker(self, obj):
        lease = self._lease(obj)
        worker = lease.worker if lease is not None else obj.worker
        return worker or display.EMPTY

    @admin.display(description="lease generation")
    def lease_generation(self, obj):
        return obj.generation

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return display.json_block(obj.payload_value)

    @admin.display(description="tags")
    def tag_list(self, obj):
        if not obj.tags:
            return display.EMPTY
        tags = [t for t in obj.tags.strip("|").split("|") if t]
        return format_html_join(" ", '<span class="fq-tag">{}</span>', ((t,) for t in tags))

    @admin.display(description="metadata")
    def metadata_pretty(self, obj):
        if obj.metadata is None:
            return display.EMPTY
        return display.json_block(validation.stored_json(obj.metadata, "metadata"))

    @admin.display(description="result")
    def result_pretty(self, obj):
        if obj.result is None:
            return display.EMPTY
        return display.json_block(obj.result_value)

    @admin.display(description="depends on")
    def depends_on_links(self, obj):
        return _edge_links(Dependency, {"job_id": obj.seq}, "upstream", self.admin_site.name)

    @admin.display(description="dependents")
    def dependents_links(self, obj):
        if not obj.has_dependents:
            return display.EMPTY
        return _edge_links(Dependency, {"upstream_id": obj.seq}, "job", self.admin_site.name)

    @admin.display(description="last error")
    def last_error_text(self, obj):
        if not obj.last_error:
            return display.EMPTY
        return format_html('<pre class="fq-error">{}</pre>', obj.last_error)

    @admin.display(description="history (newest first)")
    def error_history(self, obj):
        entries = [e for e in (obj.errors or []) if isinstance(e, dict)][::-1]
        if not entries:
            return display.EMPTY
        recent = _history_table(entries[:HISTORY_OPEN])
        if len(entries) <= HISTORY_OPEN:
            return recent
        older = len(entries) - HISTORY_OPEN
        return format_html(
            '{}<details class="fq-older"><summary>{} older entr{}</summary>{}</details>',
            recent,
            older,
            "y" if older == 1 else "ies",
            _history_table(entries[HISTORY_OPEN:]),
        )

    # --- detail page: read-only, with repair buttons -------------------------------------

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        # Before the verbs: "<path:object_id>/cancel/" would match ".../workflow/cancel/" and "bulk/cancel/" too.
        return [
            path("bulk/<str:verb>/", wrap(self.bulk_view), name="{}_{}_bulk".format(*info)),
            path(
                "<path:object_id>/workflow/cancel/",
                wrap(self.workflow_cancel_view),
                name="{}_{}_workflow_cancel".format(*info),
            ),
            path("<path:object_id>/workflow/", wrap(self.workflow_view), name="{}_{}_workflow".format(*info)),
            path("live/", wrap(self.live_view), name="{}_{}_live".format(*info)),
            path("<path:object_id>/delete-finished/", wrap(self.delete_finished_view), name="{}_{}_delete_finished".format(*info)),
        ] + [
            path(f"<path:object_id>/{verb}/", wrap(self.repair_view), {"verb": verb}, name="{}_{}_{}".format(*info, verb))
            for verb in VERBS
        ] + super().get_urls()

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        if request.method == "POST":
            # Jobs are not edited in place; repairs go through the buttons' own URLs.
            raise PermissionDenied
        extra_context = dict(extra_context or {})
        extra_context.update(
            show_save=False, show_save_and_continue=False, show_save_and_add_another=False, show_delete=False
        )
        obj = self.get_object(request, object_id) if object_id else None
        if obj is not None:
            extra_context["title"] = f"Job {obj.uid}"
            extra_context["subtitle"] = None  # Django would repeat the id below the title
            extra_context["fq_repair_buttons"] = self._buttons(request, obj)
            extra_context["fq_delete_url"] = controls.delete_url(self, request, obj)
            if obj.has_dependents or Dependency.objects.using(conf.database()).filter(job_id=obj.seq).exists():
                extra_context["fq_workflow_url"] = self._workflow_url(obj.pk)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def _buttons(self, request, obj) -> list[dict]:
        if not self.has_change_permission(request, obj):
            return []
        state = getattr(obj, "reported", obj.state)
        info = self.opts.app_label, self.opts.model_name
        return [
            {"verb": verb, "label": label, "url": display.pinned(reverse("admin:{}_{}_{}".format(*info, verb), args=[obj.pk], current_app=self.admin_site.name))}
            for verb, (_, label, _, states) in VERBS.items()
            if state in states
        ]

    def repair_view(self, request, object_id, verb):
        """POST only: apply ``verb`` to one job through its service function, then show the job again."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, object_id)
        if obj is None:
            # ModelAdmin's own helper for a missing object (private, so not in the stubs).
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        fn, _, past, _ = VERBS[verb]
        try:
            info = fn(obj.queue.name, obj.uid)
        except FqError as exc:
            self.message_user(request, f"Job {obj.uid} was not {past}: {exc.message}", messages.ERROR)
        else:
            self.log_change(request, obj, f"{past.capitalize()} through the admin; now {info.state}.")
            self.message_user(request, f"Job {obj.uid} {past}: it is now {info.state}.", messages.SUCCESS)
        return HttpResponseRedirect(
            reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[obj.pk], current_app=self.admin_site.name)
        )

    # --- the workflow page: the graph of the jobs connected by dependencies ----------------

    def _workflow_job(self, request, object_id):
        """The job of a workflow URL, or 404 (not an id, no such job, a job whose queue is gone)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if not display.is_row_id(object_id):
            raise Http404("No such job.")
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404("No such job.")
        return obj

    def workflow_view(self, request, object_id):
        """The workflow of one job as an SVG graph and a table (docs/admin.md "Workflow graph")."""
        obj = self._workflow_job(request, object_id)
        graph = workflow.read(obj.uid)
        site = self.admin_site.name

        def url_of(seq):
            return reverse("admin:django_fq_job_change", args=[seq], current_app=site)

        drawn = workflow.drawing(graph, url_of=url_of) if graph.drawable else None
        unfinished = sum(1 for n in graph.nodes.values() if n.reported not in ("succeeded", "cancelled"))
        context = {
            **self.admin_site.each_context(request),
            **self._workflow_context(obj),
            "title": f"Workflow of job {obj.uid}",
            "graph": graph,
            "drawn": drawn,
            "steps": workflow.rows(graph, url_of=url_of),
            "counts": workflow.counts(graph),
            "n_steps": len(graph.nodes),
            "states": workflow.STATES,
            "policies": workflow.POLICIES,
            "draw_limit": workflow.DRAW_LIMIT,
            "edge_limit": workflow.EDGE_LIMIT,
            "unfinished": unfinished,
            "can_cancel": self.has_change_permission(request, obj) and unfinished > 0,
            "cancel_url": display.pinned(reverse("admin:django_fq_job_workflow_cancel", args=[obj.pk], current_app=site)),
        }
        request.current_app = site
        return TemplateResponse(request, "admin/django_fq/job/workflow.html", context)

    def workflow_cancel_view(self, request, object_id):
        """GET: a confirmation page; POST (CSRF-checked): cancel every unfinished job of the workflow."""
        obj = self._workflow_job(request, object_id)
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        back = self._workflow_url(obj.pk)
        if request.method == "POST":
            try:
                done = workflows.cancel(obj.queue.name, obj.uid)
            except FqError as exc:
                self.message_user(request, f"The workflow of job {obj.uid} was not cancelled: {exc.message}", messages.ERROR)
            else:
                self.log_change(request, obj, f"Workflow cancelled through the admin: {done.cancelled} unfinished jobs.")
                self.message_user(
                    request,
                    f"Workflow of job {obj.uid} cancelled: {done.cancelled} unfinished job"
                    f"{'s' if done.cancelled != 1 else ''} cancelled, {done.finished} already finished.",
                    messages.SUCCESS,
                )
            return HttpResponseRedirect(back)
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET", "POST"])
        graph = workflow.read(obj.uid)
        context = {
            **self.admin_site.each_context(request),
            **self._workflow_context(obj),
            "title": "Cancel this workflow?",
            "counts": workflow.counts(graph),
            "n_steps": len(graph.nodes),
            "truncated": graph.truncated,
            "unfinished": sum(1 for n in graph.nodes.values() if n.reported not in ("succeeded", "cancelled")),
            "draw_limit": workflow.DRAW_LIMIT,
            "workflow_url": back,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_fq/job/workflow_cancel.html", context)

    def _workflow_context(self, obj) -> dict:
        return {
            "subtitle": None,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "original": obj,
            "job_url": reverse("admin:django_fq_job_change", args=[obj.pk], current_app=self.admin_site.name),
            "workflow_url": self._workflow_url(obj.pk),
            "fq_breadcrumbs_list": django.VERSION >= (6, 1),
        }

    # --- bulk actions ---------------------------------------------------------------------

    @admin.action(description="Retry selected dead jobs", permissions=["change"])
    def retry_selected(self, request, queryset):
        return self._apply(request, queryset, "retry")

    @admin.action(description="Requeue selected scheduled jobs now", permissions=["change"])
    def requeue_selected(self, request, queryset):
        return self._apply(request, queryset, "requeue")

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_selected(self, request, queryset):
        return self._apply(request, queryset, "cancel")

    @admin.action(description="Delete selected finished jobs", permissions=["change"])
    def delete_finished_jobs(self, request, queryset):
        return self._apply(request, queryset, "delete")

    def _apply(self, request, queryset, verb: str):
        """Call the service verb for each selected job (one transaction each); report per job.

        "Select all" of the list's matches (Django's ``select_across``) goes to the
        bulk page instead, which handles every match in batches (:mod:`django_fq.admin.bulk`).
        """
        if request.POST.get("select_across") == "1":
            names = self.opts.app_label, self.opts.model_name
            url = reverse("admin:{}_{}_bulk".format(*names), args=[verb], current_app=self.admin_site.name)
            return HttpResponseRedirect(display.pinned(url + "?" + request.GET.urlencode()))  # the database the list showed
        fn = VERBS[verb][0] if verb in VERBS else bulk.VERBS[verb][0]  # delete: only in bulk.VERBS
        past = bulk.VERBS[verb][2]
        rows = list(queryset.order_by("seq").values_list("seq", "uid", "queue__name")[: ACTION_LIMIT + 1])
        more = len(rows) > ACTION_LIMIT
        done, failed = 0, []
        for seq, uid, queue in rows[:ACTION_LIMIT]:
            try:
                info: JobInfo | None = fn(queue, uid)
            except FqError as exc:
                failed.append((uid, exc.message))
            else:
                done += 1
                now = f"now {info.state}" if info is not None else "it is gone"
                self.log_change(request, Job(seq=seq, uid=uid), f"{past.capitalize()} through the admin; {now}.")
        if done:
            self.message_user(request, f"{done} job{'s' if done != 1 else ''} {past}.", messages.SUCCESS)
        for uid, message in failed[:NAMED_FAILURES]:
            self.message_user(request, f"Job {uid} was not {past}: {message}", messages.ERROR)
        if len(failed) > NAMED_FAILURES:
            self.message_user(request, f"{len(failed) - NAMED_FAILURES} more jobs were not {past}.", messages.ERROR)
        if more:
            self.message_user(
                request,
                f"Only the first {ACTION_LIMIT} selected jobs were handled; run the action again for the rest.",
                messages.WARNING,
            )


def _history_table(entries: list[dict]):
    """Error history entries as an escaped table: time, attempt, kind, worker, text."""
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre class=\"fq-error\">{}</pre></td></tr>",
        (
            (
                display.instant(e.get("at")) if isinstance(e.get("at"), int) else display.EMPTY,
                e.get("attempt", ""),
                e.get("kind", ""),
                e.get("worker") or display.EMPTY,
                e.get("error") or "",
            )
            for e in entries
        ),
    )
    # In a box that scrolls sideways: a wide table never widens the page on a phone (admin.css).
    return format_html(
        '<div class="fq-scroll-x"><table class="fq-history"><thead><tr><th>at (UTC)</th><th>attempt</th>'
        "<th>kind</th><th>worker</th><th>error</th></tr></thead><tbody>{}</tbody></table></div>",
        rows,
    )


def _progress_html(job: Job, *, width: int) -> str:
    """A ``<progress>`` bar, the percentage and the message (cut to ``width`` characters), escaped; ``""`` if none."""
    if job.progress is None:
        return ""
    text = job.progress_message or ""
    text = text[:width] + ("…" if len(text) > width else "")
    return format_html(
        '<span class="fq-nowrap"><progress max="100" value="{}">{}%</progress> {}%</span> {}',
        f"{job.progress:g}",
        f"{job.progress:g}",
        f"{job.progress:g}",
        text,
    )


#: Edges listed on a job's page, each way (the job's dependencies are at most 1,000 anyway).
EDGES_SHOWN = 1000


def _edge_links(model, where: dict, other: str, site: str):
    """The jobs at the other end of a job's edges: a link, the queue, the state, the edge's policy and name each."""
    reported = reported_expression(f"{other}__")
    rows = list(
        model.objects.using(conf.database())
        .filter(**where)
        .annotate(reported=reported)
        .order_by(f"{other}_id")
        .values_list(
            f"{other}_id", f"{other}__uid", f"{other}__queue__name", "reported", "on_failure", "pending", "name"
        )[: EDGES_SHOWN + 1]
    )
    if not rows:
        return display.EMPTY
    items = format_html_join(
        "",
        '<li>{}<a href="{}">{}</a> ({}) <span class="fq-state fq-state-{}">{}</span> on failure: {}{}</li>',
        (
            (
                format_html("<code>{}</code> ", name) if name is not None else "",
                reverse("admin:django_fq_job_change", args=[seq], current_app=site),
                uid,
                queue,
                state,
                state,
                policy,
                " (pending)" if pending else "",
            )
            for seq, uid, queue, state, policy, pending, name in rows[:EDGES_SHOWN]
        ),
    )
    more = format_html("<p>the first {} are shown</p>", EDGES_SHOWN) if len(rows) > EDGES_SHOWN else ""
    return format_html('<ul class="fq-edges">{}</ul>{}', items, more)


# The job list's count stops past COUNT_CAP, as the dashboard's do (display.AtLeast).
COUNT_CAP = display.COUNT_CAP
AtLeast = display.AtLeast


class CappedPaginator(Paginator):
    """The job list's paginator: counts at most :data:`COUNT_CAP` + 1 matches.

    An exact count of a common queue or state reads most of the table on
    every page load; a count over the list's own ordered query with a LIMIT
    stops after that many index entries.
    """

    @cached_property
    def count(self) -> int:
        # Neither the list's order nor its per-row columns (reported state, error start, has_upstream)
        # change how many rows there are: without them the planner takes the filters' index, and
        # no subquery runs for each of the 10,001 rows.
        rows = self.object_list.order_by().values("pk")  # type: ignore[attr-defined]  # a QuerySet (jobs or history)
        n = rows[: COUNT_CAP + 1].count()
        return AtLeast(n) if n > COUNT_CAP else n


def search_of(request) -> tuple[job_search.SearchForm, job_search.Search | None]:
    """The job list's search form for ``request`` and its :class:`~.search.Search` (valid and filled in), once per request.

    The search's boundary (:meth:`~.search.Search.find_boundary`) is found
    here, unless a bulk action froze it (``request._fq_frozen``).
    """
    cached = getattr(request, "_fq_search_pair", None)
    if cached is None:
        form, found = job_search.parse(request.GET)
        if found is not None:
            if getattr(request, "_fq_frozen", False):
                found.boundary = request._fq_boundary
            else:
                found.find_boundary()
        cached = (form, found)
        request._fq_search_pair = cached
    return cached


class JobChangeList(ChangeList):
    """The job list never loads payloads, results, histories or settle hashes; it applies the search form."""

    def get_filters_params(self, params=None):
        # The search form's parameters are not field lookups: the form reads them (search_of).
        lookup = super().get_filters_params(params)
        for key in [k for k in lookup if k.startswith(f"{job_search.PREFIX}-")]:
            del lookup[key]
        return lookup

    def get_queryset(self, request, *args, **kwargs):
        qs = super().get_queryset(request, *args, **kwargs)
        form, found = search_of(request)
        if found is not None:
            qs = found.apply(qs)
        elif form.is_active():
            qs = qs.none()  # the errors are shown above the list
        # has_upstream: by the (job, upstream) unique index, for the page's rows only.
        upstream = Dependency.objects.filter(job_id=OuterRef("seq"))
        return qs.defer(*LIST_DEFERRED).annotate(error_start=Left("last_error", 200), has_upstream=Exists(upstream))
