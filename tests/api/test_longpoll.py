"""Long polls over HTTP: claim ``wait_ms`` and job ``wait`` with real threads and committed data."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from django_fq import db, services, storage, wakeup

from .conftest import client_as, url

pytestmark = pytest.mark.django_db(transaction=True)

Q = "poll"


def later(delay_s: float, fn, *args, **kwargs) -> threading.Thread:
    """Run ``fn`` in another thread (with its own database connection) after ``delay_s``."""
    errors: list = []

    def run():
        try:
            time.sleep(delay_s)
            fn(*args, **kwargs)
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors
    thread.start()
    return thread


def join(thread: threading.Thread) -> None:
    thread.join(30)
    assert not thread.is_alive()
    assert not thread.errors, thread.errors


def test_long_poll_returns_a_job_enqueued_during_the_wait():
    services.configure(Q)
    client = client_as("consume")
    producer = later(0.3, services.enqueue, Q, {"late": True})
    started = time.monotonic()
    r = client.post(url("claim", Q), {"wait_ms": 10_000})
    elapsed = time.monotonic() - started
    join(producer)
    assert r.status_code == 200
    assert [j["payload"] for j in r.json()] == [{"late": True}]
    assert elapsed < 9  # answered when the job came, not when the wait ran out


def test_long_poll_ends_with_an_empty_list():
    services.configure(Q)
    started = time.monotonic()
    r = client_as("consume").post(url("claim", Q), {"wait_ms": 300})
    assert (r.status_code, r.json()) == (200, [])
    assert time.monotonic() - started >= 0.29


def test_long_poll_picks_up_a_delayed_job_coming_due():
    services.configure(Q)
    services.enqueue(Q, "soon", delay_ms=300)
    r = client_as("consume").post(url("claim", Q), {"wait_ms": 10_000})
    assert [j["payload"] for j in r.json()] == ["soon"]


def test_concurrent_long_polls_each_get_their_own_job():
    services.configure(Q)
    results: list = []

    clients = [client_as("consume") for _ in range(3)]

    def poll(client):
        results.append(client.post(url("claim", Q), {"wait_ms": 10_000}).json())

    pollers = [later(0, poll, client) for client in clients]
    time.sleep(0.3)
    services.enqueue_many(Q, [{"payload": i} for i in range(3)])
    for t in pollers:
        join(t)
    claimed = [job["payload"] for batch in results for job in batch]
    assert sorted(claimed) == [0, 1, 2]


def test_long_poll_outside_atomic_requests(monkeypatch):
    """With ATOMIC_REQUESTS on, a waiting claim still runs outside a transaction.

    Otherwise its first (empty) claim would keep a transaction open for the
    whole wait: on SQLite the write lock, so the enqueue below could not
    commit until the wait was over.
    """
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    services.configure(Q)
    in_transaction: list[bool] = []
    original = wakeup.Listener.wait

    producers: list = []

    def watching(self, mark, queues, timeout):
        in_transaction.append(db.connection().in_atomic_block)
        if not producers:  # enqueue once the claim waits, however slow the machine is to get there
            producers.append(later(0, services.enqueue, Q, "x"))
        return original(self, mark, queues, timeout)

    monkeypatch.setattr(wakeup.Listener, "wait", watching)
    client = client_as("consume")
    r = client.post(url("claim", Q), {"wait_ms": 10_000})
    for producer in producers:
        join(producer)
    assert [j["payload"] for j in r.json()] == ["x"]
    assert in_transaction and not any(in_transaction)


def test_long_poll_holds_no_database_connection_while_it_waits(monkeypatch):
    """On a database server (listening or polling) no connection is held through a pause."""
    if storage.for_connection(connection).embedded:
        pytest.skip("a SQLite connection is a file handle: the long poll keeps it")
    services.configure(Q)
    listener = wakeup.listener()
    give_up = time.monotonic() + 10
    while listener.active and not listener.listening and time.monotonic() < give_up:
        time.sleep(0.02)
    assert listener.listening or not listener.active
    held: list[bool] = []
    original = wakeup.Listener.wait

    def watching(self, mark, queues, timeout):
        held.append(db.connection().connection is not None)
        return original(self, mark, queues, timeout)

    monkeypatch.setattr(wakeup.Listener, "wait", watching)
    client = client_as("consume")
    producer = later(0.5, services.enqueue, Q, "x")
    r = client.post(url("claim", Q), {"wait_ms": 10_000})
    join(producer)
    assert [j["payload"] for j in r.json()] == ["x"]
    assert held and not any(held), held


def test_wait_returns_when_a_consumer_acks_during_the_wait():
    job = services.enqueue(Q, "work").id

    def consume():
        claimed = services.claim(Q)
        services.ack(Q, claimed[0].receipt, result="done")

    consumer = later(0.3, consume)
    r = client_as("produce").post(url("job-wait", Q, job), {"timeout_ms": 10_000})
    join(consumer)
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["result"]) == ("succeeded", "done")
