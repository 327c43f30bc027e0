"""The job list's search form (docs/admin.md "Searching jobs"), on every database.

Each filter returns exactly the jobs it should (and only those); bad input is
a message naming the field, never a 500; a view-only user sees no bulk links.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job

from .helpers import client_for, make, text


def _search_module():
    # Imported inside the tests: the admin app is installed by the package's fixture only.
    from django_fq.admin import search

    return search


def search(client, **params):
    """GET the job list with the search form's fields ``params`` (``fq-<name>``); every listed id, all pages."""
    query = {f"fq-{k}": v for k, v in params.items()}
    response = client.get(reverse("admin:django_fq_job_changelist"), {**query, "all": ""})
    assert response.status_code == 200, response.status_code
    return response


def found(client, **params) -> set[str]:
    response = search(client, **params)
    assert not response.context["fq_search_errors"], response.context["fq_search_errors"]
    return {job.uid for job in response.context["cl"].result_list}


@pytest.fixture
def jobs(db):
    """A handful of jobs in two queues, each told apart by one filter; returns their ids by name."""
    fq.configure("s:a", max_attempts=3)
    fq.configure("s:b", max_attempts=3)
    ids = {}
    ids["a_dead"] = make("s:a", "dead", {"user_id": 7, "nested": {"deep": True}})
    ids["a_ok"] = make("s:a", "succeeded", {"user_id": "42"}, metadata={"team": "blue"})
    ids["a_ready"] = make(
        "s:a", "ready", {"user_id": 42, "kind": "mail", "tags": ["x", "y"]}, metadata={"tags": ["vip"], "team": "red"}
    )
    ids["a_sched"] = make("s:a", "scheduled", {"user_id": 42, "kind": "sms"})
    ids["b_ready"] = make("s:b", "ready", {"user_id": 42})
    ids["b_cancel"] = make("s:b", "cancelled", {"user_id": 1})
    ids["b_run"] = fq.enqueue("s:b", {"user_id": 42, "kind": "mail"}).id
    claimed = fq.claim("s:b", count=5, worker="worker-9")
    assert {c.id for c in claimed} == {ids["b_ready"], ids["b_run"]}
    fq.release("s:b", next(c for c in claimed if c.id == ids["b_ready"]).receipt)
    return ids


def test_each_filter_finds_exactly_its_jobs(jobs, root_client):
    j = jobs
    assert found(root_client, id=j["a_dead"]) == {j["a_dead"]}
    assert found(root_client, queue="s:a") == {j["a_ready"], j["a_sched"], j["a_dead"], j["a_ok"]}
    assert found(root_client, state="ready") == {j["a_ready"], j["b_ready"]}
    assert found(root_client, state="scheduled") == {j["a_sched"]}
    assert found(root_client, queue="s:b", state="running") == {j["b_run"]}
    assert found(root_client, state="dead") == {j["a_dead"]}
    assert found(root_client, queue="s:b", state="running", worker="worker-9") == {j["b_run"]}
    assert found(root_client, queue="s:b", state="running", worker="worker-1") == set()
    # Error text: a case-insensitive substring of the last error.
    assert found(root_client, queue="s:a", state="dead", error="IT BROKE") == {j["a_dead"]}
    assert found(root_client, queue="s:a", state="dead", error="nothing like it") == set()
    # Payload containment: the number 42, not the string "42"; nested objects; arrays by element.
    assert found(root_client, queue="s:a", state="ready", payload='{"user_id": 42}') == {j["a_ready"]}
    assert found(root_client, queue="s:a", state="succeeded", payload='{"user_id": 42}') == set()
    assert found(root_client, queue="s:a", state="succeeded", payload='{"user_id": "42"}') == {j["a_ok"]}
    assert found(root_client, queue="s:a", state="dead", payload='{"nested": {"deep": true}}') == {j["a_dead"]}
    assert found(root_client, queue="s:a", state="dead", payload='{"nested": {"deep": 1}}') == set()
    assert found(root_client, queue="s:a", state="ready", payload='{"tags": ["y"]}') == {j["a_ready"]}
    assert found(root_client, queue="s:a", state="ready", payload='{"tags": ["z"]}') == set()
    assert found(root_client, queue="s:b", state="running", payload='{"kind": "mail", "user_id": 42}') == {j["b_run"]}
    # Metadata containment and tags.
    assert found(root_client, queue="s:a", state="succeeded", metadata='{"team": "blue"}') == {j["a_ok"]}
    assert found(root_client, queue="s:a", state="ready", metadata='{"team": "blue"}') == set()
    assert found(root_client, queue="s:a", state="ready", tag="vip") == {j["a_ready"]}
    assert found(root_client, queue="s:a", state="ready", tag="vi") == set()


def test_time_ranges(jobs, root_client):
    j = jobs
    rows = dict(Job.objects.values_list("uid", "enqueued_at"))
    finished = dict(Job.objects.exclude(finished_at=None).values_list("uid", "finished_at"))
    first, last = min(rows.values()), max(rows.values())
    assert found(root_client, enqueued_from=str(first)) == set(j.values())
    a_ready = found(root_client, queue="s:a", state="ready")
    assert found(root_client, queue="s:a", state="ready", enqueued_to=str(first)) == {
        u for u in a_ready if rows[u] <= first
    }
    assert found(root_client, queue="s:a", state="ready", enqueued_to=str(last)) == a_ready
    assert found(root_client, enqueued_from=str(last + 1)) == set()
    mid = rows[j["a_ok"]]
    assert found(root_client, enqueued_from=str(mid)) == {u for u, t in rows.items() if t >= mid}
    assert found(root_client, finished_from=str(min(finished.values()))) == set(finished)
    one = finished[j["a_dead"]]
    assert j["a_dead"] in found(root_client, finished_from=str(one), finished_to=str(one))
    assert found(root_client, finished_from=str(one), finished_to=str(one)) == {
        u for u, t in finished.items() if t == one
    }
    # A date and time in UTC, read to the millisecond.
    iso = _search_module().InstantField().to_python("1970-01-01 00:00:01.5")
    assert iso == 1500
    assert found(root_client, finished_to="2000-01-01") == set()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"queue": "s:a", "state": "ready", "payload": "{not json"}, "payload contains"),
        ({"queue": "s:a", "state": "ready", "payload": "[1, 2]"}, "payload contains"),
        ({"queue": "s:a", "state": "ready", "metadata": '{"a": NaN}'}, "metadata contains"),
        ({"enqueued_from": "yesterday"}, "enqueued from"),
        ({"finished_to": "2026-13-45"}, "finished to"),
        ({"finished_from": "2026-01-02", "finished_to": "2026-01-01"}, "finished to"),
        ({"id": "../../etc"}, "job id"),
        ({"queue": "no:such"}, "queue"),
        ({"error": "boom"}, "error text"),
        ({"queue": "s:a", "payload": '{"a": 1}'}, "payload contains"),
        ({"queue": "s:a", "state": "ready", "tag": "a b"}, "tag"),
        ({"enqueued_to": "2026-01-01"}, "enqueued to"),
        ({"queue": "s:a", "state": "ready", "worker": "w\x00"}, "worker"),
    ],
)
def test_bad_input_names_the_field(jobs, root_client, params, field):
    response = search(root_client, **params)
    errors = response.context["fq_search_errors"]
    assert errors and all(e.startswith(f"{field}: ") for e in errors), errors
    assert list(response.context["cl"].result_list) == []
    assert f"{field}: " in text(response)


def test_search_survives_paging_and_keeps_the_sidebar(jobs, root_client):
    for n in range(60):
        fq.enqueue("s:a", {"n": n})
    response = root_client.get(
        reverse("admin:django_fq_job_changelist"), {"fq-queue": "s:a", "fq-state": "ready", "p": "2"}
    )
    assert response.status_code == 200
    page2 = {job.uid for job in response.context["cl"].result_list}
    assert len(page2) == 61 - 50
    assert "fq-queue=s%3Aa" in text(response)  # the page links keep the search


def test_capped_search_says_so(jobs, root_client, monkeypatch):
    monkeypatch.setattr(_search_module(), "CANDIDATES", 2)
    new = {fq.enqueue("s:a", {"user_id": 42, "n": n}).id for n in range(3)}
    response = search(root_client, queue="s:a", state="ready", payload='{"user_id": 42}')
    listed = {job.uid for job in response.context["cl"].result_list}
    # The newest two candidates and any job changed in the same millisecond as the second: not a_ready.
    assert jobs["a_ready"] not in listed
    assert listed <= new and len(listed) >= 2
    assert 'id="fq-search-capped"' in text(response)


def test_view_only_user_gets_no_bulk_controls(jobs, make_user, root_client):
    viewer = client_for(make_user("viewer", "view_job"))
    response = search(viewer, queue="s:a", state="dead")
    assert response.status_code == 200
    assert 'id="fq-bulk-links"' not in text(response)
    assert 'name="action"' not in text(response)
    assert 'id="fq-bulk-links"' in text(search(root_client, queue="s:a", state="dead"))
    url = reverse("admin:django_fq_job_bulk", args=["retry"]) + "?fq-queue=s:a&fq-state=dead"
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"query": "fq-queue=s:a&fq-state=dead"}).status_code == 403
    assert Job.objects.get(uid=jobs["a_dead"]).state == "dead"


def test_offloaded_payload_is_searched(db, root_client, settings):
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = 64
    fq.configure("s:big")
    big = fq.enqueue("s:big", {"user_id": 42, "blob": "x" * 200}).id
    small = fq.enqueue("s:big", {"user_id": 41}).id
    assert Job.objects.get(uid=big).payload == ""
    assert found(root_client, queue="s:big", state="ready", payload='{"user_id": 42}') == {big}
    assert found(root_client, queue="s:big", state="ready", payload='{"user_id": 41}') == {small}
