"""Who may create a queue, and how many there may be (docs/reference/settings.md, docs/rest-api.md).

* ``FQ_API_CREATE_QUEUES`` (default ``"manage"``): a REST enqueue into a queue
  that does not exist creates it only for a user who may manage that queue;
  a producer gets 404 ``queue_not_found`` naming the rule, and nothing is written.
* ``FQ_MAX_QUEUES`` (default 10,000): creating one more queue fails with
  ``too_many_queues`` on every face (Python, CLI, REST, admin's configure,
  ``fq import``) and changes nothing; queues that exist keep working.
"""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.db import connections

from django_fq import backup, conf
from django_fq import services as fq
from django_fq.exceptions import InvalidBackup, TooManyQueues
from tests.test_cli import fq as run_fq

from .conftest import client_as, url

pytestmark = pytest.mark.django_db


def _names() -> list[str]:
    return [q.name for q in fq.queues()]


def test_a_producer_cannot_create_a_queue_by_a_typo():
    fq.configure("emails")
    producer = client_as("produce")
    assert producer.post(url("jobs", "emails"), {"payload": 1}).status_code == 201
    for r in (
        producer.post(url("jobs", "emials"), {"payload": 1}),
        producer.post(url("enqueue-bulk", "emials"), {"jobs": [{"payload": 1}, {"payload": 2}]}),
        producer.post(url("jobs", "emials"), {"payload": 1, "idempotency": "t", "unique_key": "k"}),
    ):
        assert r.status_code == 404, r.content
        body = r.json()
        assert (body["code"], body["field"]) == ("queue_not_found", "queue")
        assert "django_fq.manage" in body["message"] and "FQ_API_CREATE_QUEUES" in body["message"]
    assert _names() == ["emails"]


def test_a_user_who_may_manage_creates_the_queue_by_enqueueing():
    client = client_as("produce", "manage")
    assert client.post(url("jobs", "new:one"), {"payload": 1}).status_code == 201
    assert client.post(url("enqueue-bulk", "new:two"), {"jobs": [{"payload": 1}]}).status_code == 201
    assert _names() == ["new:one", "new:two"]


def test_the_setting_can_let_producers_create_queues(settings):
    settings.FQ_API_CREATE_QUEUES = "produce"
    assert client_as("produce").post(url("jobs", "made:by-producer"), {"payload": 1}).status_code == 201
    assert _names() == ["made:by-producer"]


def test_the_rule_asks_the_permission_class_about_the_queue(settings):
    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.ManageOwnQueuesOnly"]
    client = client_as("produce", "manage")
    own = f"{client.handler._force_user.username}:q"
    assert client.post(url("jobs", own), {"payload": 1}).status_code == 201
    assert client.post(url("jobs", "other:q"), {"payload": 1}).status_code == 404
    assert _names() == [own]


def test_a_bad_setting_value_is_a_check_error_and_the_default_applies(settings):
    from django_fq.security_checks import check_api_settings

    settings.FQ_API_CREATE_QUEUES = "anyone"
    assert [e.id for e in check_api_settings()] == ["django_fq.E020"]
    assert client_as("produce").post(url("jobs", "x"), {"payload": 1}).status_code == 404


# --- FQ_MAX_QUEUES ------------------------------------------------------------------------------------


@pytest.fixture
def two_queues_max(settings):
    settings.FQ_MAX_QUEUES = 2
    fq.configure("full:a")
    fq.enqueue("full:b", 1)
    return settings


def _refused(exc_info_or_body) -> None:
    assert "too many queues" in str(exc_info_or_body) and "FQ_MAX_QUEUES" in str(exc_info_or_body)


def test_every_python_verb_that_creates_a_queue_stops_at_the_limit(two_queues_max):
    before = fq.stats("full:b").totals
    for create in (
        lambda: fq.enqueue("full:c", 1),
        lambda: fq.enqueue_many("full:c", [{"payload": 1}, {"payload": 2}]),
        lambda: fq.enqueue("full:c", 1, idempotency="t", unique_key="k", delay_ms=5),
        lambda: fq.configure("full:c", max_attempts=3),
    ):
        with pytest.raises(TooManyQueues) as caught:
            create()
        assert (caught.value.code, caught.value.field, caught.value.status) == ("too_many_queues", "queue", 409)
        assert caught.value.extra["limit"] == 2
        _refused(caught.value)
    assert _names() == ["full:a", "full:b"]
    # The queues that exist keep working at the limit.
    assert fq.enqueue("full:a", 1).created and fq.configure("full:b", max_attempts=2).max_attempts == 2
    assert fq.stats("full:b").totals["enqueued"] == before["enqueued"]


def test_the_cli_stops_at_the_limit(two_queues_max):
    for argv in (("enqueue", "full:c", "1", "--json"), ("config", "full:c", "--max-attempts", "3")):
        run = run_fq(*argv)
        assert run.code == 1, run
        _refused(run.err + run.out)
    assert _names() == ["full:a", "full:b"]


def test_rest_stops_at_the_limit(two_queues_max):
    client = client_as("produce", "manage")
    for r in (
        client.post(url("jobs", "full:c"), {"payload": 1}),
        client.post(url("enqueue-bulk", "full:c"), {"jobs": [{"payload": 1}]}),
        client.put(url("queue", "full:c"), {"max_attempts": 3}),
        client.patch(url("queue", "full:c"), {"max_attempts": 3}),
    ):
        assert r.status_code == 409, r.content
        assert (r.json()["code"], r.json()["field"], r.json()["limit"]) == ("too_many_queues", "queue", 2)
    assert _names() == ["full:a", "full:b"]


def test_fq_import_stops_at_the_limit(two_queues_max):
    out = io.StringIO()
    fq.enqueue("full:a", {"n": 1})
    backup.export_jsonl(out, ["full:a"])
    text = out.getvalue().replace('"full:a"', '"full:c"')
    with pytest.raises(InvalidBackup) as caught:
        backup.import_jsonl(text.splitlines(keepends=True))
    _refused(caught.value)
    assert getattr(caught.value, "field", None) == "name"
    assert _names() == ["full:a", "full:b"]
    json.loads(text.splitlines()[0])  # the header was a real backup line


@pytest.mark.django_db(transaction=True)
def test_concurrent_creations_never_pass_the_limit(settings):
    """Eight threads create eight queues against a limit of five: exactly five exist (the creation lock)."""
    settings.FQ_MAX_QUEUES = 5
    start = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        try:
            start.wait(timeout=30)
            try:
                fq.enqueue(f"race:{i}", 1)
                result = "created"
            except TooManyQueues:
                result = "refused"
            with lock:
                outcomes.append(result)
        finally:
            connections[conf.database()].close()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["created"] * 5 + ["refused"] * 3
    assert len(_names()) == 5
