"""Hostile search input and crafted bulk POSTs (docs/admin.md "Searching jobs", "Permissions"), on every database.

Every hostile value of the search form or of the sidebar's filters gives the
list and the bulk page a 200 or a 400 naming the field, never a 500; a bulk
run's signed state belongs to the user who started it; the bulk endpoints
need the CSRF token.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job

from .helpers import client_for, text

Q = "atk:q"
HOSTILE = [
    ("payload", "[" * 5000 + "]" * 5000),
    ("payload", '{"a":' * 3000 + "1" + "}" * 3000),
    ("payload", json.dumps({"a": "x" * 20000})),
    ("payload", "[1,2]"),
    ("payload", '"str"'),
    ("payload", "1e999999"),
    ("payload", "NaN"),
    ("payload", '{"a": 1e400}'),
    ("payload", '{"a": 123456789012345678901234567890}'),
    ("payload", '{"\\ud800": 1}'),
    ("payload", '{"a":"\\u0000"}'),
    ("metadata", "' OR 1=1 --"),
    ("error", "'; DROP TABLE x; --"),
    ("error", "%_\\"),
    ("error", "\u202e\U0001f600"),
    ("worker", "a\x00b"),
    ("id", "-1"),
    ("id", "9" * 100),
    ("enqueued_from", "999999999999999"),
    ("enqueued_from", "0"),
    ("enqueued_to", "9999-12-31T23:59:59-23:59"),
    ("enqueued_from", "0001-01-01T00:00+23:59"),
    ("finished_to", "9999-12-31 23:59:59.999999"),
    ("finished_from", "-5"),
    ("finished_from", "1" * 15),
    ("enqueued_from", "1" * 16),
    ("queue", "x" * 500),
    ("tag", "\x00"),
    ("state", "nope"),
]
SIDEBAR = [
    ("state", "nope"),
    ("queue__id__exact", "-1"),
    ("queue__id__exact", "99999999999999999999999"),
    ("queue__id__exact", "abc"),
    ("tag", "\x00"),
    ("tag", "'"),
    ("o", "999"),
    ("p", "-1"),
    ("p", "9" * 30),
    ("q", "\x00"),
    ("q", "x" * 10000),
    ("seq", "1"),
    ("seq__gt", "99999999999999999999999"),
]


@pytest.mark.parametrize("field,value", HOSTILE)
def test_hostile_search_is_never_a_500(db, root_client, field, value):
    fq.configure(Q)
    fq.enqueue(Q, {"a": 1})
    qs = urlencode({"fq-queue": Q, "fq-state": "ready", f"fq-{field}": value})
    r = root_client.get(reverse("admin:django_fq_job_changelist") + "?" + qs)
    assert r.status_code in (200, 400), r.status_code
    for verb in ("cancel",):
        url = reverse("admin:django_fq_job_bulk", args=[verb])
        r2 = root_client.get(url + "?" + qs)
        assert r2.status_code in (200, 400)
        r3 = root_client.post(url, {"query": qs})
        assert r3.status_code in (200, 400)


@pytest.mark.parametrize("field,value", SIDEBAR)
def test_hostile_sidebar_filter_is_never_a_500(db, root_client, field, value):
    fq.configure(Q)
    fq.enqueue(Q, {"a": 1})
    qs = urlencode({field: value})
    r = root_client.get(reverse("admin:django_fq_job_changelist") + "?" + qs)
    assert r.status_code in (200, 302, 400)
    url = reverse("admin:django_fq_job_bulk", args=["cancel"])
    assert root_client.get(url + "?" + qs).status_code in (200, 400)
    assert root_client.post(url, {"query": qs}).status_code in (200, 400)


@pytest.mark.parametrize(
    "field,value",
    [
        ("enqueued_from", "999999999999999"),  # 15 digits of epoch ms: the year 33658
        ("finished_to", "9999-12-31T23:59:59.999-00:01"),  # the year 10000 of UTC
        ("enqueued_to", "9999-12-31T23:59:59-23:59"),
        ("finished_from", "0001-01-01T00:00+23:59"),
    ],
)
def test_an_instant_past_the_printable_years_names_its_field(db, root_client, field, value):
    fq.configure(Q)
    qs = urlencode({"fq-queue": Q, "fq-state": "ready", f"fq-{field}": value})
    listed = root_client.get(reverse("admin:django_fq_job_changelist") + "?" + qs)
    label = field.replace("_", " ")
    assert listed.status_code == 200
    assert re.search(rf"{label}: not a date and time: outside the years 1 to 9999", text(listed))
    bulk = root_client.get(reverse("admin:django_fq_job_bulk", args=["cancel"]) + "?" + qs)
    assert bulk.status_code == 400
    assert re.search(rf"{label}: not a date and time", text(bulk))


def test_the_last_printable_instant_is_taken(db, root_client):
    fq.configure(Q)
    qs = urlencode({"fq-queue": Q, "fq-state": "ready", "fq-enqueued_to": "9999-12-31 23:59:59.999"})
    bulk = root_client.get(reverse("admin:django_fq_job_bulk", args=["cancel"]) + "?" + qs)
    assert bulk.status_code == 200
    assert "9999-12-31 23:59:59.999 UTC" in text(bulk)


def test_a_run_belongs_to_the_user_who_started_it(db, root_client, make_user, monkeypatch):
    from django_fq.admin import bulk

    monkeypatch.setattr(bulk, "BATCH", 1)
    fq.configure(Q)
    ids = [fq.enqueue(Q, {"n": n}).id for n in range(3)]
    url = reverse("admin:django_fq_job_bulk", args=["cancel"])
    first = root_client.post(url, {"query": f"fq-queue={Q}"})
    assert (first.context["done"], first.context["finished"]) == (1, False)
    other = client_for(make_user("repairer", "change_job"))
    # Another user with the permission replays the form: refused, nothing more cancelled.
    assert other.post(url, {"state": first.context["state"]}).status_code == 403
    assert Job.objects.filter(uid__in=ids, state="cancelled").count() == 1
    # A user without change_job is refused whatever the state says.
    viewer = client_for(make_user("viewer", "view_job"))
    assert viewer.post(url, {"state": first.context["state"]}).status_code == 403
    assert Job.objects.filter(uid__in=ids, state="cancelled").count() == 1
    again = root_client.post(url, {"state": first.context["state"]})
    assert again.status_code == 200 and again.context["done"] == 2


def test_bulk_post_needs_the_csrf_token(db, make_user):
    fq.configure(Q)
    job = fq.enqueue(Q, {"n": 1}).id
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("root2", superuser=True))
    url = reverse("admin:django_fq_job_bulk", args=["cancel"])
    assert client.post(url, {"query": f"fq-queue={Q}"}).status_code == 403
    assert Job.objects.get(uid=job).state == "queued"


def test_hostile_text_is_escaped_on_the_search_and_bulk_pages(db, root_client):
    from .helpers import claim_one

    fq.configure(Q, max_attempts=1)
    fq.enqueue(Q, {"x": "<script>alert(1)</script>"})
    job = claim_one(Q, worker="w")
    fq.nack(Q, job.receipt, error="<img src=x onerror=alert(2)>", permanent=True)
    qs = urlencode(
        {
            "fq-queue": Q,
            "fq-state": "dead",
            "fq-error": "<img src=x",
            "fq-payload": '{"x": "<script>alert(1)</script>"}',
        }
    )
    for response in (
        root_client.get(reverse("admin:django_fq_job_changelist") + "?" + qs),
        root_client.get(reverse("admin:django_fq_job_bulk", args=["retry"]) + "?" + qs),
    ):
        body = text(response)
        assert response.status_code == 200
        assert "<img src=x" not in body and "<script>alert" not in body
        assert job.receipt not in body
