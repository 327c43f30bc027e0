"""Queue admin: live counts, totals and times; policy edits through configure; delete through delete_queue."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_fq import services as fq
from django_fq.exceptions import InvalidPolicy, QueueNotFound
from django_fq.models import IdempotencyToken, Job, Lease, Queue
from django_fq.types import STATE_NAMES, QueuePolicy

from .helpers import changelist, claim_one, client_for, make, messages_of, queue_pk, squash, text

pytestmark = pytest.mark.django_db

CHANGE = "/admin/django_fq/queue/{}/change/"
DELETE = "/admin/django_fq/queue/{}/delete/"
ADD = "/admin/django_fq/queue/add/"


def _policy_post(queue: str, **changes) -> dict:
    """The change form's POST data: the current policy with ``changes`` applied."""
    data = {k: str(v) for k, v in vars(fq.policy(queue)).items()}
    data.update({k: str(v) for k, v in changes.items()})
    return data


def _one_of_each(queue: str) -> dict[str, str]:
    # Order matters: "running" claims the only ready job, so it comes before "ready".
    ids = {}
    for state in ("succeeded", "dead", "cancelled", "running", "scheduled", "ready"):
        ids[state] = make(queue, state)
    ids["waiting"] = fq.enqueue(queue, {"state": "waiting"}, depends_on=[ids["running"]]).id
    return ids


def test_changelist_shows_live_counts_per_state(root_client, queue):
    _one_of_each(queue)
    make(queue, "scheduled")
    fq.configure("adm:empty")
    response = root_client.get(changelist("queue"))
    assert response.status_code == 200
    rows = {q.name: q for q in response.context["cl"].result_list}
    assert set(rows) == {queue, "adm:empty"}
    expected = dict.fromkeys(STATE_NAMES, 1) | {"scheduled": 2}
    assert {s: getattr(rows[queue], f"n_{s}") for s in STATE_NAMES} == expected
    assert {s: getattr(rows["adm:empty"], f"n_{s}") for s in STATE_NAMES} == dict.fromkeys(STATE_NAMES, 0)
    html = text(response)
    # Each non-zero count links to the job list filtered by queue and state.
    qid = queue_pk(queue)
    assert f"?queue__id__exact={qid}&amp;state=scheduled\">2</a>" in html
    assert f"?queue__id__exact={qid}&amp;state=dead\">1</a>" in html


def test_counts_follow_the_database_clock(root_client, queue, clock):
    fq.enqueue(queue, {"later": True}, delay_ms=60_000)
    [row] = root_client.get(changelist("queue")).context["cl"].result_list
    assert (row.n_scheduled, row.n_ready) == (1, 0)
    clock.advance(60_001)
    [row] = root_client.get(changelist("queue")).context["cl"].result_list
    assert (row.n_scheduled, row.n_ready) == (0, 1)


def test_changelist_shows_totals_and_average_wait_and_run(root_client, queue, clock):
    for _ in range(3):
        fq.enqueue(queue, {"n": 1})
    fq.enqueue(queue, {"n": 1}, idempotency="same")
    fq.enqueue(queue, {"n": 1}, idempotency="same")  # deduplicated: not enqueued again
    clock.advance(2_000)
    first = claim_one(queue)
    clock.advance(500)
    fq.ack(queue, first.receipt)
    second = claim_one(queue)
    fq.nack(queue, second.receipt, error="no")
    response = root_client.get(changelist("queue"))
    [row] = response.context["cl"].result_list
    assert row.fq_totals["enqueued"] == 4
    assert row.fq_totals["acked"] == 1
    assert row.fq_totals["nacked"] == 1
    stats = fq.stats(queue)
    assert stats.wait_count == 2 and stats.wait_ms_sum >= 4_000
    assert stats.run_count == 1 and stats.run_ms_sum >= 500
    from django_fq.admin import display  # imported once the admin is installed (it registers on import)

    html = squash(text(response))
    assert '<td class="field-total_enqueued">4</td>' in html
    assert '<td class="field-total_acked">1</td>' in html
    assert '<td class="field-total_failed"><span class="fq-alert">1</span></td>' in html
    assert display.average(stats.wait_ms_sum, stats.wait_count) in html
    assert display.average(stats.run_ms_sum, stats.run_count) in html


def _queries_for_changelist(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(changelist("queue")).status_code == 200
    return len(ctx.captured_queries)


def test_changelist_query_count_does_not_grow_with_the_number_of_queues(root_client):
    fq.enqueue("adm:a", {"n": 1})
    one = _queries_for_changelist(root_client)
    for i in range(6):
        fq.enqueue(f"adm:more-{i}", {"n": i})
        claim_one(f"adm:more-{i}")
    assert _queries_for_changelist(root_client) == one


def test_change_form_shows_counts_totals_and_policy(root_client, queue):
    _one_of_each(queue)
    response = root_client.get(CHANGE.format(queue_pk(queue)))
    assert response.status_code == 200
    html = text(response)
    form = response.context["adminform"].form
    assert form.initial["max_attempts"] == 3
    assert "name" not in form.fields  # the name is read-only once the queue exists
    for total in ("enqueued", "claimed", "acked", "nacked", "cancelled", "dead"):
        assert f"<th>{total}</th>" in html
    assert "average wait" in html and "average run" in html


def test_policy_edit_goes_through_configure(root_client, queue):
    url = CHANGE.format(queue_pk(queue))
    response = root_client.post(
        url, _policy_post(queue, concurrency=7, backoff_ms=250, timeout_ms=9_000, rate_limit=10, rate_window_ms=500)
    )
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    policy = fq.policy(queue)
    assert (policy.concurrency, policy.backoff_ms, policy.timeout_ms, policy.max_attempts) == (7, 250, 9_000, 3)
    assert (policy.rate_limit, policy.rate_window_ms) == (10, 500)


def test_the_policy_form_sets_key_rate_limit(root_client, queue):
    url = CHANGE.format(queue_pk(queue))
    response = root_client.post(url, _policy_post(queue, key_rate_limit=4, rate_window_ms=2000))
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    assert (fq.policy(queue).key_rate_limit, fq.policy(queue).rate_window_ms) == (4, 2000)


def test_the_policy_form_sets_key_concurrency_and_refuses_it_out_of_bounds(root_client, queue):
    url = CHANGE.format(queue_pk(queue))
    response = root_client.post(url, _policy_post(queue, key_concurrency=2))
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    assert fq.policy(queue).key_concurrency == 2
    response = root_client.post(url, _policy_post(queue, key_concurrency=100_001))
    assert response.status_code == 200
    assert "key_concurrency" in response.context["adminform"].form.errors
    assert fq.policy(queue).key_concurrency == 2


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"max_attempts": 0}, "max_attempts", "max_attempts must be between 1 and 1000"),
        ({"concurrency": 100_001}, "concurrency", "concurrency must be between 0 and 100000"),
        ({"visibility_ms": 0}, "visibility_ms", "visibility_ms must be between 1 and 86400000"),
        ({"rate_limit": 1_000_001}, "rate_limit", "rate_limit must be between 0 and 1000000"),
        ({"rate_window_ms": 0}, "rate_window_ms", "rate_window_ms must be between 1 and 86400000"),
        ({"key_rate_limit": 1_000_001}, "key_rate_limit", "key_rate_limit must be between 0 and 1000000"),
        ({"backoff_ms": 5_000, "max_backoff_ms": 4_000}, "max_backoff_ms", "max_backoff_ms must be at least backoff_ms"),
    ],
)
def test_policy_errors_show_on_the_field_and_change_nothing(root_client, queue, changes, field, message):
    before = fq.policy(queue)
    response = root_client.post(CHANGE.format(queue_pk(queue)), _policy_post(queue, **changes))
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert form.errors == {field: [message]}
    assert message in text(response)
    assert fq.policy(queue) == before


def test_the_form_reports_the_service_message_not_its_own(root_client, queue):
    # The service is the one judge: its message reaches the page word for word.
    with pytest.raises(InvalidPolicy) as raised:
        fq.configure(queue, idempotency_retention_ms=0)
    response = root_client.post(CHANGE.format(queue_pk(queue)), _policy_post(queue, idempotency_retention_ms=0))
    assert response.context["adminform"].form.errors == {"idempotency_retention_ms": [raised.value.message]}


def test_add_creates_the_queue_through_configure(root_client):
    data = {k: str(v) for k, v in vars(QueuePolicy()).items()}
    data.update(name="adm:new", max_attempts="4", visibility_ms="60000")
    response = root_client.post(ADD, data)
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    policy = fq.policy("adm:new")
    assert (policy.max_attempts, policy.visibility_ms) == (4, 60_000)


def test_add_with_a_bad_name_shows_the_service_error_on_the_name(root_client):
    data = {k: str(v) for k, v in vars(QueuePolicy()).items()}
    data["name"] = "no spaces allowed"
    response = root_client.post(ADD, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["name"]
    assert "[A-Za-z0-9:._-]" in errors["name"][0]
    assert not Queue.objects.exists()


def test_add_of_an_existing_name_is_refused_and_changes_nothing(root_client, queue):
    data = {k: str(v) for k, v in vars(QueuePolicy()).items()}
    data.update(name=queue, max_attempts="9")
    response = root_client.post(ADD, data)
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["name"]
    assert fq.policy(queue).max_attempts == 3


def test_add_past_fq_max_queues_is_refused_on_the_name_and_creates_nothing(root_client, queue, settings):
    settings.FQ_MAX_QUEUES = Queue.objects.count()
    data = {k: str(v) for k, v in vars(QueuePolicy()).items()}
    data["name"] = "adm:one-too-many"
    response = root_client.post(ADD, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["name"] and "too many queues" in errors["name"][0]
    assert not Queue.objects.filter(name="adm:one-too-many").exists()


def test_delete_asks_for_confirmation_with_what_goes(root_client, queue):
    _one_of_each(queue)
    fq.enqueue(queue, {"t": 1}, idempotency="tok-1")
    url = DELETE.format(queue_pk(queue))
    response = root_client.get(url)
    assert response.status_code == 200
    html = squash(text(response))
    assert "Are you sure you want to delete the queue" in html
    assert "<strong>8</strong> jobs in total" in html
    assert 'name="post" value="yes"' in html
    # Nothing was deleted by looking, nor by a POST without the confirmation field.
    root_client.post(url, {})
    assert Job.objects.filter(queue__name=queue).count() == 8


def test_confirmed_delete_calls_delete_queue(root_client, queue):
    _one_of_each(queue)
    fq.enqueue(queue, {"t": 1}, idempotency="tok-1")
    fq.enqueue("adm:other", {"keep": True})
    qid = queue_pk(queue)
    response = root_client.post(DELETE.format(qid), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert any("was deleted" in m for m in messages_of(response))
    with pytest.raises(QueueNotFound):
        fq.policy(queue)
    assert not Job.objects.filter(queue_id=qid).exists()
    assert not Lease.objects.filter(queue_id=qid).exists()
    assert not IdempotencyToken.objects.filter(queue_id=qid).exists()
    assert fq.stats("adm:other").counts["ready"] == 1


def test_no_bulk_delete_action(root_client, queue):
    response = root_client.get(changelist("queue"))
    assert "delete_selected" not in response.context["cl"].model_admin.get_actions(response.wsgi_request)
    assert 'value="delete_selected"' not in text(response)


def test_permissions_gate_edit_and_delete(make_user, queue):
    viewer = client_for(make_user("viewer", "view_queue"))
    assert viewer.get(changelist("queue")).status_code == 200
    url = CHANGE.format(queue_pk(queue))
    response = viewer.get(url)
    assert response.status_code == 200
    assert "adminform" in response.context and not response.context["has_change_permission"]
    assert viewer.post(url, _policy_post(queue, max_attempts=9)).status_code == 403
    assert viewer.get(DELETE.format(queue_pk(queue))).status_code == 403
    assert viewer.post(DELETE.format(queue_pk(queue)), {"post": "yes"}).status_code == 403
    assert viewer.get(ADD).status_code == 403
    assert fq.policy(queue).max_attempts == 3

    editor = client_for(make_user("editor", "view_queue", "change_queue"))
    assert editor.post(url, _policy_post(queue, max_attempts=9)).status_code == 302
    assert fq.policy(queue).max_attempts == 9
    assert editor.post(DELETE.format(queue_pk(queue)), {"post": "yes"}).status_code == 403
    fq.policy(queue)  # still there

    stranger = client_for(make_user("stranger"))
    assert stranger.get(changelist("queue")).status_code == 403


def test_queue_list_and_dashboard_make_dead_and_failed_counts_stand_out(root_client, queue):
    """Non-zero dead counts and failed attempts carry fq-alert (the admin's error colours, dark mode too)."""
    from django.urls import reverse

    make(queue, "dead")
    make("adm:calm", "succeeded")
    for page in (changelist("queue"), reverse("admin:django_fq_dashboard")):
        html = squash(text(root_client.get(page)))
        assert html.count('class="fq-alert"') == 2, page  # the dead count and the failed attempts of adm:q
        assert '<a class="fq-alert" href="' in html or 'class="fq-alert">1</a>' in html
    css = (Path(__file__).parents[2] / "django_fq/static/django_fq/admin.css").read_text()
    assert "var(--error-fg" in css and "var(--message-error-bg" in css
