"""Pause and resume over HTTP (docs/reference/semantics.md §9 "Pause"): manage pauses, producers go on, consumers get nothing."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_fq import db, services

from .conftest import client_as, url

Q = "api:pause"


@pytest.mark.django_db
def test_a_manager_pauses_and_resumes_and_the_queue_shows_it():
    manager = client_as("manage")
    services.enqueue(Q, {"n": 1})
    before = db.db_now_ms()
    r = manager.post(url("queue-pause", Q))
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["queue"], body["paused"], body["changed"]) == (Q, True, True)
    assert body["paused_at"] >= before

    again = manager.post(url("queue-pause", Q)).json()
    assert again == {**body, "changed": False}  # no error, nothing changes

    [info] = [q for q in manager.get(url("queues")).json() if q["name"] == Q]
    assert (info["paused"], info["paused_at"]) == (True, body["paused_at"])
    stats = manager.get(url("stats", Q)).json()
    assert (stats["paused"], stats["paused_at"]) == (True, body["paused_at"])

    r = manager.post(url("queue-resume", Q))
    assert r.status_code == 200
    assert r.json() == {"queue": Q, "paused": False, "paused_at": None, "changed": True}
    assert manager.post(url("queue-resume", Q)).json()["changed"] is False
    assert manager.get(url("stats", Q)).json()["paused"] is False


@pytest.mark.django_db
def test_unknown_queue_bad_name_and_a_body_field_are_refused():
    manager = client_as("manage")
    for name in ("queue-pause", "queue-resume"):
        r = manager.post(url(name, "api:none"))
        assert (r.status_code, r.json()["code"], r.json()["field"]) == (404, "queue_not_found", "queue")
        r = manager.post(url(name, "bad name!"))
        assert (r.status_code, r.json()["code"]) == (400, "invalid_queue_name")
    services.configure(Q)
    r = manager.post(url("queue-pause", Q), {"paused": True})
    assert r.status_code == 400 and r.json()["field"] == "paused"
    assert services.stats(Q).paused is False  # refused: nothing changed
    assert "api:none" not in [q.name for q in services.queues()]


@pytest.mark.django_db
def test_while_paused_a_producer_enqueues_and_a_consumer_claims_nothing():
    services.configure(Q)
    services.pause(Q)
    producer, consumer = client_as("produce"), client_as("consume")
    r = producer.post(url("jobs", Q), {"payload": {"n": 1}})
    assert r.status_code == 201 and r.json()["created"] is True
    r = consumer.post(url("claim", Q), {"count": 10})
    assert r.status_code == 200 and r.json() == []
    services.resume(Q)
    r = consumer.post(url("claim", Q), {"count": 10})
    assert [j["payload"] for j in r.json()] == [{"n": 1}]


@pytest.mark.django_db
def test_a_job_running_when_the_queue_is_paused_is_acked_over_http():
    consumer, manager = client_as("consume"), client_as("manage")
    services.enqueue(Q, {"n": 1})
    services.enqueue(Q, {"n": 2})
    first, second = consumer.post(url("claim", Q), {"count": 2}).json()
    manager.post(url("queue-pause", Q))
    r = consumer.post(url("extend", Q), {"receipt": first["receipt"], "visibility_ms": 60_000})
    assert r.status_code == 200
    assert consumer.post(url("ack", Q), {"receipt": first["receipt"]}).json()["state"] == "succeeded"
    assert consumer.post(url("nack", Q), {"receipt": second["receipt"], "delay_ms": 0}).json()["state"] == "ready"
    assert consumer.post(url("claim", Q), {}).json() == []


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_waits_while_paused_then_returns_none_and_a_resume_wakes_it():
    services.enqueue(Q, {"n": 1})
    services.pause(Q)
    consumer = client_as("consume")
    started = time.monotonic()
    r = consumer.post(url("claim", Q), {"wait_ms": 400})
    assert r.status_code == 200 and r.json() == []
    assert time.monotonic() - started >= 0.4  # it waited its wait out

    def resume_soon():
        try:
            time.sleep(0.3)
            services.resume(Q)
        finally:
            connections.close_all()

    thread = threading.Thread(target=resume_soon)
    thread.start()
    started = time.monotonic()
    r = consumer.post(url("claim", Q), {"wait_ms": 15_000})
    thread.join(30)
    assert [j["payload"] for j in r.json()] == [{"n": 1}]
    assert time.monotonic() - started < 14  # answered at the resume, not when the wait ran out
