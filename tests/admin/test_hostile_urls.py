"""Changelist URLs a user can type: only the filters the pages offer, and no value breaks the database.

docs/admin.md ("What a list URL may filter on"): each admin allows a short
list of lookups from the URL (exact ids, the queue, the reported state);
anything else (a regex or a contains over every payload, a digest column) is
Django's 400. A filter value with a NUL character is a 400 too, and a search
for one finds nothing — never a 500 (PostgreSQL cannot hold NUL in text).
"""

from __future__ import annotations

import pytest

from django_fq import services as fq

from .helpers import changelist, client_for, listed_ids, make, messages_of, queue_pk, seq

pytestmark = pytest.mark.django_db

MODELS = ("job", "queue", "lease", "idempotencytoken")


@pytest.fixture
def jobs(queue):
    """A job in each of a few states (a live lease, a token) on ``queue``."""
    running = make(queue, "running")
    dead = make(queue, "dead", unique_key="key-1")
    ready = make(queue, "ready", idempotency="tok-1")
    return {"ready": ready, "running": running, "dead": dead}


@pytest.mark.parametrize(
    ("model", "query"),
    [
        ("job", "uid=%00"),
        ("job", "uid__in=a,%00"),
        ("job", "worker=%00"),
        ("job", "state=%00"),
        ("job", "queue__id__exact=%00"),
        ("job", "unique_key=a%00b"),
        ("queue", "name=%00"),
        ("lease", "worker=%00"),
        ("lease", "job__uid=%00"),
        ("idempotencytoken", "token=%00"),
    ],
)
def test_a_nul_in_an_allowed_filter_is_a_400(root_client, jobs, model, query):
    response = root_client.get(changelist(model) + "?" + query)
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("model", "query"),
    [
        ("job", "payload__contains=%00"),
        ("job", "payload__contains=state"),
        ("job", "payload__regex=.*"),
        ("job", "payload__iregex=(a%2B)%2B%24"),
        ("job", "result__icontains=ok"),
        ("job", "last_error__startswith=boom"),
        ("job", "errors__contains=boom"),
        ("job", "settled_hash__startswith=a"),
        ("job", "uid__regex=.*"),
        ("job", "uid__startswith=a"),
        ("job", "queue__name__regex=.*"),
        ("job", "worker__contains=w"),
        ("queue", "name__regex=.*"),
        ("queue", "jobs__payload__contains=x"),
        ("lease", "receipt_hash__startswith=a"),
        ("lease", "job__payload__contains=x"),
        ("idempotencytoken", "token__startswith=t"),
    ],
)
def test_lookups_outside_the_allow_list_are_a_400(make_user, jobs, model, query):
    viewer = client_for(make_user("viewer", "view_job", "view_queue", "view_lease", "view_idempotencytoken"))
    response = viewer.get(changelist(model) + "?" + query)
    assert response.status_code == 400


@pytest.mark.parametrize("model", MODELS)
def test_a_nul_in_the_search_box_is_no_500(root_client, jobs, model):
    for term in ("%00", "a%00b", "%20%00%20"):
        response = root_client.get(changelist(model) + "?q=" + term)
        assert response.status_code == 200
        # Django's search form refuses the term with a message and searches nothing.
        assert "Null characters are not allowed." in messages_of(response)


def test_the_filters_the_pages_link_to_still_work(root_client, queue, jobs):
    qid = queue_pk(queue)
    base = changelist("job")
    assert listed_ids(root_client.get(f"{base}?queue__id__exact={qid}&state=dead")) == [jobs["dead"]]
    assert set(listed_ids(root_client.get(f"{base}?queue__id__exact={qid}"))) == set(jobs.values())
    assert listed_ids(root_client.get(f"{base}?uid={jobs['ready']}")) == [jobs["ready"]]
    assert listed_ids(root_client.get(f"{base}?uid__in={jobs['ready']},{jobs['dead']}"))
    assert listed_ids(root_client.get(f"{base}?worker=worker-7&state=running")) == [jobs["running"]]
    assert listed_ids(root_client.get(f"{base}?q={jobs['dead']}")) == [jobs["dead"]]
    assert listed_ids(root_client.get(f"{base}?q=key-1")) == [jobs["dead"]]
    assert listed_ids(root_client.get(f"{base}?queue__name={queue}&state=ready")) == [jobs["ready"]]
    for model in ("lease", "idempotencytoken"):
        response = root_client.get(f"{changelist(model)}?queue__id__exact={qid}")
        assert response.status_code == 200 and len(response.context["cl"].result_list) == 1
    assert root_client.get(f"{changelist('lease')}?q=worker-7").context["cl"].result_list
    assert root_client.get(f"{changelist('idempotencytoken')}?q=tok-1").context["cl"].result_list
    response = root_client.get(f"{changelist('queue')}?q=adm")
    assert [q.name for q in response.context["cl"].result_list] == [queue]


@pytest.mark.parametrize(
    "query", ["queue__id__exact=abc", "queue__id__exact=99999999999999999999999", "uid__in=", "state=nope"]
)
def test_odd_values_of_allowed_filters_are_no_500(root_client, jobs, query):
    response = root_client.get(changelist("job") + "?" + query)
    # 302: Django's "?e=1" for a value of the wrong type; 400: an id past 64 bits (below)
    assert response.status_code in (200, 302, 400)


BIG = "99999999999999999999999"  # past 64 bits: SQLite cannot even bind it


@pytest.mark.parametrize(
    ("model", "query"),
    [
        ("job", f"queue={BIG}"),
        ("job", f"queue__id__in=1,{BIG}"),
        ("job", f"queue__id={BIG}"),
        ("job", "queue__id__in=" + "9" * 5000),
        ("lease", f"queue__id__in={BIG}"),
        ("lease", f"job={BIG}"),
        ("queue", f"id__in=1,{BIG}"),
        ("idempotencytoken", f"queue__id__in={BIG}"),
        ("idempotencytoken", f"queue={BIG}"),
    ],
)
def test_an_id_past_64_bits_in_an_allowed_filter_is_a_400(root_client, jobs, model, query):
    # It used to reach the database in an IN list or a foreign-key filter: a 500.
    response = root_client.get(changelist(model) + "?" + query)
    assert response.status_code == 400


def test_ids_within_64_bits_still_filter(root_client, queue, jobs):
    qid = queue_pk(queue)
    base = changelist("job")
    assert set(listed_ids(root_client.get(f"{base}?queue__id__in={qid},{2**63 - 1}"))) == set(jobs.values())
    assert listed_ids(root_client.get(f"{base}?queue={-(2**63)}")) == []
    assert root_client.get(f"{base}?queue__id__in=abc").status_code == 302  # Django's own "?e=1"


@pytest.mark.parametrize("bad", ["abc", "", "1.5", BIG, "9" * 5000, "-1x"])
def test_a_forged_action_selection_is_a_message_and_changes_nothing(root_client, jobs, bad):
    # The page only posts row ids; Django filtered pk__in with any posted text (a 500).
    response = root_client.post(
        changelist("job"),
        {"action": "cancel_selected", "_selected_action": [str(seq(jobs["ready"])), bad]},
        follow=True,
    )
    assert response.status_code == 200
    assert "The selection is not a list of row ids; nothing was changed." in messages_of(response)
    assert fq.get("adm:q", jobs["ready"]).state == "ready"
