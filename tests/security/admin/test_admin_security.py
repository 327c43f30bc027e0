"""Admin: no page shows a receipt, repairs need the change permission, and CSRF protects every POST.

``tests/admin/test_secrets.py`` renders a fixed list of pages; here a crawler
follows every link of the admin from its index (filters, details, histories,
the dashboard, delete confirmations) with running, settled and cancelled
jobs in the database, and searches each page for receipts, their secrets,
and every hash or digest stored about a lease.
"""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import urljoin, urlsplit

import pytest
from django.test import Client
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job, Lease
from tests.admin.helpers import changelist, claim_one, client_for, job_url, make, queue_pk, seq

pytestmark = pytest.mark.django_db

HREF = re.compile(r'href="([^"#]*)"')
#: Most pages the crawler visits (it stops there; the test says how many it saw).
MAX_PAGES = 150


def _log_entries():
    from django.contrib.admin.models import LogEntry  # the admin is installed by the package fixture

    return LogEntry.objects


def _secrets(receipts: list[str]) -> set[str]:
    found = set(receipts) | {r.rsplit(".", 1)[1] for r in receipts}
    found |= set(Lease.objects.values_list("receipt_hash", flat=True))
    for settled_hash, settled_args in Job.objects.values_list("settled_hash", "settled_args"):
        found |= {v for v in (settled_hash, settled_args) if v}
    return found


def _crawl(client: Client, start: str) -> dict[str, str]:
    """GET every django-fq admin page reachable from ``start``; ``{url: html}``.

    Skipped: other apps, another sort order, the same page with list filters to
    return to, and lists with more than one filter at once.
    """
    pages: dict[str, str] = {}
    todo = [start]
    while todo and len(pages) < MAX_PAGES:
        link = todo.pop(0)
        if link in pages:
            continue
        response = client.get(link)
        assert response.status_code in (200, 302), (link, response.status_code)
        html = response.content.decode()
        pages[link] = html
        if response.status_code != 200:
            continue
        for href in HREF.findall(html):
            target = urljoin(link, unescape(href))
            parts = urlsplit(target)
            if not parts.path.startswith("/admin/") or parts.netloc:
                continue
            if parts.path != "/admin/" and not parts.path.startswith("/admin/django_fq/"):
                continue  # other apps' pages, logout, password change
            if "_changelist_filters" in parts.query or "o=" in parts.query or "&" in parts.query:
                continue  # the same page again with other list filters to return to, or another order
            url = parts.path + (f"?{parts.query}" if parts.query else "")
            if url not in pages and url not in todo:
                todo.append(url)
    return pages


def test_no_admin_page_reachable_from_the_index_shows_a_receipt(root_client, queue):
    receipts = []
    fq.configure(queue, backoff_ms=0)
    fq.enqueue(queue, {"n": 1}, idempotency="tok-sec")
    running = claim_one(queue, worker="w-live")
    receipts.append(running.receipt)
    for action in ("ack", "nack", "release", "cancel"):
        job_id = fq.enqueue(queue, {"action": action}).id
        held = claim_one(queue)
        receipts.append(held.receipt)
        if action == "ack":
            fq.ack(queue, held.receipt, result={"ok": True})
        elif action == "nack":
            fq.nack(queue, held.receipt, error="failed", permanent=True)
        elif action == "release":
            fq.release(queue, held.receipt)
            again = claim_one(queue)
            receipts.append(again.receipt)
        else:
            fq.cancel(queue, job_id)
    dead = Job.objects.get(state="dead").uid
    # A repair through the admin writes a LogEntry (shown on the history pages and the index).
    assert root_client.post(reverse("admin:django_fq_job_retry", args=[seq(dead)])).status_code == 302
    secrets = _secrets(receipts)
    assert len(secrets) >= 12

    pages = _crawl(root_client, reverse("admin:index"))
    visited = set(pages)
    for must in (
        job_url(running.id),
        job_url(running.id, "history"),
        reverse("admin:django_fq_dashboard"),
        reverse("admin:django_fq_queue_change", args=[queue_pk(queue)]),
        reverse("admin:django_fq_lease_change", args=[seq(running.id)]),
    ):
        if must not in visited:
            pages[must] = root_client.get(must).content.decode()
    for extra in (
        reverse("admin:django_fq_queue_history", args=[queue_pk(queue)]),
        reverse("admin:django_fq_queue_delete", args=[queue_pk(queue)]),
        reverse("admin:django_fq_lease_history", args=[seq(running.id)]),
        changelist("job") + f"?q={running.id}",
        reverse("admin:django_fq_dashboard") + f"?queue={queue}",
    ):
        response = root_client.get(extra)
        assert response.status_code == 200, extra
        pages[extra] = response.content.decode()
    assert len(pages) >= 30, len(pages)
    assert any("/history/" in p for p in pages)
    for link, html in pages.items():
        shown = [s for s in secrets if s in html]
        assert not shown, f"{link} shows a receipt, a secret or a stored hash"
    log = "\n".join(e.get_change_message() + e.object_repr for e in _log_entries().all())
    assert log and not [s for s in secrets if s in log]


# --- repairs need the change permission ---------------------------------------------------------------------


def _bulk(client, action: str, *job_ids: str):
    return client.post(changelist("job"), {"action": action, "_selected_action": [str(seq(j)) for j in job_ids]})


@pytest.mark.parametrize(
    "action, state", [("retry_selected", "dead"), ("requeue_selected", "scheduled"), ("cancel_selected", "ready")]
)
def test_a_viewer_cannot_run_a_bulk_repair_by_posting_it(make_user, queue, action, state):
    job_id = make(queue, state)
    viewer = client_for(make_user("viewer", "view_job", "view_queue"))
    response = _bulk(viewer, action, job_id)
    assert response.status_code in (200, 302, 403)
    assert fq.get(queue, job_id).state == state
    assert not _log_entries().exists()


@pytest.mark.parametrize("verb, state", [("retry", "dead"), ("requeue", "scheduled"), ("cancel", "running")])
def test_queue_permissions_do_not_grant_job_repairs(make_user, queue, verb, state):
    """``change_queue`` and ``delete_queue`` are about queues: they do not allow repairing jobs."""
    job_id = make(queue, state)
    queue_admin = client_for(make_user("qadmin", "view_queue", "change_queue", "delete_queue", "view_job"))
    assert queue_admin.post(reverse(f"admin:django_fq_job_{verb}", args=[seq(job_id)])).status_code == 403
    assert fq.get(queue, job_id).state == state


def test_repair_urls_refuse_get(root_client, queue):
    job_id = make(queue, "dead")
    for verb in ("retry", "requeue", "cancel"):
        assert root_client.get(reverse(f"admin:django_fq_job_{verb}", args=[seq(job_id)])).status_code == 405
    assert fq.get(queue, job_id).state == "dead"


# --- CSRF -------------------------------------------------------------------------------------------------------


@pytest.fixture
def csrf_client(make_user):
    """A superuser's browser that enforces CSRF, as a real one does."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("csrfroot", superuser=True))
    return client


def test_every_admin_post_of_django_fq_needs_the_csrf_token(csrf_client, queue):
    dead = make(queue, "dead")
    scheduled = make(queue, "scheduled")
    posts = [
        (reverse("admin:django_fq_job_retry", args=[seq(dead)]), {}),
        (reverse("admin:django_fq_job_requeue", args=[seq(scheduled)]), {}),
        (reverse("admin:django_fq_job_cancel", args=[seq(scheduled)]), {}),
        (changelist("job"), {"action": "cancel_selected", "_selected_action": [str(seq(dead))]}),
        (reverse("admin:django_fq_queue_change", args=[queue_pk(queue)]), {"max_attempts": 9}),
        (reverse("admin:django_fq_queue_delete", args=[queue_pk(queue)]), {"post": "yes"}),
        (reverse("admin:django_fq_queue_add"), {"name": "sec:new"}),
    ]
    for path, data in posts:
        response = csrf_client.post(path, data)
        assert response.status_code == 403, path
        assert b"CSRF" in response.content
    assert fq.get(queue, dead).state == "dead" and fq.get(queue, scheduled).state == "scheduled"
    assert fq.policy(queue).max_attempts == 3
    assert [q.name for q in fq.queues()] == [queue]

    # The same POST with the token works: the 403s above were CSRF's.
    page = csrf_client.get(job_url(dead))
    token = page.cookies["csrftoken"].value if "csrftoken" in page.cookies else csrf_client.cookies["csrftoken"].value
    response = csrf_client.post(reverse("admin:django_fq_job_retry", args=[seq(dead)]), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert fq.get(queue, dead).state == "ready"
