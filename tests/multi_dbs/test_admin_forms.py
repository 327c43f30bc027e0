"""The admin's forms act on the database their page showed, whatever the session says by the time they post.

Run with ``tests.settings_multi_dbs`` (see ``tests/test_queues_over_databases.py``). Each test
makes a row of the same number on ``second`` and ``default`` (row numbers are per database),
shows a page of ``second``, lets "another tab" switch the session to ``default``, then posts
the page's form as a browser would: only the row of ``second`` may change. docs/admin.md,
docs/how-to/queues-over-databases.md "Admin".
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_fq import services as fq
from django_fq.models import Job, Queue
from tests.multi_dbs.test_multi_dbs import ALIASES, POLICY_FORM, job_rows, queue_rows

pytestmark = pytest.mark.django_db(databases=ALIASES)


def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def same_number(model, make) -> dict[str, object]:
    """``{"second": row, "default": row}`` of ``model`` with one primary key, made with ``make(alias, i)``.

    PostgreSQL's and MariaDB's sequences are not rolled back between tests, so rows are made
    on the database that is behind until both have the same number.
    """
    rows = {alias: make(alias, 0) for alias in ("second", "default")}
    for i in range(1, 2000):
        if rows["second"].pk == rows["default"].pk:
            return rows
        behind = min(rows, key=lambda a: rows[a].pk)
        rows[behind] = make(behind, i)
    raise AssertionError("no common row number")


def make_job(alias: str, i: int) -> Job:
    uid = fq.enqueue("two:form" if alias == "second" else "t.form", {"n": i}).id
    return Job.objects.using(alias).get(uid=uid)


def make_queue(alias: str, i: int) -> Queue:
    name = f"two:form{i}" if alias == "second" else f"t.form{i}"
    fq.configure(name)
    return Queue.objects.using(alias).get(name=name)


def shown_then_switched(client: Client, url: str) -> str:
    """GET ``url`` of database ``second``, then switch the session to ``default`` (another tab); the page's HTML."""
    assert client.get("/admin/django_fq/job/?fq_db=second").status_code == 200
    page = client.get(url)
    assert page.status_code == 200
    assert client.get("/admin/django_fq/job/?fq_db=default").status_code == 200
    return page.content.decode()


def test_the_job_lists_action_acts_on_the_database_the_list_showed():
    client = admin_client()
    jobs = same_number(Job, make_job)
    html = shown_then_switched(client, "/admin/django_fq/job/")
    shown = re.search(r'name="fq_db" value="([^"]*)"', html).group(1)
    assert shown == "second"
    r = client.post(
        "/admin/django_fq/job/",
        {"action": "cancel_selected", "_selected_action": [jobs["second"].pk], "index": 0, "fq_db": shown},
    )
    assert r.status_code == 302
    assert job_rows("second", jobs["second"].uid) == [(jobs["second"].uid, "cancelled")]
    assert job_rows("default", jobs["default"].uid) == [(jobs["default"].uid, "queued")]
    # "Select all" goes to the bulk page of the database the list showed.
    r = client.post(
        "/admin/django_fq/job/",
        {
            "action": "cancel_selected",
            "_selected_action": [jobs["second"].pk],
            "select_across": "1",
            "index": 0,
            "fq_db": shown,
        },
    )
    assert r.status_code == 302 and "fq_db=second" in r["Location"], r["Location"]


def test_the_queue_lists_action_acts_on_the_database_the_list_showed():
    client = admin_client()
    queues = same_number(Queue, make_queue)
    html = shown_then_switched(client, "/admin/django_fq/queue/")
    shown = re.search(r'name="fq_db" value="([^"]*)"', html).group(1)
    r = client.post(
        "/admin/django_fq/queue/",
        {"action": "pause_selected", "_selected_action": [queues["second"].pk], "index": 0, "fq_db": shown},
    )
    assert r.status_code == 302
    assert Queue.objects.using("second").get(pk=queues["second"].pk).paused
    assert not Queue.objects.using("default").get(pk=queues["default"].pk).paused


def queue_form_of_second(client: Client, page: str, form: str) -> tuple[dict, str]:
    """Same-numbered queues, and the URL the form of the ``page`` of second's queue posts to (regex ``form``)."""
    queues = same_number(Queue, make_queue)
    html = shown_then_switched(client, f"/admin/django_fq/queue/{queues['second'].pk}/{page}/")
    action = re.search(form, html).group(1).replace("&amp;", "&")
    assert "fq_db=second" in action
    return queues, action


def test_a_queue_edit_form_saves_on_the_database_it_showed():
    client = admin_client()
    queues, action = queue_form_of_second(client, "change", r'action="([^"]*)" method="post" id="queue_form"')
    r = client.post(action, {**POLICY_FORM, "max_attempts": 7})
    assert r.status_code == 302, r.content.decode()[:2000]
    assert Queue.objects.using("second").get(pk=queues["second"].pk).max_attempts == 7
    assert Queue.objects.using("default").get(pk=queues["default"].pk).max_attempts == POLICY_FORM["max_attempts"]


def test_a_queue_delete_confirmation_deletes_on_the_database_it_showed():
    client = admin_client()
    queues, action = queue_form_of_second(client, "delete", r'<form method="post" action="([^"]*)">')
    r = client.post(action, {"post": "yes"})
    assert r.status_code == 302
    assert queues["second"].name not in queue_rows("second")
    assert queues["default"].name in queue_rows("default")


def test_a_form_naming_no_database_of_the_mapping_changes_nothing():
    client = admin_client()
    queues = same_number(Queue, make_queue)
    assert client.get("/admin/django_fq/queue/?fq_db=second").status_code == 200
    for bad in ("nowhere", "<script>", ""):
        r = client.post(
            "/admin/django_fq/queue/",
            {"action": "pause_selected", "_selected_action": [queues["second"].pk], "index": 0, "fq_db": bad},
        )
        assert r.status_code == 400 and r["Content-Type"].startswith("text/plain"), r.content
        assert r.content.decode().startswith("fq_db: ")
    # The URL and the form naming two databases: refused too.
    r = client.post(
        "/admin/django_fq/queue/?fq_db=default",
        {"action": "pause_selected", "_selected_action": [queues["second"].pk], "index": 0, "fq_db": "second"},
    )
    assert r.status_code == 400
    assert not any(Queue.objects.using(a).get(pk=queues[a].pk).paused for a in ("second", "default"))
    # A queue added on a page of "default" that the mapping sends to "second": refused, on its field.
    assert client.get("/admin/django_fq/queue/?fq_db=default").status_code == 200
    r = client.post("/admin/django_fq/queue/add/", {**POLICY_FORM, "name": "two:misplaced"})
    assert r.status_code == 200
    assert "queue two:misplaced is on database &#x27;second&#x27;" in r.content.decode()
    assert "two:misplaced" not in queue_rows("default") | queue_rows("second")
