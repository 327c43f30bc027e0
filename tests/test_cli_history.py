"""``manage.py fq history [QUEUE] [--span]`` (docs/reference/cli.md, docs/reference/history.md)."""

from __future__ import annotations

import pytest

from django_fq import services
from django_fq.services import history

from .test_cli import fails, fq, ok

# Committed transactions: the history is tallied when the work commits.
pytestmark = pytest.mark.django_db(transaction=True)

Q = "cli:hist"


def test_history_counts_what_was_done_and_matches_the_python_api():
    services.enqueue_many(Q, [{"payload": n} for n in range(3)])
    a, b, c = services.claim(Q, count=3)
    services.ack(Q, a.receipt)
    services.nack(Q, b.receipt, delay_ms=0)
    services.nack(Q, c.receipt, permanent=True)
    data = ok("history", Q)
    assert data == {**history.history_series(Q, "hour"), "now": data["now"]}
    t = data["totals"]
    assert (t["enqueued"], t["succeeded"], t["failed"], t["dead"]) == (3, 1, 2, 1)
    assert (t["wait_ms"]["count"], t["run_ms"]["count"]) == (3, 1)
    week = ok("history", "--span", "week")
    assert (week["queue"], len(week["buckets"]), week["totals"]["enqueued"]) == (None, 168, 3)
    human = fq("history", Q, "--span", "day")
    assert human.code == 0
    assert "history of cli:hist, last day, buckets of 15 min" in human.out
    assert "enqueued 3, succeeded 1, failed 2, dead 1" in human.out


def test_an_empty_history_says_so():
    services.configure(Q)
    run = fq("history", Q)
    assert run.code == 0 and "(no activity in this span)" in run.out


@pytest.mark.parametrize("span", ["year", "", "hour\x00"])
def test_a_bad_span_is_an_error_naming_it(span):
    services.configure(Q)
    fails("history", Q, "--span", span, code="invalid", field="span")


def test_a_bad_or_unknown_queue_is_an_error_naming_it():
    fails("history", "no such", code="invalid_queue_name", field="queue")
    fails("history", "cli:missing", code="queue_not_found", field="queue")
