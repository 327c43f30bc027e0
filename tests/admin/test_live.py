"""The live-update JSON views of the dashboard and the job list (docs/admin.md "Live updates").

Permissions (anonymous: the login page; view-only staff: the numbers), what
the answers hold (counts that follow the jobs, never a payload, an error text
or a receipt), and hostile parameters (a 400 naming the parameter, no 500).
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_fq import services as fq

from .helpers import changelist, client_for, make, seq, text

pytestmark = pytest.mark.django_db

SECRET = "s3cret-payload-text-4711"


def dash_url() -> str:
    return reverse("admin:django_fq_dashboard_live")


def jobs_url() -> str:
    return reverse("admin:django_fq_job_live")


def _json(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    return json.loads(response.content)


def test_anonymous_is_sent_to_the_login_page(queue):
    for url in (dash_url(), jobs_url()):
        response = Client().get(url)
        assert response.status_code == 302
        assert "/admin/login/" in response["Location"]


def test_staff_without_view_permission_gets_403(make_user, queue):
    nobody = client_for(make_user("nobody"))
    assert nobody.get(dash_url()).status_code == 403
    assert nobody.get(jobs_url()).status_code == 403


def test_dashboard_counts_follow_the_jobs_for_a_view_only_user(make_user, queue):
    viewer = client_for(make_user("viewer", "view_queue"))
    make(queue, "dead")
    before = _json(viewer.get(dash_url()))
    row = next(q for q in before["queues"] if q["name"] == queue)
    assert row["counts"]["dead"] == 1 and row["counts"]["ready"] == 0
    assert before["all"]["dead"] == 1 and before["n_queues"] == 1
    assert row["paused"] is False
    fq.enqueue(queue, {"n": 1})
    fq.pause(queue)
    after = _json(viewer.get(dash_url()))
    row = next(q for q in after["queues"] if q["name"] == queue)
    assert row["counts"]["ready"] == 1 and after["all"]["ready"] == 1
    assert row["paused"] is True and row["paused_at"].endswith("UTC")
    assert row["enqueued"] == 2 and row["failed"] == 1
    assert row["jobs_url"] == changelist("job") + f"?queue__id__exact={row['jobs_url'].rsplit('=', 1)[1]}"
    assert after["now"] >= before["now"]
    # The dashboard page itself shows the live bar for JavaScript, and the no-JS text.
    page = text(viewer.get(reverse("admin:django_fq_dashboard")))
    assert 'id="fq-live"' in page and f'data-url="{dash_url()}"' in page and "django_fq/live.js" in page
    assert "Reload the page for fresh numbers." in page


def test_dashboard_answer_is_bounded_and_only_gets(root_client, queue):
    for i in range(5):
        fq.configure(f"adm:many{i}")
        fq.enqueue(f"adm:many{i}", {"n": i})
    with CaptureQueriesContext(connection) as few:
        assert root_client.get(dash_url()).status_code == 200
    for i in range(5, 25):
        fq.enqueue(f"adm:many{i}", {"n": i})
    with CaptureQueriesContext(connection) as many:
        assert root_client.get(dash_url()).status_code == 200
    # The same number of queries whatever the number of queues (session and user lookups included);
    # on PostgreSQL the page's reads also open a (sub)transaction that turns JIT off (Store.page_reads).
    extra = 2 if connection.vendor == "postgresql" else 0
    assert len(many) == len(few) <= 12 + extra
    assert root_client.post(dash_url()).status_code == 405


def test_job_list_rows_and_new_matches(make_user, queue):
    viewer = client_for(make_user("viewer", "view_job"))
    a = make(queue, "ready", payload={"secret": SECRET})
    b = make(queue, "ready")
    page = viewer.get(changelist("job") + "?state=ready")
    since = page.context["fq_live_since"]
    assert since == seq(b)
    assert f'data-since="{since}"' in text(page) and 'id="fq-live"' in text(page)
    query = f"?state=ready&live_rows={seq(a)},{seq(b)}&live_since={since}"
    data = _json(viewer.get(jobs_url() + query))
    assert data["rows"][str(seq(a))] == {"state": "ready", "attempts": "0 / 3", "worker": "", "matches": True}
    assert data["new"] == 0 and data["matches"] == 2
    # One job is claimed (no longer matches ?state=ready), two new ready jobs arrive.
    job = fq.claim(queue, worker="w-live")[0]
    assert job.id == a
    fq.enqueue(queue, {"n": 3})
    fq.enqueue(queue, {"n": 4})
    fq.enqueue("adm:elsewhere", {"n": 5}, delay_ms=3_600_000)  # scheduled: does not match
    data = _json(viewer.get(jobs_url() + query))
    assert data["rows"][str(seq(a))] == {"state": "running", "attempts": "1 / 3", "worker": "w-live", "matches": False}
    assert data["rows"][str(seq(b))]["matches"] is True
    assert data["new"] == 2 and data["new_capped"] is False and data["matches"] == 3
    assert SECRET not in json.dumps(data) and job.receipt not in json.dumps(data)
    # A deleted job is absent from the answer.
    fq.ack(queue, job.receipt)
    from django_fq.services.jobs import delete_finished

    delete_finished(queue, a)
    data = _json(viewer.get(jobs_url() + query))
    assert str(seq(b)) in data["rows"] and len(data["rows"]) == 1


def test_job_list_live_applies_the_search_form(root_client, queue):
    make(queue, "dead")
    keep = make("adm:other", "dead")
    since = 0
    data = _json(
        root_client.get(jobs_url() + f"?fq-queue=adm:other&fq-state=dead&live_since={since}&live_rows={seq(keep)}")
    )
    assert data["new"] == 1 and data["matches"] == 1
    assert data["rows"][str(seq(keep))]["matches"] is True
    # The search's own errors come back as the list shows them, with a 400.
    bad = root_client.get(jobs_url() + "?fq-queue=adm:other&fq-state=nonsense")
    assert bad.status_code == 400
    assert any(e.startswith("state") or "state" in e for e in _json(bad)["errors"])


@pytest.mark.parametrize(
    "query, names",
    [
        ("?live_rows=1,x", "live_rows"),
        ("?live_rows=" + ",".join(["1"] * 201), "live_rows"),
        ("?live_rows=99999999999999999999", "live_rows"),
        ("?live_rows=9223372036854775808", "live_rows"),
        ("?live_since=-1", "live_since"),
        ("?live_since=1%002", "live_since"),
        ("?payload__contains=x", "filters"),
        ("?queue__id__exact=99999999999999999999", "filters"),
        ("?state=ready%00", None),
        ("?o=zzz", None),
    ],
)
def test_job_list_live_refuses_hostile_parameters_without_a_500(root_client, queue, query, names):
    make(queue, "ready")
    response = root_client.get(jobs_url() + query)
    assert response.status_code in (200, 400), response.status_code
    if names is not None:
        assert response.status_code == 400
        assert names in " ".join(_json(response)["errors"])


def test_job_list_live_is_bounded(root_client, queue):
    ids = [make(queue, "ready") for _ in range(3)]
    rows = ",".join(str(seq(i)) for i in ids)
    with CaptureQueriesContext(connection) as few:
        assert root_client.get(jobs_url() + f"?live_rows={rows}&live_since=0").status_code == 200
    ids += [make(queue, "ready") for _ in range(30)]
    rows = ",".join(str(seq(i)) for i in ids)
    with CaptureQueriesContext(connection) as many:
        data = _json(root_client.get(jobs_url() + f"?live_rows={rows}&live_since=0"))
    assert len(data["rows"]) == 33 and data["new"] == 33
    assert len(many) == len(few) <= 12
    assert root_client.post(jobs_url()).status_code == 405
