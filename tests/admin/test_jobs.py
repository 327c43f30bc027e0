"""Job admin: list, filters, exact search, read-only detail, repair through the service verbs, permissions."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.exceptions import ReceiptCancelled
from django_fq.models import Job

from .helpers import (
    changelist,
    claim_one,
    client_for,
    job_url,
    listed_ids,
    make,
    messages_of,
    queue_pk,
    seq,
    squash,
    text,
)

pytestmark = pytest.mark.django_db


def _action(client, action: str, *job_ids: str, follow: bool = True, **params):
    return client.post(
        changelist("job") + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""),
        {"action": action, "_selected_action": [str(seq(j)) for j in job_ids]},
        follow=follow,
    )


# --- list, filters, search ------------------------------------------------------------------


def test_list_filters_by_queue_and_reported_state(root_client, queue):
    ids = {state: make(queue, state) for state in ("succeeded", "dead", "cancelled", "running", "scheduled", "ready")}
    other = make("adm:other", "ready")
    response = root_client.get(changelist("job"))
    assert set(listed_ids(response)) == {*ids.values(), other}
    for state, job_id in ids.items():
        expected = {job_id, other} if state == "ready" else {job_id}
        assert set(listed_ids(root_client.get(changelist("job"), {"state": state}))) == expected, state
    by_queue = root_client.get(changelist("job"), {"queue__id__exact": queue_pk("adm:other")})
    assert listed_ids(by_queue) == [other]
    both = root_client.get(changelist("job"), {"queue__id__exact": queue_pk(queue), "state": "ready"})
    assert listed_ids(both) == [ids["ready"]]


def test_scheduled_becomes_ready_by_the_database_clock(root_client, queue, clock):
    job_id = fq.enqueue(queue, {"later": True}, delay_ms=30_000).id
    assert listed_ids(root_client.get(changelist("job"), {"state": "scheduled"})) == [job_id]
    assert listed_ids(root_client.get(changelist("job"), {"state": "ready"})) == []
    clock.advance(30_001)
    assert listed_ids(root_client.get(changelist("job"), {"state": "scheduled"})) == []
    assert listed_ids(root_client.get(changelist("job"), {"state": "ready"})) == [job_id]
    assert 'fq-state-ready">ready<' in text(root_client.get(changelist("job")))


def test_search_is_exact_on_id_token_and_unique_key(root_client, queue):
    a = fq.enqueue(queue, {"a": 1}, idempotency="order-1001").id
    b = fq.enqueue(queue, {"b": 1}, unique_key="user-42").id
    c = fq.enqueue(queue, {"c": 1}).id
    search = lambda term: listed_ids(root_client.get(changelist("job"), {"q": term}))  # noqa: E731
    assert search(c) == [c]
    assert search("order-1001") == [a]
    assert search("user-42") == [b]
    assert search(c[:10]) == []  # no partial matches: ids, tokens and keys are looked up exactly
    assert search("order-10") == []
    assert search("USER-42") == []


def test_list_never_loads_payloads(root_client, queue):
    make(queue, "ready", payload={"secret-ish": "payload-marker-123"})
    response = root_client.get(changelist("job"))
    assert "payload-marker-123" not in text(response)
    [job] = response.context["cl"].result_list
    assert {"payload", "result", "errors", "settled_hash"} <= job.get_deferred_fields()


# --- detail ----------------------------------------------------------------------------


def test_detail_shows_payload_result_history_attempts_and_times(root_client, queue):
    job_id = fq.enqueue(queue, {"to": "a@example.com", "n": [1, 2], "html": "<b>x</b>"}, unique_key="k-1", idempotency="tok-1").id
    first = claim_one(queue, worker="w-first")
    fq.nack(queue, first.receipt, error="SMTP 451 <try later>", delay_ms=0)
    second = claim_one(queue, worker="w-second")
    fq.ack(queue, second.receipt, result={"sent": True, "id": "m-9"})
    info = fq.get(queue, job_id)
    response = root_client.get(job_url(job_id))
    assert response.status_code == 200
    html = text(response)
    # Pretty-printed (indented) and escaped JSON.
    payload = json.dumps({"to": "a@example.com", "n": [1, 2], "html": "<b>x</b>"}, indent=2)
    assert payload.replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;") in html
    assert "<b>x</b>" not in html
    assert json.dumps({"sent": True, "id": "m-9"}, indent=2).replace('"', "&quot;") in html
    # History entry with its kind, attempt, worker and escaped text.
    assert "SMTP 451 &lt;try later&gt;" in html
    assert "<td>nack</td>" in html and "w-first" in html
    assert "2 / 3" in html  # attempts / max_attempts
    assert "k-1" in html and "tok-1" in html
    assert 'fq-state-succeeded">succeeded<' in html
    from django_fq.admin import display

    for ms in (info.enqueued_at, info.claimed_at, info.finished_at, info.changed_at):
        assert display.instant(ms) in html and f"({ms} ms)" in html


def test_detail_of_a_running_job_shows_lease_deadline_and_worker(root_client, queue):
    job_id = fq.enqueue(queue, {"n": 1}).id
    claimed = claim_one(queue, worker="host-a:123", visibility_ms=90_000)
    html = text(root_client.get(job_url(job_id)))
    from django_fq.admin import display

    assert display.instant(claimed.deadline) in html and f"({claimed.deadline} ms)" in html
    assert "host-a:123" in html
    assert 'fq-state-running">running<' in html


def test_detail_shows_the_snooze_count(root_client, queue):
    job_id = fq.enqueue(queue, {"n": 1}).id
    for _ in range(2):
        fq.release(queue, claim_one(queue).receipt, delay_ms=0)
    html = squash(text(root_client.get(job_url(job_id))))
    assert '<label>Snoozes:</label> <div class="readonly">2</div>' in html


def test_detail_is_read_only_and_jobs_are_never_added_or_deleted(root_client, queue):
    job_id = make(queue, "ready")
    response = root_client.get(job_url(job_id))
    assert list(response.context["adminform"].form.fields) == []
    html = text(response)
    assert 'name="_save"' not in html and 'name="_continue"' not in html and "deletelink" not in html
    assert root_client.post(job_url(job_id), {"priority": "9"}).status_code == 403
    assert root_client.get(reverse("admin:django_fq_job_add")).status_code == 403
    assert root_client.post(job_url(job_id, "delete"), {"post": "yes"}).status_code == 403
    assert "delete_selected" not in text(root_client.get(changelist("job")))
    assert Job.objects.get(uid=job_id).priority == 0


def test_detail_offers_only_the_repairs_that_fit_the_state(root_client, queue):
    ids = {state: make(queue, state) for state in ("succeeded", "dead", "cancelled", "running", "scheduled", "ready")}
    expected = {
        "scheduled": {"requeue", "cancel"},
        "ready": {"cancel"},
        "running": {"cancel"},
        "dead": {"retry", "cancel"},
        "succeeded": set(),
        "cancelled": set(),
    }
    for state, job_id in ids.items():
        buttons = root_client.get(job_url(job_id)).context["fq_repair_buttons"]
        assert {b["verb"] for b in buttons} == expected[state], state


# --- repair from the detail page ----------------------------------------------------------


def test_retry_button_makes_a_dead_job_ready(root_client, queue):
    job_id = make(queue, "dead")
    url = reverse("admin:django_fq_job_retry", args=[seq(job_id)])
    assert root_client.get(url).status_code == 405  # a GET never changes anything
    assert fq.get(queue, job_id).state == "dead"
    response = root_client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == job_url(job_id)
    info = fq.get(queue, job_id)
    assert (info.state, info.attempts) == ("ready", 0)
    assert f"Job {job_id} retried: it is now ready." in messages_of(response)


def test_requeue_button_makes_a_scheduled_job_ready_now(root_client, queue):
    job_id = make(queue, "scheduled")
    before = fq.get(queue, job_id)
    response = root_client.post(reverse("admin:django_fq_job_requeue", args=[seq(job_id)]), follow=True)
    after = fq.get(queue, job_id)
    assert after.state == "ready" and after.run_at < before.run_at
    assert after.attempts == before.attempts
    assert f"Job {job_id} requeued: it is now ready." in messages_of(response)
    assert [j.id for j in fq.claim(queue)] == [job_id]


def test_cancel_button_ends_a_running_lease(root_client, queue):
    job_id = fq.enqueue(queue, {"n": 1}).id
    claimed = claim_one(queue)
    response = root_client.post(reverse("admin:django_fq_job_cancel", args=[seq(job_id)]), follow=True)
    assert fq.get(queue, job_id).state == "cancelled"
    assert f"Job {job_id} cancelled: it is now cancelled." in messages_of(response)
    with pytest.raises(ReceiptCancelled):
        fq.ack(queue, claimed.receipt)


def test_a_refused_repair_shows_the_service_error(root_client, queue):
    job_id = make(queue, "succeeded")
    response = root_client.post(reverse("admin:django_fq_job_retry", args=[seq(job_id)]), follow=True)
    assert response.status_code == 200
    assert messages_of(response) == [
        f"Job {job_id} was not retried: only dead jobs can be retried; this job is succeeded"
    ]
    assert fq.get(queue, job_id).state == "succeeded"


# --- bulk actions -----------------------------------------------------------------------


def test_retry_action_retries_dead_jobs_and_reports_the_rest(root_client, queue):
    dead = [make(queue, "dead") for _ in range(2)]
    ready = make(queue, "ready")
    response = _action(root_client, "retry_selected", *dead, ready)
    assert response.status_code == 200
    assert [fq.get(queue, j).state for j in dead] == ["ready", "ready"]
    assert all(fq.get(queue, j).attempts == 0 for j in dead)
    msgs = messages_of(response)
    assert "2 jobs retried." in msgs
    assert f"Job {ready} was not retried: only dead jobs can be retried; this job is ready" in msgs


def test_retry_action_names_the_job_holding_the_unique_key(root_client, queue):
    dead = make(queue, "dead", unique_key="only-one")
    holder = fq.enqueue(queue, {"n": 2}, unique_key="only-one").id
    msgs = messages_of(_action(root_client, "retry_selected", dead))
    assert len(msgs) == 1 and holder in msgs[0] and msgs[0].startswith(f"Job {dead} was not retried:")
    assert fq.get(queue, dead).state == "dead"


def test_cancel_action(root_client, queue):
    done = make(queue, "succeeded")
    ids = [make(queue, s) for s in ("dead", "running", "scheduled", "ready")]
    msgs = messages_of(_action(root_client, "cancel_selected", *ids, done))
    assert [fq.get(queue, j).state for j in ids] == ["cancelled"] * 4
    assert "4 jobs cancelled." in msgs
    assert f"Job {done} was not cancelled: a succeeded job cannot be cancelled" in msgs


def test_requeue_action(root_client, queue):
    scheduled = [make(queue, "scheduled") for _ in range(2)]
    dead = make(queue, "dead")
    msgs = messages_of(_action(root_client, "requeue_selected", *scheduled, dead))
    assert [fq.get(queue, j).state for j in scheduled] == ["ready", "ready"]
    assert fq.get(queue, dead).state == "dead"
    assert "2 jobs requeued." in msgs
    assert any(m.startswith(f"Job {dead} was not requeued: only scheduled or ready jobs") for m in msgs)


def test_actions_are_logged(root_client, queue):
    from django.contrib.admin.models import LogEntry

    job_id = make(queue, "dead")
    _action(root_client, "retry_selected", job_id)
    entry = LogEntry.objects.get(object_id=str(seq(job_id)))
    assert entry.object_repr == job_id and "Retried" in entry.get_change_message()


# --- permissions ----------------------------------------------------------------------------


def test_viewers_cannot_repair(make_user, queue):
    dead = make(queue, "dead")
    viewer = client_for(make_user("viewer", "view_job"))
    response = viewer.get(changelist("job"))
    assert response.status_code == 200
    assert not response.context["cl"].model_admin.get_actions(response.wsgi_request)
    assert "retry_selected" not in text(response)
    response = _action(viewer, "retry_selected", dead)
    assert fq.get(queue, dead).state == "dead"
    detail = viewer.get(job_url(dead))
    assert detail.status_code == 200 and detail.context["fq_repair_buttons"] == []
    for verb in ("retry", "cancel", "requeue"):
        assert viewer.post(reverse(f"admin:django_fq_job_{verb}", args=[seq(dead)])).status_code == 403
    assert fq.get(queue, dead).state == "dead"


def test_change_permission_allows_repair(make_user, queue):
    dead = make(queue, "dead")
    repairer = client_for(make_user("repairer", "view_job", "change_job"))
    actions = repairer.get(changelist("job")).context["action_form"].fields["action"].choices
    assert {"retry_selected", "cancel_selected", "requeue_selected"} <= {name for name, _ in actions}
    _action(repairer, "retry_selected", dead)
    assert fq.get(queue, dead).state == "ready"


def test_users_without_job_permissions_see_nothing(make_user, queue):
    job_id = make(queue, "dead")
    stranger = client_for(make_user("stranger", "view_queue"))
    assert stranger.get(changelist("job")).status_code == 403
    assert stranger.get(job_url(job_id)).status_code == 403
    assert stranger.post(reverse("admin:django_fq_job_retry", args=[seq(job_id)])).status_code == 403
    assert fq.get(queue, job_id).state == "dead"


def test_filter_counts_when_facets_are_shown(root_client, queue):
    make(queue, "dead")
    make(queue, "scheduled")
    make(queue, "scheduled")
    response = root_client.get(changelist("job"), {"_facets": "True"})
    assert response.status_code == 200
    html = text(response)
    assert "scheduled (2)" in html and "dead (1)" in html and "ready (0)" in html


def test_job_page_puts_the_repairs_first_shows_the_id_once_and_folds_old_history(root_client, queue):
    """docs/admin.md, "Jobs": buttons above the fields, the id as the title only, newest history open."""
    import re

    fq.configure(queue, max_attempts=5, backoff_ms=1000)
    job_id = fq.enqueue(queue, {"n": 1}).id
    for attempt in range(1, 6):
        fq.nack(queue, claim_one(queue, worker=f"w-{attempt}").receipt, error=f"failure number {attempt}", delay_ms=0)
    assert fq.get(queue, job_id).state == "dead"
    html = text(root_client.get(job_url(job_id)))
    main = html.split('id="content-main"')[1]
    assert main.index('class="submit-row fq-repair"') < main.index("<fieldset") < main.index('class="fq-history"')
    assert job_id not in main  # only the title names the job
    assert re.findall(r"<h[12][^>]*>([^<]*)</h[12]>", html.split('id="content"')[1].split('id="content-main"')[0]) == [
        f"Job {job_id}"
    ]
    # Newest first: the three latest open, the two older ones inside a closed <details>.
    recent, older = main.split('class="fq-history"', 1)[1].split('<details class="fq-older">')
    assert [int(n) for n in re.findall(r"failure number (\d)", recent)] == [5, 4, 3]
    assert "2 older entries" in older and [int(n) for n in re.findall(r"failure number (\d)", older)] == [2, 1]
    labels = re.findall(r'name="fq_\w+" value="([^"]+)"', main)
    assert labels == ["Retry job", "Cancel job"]


def test_repair_labels_share_one_style():
    from django_fq.admin.jobs import VERBS

    for _, label, _, _ in VERBS.values():
        assert label[0].isupper() and label[1:] == label[1:].lower() and " job" in label, label
