"""The dashboard: counts per queue and the last hour's activity as a server-rendered SVG chart."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job
from django_fq.types import STATE_NAMES

from .helpers import changelist, claim_one, client_for, make, squash, text

pytestmark = pytest.mark.django_db

MINUTE = 60_000


def _dashboard_url(**params) -> str:
    url = reverse("admin:django_fq_dashboard")
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def test_dashboard_shows_counts_per_queue(root_client, queue):
    ids = {state: make(queue, state) for state in ("succeeded", "dead", "cancelled", "running", "scheduled", "ready")}
    fq.enqueue(queue, {"state": "waiting"}, depends_on=[ids["running"]])
    make("adm:b", "ready")
    make("adm:b", "ready")
    response = root_client.get(_dashboard_url())
    assert response.status_code == 200
    rows = {q["name"]: {s: n for s, n, _ in q["cells"]} for q in response.context["queues"]}
    assert rows == {queue: dict.fromkeys(STATE_NAMES, 1), "adm:b": dict.fromkeys(STATE_NAMES, 0) | {"ready": 2}}
    assert dict(response.context["all_counts"]) == dict.fromkeys(STATE_NAMES, 1) | {"ready": 3}
    html = squash(text(response))
    assert 'data-queue="adm:b"' in html
    assert re.search(r'<td class="fq-count-ready"><a href="[^"]*state=ready">2</a></td>', html)
    assert "<svg" in html and 'id="fq-activity-chart"' in html
    assert "<script" not in html.split('id="content-main"')[1]  # server-rendered: no script in the page body


def test_chart_counts_the_last_hour_per_minute(root_client, queue, clock):
    fq.configure("adm:exp", max_attempts=1)
    # 90 minutes ago: a failed attempt of a job that finishes now, and one finished job. Both outside.
    clock.advance(-90 * MINUTE)
    late = fq.enqueue("adm:late", {"late": True}).id
    fq.nack("adm:late", claim_one("adm:late").receipt, error="first try failed", delay_ms=0)
    make(queue, "succeeded")
    # 30 minutes ago: two finished, a nack on another queue, a lease expiry handled by the reaper.
    clock.advance(60 * MINUTE)
    half_hour = [make(queue, "succeeded") for _ in range(2)]
    make("adm:b", "dead")
    fq.enqueue("adm:exp", {"expires": True})
    claim_one("adm:exp", visibility_ms=1_000)
    clock.advance(2_000)
    assert fq.reap("adm:exp").expired == 1
    # Now: the late job succeeds; a nack without text; a release and a cancel (not failures).
    clock.advance(30 * MINUTE - 2_000)
    fq.ack("adm:late", claim_one("adm:late").receipt)
    fq.enqueue(queue, {"quiet": True})
    fq.nack(queue, claim_one(queue).receipt)
    fq.enqueue(queue, {"released": True})
    fq.release(queue, claim_one(queue).receipt)
    make(queue, "cancelled")

    from django_fq.admin import dashboard

    act = dashboard.activity()
    assert sum(act.finished) == 3
    assert sum(act.failures) == 3  # the nack on adm:b, the expiry, the quiet nack
    for job_id in (*half_hour, late):
        finished_at = Job.objects.get(uid=job_id).finished_at
        assert act.finished[(finished_at - act.start) // MINUTE] >= 1
    assert act.finished[-1] == 1 and act.start <= act.now < act.end == act.start + 60 * MINUTE
    only_b = dashboard.activity(Job.objects.get(queue__name="adm:b").queue_id)
    assert (sum(only_b.finished), sum(only_b.failures)) == (0, 1)

    response = root_client.get(_dashboard_url())
    html = squash(text(response))
    assert 'id="fq-total-finished">3<' in html and 'id="fq-total-failed">3<' in html
    chart = response.context["chart"]
    assert sum(m["finished"] for m in chart["minutes"]) == 3
    assert len([b for b in chart["bars"] if b["series"] == "finished"]) == len([n for n in act.finished if n])
    assert html.count('<rect class="failed"') == len([n for n in act.failures if n])

    response = root_client.get(_dashboard_url(queue="adm:b"))
    assert response.context["selected"] == "adm:b"
    assert (response.context["chart"]["total_finished"], response.context["chart"]["total_failed"]) == (0, 1)


def test_unknown_queue_in_the_selector_falls_back_to_all_queues(root_client, queue):
    make(queue, "succeeded")
    response = root_client.get(_dashboard_url(queue="nope"))
    assert response.status_code == 200
    assert response.context["selected"] == "" and response.context["chart"]["total_finished"] == 1
    assert "No such queue" in text(response)


def test_failure_scan_is_bounded_and_says_so(root_client, queue, monkeypatch):
    from django_fq.admin import dashboard

    for _ in range(3):
        make(queue, "dead")
    monkeypatch.setattr(dashboard, "FAILURE_SCAN_LIMIT", 2)
    act = dashboard.activity()
    assert act.partial and sum(act.failures) == 2
    assert "counted on the most recently changed jobs only" in text(root_client.get(_dashboard_url()))


def test_chart_geometry_stays_inside_the_plot():
    from django_fq.admin import dashboard

    finished = [0] * 60
    failures = [0] * 60
    finished[0], finished[30], finished[59] = 5, 37, 1
    failures[30] = 4
    act = dashboard.Activity(start=0, end=3_600_000, now=3_599_000, finished=finished, failures=failures, partial=False)
    chart = dashboard.chart(act)
    assert len(chart["bars"]) == 4
    top_value = chart["grid"][-1]["value"]
    assert top_value >= 37 and top_value % 4 == 0
    tallest = max(chart["bars"], key=lambda b: b["h"])
    assert tallest["title"] == "00:30–00:31 UTC: 37 jobs succeeded"
    for b in chart["bars"]:
        assert chart["left"] <= b["x"] and b["x"] + b["w"] <= chart["right_x"]
        assert chart["top"] <= b["y"] and abs(b["y"] + b["h"] - chart["base"]) < 0.02
    assert [t["label"] for t in chart["ticks"]] == ["00:00", "00:10", "00:20", "00:30", "00:40", "00:50", "01:00"]
    empty = dashboard.chart(dashboard.Activity(0, 3_600_000, 0, [0] * 60, [0] * 60, False))
    assert empty["bars"] == [] and empty["grid"][-1]["value"] == 4


def test_dashboard_needs_the_queue_view_permission(make_user, queue, client):
    login = client.get(_dashboard_url())
    assert login.status_code == 302 and "/login/" in login["Location"]
    assert client_for(make_user("nobody", "view_job")).get(_dashboard_url()).status_code == 403
    assert client_for(make_user("watcher", "view_queue")).get(_dashboard_url()).status_code == 200


def test_app_page_and_queue_list_link_to_the_dashboard(root_client, queue):
    url = _dashboard_url()
    assert f'href="{url}"' in text(root_client.get(reverse("admin:app_list", args=["django_fq"])))
    assert f'href="{url}"' in text(root_client.get(changelist("queue")))


def test_dashboard_counts_failures_in_sql_without_reading_error_texts(root_client, queue, clock):
    """The failure count never brings an error history into Python (docs/admin.md, "The dashboard")."""
    from django.db import connections

    from django_fq import conf
    from django_fq.admin import dashboard

    fq.configure(queue, max_attempts=5, backoff_ms=1000)
    big = "x" * 65_536
    for _ in range(3):
        fq.enqueue(queue, {"n": 1})
    for job in fq.claim(queue, count=3):
        fq.nack(queue, job.receipt, error=big, delay_ms=0)
    # Entries a hand-edited or imported history may hold: none of them counts, none breaks the query.
    odd = make("adm:b", "ready")
    now = Job.objects.get(uid=odd).changed_at
    Job.objects.filter(uid=odd).update(
        errors=[
            "not an object",
            {"kind": "nack", "at": now + 0.5},
            {"kind": "nack", "at": str(now)},
            {"kind": "nack"},
            {"kind": "release", "at": now},
            {"kind": "timeout", "at": now, "error": big},
        ]
    )
    returned: list[str] = []

    def record(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        description = context["cursor"].description or ()
        returned.extend(col[0] for col in description)
        return result

    conn = connections[conf.database()]
    queue_b = Job.objects.values_list("queue_id", flat=True).get(uid=odd)
    with conn.execute_wrapper(record):
        response = root_client.get(_dashboard_url())
        only_b = dashboard.activity(queue_b)
    assert response.status_code == 200
    assert "errors" not in returned and "last_error" not in returned, returned
    chart = response.context["chart"]
    assert chart["total_failed"] == 4 and not chart["partial"]  # three nacks and the timeout
    assert sum(only_b.failures) == 1


def test_dashboard_breadcrumbs_use_the_markup_of_this_django_admin(root_client, queue):
    """Django 6.1 styles an ``ol.breadcrumbs`` of ``li`` items, 5.2 and 6.0 a ``div``: the dashboard follows the admin."""
    own = text(root_client.get(changelist("queue")))
    tag = re.search(r'<(ol|div) class="breadcrumbs">', own).group(1)
    html = text(root_client.get(_dashboard_url()))
    crumbs = re.search(r'<(ol|div) class="breadcrumbs">(.*?)</\1>', html, re.S)
    assert crumbs and crumbs.group(1) == tag
    if tag == "ol":
        assert re.findall(r"<li[^>]*>", crumbs.group(2)) and '<li aria-current="page">Dashboard</li>' in crumbs.group(2)
    assert "Dashboard" in crumbs.group(2) and 'href="/admin/django_fq/"' in crumbs.group(2)
