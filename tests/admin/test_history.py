"""The history charts on the dashboard and the queue page, and their JSON (docs/admin.md "History")."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.services import history

from .helpers import claim_one, client_for, make, queue_pk, squash, text

# Committed transactions: the history is tallied when the work commits.
pytestmark = pytest.mark.django_db(transaction=True)

SVG = "{http://www.w3.org/2000/svg}"


def dashboard(client, **params):
    return client.get(reverse("admin:django_fq_dashboard"), params)


def history_json(client, **params):
    return client.get(reverse("admin:django_fq_history"), params)


def charts(html: str) -> dict[str, ET.Element]:
    """The history's SVG charts, parsed (each must be well-formed XML)."""
    found = {}
    for m in re.finditer(r'<svg class="fq-chart fq-h-chart" id="(fq-h-\w+)".*?</svg>', html, re.S):
        found[m.group(1)] = ET.fromstring(m.group(0))
    return found


def test_the_dashboard_draws_both_charts_with_no_data(root_client, queue):
    response = dashboard(root_client)
    assert response.status_code == 200
    html = text(response)
    svgs = charts(html)
    assert set(svgs) == {"fq-h-throughput", "fq-h-times"}
    for svg in svgs.values():
        assert svg.get("role") == "img" and svg.find(f"{SVG}title").text and svg.find(f"{SVG}desc") is not None
        assert not svg.findall(f"{SVG}path")  # no line without a point
    assert "no jobs in this span" in html and "Nothing was enqueued, claimed or settled" in html
    assert "django_fq/history.css" in html
    assert "<script" not in html.split('id="content-main"')[1]


def test_the_charts_show_real_work(root_client, queue):
    make(queue, "succeeded")
    make(queue, "succeeded")
    make(queue, "dead")
    fq.enqueue(queue, "retried")
    fq.nack(queue, claim_one(queue).receipt, delay_ms=0)
    fq.enqueue("adm:other", "elsewhere")
    for params, enqueued in (({}, 5), ({"queue": queue}, 4), ({"queue": queue, "span": "week"}, 4)):
        response = dashboard(root_client, **params)
        html = squash(text(response))
        svgs = charts(html)
        lines = {p.get("class") for p in svgs["fq-h-throughput"].iter(f"{SVG}path")}
        assert {"fq-h-line fq-h-enqueued", "fq-h-line fq-h-succeeded", "fq-h-line fq-h-dead"} <= lines
        assert len(list(svgs["fq-h-times"].iter(f"{SVG}path"))) == 4  # wait and run, median and p95
        assert f"jobs enqueued: <strong>{enqueued}</strong>" in html
    assert "jobs succeeded: <strong>2</strong>" in html and "jobs gone dead: <strong>1</strong>" in html
    assert "failed attempts: <strong>2</strong>" in html  # the retried job's and the dead job's
    assert 'value="week" checked' in html and "last week" in html
    assert '<input type="hidden" name="queue" value="adm:q">' in html  # the span selector keeps the queue


def test_a_job_that_fails_once_then_goes_dead_counts_the_same_in_both_charts(root_client, queue):
    """Failed = attempts that failed (the last too), dead = jobs gone dead: in the last-hour chart, the
    queue table, the history's charts and JSON (docs/reference/history.md, docs/admin.md "Dashboard")."""
    fq.configure(queue, max_attempts=2, backoff_ms=0)
    job = fq.enqueue(queue, "flaky").id
    fq.nack(queue, claim_one(queue).receipt, delay_ms=0)  # attempt 1 fails: retried
    fq.nack(queue, claim_one(queue).receipt)  # attempt 2 fails: out of attempts
    assert fq.get(queue, job).state == "dead"
    html = squash(text(dashboard(root_client, queue=queue)))
    # The last-hour chart (from the jobs' error history) and the queue table (from the counters).
    assert 'failed attempts (retried or not): <strong id="fq-total-failed">2</strong>' in html
    row = html.split(f'data-queue="{queue}"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'class="fq-failed"><span class="fq-alert">2</span>', row)
    # The history (the workers' per-minute rows): the same two attempts, and the one job.
    assert "failed attempts: <strong>2</strong>" in html and "jobs gone dead: <strong>1</strong>" in html
    for span in ("hour", "day", "week"):
        totals = history_json(root_client, queue=queue, span=span).json()["totals"]
        assert (totals["failed"], totals["dead"]) == (2, 1)
        assert history.history_series(queue, span)["totals"] == totals


def test_the_queue_page_has_its_history(root_client, queue):
    make(queue, "succeeded")
    response = root_client.get(reverse("admin:django_fq_queue_change", args=[queue_pk(queue)]), {"span": "day"})
    assert response.status_code == 200
    html = squash(text(response))
    assert "History: adm:q, last day" in html and set(charts(html)) == {"fq-h-throughput", "fq-h-times"}
    # The span form sits outside the policy form: forms do not nest.
    policy = html.split('id="queue_form"')[1].split("</form>")[0]
    assert 'name="span"' not in policy


def test_json_is_the_series(root_client, queue):
    make(queue, "succeeded")
    response = history_json(root_client, queue=queue, span="day")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    body = response.json()
    assert body == {**history.history_series(queue, "day"), "now": body["now"]}
    assert (body["span"], body["step_ms"], len(body["buckets"])) == ("day", 900_000, 96)
    assert body["totals"]["succeeded"] == 1 and body["totals"]["run_ms"]["count"] == 1


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"span": "year"}, 400, "span"),
        ({"span": "hour\x00"}, 400, "span"),
        ({"span": "x" * 5000}, 400, "span"),
        ({"queue": "no such"}, 400, "queue"),
        ({"queue": "a\x00b"}, 400, "queue"),
        ({"queue": "adm:missing"}, 404, "queue"),
    ],
)
def test_hostile_parameters_get_clear_errors_never_a_500(root_client, queue, params, status, field):
    response = history_json(root_client, **params)
    assert response.status_code == status
    assert response.json()["field"] == field
    page = dashboard(root_client, **params)
    assert page.status_code == 200
    if field == "span":
        assert 'id="fq-history-error"' in text(page) and "span: span must be one of: hour, day, week" in text(page)


def test_the_json_and_the_charts_need_the_view_permission(make_user, queue):
    nobody = client_for(make_user("nobody"))
    assert history_json(nobody).status_code == 403
    viewer = client_for(make_user("viewer", "view_queue"))
    assert history_json(viewer).status_code == 200
    anonymous = history_json(type(nobody)())
    assert anonymous.status_code == 302  # to the admin's login page


def test_a_point_alone_is_drawn():
    """A bucket with a value between two without one still draws a stroke (a one-point path draws nothing)."""
    from django_fq.admin import history as charts

    d = charts._paths([None, 5.0, None, 1.0, 2.0], 5, lambda v: v * 10)
    lone, run = d.split(" M")
    assert lone.startswith("M") and " L" in lone and lone.count("50.0") == 2  # level, 4 units wide
    assert run.count("L") == 1
