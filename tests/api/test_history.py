"""``GET /queues/{queue}/history/?span=`` (docs/rest-api.md, docs/reference/history.md)."""

from __future__ import annotations

import pytest

from django_fq import services
from django_fq.services import history

from .conftest import client_as, url
from .test_endpoints import err

# Committed transactions: the history is tallied when the work commits.
pytestmark = pytest.mark.django_db(transaction=True)

Q = "api:hist"


def test_history_is_the_series_of_the_python_api():
    api = client_as("manage")
    services.enqueue_many(Q, [{"payload": n} for n in range(2)])
    a, b = services.claim(Q, count=2)
    services.ack(Q, a.receipt)
    services.nack(Q, b.receipt, permanent=True)
    response = api.get(url("history", Q), {"span": "day"})
    assert response.status_code == 200
    body = response.json()
    assert body == {**history.history_series(Q, "day"), "now": body["now"]}
    t = body["totals"]
    assert (t["enqueued"], t["succeeded"], t["failed"], t["dead"]) == (2, 1, 1, 1)
    assert len(body["buckets"]) == 96
    assert len(api.get(url("history", Q)).json()["buckets"]) == 60  # hour by default


@pytest.mark.parametrize("span", ["year", "", "hour\x00", "x" * 3000])
def test_a_bad_span_is_a_400_naming_it(span):
    services.configure(Q)
    err(client_as("manage").get(url("history", Q), {"span": span}), 400, "invalid", "span")


def test_an_unknown_queue_is_a_404():
    err(client_as("manage").get(url("history", "api:missing")), 404, "queue_not_found", "queue")


def test_only_managers_read_it():
    services.configure(Q)
    assert client_as("produce", "consume").get(url("history", Q)).status_code == 403
