"""Pausing and resuming queues from the admin: the list column, the two bulk actions, their permission and history."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_fq import services as fq

from .helpers import changelist, client_for, messages_of, queue_pk, squash, text

pytestmark = pytest.mark.django_db

CHANGE = "/admin/django_fq/queue/{}/change/"


def _action(client, action: str, *names: str):
    return client.post(
        changelist("queue"), {"action": action, "_selected_action": [str(queue_pk(n)) for n in names]}, follow=True
    )


def test_pause_and_resume_actions_go_through_the_services_and_report(root_client, queue):
    fq.configure("adm:other")
    fq.enqueue(queue, {"n": 1})
    response = _action(root_client, "pause_selected", queue, "adm:other")
    assert response.status_code == 200
    assert "2 queues paused." in messages_of(response)
    assert fq.stats(queue).paused and fq.stats("adm:other").paused
    assert fq.claim(queue) == []  # the claim refuses

    msgs = messages_of(_action(root_client, "pause_selected", queue))
    assert msgs == ["1 queue already paused: unchanged."]

    msgs = messages_of(_action(root_client, "resume_selected", queue))
    assert msgs == ["1 queue resumed."]
    assert not fq.stats(queue).paused and fq.stats("adm:other").paused
    assert len(fq.claim(queue)) == 1


def test_the_list_shows_and_filters_paused_queues_and_the_form_says_since_when(root_client, queue):
    fq.configure("adm:running")
    at = fq.pause(queue).paused_at
    response = root_client.get(changelist("queue"))
    html = squash(text(response))
    assert '<span class="fq-paused"' in html
    rows = {q.name: q.paused for q in response.context["cl"].result_list}
    assert rows == {queue: True, "adm:running": False}
    only = root_client.get(changelist("queue") + "?paused__exact=1")
    assert [q.name for q in only.context["cl"].result_list] == [queue]

    form = text(root_client.get(CHANGE.format(queue_pk(queue))))
    assert "paused" in form and f"({at} ms)" in form
    form = text(root_client.get(CHANGE.format(queue_pk("adm:running"))))
    assert "running: claims take jobs" in form


def test_the_actions_are_logged_in_the_admin_history(root_client, queue):
    from django.contrib.admin.models import LogEntry  # the admin is installed for this package only

    _action(root_client, "pause_selected", queue)
    _action(root_client, "pause_selected", queue)  # unchanged: not logged again
    _action(root_client, "resume_selected", queue)
    entries = LogEntry.objects.filter(object_id=str(queue_pk(queue))).order_by("action_time", "pk")
    assert [e.object_repr for e in entries] == [queue, queue]
    paused, resumed = (e.get_change_message() for e in entries)
    assert paused.startswith("Paused through the admin (since ") and resumed == "Resumed through the admin."
    history = text(root_client.get(reverse("admin:django_fq_queue_history", args=[queue_pk(queue)])))
    assert "Paused through the admin" in history and "Resumed through the admin" in history


def test_a_view_only_user_sees_neither_action_and_cannot_post_one(make_user, queue):
    viewer = client_for(make_user("viewer", "view_queue"))
    response = viewer.get(changelist("queue"))
    assert response.status_code == 200
    assert not response.context["cl"].model_admin.get_actions(response.wsgi_request)
    html = text(response)
    assert "pause_selected" not in html and "resume_selected" not in html
    _action(viewer, "pause_selected", queue)
    assert fq.stats(queue).paused is False


def test_the_change_permission_offers_both_actions(make_user, queue):
    operator = client_for(make_user("operator", "view_queue", "change_queue"))
    choices = operator.get(changelist("queue")).context["action_form"].fields["action"].choices
    assert {"pause_selected", "resume_selected"} <= {name for name, _ in choices}
    labels = dict(choices)
    assert (labels["pause_selected"], labels["resume_selected"]) == ("Pause selected queues", "Resume selected queues")
    _action(operator, "pause_selected", queue)
    assert fq.stats(queue).paused is True


def test_the_dashboard_marks_paused_queues(root_client, queue):
    fq.enqueue(queue, {})
    fq.enqueue("adm:b", {})
    fq.pause(queue)
    response = root_client.get(reverse("admin:django_fq_dashboard"))
    rows = {q["name"]: q["paused"] for q in response.context["queues"]}
    assert rows == {queue: True, "adm:b": False}
    html = squash(text(response))
    marked = html.split(f'data-queue="{queue}"')[1].split("</tr>")[0]
    assert 'class="fq-paused"' in marked
    assert 'class="fq-paused"' not in html.split('data-queue="adm:b"')[1].split("</tr>")[0]
