"""One handler per queue: a second one is refused with a message naming both (and the Tasks hint)."""

from __future__ import annotations

import pytest

from django_fq import handlers
from django_fq.tasks.runner import run_task


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(handlers, "_registry", {})


def first(job):
    return None


def second(job):
    return None


def test_a_second_handler_for_a_queue_is_refused_naming_both(clean_registry):
    handlers.handler("reg.a")(first)
    with pytest.raises(ValueError, match="already has handler") as err:
        handlers.handler("reg.a")(second)
    text = str(err.value)
    assert "tests.test_handler_registry.first" in text and "tests.test_handler_registry.second" in text
    assert "queue_prefix" not in text
    assert handlers.get("reg.a") is first
    handlers.handler("reg.a")(first)  # the same function again is fine


def test_a_queue_taken_by_the_tasks_runner_suggests_a_queue_prefix(clean_registry):
    handlers.handler("emails")(run_task)
    with pytest.raises(ValueError, match=r"queue_prefix") as err:
        handlers.handler("emails")(second)
    text = str(err.value)
    # fits a backend that already has a prefix too: it does not only say "give it a prefix"
    assert "move the @handler to another queue" in text and "a different OPTIONS['queue_prefix']" in text
    assert "rename the queue" not in text
    assert handlers.get("emails") is run_task
