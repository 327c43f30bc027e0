"""The count cells of the dashboard and the queue list stop past a bound (docs/admin.md "Queues").

An exact count of a queue's succeeded jobs reads every one of them on every
page load; the cells count at most ``COUNT_CAP`` + 1 jobs and then read
"more than COUNT_CAP", as the job list's own count does. The bound is
lowered to 3 here; the page-load benchmark (bench/admin_pages.py) has the
numbers with 1,000,000 jobs.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_fq import services as fq

from .helpers import changelist, make, text

pytestmark = pytest.mark.django_db

CAP = 3


@pytest.fixture
def capped(monkeypatch):
    from django_fq.admin import display

    monkeypatch.setattr(display, "COUNT_CAP", CAP)


def _jobs(queue: str, state: str, n: int) -> None:
    for _ in range(n):
        make(queue, state)


def test_counts_past_the_bound_read_more_than_and_the_rest_stay_exact(root_client, queue, capped):
    from django_fq.admin import display

    _jobs(queue, "succeeded", CAP + 2)
    _jobs(queue, "dead", CAP)  # exactly the bound: still exact
    _jobs(queue, "ready", 2)
    _jobs(queue, "scheduled", 1)
    _jobs("adm:b", "ready", CAP + 1)
    fq.enqueue("adm:b", {"later": True}, delay_ms=3_600_000)  # 5 queued jobs there: past the bound, 1 scheduled

    response = root_client.get(reverse("admin:django_fq_dashboard"))
    assert response.status_code == 200
    rows = {q["name"]: {s: n for s, n, _ in q["cells"]} for q in response.context["queues"]}
    mine, other = rows[queue], rows["adm:b"]
    assert isinstance(mine["succeeded"], display.AtLeast) and str(mine["succeeded"]) == "more than 3"
    assert (mine["dead"], mine["ready"], mine["scheduled"]) == (CAP, 2, 1)
    assert not isinstance(mine["dead"], display.AtLeast)
    assert str(other["ready"]) == "more than 3" and other["scheduled"] == 1
    totals = dict(response.context["all_counts"])
    assert str(totals["succeeded"]) == "more than 3" and str(totals["ready"]) == "more than 3"
    assert totals["dead"] == CAP and totals["scheduled"] == 2
    assert "more than 3</a>" in text(response)

    # The queue list's cells and its ordering by a count use the same bounded numbers.
    page = text(root_client.get(changelist("queue"), {"o": "-6"}))
    assert "more than 3</a>" in page


def test_a_total_over_capped_counts_says_more_than(root_client, queue, capped):
    from django_fq.admin import dashboard, display

    _jobs(queue, "succeeded", CAP + 1)
    _jobs(queue, "dead", 2)
    from django_fq.models import Queue

    row = Queue.objects.annotate(**dashboard.count_annotations()).get(name=queue)
    total = sum(dashboard.counts_of(row).values())
    assert isinstance(total, display.AtLeast) and str(total) == "more than 5"  # > 3 succeeded, 2 dead
    page = text(root_client.get(reverse("admin:django_fq_queue_delete", args=[row.pk])))
    assert "more than 5" in page


def test_counts_are_exact_below_the_bound_with_the_default(root_client, queue):
    from django_fq.admin import display

    _jobs(queue, "succeeded", 4)
    _jobs(queue, "ready", 2)
    response = root_client.get(reverse("admin:django_fq_dashboard"))
    cells = {s: n for s, n, _ in response.context["queues"][0]["cells"]}
    assert (cells["succeeded"], cells["ready"], cells["scheduled"]) == (4, 2, 0)
    assert display.COUNT_CAP == 10_000
