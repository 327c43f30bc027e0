"""Controls in place: a queue's pause/resume and limits from the queue list, and deleting one finished job.

Each goes through the service (``pause``/``resume``, ``configure``,
``jobs.delete_finished``), is logged in the admin's history, needs the change
permission (a view-only user sees no control and gets 403), and refuses bad
input with a message naming the field, changing nothing.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job

from .helpers import changelist, client_for, job_url, make, messages_of, queue_pk, seq, text

pytestmark = pytest.mark.django_db


def pause_url(name: str) -> str:
    return reverse("admin:django_fq_queue_pause", args=[queue_pk(name)])


def limits_url(name: str) -> str:
    return reverse("admin:django_fq_queue_limits", args=[queue_pk(name)])


def delete_url(job_id: str) -> str:
    return reverse("admin:django_fq_job_delete_finished", args=[seq(job_id)])


def _history(name_or_uid: str) -> list[str]:
    from django.contrib.admin.models import LogEntry  # the admin is installed for this package only

    return [e.get_change_message() for e in LogEntry.objects.filter(object_repr=name_or_uid).order_by("pk")]


def test_the_queue_list_shows_controls_to_a_user_who_may_change_queues(root_client, queue):
    html = text(root_client.get(changelist("queue")))
    pk = queue_pk(queue)
    assert f'<form id="fq-pause-{pk}" method="post"' in html and f'<form id="fq-limits-{pk}" method="post"' in html
    assert f'form="fq-limits-{pk}" value="0"' in html  # concurrency, unlimited
    assert f'<label for="fq-{pk}-rate_window_ms">rate window (ms)</label>' in html
    assert html.count("csrfmiddlewaretoken") >= 3  # the action form and the two control forms
    page = text(root_client.get(f"/admin/django_fq/queue/{pk}/change/"))
    assert 'id="fq-pause-queue"' in page and "Pause queue" in page


def test_a_view_only_user_sees_no_controls_and_gets_403(make_user, queue):
    viewer = client_for(make_user("viewer", "view_queue", "view_job"))
    before = fq.policy(queue)
    html = text(viewer.get(changelist("queue")))
    assert "fq-controls" not in html and "fq-pause-" not in html and "fq-limits-" not in html
    assert "fq-pause-queue" not in text(viewer.get(f"/admin/django_fq/queue/{queue_pk(queue)}/change/"))
    assert viewer.post(pause_url(queue), {"op": "pause"}).status_code == 403
    assert viewer.post(limits_url(queue), {"concurrency": "3"}).status_code == 403
    assert fq.policy(queue) == before and fq.stats(queue).paused is False
    done = make(queue, "succeeded")
    assert "fq-delete-job" not in text(viewer.get(job_url(done)))
    assert viewer.get(delete_url(done)).status_code == 403
    assert viewer.post(delete_url(done), {"post": "yes"}).status_code == 403
    assert fq.get(queue, done).state == "succeeded"


def test_anonymous_posts_go_to_the_login_page(queue):
    for url in (pause_url(queue), limits_url(queue)):
        response = Client().post(url, {"op": "pause", "concurrency": "1"})
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert fq.stats(queue).paused is False


def test_the_control_forms_are_csrf_protected(make_user, queue):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("boss", "view_queue", "change_queue"))
    assert client.post(pause_url(queue), {"op": "pause"}).status_code == 403
    assert fq.stats(queue).paused is False


def test_pause_and_resume_from_the_row_go_through_the_services_and_are_logged(make_user, queue):
    boss = client_for(make_user("boss", "view_queue", "change_queue"))
    back = changelist("queue") + "?paused__exact=0"
    response = boss.post(pause_url(queue), {"op": "pause", "next": back}, follow=True)
    assert response.redirect_chain == [(back, 302)]
    (said,) = messages_of(response)
    assert said.startswith(f"Queue {queue} paused (since ")
    assert fq.stats(queue).paused is True and fq.claim(queue) == []
    response = boss.post(pause_url(queue), {"op": "pause"}, follow=True)
    assert messages_of(response) == [f"Queue {queue} is already paused: unchanged."]
    response = boss.post(pause_url(queue), {"op": "resume"}, follow=True)
    assert messages_of(response) == [f"Queue {queue} resumed."]
    assert fq.stats(queue).paused is False
    history = _history(queue)
    assert len(history) == 2
    assert history[0].startswith("Paused through the admin (since ") and history[1] == "Resumed through the admin."
    # The queue's page offers the opposite verb.
    fq.pause(queue)
    assert "Resume queue" in text(boss.get(f"/admin/django_fq/queue/{queue_pk(queue)}/change/"))


def test_limits_edit_in_place_through_configure_and_is_logged(make_user, queue):
    boss = client_for(make_user("boss", "view_queue", "change_queue"))
    response = boss.post(
        limits_url(queue),
        {
            "concurrency": "4",
            "key_concurrency": "0",
            "rate_limit": "100",
            "rate_window_ms": " 60000 ",
            "key_rate_limit": "",
        },
        follow=True,
    )
    policy = fq.policy(queue)
    assert (policy.concurrency, policy.rate_limit, policy.rate_window_ms) == (4, 100, 60000)
    (message,) = messages_of(response)
    assert message.startswith(f"Limits of queue {queue} saved: concurrency 0 → 4, rate_limit 0 → 100, rate_window_ms ")
    assert _history(queue) == [message.replace(f"Limits of queue {queue} saved", "Limits changed through the admin")]
    # Nothing different: nothing written, nothing logged.
    response = boss.post(limits_url(queue), {"concurrency": "4"}, follow=True)
    assert messages_of(response) == [f"Limits of queue {queue} unchanged."] and len(_history(queue)) == 1


@pytest.mark.parametrize(
    "posted, field",
    [
        ({"concurrency": "-1"}, "concurrency must be between 0 and 100000"),
        ({"concurrency": "100001"}, "concurrency must be between 0 and 100000"),
        ({"rate_window_ms": "0"}, "rate_window_ms must be between 1 and 86400000"),
        ({"key_rate_limit": "1e3"}, "key_rate_limit must be an integer"),
        ({"rate_limit": "9" * 400}, "rate_limit must be an integer"),
        ({"key_concurrency": "2\x00"}, "key_concurrency must be an integer"),
        ({"rate_limit": "٣"}, "rate_limit must be an integer"),
        ({"concurrency": "5", "rate_limit": "-3"}, "rate_limit must be between 0 and 1000000"),
    ],
)
def test_bad_limits_name_the_field_and_change_nothing(root_client, queue, posted, field):
    before = fq.policy(queue)
    response = root_client.post(limits_url(queue), posted, follow=True)
    assert response.status_code == 200
    (message,) = messages_of(response)
    assert message.startswith(f"Limits of queue {queue} were not saved: ") and field in message
    assert fq.policy(queue) == before
    assert _history(queue) == []


@pytest.mark.parametrize(
    "url",
    [
        "/admin/django_fq/queue/99999999999999999999/limits-control/",
        "/admin/django_fq/queue/abc/pause-control/",
        "/admin/django_fq/queue/12345/pause-control/",
        "/admin/django_fq/job/99999999999999999999/delete-finished/",
        "/admin/django_fq/job/x%00/delete-finished/",
    ],
)
def test_hostile_urls_are_404_not_500(root_client, queue, url):
    assert root_client.post(url, {"op": "pause", "post": "yes"}).status_code == 404


def test_controls_refuse_get_and_odd_ops(root_client, queue):
    assert root_client.get(pause_url(queue)).status_code == 405
    assert root_client.get(limits_url(queue)).status_code == 405
    response = root_client.post(pause_url(queue), {"op": "explode", "next": "https://evil.example/"})
    assert response["Location"] == changelist("queue")  # another site's URL is not followed
    assert fq.stats(queue).paused is False


def test_delete_one_finished_job_with_confirmation(make_user, queue):
    boss = client_for(make_user("boss", "view_job", "change_job"))
    done = make(queue, "succeeded", payload={"n": 1})
    page = text(boss.get(job_url(done)))
    assert f'href="{delete_url(done)}"' in page and "Delete job" in page
    confirm = boss.get(delete_url(done))
    assert confirm.status_code == 200 and "Yes, delete this job" in text(confirm) and done in text(confirm)
    assert Job.objects.filter(uid=done).exists()  # a GET deletes nothing
    url = delete_url(done)
    response = boss.post(url, {"post": "yes"}, follow=True)
    assert messages_of(response) == [f"Job {done} was deleted."]
    assert not Job.objects.filter(uid=done).exists()
    from django.contrib.admin.models import DELETION, LogEntry

    assert LogEntry.objects.get(object_repr=done).action_flag == DELETION
    gone = boss.post(url, {"post": "yes"})
    assert gone.status_code == 404


def test_delete_refuses_a_running_or_dead_job_with_the_reason(root_client, queue):
    running = fq.enqueue(queue, {"n": 1}).id
    fq.claim(queue)
    assert "fq-delete-job" not in text(root_client.get(job_url(running)))
    response = root_client.post(delete_url(running), {"post": "yes"}, follow=True)
    assert messages_of(response) == [
        f"Job {running} was not deleted: it is running; only succeeded or cancelled jobs can be deleted (cancel it first)."
    ]
    assert fq.get(queue, running).state == "running"
    dead = make("adm:dead", "dead")
    response = root_client.get(delete_url(dead), follow=True)
    assert "it is dead" in messages_of(response)[0] and fq.get("adm:dead", dead).state == "dead"
    # Cancelled jobs can go.
    cancelled = make(queue, "cancelled")
    assert "fq-delete-job" in text(root_client.get(job_url(cancelled)))
    root_client.post(delete_url(cancelled), {"post": "yes"})
    assert not Job.objects.filter(uid=cancelled).exists()
