"""Fixtures of the worker tests: worker processes that are always cleaned up, event files and gates."""

from __future__ import annotations

import pytest

from .helpers import Events, WorkerProc


@pytest.fixture
def workers():
    """Start ``fq_worker`` processes with ``workers(*args, **kw)``; any still running at teardown is killed."""
    started: list[WorkerProc] = []

    def start(*args: str, **kwargs) -> WorkerProc:
        proc = WorkerProc(*args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def events(tmp_path):
    return Events(tmp_path / "events.jsonl")


@pytest.fixture
def gate(tmp_path):
    """A path the ``t.ctl`` handler waits for; ``helpers.touch(gate)`` opens it."""
    return tmp_path / "gate"
