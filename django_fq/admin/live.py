"""Live updates of the dashboard and the job list: two small JSON views that ``live.js`` polls.

The pages work without JavaScript (reload for fresh numbers). With it,
``django_fq/live.js`` asks one of these views every few seconds (slower while
the tab is hidden or after errors; docs/admin.md "Live updates") and rewrites
the numbers in place:

* :func:`dashboard_data` — the dashboard's counts per queue and state, its
  totals row, the counters' totals and the pause flags: the same bounded
  queries as the page (the :data:`~django_fq.admin.dashboard.DASHBOARD_QUEUES`
  busiest queues, one aggregate for the totals row), never the chart.
* :func:`job_list_data` — for the job list with its filters and search: the
  reported state, attempts and worker of the rows on the page (at most
  :data:`MAX_ROWS` primary-key lookups), which of them still match, the
  list's capped count, and how many matching jobs were enqueued since the
  page was shown (counted up to :data:`NEW_CAP`, over the primary key's range
  of new rows).

Both need the admin's view permission (of queues, of jobs) and answer only
numbers, states, queue names, worker names and links: never a payload, a
result, an error text, a receipt or a digest of one.
"""

from __future__ import annotations

import re

from django.core.exceptions import PermissionDenied
from django.db.models import Max
from django.http import HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.urls import reverse

from .. import conf, db
from ..models import Job, Queue
from . import bulk, dashboard, display

#: Seconds between two polls while the tab is visible and the server answers.
INTERVAL_S = 5
#: Most rows of the page whose states one answer reports (the list shows 50; "Show all" up to 200).
MAX_ROWS = 200
#: New matching jobs counted exactly; past it the answer says "more than".
NEW_CAP = 1000
#: The poll's own parameters, taken off before the list's filters are read.
ROWS_PARAM, SINCE_PARAM = "live_rows", "live_since"
_ROW_LIST = re.compile(rf"[0-9]{{1,19}}(?:,[0-9]{{1,19}}){{0,{MAX_ROWS - 1}}}")


def _error(status: int, errors: list[str]) -> JsonResponse:
    return JsonResponse({"errors": errors}, status=status)


def _no_cache(response: JsonResponse) -> JsonResponse:
    response["Cache-Control"] = "no-store"
    return response


def dashboard_data(model_admin, request) -> HttpResponse:
    """GET: the dashboard's numbers as JSON (the queue admin's view permission).

    ``{"now": epoch ms (database clock), "now_text": "… UTC", "n_queues": int,
    "all": {state: count}, "queues": [{"name", "paused", "paused_at",
    "jobs_url", "counts": {state: count}, "enqueued", "acked", "failed",
    "avg_wait", "avg_run"}]}``, the queues in the page's order (most
    unfinished jobs first). Six bounded queries, as the page's table.
    """
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    alias = conf.database()
    shown = dashboard.busiest_queue_ids(dashboard.DASHBOARD_QUEUES)
    rows = Queue.objects.using(alias).filter(pk__in=shown).only("id", "name", "paused", "paused_at")
    by_id = {q.pk: q for q in rows.annotate(**dashboard.count_annotations())}
    totals = dashboard.counter_totals(by_id)
    jobs = reverse("admin:django_fq_job_changelist", current_app=model_admin.admin_site.name)
    queues = []
    for pk in shown:
        q = by_id.get(pk)
        if q is None:
            continue  # deleted between the two queries
        queues.append(
            {
                "name": q.name,
                "paused": q.paused,
                "paused_at": display.instant(q.paused_at) if q.paused else "",
                "jobs_url": f"{jobs}?queue__id__exact={pk}",
                "counts": dashboard.counts_of(q),
                **dashboard.totals_row(totals.get(pk, {})),
            }
        )
    now = db.db_now_ms()
    return _no_cache(
        JsonResponse(
            {
                "now": now,
                "now_text": display.instant(now),
                "n_queues": Queue.objects.using(alias).count(),
                "all": dashboard.all_counts(),
                "queues": queues,
            }
        )
    )


def list_context(model_admin, request) -> dict:
    """The job list's template context for its live bar: the poll's URL and the newest job's ``seq`` now.

    The newest ``seq`` of the whole table (one probe of the primary key) is the
    line after which a matching job is *new*: the poll counts matches above it.
    """
    url = reverse("admin:django_fq_job_live", current_app=model_admin.admin_site.name)
    top = Job.objects.using(conf.database()).aggregate(top=Max("seq"))["top"] or 0
    return {"fq_live_url": display.pinned(url), "fq_live_since": top, "fq_live_interval": INTERVAL_S * 1000}


def dashboard_live_context(model_admin) -> dict:
    """The dashboard's template context for its live bar."""
    url = reverse("admin:django_fq_dashboard_live", current_app=model_admin.admin_site.name)
    return {"fq_live_url": display.pinned(url), "fq_live_interval": INTERVAL_S * 1000}


def job_list_data(model_admin, request) -> HttpResponse:
    """GET: the job list's live numbers as JSON (the job admin's view permission).

    The query string is the list's own (filters, search form, ordering) plus
    ``live_rows=SEQ,SEQ,…`` (the rows on the page, at most :data:`MAX_ROWS`)
    and ``live_since=SEQ`` (the newest job when the page was shown).
    Answers ``{"now", "now_text", "matches": int or "more than 10,000",
    "new": int, "new_capped": bool, "rows": {seq: {"state", "attempts",
    "worker", "matches"}}}``; a row that is gone (deleted, pruned) is absent.
    Filters or a search that are not valid answer 400 with ``{"errors":
    ["<field>: <message>", ...]}``, as the list shows them.
    """
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    params = request.GET.copy()
    raw_rows = params.pop(ROWS_PARAM, [""])[-1]
    raw_since = params.pop(SINCE_PARAM, [""])[-1]
    if raw_rows and not _ROW_LIST.fullmatch(raw_rows):
        return _error(400, [f"{ROWS_PARAM}: a comma-separated list of at most {MAX_ROWS} row ids"])
    if raw_since and not display.is_row_id(raw_since):
        return _error(400, [f"{SINCE_PARAM}: a row id (the newest job when the page was shown)"])
    ids = sorted({int(v) for v in raw_rows.split(",")} if raw_rows else set())
    if any(not display.is_row_id(str(v)) for v in ids):
        return _error(400, [f"{ROWS_PARAM}: a row id is out of range"])
    cl, _, errors = bulk.changelist_for(model_admin, request, params.urlencode())
    if cl is None:
        return _error(400, errors)
    matches = cl.queryset.order_by()
    rows: dict[str, dict] = {}
    if ids:
        # By the primary key: at most MAX_ROWS lookups each, whatever the filters.
        found = (
            model_admin.get_queryset(request)
            .filter(seq__in=ids)
            .order_by()
            .values_list("seq", "reported", "attempts", "max_attempts", "worker")
        )
        still = set(matches.filter(seq__in=ids).values_list("seq", flat=True))
        for seq, state, attempts, max_attempts, worker in found:
            rows[str(seq)] = {
                "state": state,
                "attempts": f"{attempts} / {max_attempts}",
                "worker": worker or "",
                "matches": seq in still,
            }
    new, capped = 0, False
    if raw_since:
        # The new rows' range of the primary key: small however large the table is.
        new = matches.filter(seq__gt=int(raw_since)).values("seq")[: NEW_CAP + 1].count()
        capped = new > NEW_CAP
        new = min(new, NEW_CAP)
    now = db.db_now_ms()
    count = cl.result_count
    return _no_cache(
        JsonResponse(
            {
                "now": now,
                "now_text": display.instant(now),
                "matches": count if type(count) is int else str(count),  # AtLeast reads "more than 10,000"
                "new": new,
                "new_capped": capped,
                "rows": rows,
            }
        )
    )
