"""Controls in place: pause/resume and limits of a queue from its row, and deleting one finished job.

Each is a small POST form (CSRF-checked by Django's middleware) to a view of
its own, which needs the change permission and calls the same service as the
Python API: :func:`django_fq.services.pause` / :func:`~django_fq.services.resume`,
:func:`django_fq.services.configure` (whose validation decides what is valid:
a bad value is refused with its message naming the field, and nothing is
written) and :func:`django_fq.services.jobs.delete_finished`. What changed is
logged in the admin's history (``LogEntry``), as the bulk actions do. A
view-only user gets no controls and a 403 for a forged POST.
"""

from __future__ import annotations

import re

import django
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from .. import services as fq
from ..exceptions import FqError
from ..models import Queue
from ..services.jobs import DELETABLE, delete_finished
from ..services.queues import POLICY_BOUNDS
from . import display

#: The policy fields edited in place on the queue list, in this order.
LIMITS = ("concurrency", "key_concurrency", "rate_limit", "rate_window_ms", "key_rate_limit")
_LABELS = {
    "concurrency": "concurrency",
    "key_concurrency": "per-key concurrency",
    "rate_limit": "rate limit",
    "rate_window_ms": "rate window (ms)",
    "key_rate_limit": "per-key rate limit",
}
#: An integer as a form field may spell it; longer values are refused before any ``int()``.
_INTEGER = re.compile(r"[+-]?[0-9]{1,12}")


def _site(model_admin) -> str:
    return model_admin.admin_site.name


def _url(model_admin, name: str, pk) -> str:
    return display.pinned(reverse(f"admin:django_fq_{name}", args=[pk], current_app=_site(model_admin)))


# --- the queue list's controls column ---------------------------------------------------------


def attach(model_admin, request, queues) -> None:
    """Give each listed queue ``fq_controls`` (the URLs of its forms) when ``request`` may change queues."""
    if not model_admin.has_change_permission(request):
        return
    for q in queues:
        q.fq_controls = {
            "pause": _url(model_admin, "queue_pause", q.pk),
            "limits": _url(model_admin, "queue_limits", q.pk),
        }


def column(obj):
    """The queue list's controls cell: a pause/resume button and the limits, each bound to its own form.

    The forms themselves are outside the list's action form (nested forms are
    not HTML), after the list (``queue/change_list.html``); the inputs name
    them with ``form=``.
    """
    if not hasattr(obj, "fq_controls"):
        return ""
    pk = obj.pk
    verb = "Resume" if obj.paused else "Pause"
    fields = format_html_join(
        "",
        '<span class="fq-limit"><label for="fq-{}-{}">{}</label>'
        '<input type="number" inputmode="numeric" id="fq-{}-{}" name="{}" form="fq-limits-{}" value="{}" min="{}" max="{}" step="1" required></span>',
        ((pk, f, _LABELS[f], pk, f, f, pk, getattr(obj, f), *POLICY_BOUNDS[f]) for f in LIMITS),
    )
    rate = f"{obj.rate_limit} per {display.duration(obj.rate_window_ms)}" if obj.rate_limit else "no rate limit"
    summary = f"{obj.concurrency or 'unlimited'} at once · {rate}"
    return format_html(
        '<div class="fq-controls">'
        '<button type="submit" form="fq-pause-{}" name="op" value="{}" class="fq-control-pause" aria-label="{} queue {}">{}</button>'
        '<details class="fq-limits"><summary aria-label="Limits of queue {}: {}">Limits <span class="fq-limits-now">{}</span></summary>'
        '<div class="fq-limits-grid">{}</div>'
        '<button type="submit" form="fq-limits-{}" class="fq-control-save">Save limits</button>'
        "</details></div>",
        pk, verb.lower(), verb, obj.name, verb,
        obj.name, summary, summary,
        fields,
        pk,
    )  # fmt: skip


def change_context(model_admin, request, object_id, extra_context) -> dict:
    """A queue's page: the URL of its pause/resume form, when the user may change queues."""
    extra = dict(extra_context or {})
    if display.is_row_id(object_id) and model_admin.has_change_permission(request):
        obj = model_admin.get_object(request, object_id)
        if obj is not None:
            extra["fq_pause"] = {"url": _url(model_admin, "queue_pause", obj.pk), "paused": obj.paused}
    return extra


def _back(model_admin, request) -> HttpResponseRedirect:
    """Back to the page the form was on (``next``, this site's URLs only), else the queue list."""
    target = request.POST.get("next", "")
    if not (
        target
        and target.startswith("/")
        and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        )
    ):
        target = reverse("admin:django_fq_queue_changelist", current_app=_site(model_admin))
    return HttpResponseRedirect(target)


def _queue_for_post(model_admin, request, object_id) -> Queue:
    """The queue of a control's POST: 405 if not a POST, 403 without the change permission, 404 if there is none."""
    if request.method != "POST":
        raise _NotPost
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    obj = model_admin.get_object(request, object_id) if display.is_row_id(object_id) else None
    if obj is None:
        raise Http404("No such queue.")
    return obj


class _NotPost(Exception):
    pass


def pause_view(model_admin, request, object_id):
    """POST ``op=pause`` or ``op=resume``: call ``services.pause`` / ``resume`` on the queue; log a change."""
    try:
        obj = _queue_for_post(model_admin, request, object_id)
    except _NotPost:
        return HttpResponseNotAllowed(["POST"])
    op = request.POST.get("op")
    if op not in ("pause", "resume"):
        model_admin.message_user(request, "op: must be pause or resume; nothing was changed.", messages.ERROR)
        return _back(model_admin, request)
    verb, past = (fq.pause, "paused") if op == "pause" else (fq.resume, "resumed")
    try:
        res = verb(obj.name)
    except FqError as exc:
        model_admin.message_user(request, f"Queue {obj.name} was not {past}: {exc.message}", messages.ERROR)
        return _back(model_admin, request)
    if not res.changed:
        already = "already paused" if op == "pause" else "not paused"
        model_admin.message_user(request, f"Queue {obj.name} is {already}: unchanged.", messages.INFO)
        return _back(model_admin, request)
    since = f" (since {display.instant(res.paused_at)})" if res.paused else ""
    model_admin.log_change(request, obj, f"{past.capitalize()} through the admin{since}.")
    model_admin.message_user(request, f"Queue {obj.name} {past}{since}.", messages.SUCCESS)
    return _back(model_admin, request)


def parse_limits(data) -> tuple[dict[str, int], list[str]]:
    """The limit fields of a POST (``{field: int}``, empty values left out) and the errors naming a field.

    Only the shape is checked here (an integer of at most 12 digits); the
    bounds are the service's (:func:`django_fq.services.configure`).
    """
    values, errors = {}, []
    for name in LIMITS:
        raw = data.get(name, "")
        if not isinstance(raw, str) or not raw.strip():
            continue
        raw = raw.strip()
        if not _INTEGER.fullmatch(raw):
            errors.append(f"{name} must be an integer")
            continue
        values[name] = int(raw)
    return values, errors


def limits_view(model_admin, request, object_id):
    """POST the limit fields (:data:`LIMITS`): ``services.configure`` with the changed ones; log a change.

    An invalid value (not an integer, out of the service's bounds, or a
    combination it refuses) changes nothing; the message names the field.
    """
    try:
        obj = _queue_for_post(model_admin, request, object_id)
    except _NotPost:
        return HttpResponseNotAllowed(["POST"])
    values, errors = parse_limits(request.POST)
    if errors:
        model_admin.message_user(
            request, f"Limits of queue {obj.name} were not saved: {'; '.join(errors)}.", messages.ERROR
        )
        return _back(model_admin, request)
    before = fq.policy(obj.name)
    changes = {f: v for f, v in values.items() if getattr(before, f) != v}
    if not changes:
        model_admin.message_user(request, f"Limits of queue {obj.name} unchanged.", messages.INFO)
        return _back(model_admin, request)
    try:
        fq.configure(obj.name, **changes)
    except FqError as exc:
        model_admin.message_user(request, f"Limits of queue {obj.name} were not saved: {exc.message}.", messages.ERROR)
        return _back(model_admin, request)
    said = ", ".join(f"{f} {getattr(before, f)} → {v}" for f, v in changes.items())
    model_admin.log_change(request, obj, f"Limits changed through the admin: {said}.")
    model_admin.message_user(request, f"Limits of queue {obj.name} saved: {said}.", messages.SUCCESS)
    return _back(model_admin, request)


# --- deleting one finished job from its page -----------------------------------------------------


def delete_url(model_admin, request, obj) -> str:
    """The job page's *Delete job* link: for a succeeded or cancelled job, with the change permission; else ``""``."""
    state = getattr(obj, "reported", obj.state)
    if state not in DELETABLE or not model_admin.has_change_permission(request, obj):
        return ""
    return _url(model_admin, "job_delete_finished", obj.pk)


def delete_job_view(model_admin, request, object_id):
    """GET: a confirmation page; POST with ``post=yes``: ``services.jobs.delete_finished``, then the job list.

    A job that is not succeeded or cancelled (running, ready, dead, …) is
    refused with the reason on its page; nothing is deleted.
    """
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    obj = model_admin.get_object(request, object_id) if display.is_row_id(object_id) else None
    if obj is None:
        raise Http404("No such job.")
    site = _site(model_admin)
    job_url = display.pinned(reverse("admin:django_fq_job_change", args=[obj.pk], current_app=site))
    state = getattr(obj, "reported", obj.state)
    if state not in DELETABLE:
        model_admin.message_user(
            request,
            f"Job {obj.uid} was not deleted: it is {state}; only succeeded or cancelled jobs can be deleted (cancel it first).",
            messages.ERROR,
        )
        return HttpResponseRedirect(job_url)
    if request.method == "POST" and request.POST.get("post") == "yes":
        try:
            delete_finished(obj.queue.name, obj.uid)
        except FqError as exc:
            model_admin.message_user(request, f"Job {obj.uid} was not deleted: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(job_url)
        model_admin.log_deletions(request, [obj])  # the row is gone: the object itself is logged
        model_admin.message_user(request, f"Job {obj.uid} was deleted.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:django_fq_job_changelist", current_app=site))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Delete this job?",
        "subtitle": None,
        "opts": model_admin.opts,
        "app_label": model_admin.opts.app_label,
        "original": obj,
        "state": state,
        "finished_at": display.instant(obj.finished_at),
        "job_url": job_url,
        "action_url": _url(model_admin, "job_delete_finished", obj.pk),
        "fq_breadcrumbs_list": django.VERSION >= (6, 1),
    }
    request.current_app = site
    return TemplateResponse(request, "admin/django_fq/job/delete_finished.html", context)
