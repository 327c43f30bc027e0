"""Fixtures of the security tests."""

from __future__ import annotations

import pytest

from tests.worker.helpers import WorkerProc


@pytest.fixture
def workers():
    """Start ``fq_worker`` child processes with ``workers(*args, **kw)``; any still running at teardown is killed."""
    started: list[WorkerProc] = []

    def start(*args: str, **kwargs) -> WorkerProc:
        proc = WorkerProc(*args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)
