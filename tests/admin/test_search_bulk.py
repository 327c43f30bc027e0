"""Bulk verbs on every match of a search (docs/admin.md "Acting on every match"), on every database.

5,000 matches across many list pages: retry, cancel and delete go through the
service verbs in batches, refuse (and count) the jobs they do not apply to,
and leave one admin history entry per job changed. A view-only user's POST is
refused.
"""

from __future__ import annotations

import re
import time

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job

from .helpers import client_for, text

N = 5000
QUEUE = "bulk:q"


def _bulk_module():
    from django_fq.admin import bulk

    return bulk


def run_bulk(client, verb: str, query: str) -> dict:
    """Drive the bulk page as its script would: GET, start, then POST each next batch until finished."""
    url = reverse("admin:django_fq_job_bulk", args=[verb])
    start = client.get(f"{url}?{query}")
    assert start.status_code == 200, text(start)
    total = start.context["total"]
    response = client.post(url, {"query": query})
    steps = 1
    while not response.context["finished"]:
        assert response.status_code == 200
        assert 'data-fq-continue="1"' in text(response)
        response = client.post(url, {"state": response.context["state"]})
        steps += 1
        assert steps < 100
    ctx = response.context
    return {"total": total, "done": ctx["done"], "seen": ctx["seen"], "refused": dict(ctx["refused"]), "steps": steps}


def _states() -> dict[str, int]:
    rows = Job.objects.filter(queue__name=QUEUE).values_list("state", flat=True)
    out: dict[str, int] = {}
    for s in rows:
        out[s] = out.get(s, 0) + 1
    return out


def build(n: int):
    """``n`` jobs of one queue (a multiple of 100): 80 % dead, 10 % running (returned), 10 % ready."""
    fq.configure(QUEUE, max_attempts=1)
    for start in range(0, n, 1000):
        fq.enqueue_many(QUEUE, [{"payload": {"n": i, "user_id": i % 7}} for i in range(start, min(n, start + 1000))])
    dead, running = n * 8 // 10, n // 10
    for start in range(0, dead, 1000):
        assert len(fq.claim(QUEUE, count=min(1000, dead - start), visibility_ms=1)) == min(1000, dead - start)
    deadline = time.monotonic() + 600  # the machine may be loaded: the reaper is not what is tested here
    while _states().get("dead", 0) < dead:  # the 1 ms leases have passed: the reaper ends them
        fq.reap(QUEUE)
        assert time.monotonic() < deadline
    taken = fq.claim(QUEUE, count=running, visibility_ms=3_600_000)
    assert len(taken) == running
    assert _states() == {"dead": dead, "running": running, "queued": n - dead - running}
    return taken


@pytest.mark.slow
def test_retry_cancel_delete_every_match(db, root_client):
    """The issue's figure: 5,000 matches, 100 list pages, 10 batches per verb."""
    check_every_match(root_client, N)


def test_retry_cancel_delete_every_match_small_batches(db, root_client, monkeypatch):
    """The same path in the fast tier: 600 matches, batches of 70 (the last one short), 23 jobs per transaction."""
    bulk = _bulk_module()
    monkeypatch.setattr(bulk, "BATCH", 70)
    monkeypatch.setattr(bulk, "PER_TRANSACTION", 23)
    check_every_match(root_client, 600)


def check_every_match(client, n: int) -> None:
    from django.contrib.admin.models import CHANGE, DELETION, LogEntry  # the admin is installed for this package only

    bulk = _bulk_module()
    running = build(n)
    dead, active = n * 8 // 10, n // 10
    query = f"fq-queue={QUEUE}"
    listed = client.get(reverse("admin:django_fq_job_changelist") + "?" + query)
    assert listed.context["cl"].result_count == n
    assert len(listed.context["cl"].result_list) == 50  # one page of many
    assert 'id="fq-bulk-retry"' in text(listed)

    before = LogEntry.objects.count()
    # From the list's last page: the page number is no filter, and that page is gone after the retry.
    got = run_bulk(client, "retry", query + f"&p={n // 50}")
    assert got["total"] == n and got["seen"] == n
    assert got["done"] == dead
    assert got["refused"] == {"job is running": active, "job is ready": n - dead - active}
    assert got["steps"] == n // bulk.BATCH + 1
    assert _states() == {"queued": n - active, "running": active}
    assert LogEntry.objects.count() - before == dead
    assert set(LogEntry.objects.values_list("action_flag", flat=True)) == {CHANGE}

    # Some running jobs succeed: cancel refuses them, and cancels the rest (running ones included).
    acked = active // 5
    for job in running[:acked]:
        fq.ack(QUEUE, job.receipt)
    got = run_bulk(client, "cancel", query)
    assert (got["done"], got["refused"]) == (n - acked, {"job is succeeded": acked})
    assert _states() == {"cancelled": n - acked, "succeeded": acked}

    # A search with a state: only the succeeded ones; then every finished job.
    got = run_bulk(client, "delete", query + "&fq-state=succeeded")
    assert (got["total"], got["done"], got["refused"]) == (acked, acked, {})
    assert _states() == {"cancelled": n - acked}
    got = run_bulk(client, "delete", query)
    assert (got["done"], got["refused"]) == (n - acked, {})
    assert _states() == {}
    assert LogEntry.objects.filter(action_flag=DELETION).count() == n


def test_select_across_goes_to_the_bulk_page(db, root_client):
    build(300)
    url = reverse("admin:django_fq_job_changelist") + f"?fq-queue={QUEUE}&fq-state=dead"
    page = root_client.get(url)
    first = [str(j.pk) for j in page.context["cl"].result_list]
    response = root_client.post(
        url, {"action": "retry_selected", "_selected_action": first, "select_across": "1", "index": "0"}
    )
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:django_fq_job_bulk", args=["retry"]))
    assert "fq-state=dead" in response["Location"]
    assert _states()["dead"] == 240  # nothing changed before the bulk page's start


def test_bulk_refuses_view_only_and_bad_input(db, make_user, root_client):
    fq.configure(QUEUE)
    job = fq.enqueue(QUEUE, {"n": 1}).id
    url = reverse("admin:django_fq_job_bulk", args=["cancel"])
    viewer = client_for(make_user("viewer", "view_job"))
    assert viewer.get(f"{url}?fq-queue={QUEUE}").status_code == 403
    assert viewer.post(url, {"query": f"fq-queue={QUEUE}"}).status_code == 403
    assert Job.objects.get(uid=job).state == "queued"
    bad = root_client.get(f"{url}?fq-queue={QUEUE}&fq-state=ready&fq-payload=%7Bnope")
    assert bad.status_code == 400
    assert re.search(r"payload contains: ", text(bad))
    assert root_client.get(reverse("admin:django_fq_job_bulk", args=["explode"])).status_code == 403
    # A forged state is not trusted: the start again, over the search in the form.
    forged = root_client.post(url, {"state": "x:y:z", "query": f"fq-queue={QUEUE}"})
    assert forged.status_code == 200 and forged.context["done"] == 1
    assert Job.objects.get(uid=job).state == "cancelled"


def test_a_run_belongs_to_its_verb(db, root_client, monkeypatch):
    monkeypatch.setattr(_bulk_module(), "BATCH", 1)
    fq.configure(QUEUE)
    ids = [fq.enqueue(QUEUE, {"n": n}).id for n in range(2)]
    cancel = reverse("admin:django_fq_job_bulk", args=["cancel"])
    first = root_client.post(cancel, {"query": f"fq-queue={QUEUE}"})
    assert (first.context["done"], first.context["finished"]) == (1, False)
    # The steps of the cancel cannot be posted to another verb's URL.
    delete = reverse("admin:django_fq_job_bulk", args=["delete"])
    assert root_client.post(delete, {"state": first.context["state"]}).status_code == 403
    assert Job.objects.filter(uid__in=ids).count() == 2
    second = root_client.post(cancel, {"state": first.context["state"]})
    assert (second.context["done"], second.context["finished"]) == (2, False)
    last = root_client.post(cancel, {"state": second.context["state"]})
    assert (last.context["done"], last.context["seen"], last.context["finished"]) == (2, 2, True)
    assert {fq.get(QUEUE, i).state for i in ids} == {"cancelled"}
