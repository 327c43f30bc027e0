"""Bulk repair of every job a search matches, in batches, with a progress page.

Why batches of requests rather than one long request or an fq job: a job per
job-verb through the service (each its own short transaction, as the one-job
buttons) costs a few milliseconds, so 5,000 matches take seconds to tens of
seconds: longer than a web server's request timeout. A job on an internal
queue would need a worker consuming that queue on every site, and an admin
page waiting on a worker that is not there shows nothing at all. So each POST
handles one batch of :data:`BATCH` matches and answers with the progress; the
page posts the next batch by itself (a small script; without JavaScript, a
button), until none is left. The state between batches (the search, a cursor
over the matches in sequence order, the highest sequence number at the start,
the counts) travels signed in the form, so the server keeps nothing.

A match that the verb does not apply to is refused and counted by its state
(a running job is not retried); a refusal by the service itself (a race, a
unique key held by another job) is counted by its message. Every job the verb
changed gets an entry in the admin's history (``LogEntry``), one insert per
batch.
"""

from __future__ import annotations

import copy
from collections import Counter

from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ALL_VAR, ERROR_FLAG, PAGE_VAR
from django.core import signing
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db import DatabaseError
from django.db.models import Max
from django.http import HttpResponseNotAllowed, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import conf, db, routing
from ..exceptions import FqError
from ..models import Job
from ..services.jobs import cancel_job, delete_finished, requeue_job, retry_job

#: Matches handled per request (each through its service verb, in its own transaction).
BATCH = 500
#: Matches handled per transaction (each verb in a savepoint of it).
PER_TRANSACTION = 100
#: Distinct refusal reasons counted one by one; the rest are counted together.
REASONS = 10
_SALT = "django_fq.admin.bulk"

#: The verbs a search's matches can be given: name -> (function, label, past tense, reported states).
VERBS = {
    # The service verbs, less the read-back of the job each returns (half their time here).
    "retry": (retry_job, "Retry", "retried", ("dead",)),
    "cancel": (cancel_job, "Cancel", "cancelled", ("waiting", "scheduled", "ready", "running", "dead")),
    "requeue": (requeue_job, "Requeue now", "requeued", ("scheduled",)),
    "delete": (delete_finished, "Delete", "deleted", ("succeeded", "cancelled")),
}


def bulk_view(model_admin, request, verb: str):
    """GET: what the verb would do to the search's matches; POST: the next batch, and the progress.

    The search is the job list's query string (``?fq-queue=…&state=…``), the
    sidebar's filters included; it is read through the list's own ChangeList,
    so the matches are exactly the list's. Needs the change permission on jobs.
    """
    if verb not in VERBS or not model_admin.has_change_permission(request):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    fn, label, past, states = VERBS[verb]
    if request.method == "GET":
        query = request.GET.urlencode()
        state = None
    else:
        try:
            state = signing.loads(request.POST.get("state", ""), salt=_SALT)
        except signing.BadSignature:
            state = None  # none yet (the start), or not one this site signed: start over the posted search
        if state is not None and state.get("verb") != verb:
            raise PermissionDenied  # the steps of another verb's run, posted to this verb's URL
        if state is not None and state.get("user") != request.user.pk:
            # Another user's run (a copied form): the history must name who ran each step.
            raise PermissionDenied
        query = state["query"] if state else request.POST.get("query", "")
    shown = routing.current() if routing.enabled() else None
    started = (state.get("db") if state else request.POST.get("db") or shown) if request.method == "POST" else shown
    if started != shown and (started or shown):
        # The session's database changed since the page was shown (another tab's switcher):
        # the cursor and row numbers are another database's, so nothing is run here.
        errors = [
            f"database: this run was started on {started!r} but the admin now shows {shown!r}; "
            f"open the job list with ?fq_db={started} to continue it"
        ]
        qs, search = Job.objects.none(), None
    else:
        qs, search, errors = _matches(
            model_admin, request, query, frozen=state is not None, boundary=state.get("boundary") if state else None
        )
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "app_label": model_admin.opts.app_label,
        "title": f"{label} every matching job",
        "verb": verb,
        "label": label,
        "past": past,
        "states": states,
        "errors": errors,
        "described": search.describe() if search else "every job the list shows",
        "list_url": reverse("admin:django_fq_job_changelist", current_app=model_admin.admin_site.name)
        + ("?" + query if query else ""),
        "query": query,
        "batch": BATCH,
        "db": shown or "",
    }
    request.current_app = model_admin.admin_site.name
    if errors:
        return TemplateResponse(request, "admin/django_fq/job/bulk.html", context, status=400)
    if request.method == "GET" or state is None:
        if request.method == "POST":  # the start: freeze the matches' upper bound and the search's boundary
            # The newest job of the table (by the primary key, one probe): later jobs are not touched.
            top = Job.objects.using(conf.database()).aggregate(top=Max("seq"))["top"]
            state = {
                "verb": verb, "user": request.user.pk, "db": shown, "query": query, "cursor": 0, "top": top or 0, "total": qs.count(),
                "boundary": search.boundary if search else None, "capped": bool(search and search.capped),
                "done": 0, "refused": {}, "seen": 0,
            }  # fmt: skip
        else:
            context.update(total=qs.count(), capped=bool(search and search.capped), start=True)
            return TemplateResponse(request, "admin/django_fq/job/bulk.html", context)
    state = _run_batch(model_admin, request, qs, state, fn, past, states)
    finished = state["cursor"] is None
    context.update(
        total=state["total"], done=state["done"], seen=state["seen"], capped=state["capped"],
        refused=sorted(state["refused"].items(), key=lambda kv: -kv[1]),
        refused_total=sum(state["refused"].values()), finished=finished,
        state=signing.dumps(state, salt=_SALT) if not finished else "",
    )  # fmt: skip
    return TemplateResponse(request, "admin/django_fq/job/bulk.html", context)


def _matches(model_admin, request, query: str, *, frozen: bool, boundary):
    """The job list's queryset for ``query`` (a list URL's query string), its search, and the form's errors."""
    cl, search, errors = changelist_for(model_admin, request, query, frozen=frozen, boundary=boundary)
    return (cl.queryset if cl is not None else Job.objects.none()), search, errors


def changelist_for(model_admin, request, query: str, *, frozen: bool = False, boundary=None):
    """The job list's ``ChangeList`` for ``query`` (a list URL's query string, less its page), its search, and errors.

    Returns ``(changelist, search, [])``, or ``(None, None, ["<field>: <message>", ...])``
    when the search form or the list's filters are not valid. Also used by the
    list's live updates (:mod:`django_fq.admin.live`).
    """
    from .jobs import search_of

    fake = copy.copy(request)  # the list's request, as the list would have seen it
    fake.__dict__.pop("_fq_search_pair", None)
    params = QueryDict(query, mutable=True)
    for key in (PAGE_VAR, ALL_VAR, ERROR_FLAG):  # which page was shown is no filter (and may be gone by now)
        params.pop(key, None)
    fake.GET = params
    fake._fq_frozen = frozen
    fake._fq_boundary = boundary
    form, search = search_of(fake)
    if form.is_active() and search is None:
        return None, None, job_errors(form)
    try:
        cl = model_admin.get_changelist_instance(fake)
    except (IncorrectLookupParameters, DisallowedModelAdminLookup, SuspiciousOperation) as exc:
        return None, None, [f"the list's filters are not valid: {exc}"]
    return cl, search, []


def job_errors(form) -> list[str]:
    """The form's errors as ``"<field label>: <message>"`` lines."""
    out: list[str] = []
    for name, messages in form.errors.items():
        label = form.fields[name].label if name in form.fields else "search"
        out.extend(f"{label}: {m}" for m in messages)
    return out


def _run_batch(model_admin, request, qs, state: dict, fn, past: str, states) -> dict:
    rows = list(
        qs.filter(seq__gt=state["cursor"], seq__lte=state["top"])
        .order_by("seq")
        .values_list("seq", "uid", "queue__name", "reported")[:BATCH]
    )
    refused = Counter(state["refused"])
    changed: list[Job] = []
    for start in range(0, len(rows), PER_TRANSACTION):
        chunk = rows[start : start + PER_TRANSACTION]
        try:
            # One transaction for the chunk (each verb in its own savepoint): a commit per job
            # is what a file database's fsync makes slow.
            with db.write_atomic():
                outcome = [_one(fn, states, row) for row in chunk]
        except DatabaseError:
            # A deadlock or lock timeout: each job alone, with the services' own retries.
            outcome = [_one(fn, states, row) for row in chunk]
        for (seq, uid, _, _), reason in zip(chunk, outcome, strict=True):
            if reason is None:
                changed.append(Job(seq=seq, uid=uid))
            else:
                refused[reason if len(refused) < REASONS or reason in refused else "other reasons"] += 1
    if changed:
        from django.contrib.admin.models import CHANGE, DELETION, LogEntry  # the admin app may load after this module

        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=changed,
            action_flag=DELETION if fn is delete_finished else CHANGE,
            change_message=f"{past.capitalize()} through the admin (bulk action on a search).",
        )
    state = dict(state)
    state["done"] += len(changed)
    state["seen"] += len(rows)
    state["refused"] = dict(refused)
    state["cursor"] = rows[-1][0] if len(rows) == BATCH else None
    return state


def _one(fn, states, row) -> str | None:
    """Apply ``fn`` to the job of ``row``: ``None`` when done, else why it was refused."""
    _, uid, queue, reported = row
    if reported not in states:
        return f"job is {reported}"
    try:
        fn(queue, uid)
    except FqError as exc:
        return exc.message
    return None
