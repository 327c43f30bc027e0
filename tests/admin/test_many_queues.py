"""Thousands of queues: the dashboard, the job list's queue filter and ``/metrics/`` stay bounded.

The fast tests check the structure with the bounds lowered (rows and
choices shown, series exported, queries run: none of them grows with the
number of queues). The slow test measures the pages with
``FQ_MANY_QUEUES`` queues (default 5,000) and prints the numbers; the
figures before and after the bounds are in docs/admin.md.
"""

from __future__ import annotations

import os
import time

import pytest
from django.db import connections
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_fq import conf
from django_fq import services as fq
from django_fq.models import Queue

from .helpers import changelist, make, text

pytestmark = pytest.mark.django_db


def _queues(n: int, *, prefix: str = "many") -> list[str]:
    """``n`` queues with one ready job each (names sort in creation order)."""
    names = [f"{prefix}:{i:05d}" for i in range(n)]
    for name in names:
        fq.enqueue(name, {"q": name})
    return names


def _claim_ready(name: str, *, dead: bool = False) -> None:
    """Claim the one ready job of ``name`` (it is then running), and fail it for good when ``dead``."""
    (job,) = fq.claim(name, worker="worker-7")
    if dead:
        fq.nack(name, job.receipt, error="boom", permanent=True)


def _scrape(settings) -> str:
    from django_fq.metrics.views import metrics_view

    settings.FQ_METRICS_PUBLIC = True
    response = metrics_view(RequestFactory().get("/metrics/"))
    assert response.status_code == 200, response.content
    return response.content.decode()


def _series(body: str) -> list[str]:
    return [line for line in body.splitlines() if line and not line.startswith("#")]


def _queries(fn) -> int:
    with CaptureQueriesContext(connections[conf.database()]) as ctx:
        fn()
    return len(ctx.captured_queries)


@pytest.mark.slow
def test_measure_pages_with_thousands_of_queues(root_client, settings):
    n = int(os.environ.get("FQ_MANY_QUEUES", "5000"))
    _queues(n)
    make("many:dead", "dead")
    pages = {
        "dashboard": lambda: root_client.get(reverse("admin:django_fq_dashboard")),
        "job list": lambda: root_client.get(changelist("job")),
        "queue list": lambda: root_client.get(changelist("queue")),
    }
    print(f"\n{n} queues on {connections[conf.database()].vendor}:")
    for label, get in pages.items():
        get()  # warm
        start = time.perf_counter()
        response = get()
        took = time.perf_counter() - start
        assert response.status_code == 200
        print(f"  {label:<11} {took * 1000:7.0f} ms {len(response.content) / 1024:8.0f} KiB {_queries(get):3d} queries")
    _scrape(settings)
    start = time.perf_counter()
    body = _scrape(settings)
    took = time.perf_counter() - start
    print(f"  /metrics/   {took * 1000:7.0f} ms {len(body) / 1024:8.0f} KiB {len(_series(body)):6d} series")
    assert Queue.objects.count() == n + 1


def test_metrics_give_own_series_to_the_first_queues_and_sum_the_rest(settings):
    from django_fq.metrics.collector import OTHER
    from tests.metrics.helpers import samples, value

    settings.FQ_METRICS_MAX_QUEUES = 5
    names = _queues(12)
    _claim_ready(names[9], dead=True)  # folded: its dead job is counted under (other)
    body = _scrape(settings)
    found = samples(body)
    labelled = {dict(labels).get("queue") for _, labels in found}
    assert labelled - {None} == {*names[:5], OTHER}
    assert value(found, "fq_queue_jobs", queue=OTHER, state="ready") == 6
    assert value(found, "fq_queue_jobs", queue=OTHER, state="dead") == 1
    assert value(found, "fq_queue_enqueued_total", queue=OTHER) == 7
    assert value(found, "fq_queue_jobs", queue=names[0], state="ready") == 1
    assert value(found, "fq_queues") == 12 and value(found, "fq_queues_folded") == 7
    assert ("fq_queue_concurrency_limit", frozenset({("queue", OTHER)})) not in found
    # A queue created later never takes the place of an older one.
    fq.enqueue("aaa:new", {"n": 1})
    again = {dict(labels).get("queue") for _, labels in samples(_scrape(settings))}
    assert "aaa:new" not in again and names[0] in again


def test_metrics_series_and_queries_do_not_grow_with_the_queues(settings):
    settings.FQ_METRICS_MAX_QUEUES = 3
    _queues(4, prefix="a")
    few_series, few_queries = len(_series(_scrape(settings))), _queries(lambda: _scrape(settings))
    _queues(40, prefix="b")
    assert len(_series(_scrape(settings))) == few_series
    assert _queries(lambda: _scrape(settings)) == few_queries


def test_dashboard_lists_the_busiest_queues_and_links_to_the_rest(root_client, monkeypatch):
    from django_fq.admin import dashboard

    monkeypatch.setattr(dashboard, "DASHBOARD_QUEUES", 5)
    names = _queues(30)
    for _ in range(3):
        fq.enqueue(names[20], {"more": True})
    make("zz:dead", "dead")
    make("zz:dead", "dead")
    url = reverse("admin:django_fq_dashboard")
    few = _queries(lambda: root_client.get(url))
    _queues(30, prefix="more")
    assert _queries(lambda: root_client.get(url)) == few
    response = root_client.get(url)
    listed = [q["name"] for q in response.context["queues"]]
    assert len(listed) == 5 and listed[0] == names[20] and "zz:dead" in listed
    assert dict(response.context["all_counts"])["ready"] == 63
    html = text(response)
    assert 'id="fq-more-queues"' in html and f'href="{changelist("queue")}"' in html
    assert html.count('class="fq-queue-row"') == 5 and html.count("<option") == 5
    # The chart picks any queue by name, listed or not; a name the database cannot hold is "no such queue".
    picked = root_client.get(url + f"?queue={names[29]}")
    assert picked.context["selected"] == names[29] and picked.context["chart"]["total_finished"] == 0
    nul = root_client.get(url + "?queue=%00")
    assert nul.status_code == 200 and nul.context["unknown_queue"]


@pytest.mark.parametrize("model", ["job", "lease", "idempotencytoken"])
def test_the_queue_filter_of_a_list_is_bounded(root_client, monkeypatch, model):
    from django_fq.admin import display

    monkeypatch.setattr(display, "FILTER_QUEUES", 4)
    names = _queues(20)
    for name in (names[0], names[17]):
        fq.enqueue(name, {"token": True}, idempotency=f"tok-{name}")
        fq.claim(name, worker="worker-7", count=2)
    few = _queries(lambda: root_client.get(changelist(model)))
    _queues(20, prefix="more")
    assert _queries(lambda: root_client.get(changelist(model))) == few
    qid = Queue.objects.get(name=names[17]).pk
    response = root_client.get(f"{changelist(model)}?queue__id__exact={qid}")
    assert response.status_code == 200
    spec = next(f for f in response.context["cl"].filter_specs if f.title == "queue")
    choices = list(spec.choices(response.context["cl"]))
    shown = [c["display"] for c in choices]
    assert shown[0] == "All" and shown[1:5] == names[:4] and names[17] in shown
    assert len(choices) == 1 + 4 + 1 + 1 and shown[-1].startswith("More queues")
    assert [c["display"] for c in choices if c["selected"]] == [names[17]]
    assert choices[-1]["query_string"] == changelist("queue")


@pytest.mark.parametrize("model", ["job", "lease", "idempotencytoken"])
def test_show_counts_adds_no_count_per_queue(root_client, monkeypatch, model):
    """docs/admin.md, "Jobs": "Show counts" (``?_facets``) counts states, never each offered queue.

    Each queue's count would be one more aggregate over the whole table: a
    view-only user's click cost a scan with a hundred of them.
    """
    from django_fq.admin import display

    monkeypatch.setattr(display, "FILTER_QUEUES", 4)
    names = _queues(4)
    for name in names:
        fq.enqueue(name, {"n": 1}, idempotency=f"tok-{name}")
        fq.claim(name, worker="worker-7")
    few = _queries(lambda: root_client.get(changelist(model), {"_facets": "True"}))
    response = root_client.get(changelist(model), {"_facets": "True"})
    assert response.status_code == 200
    spec = next(f for f in response.context["cl"].filter_specs if f.title == "queue")
    shown = [c["display"] for c in spec.choices(response.context["cl"])]
    assert shown[1:5] == names  # no " (1)" after a queue's name
    if model == "job":
        assert "running (4)" in text(response)  # the state filter still counts
    _queues(20, prefix="more")
    assert _queries(lambda: root_client.get(changelist(model), {"_facets": "True"})) == few


def test_a_url_naming_many_queues_adds_a_bounded_number_of_choices(root_client, monkeypatch):
    """A filter URL naming hundreds of queue ids offers at most FILTER_QUEUES of them beyond the first ones."""
    from django_fq.admin import display

    monkeypatch.setattr(display, "FILTER_QUEUES", 4)
    _queues(30)
    ids = sorted(Queue.objects.values_list("pk", flat=True))
    response = root_client.get(changelist("job"), {"queue__id__exact": [str(i) for i in ids[4:]]})
    assert response.status_code == 200
    spec = next(f for f in response.context["cl"].filter_specs if f.title == "queue")
    choices = list(spec.choices(response.context["cl"]))
    assert len(choices) == 1 + 4 + 4 + 1  # All, the first 4, 4 of the 26 picked, "More queues…"


#: More queues than SQLite's default limit of variables in one statement (32,766): an ``IN`` of every
#: queue's id would fail there ("too many SQL variables"), and grow past MariaDB's max packet later.
MORE_THAN_SQLITE_VARIABLES = 33_000


def test_the_busiest_queues_are_found_with_more_queues_than_sqlite_takes_variables():
    """``busiest_queue_ids`` sends one statement of a fixed size, whatever the number of queues."""
    from django_fq.admin import dashboard

    fq.enqueue("big:busy", {"n": 1})
    fq.enqueue("big:busy", {"n": 2})
    make("big:dead", "dead")
    now = Queue.objects.get(name="big:busy").created_at
    Queue.objects.using(conf.database()).bulk_create(
        [Queue(name=f"big:{i:05d}", created_at=now) for i in range(MORE_THAN_SQLITE_VARIABLES)], batch_size=2000
    )
    with CaptureQueriesContext(connections[conf.database()]) as ctx:
        ids = dashboard.busiest_queue_ids(4)
    assert len(ctx.captured_queries) == 1 and len(ctx.captured_queries[0]["sql"]) < 2000
    names = dict(Queue.objects.values_list("pk", "name"))
    # The queue with two unfinished jobs, then the dead one's, then the idle ones by name.
    assert [names[i] for i in ids] == ["big:busy", "big:dead", "big:00000", "big:00001"]
