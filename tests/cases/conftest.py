"""Fixtures of the case tests (C01–C15)."""

from __future__ import annotations

import pytest

from .procs import Child


@pytest.fixture
def spawn():
    """Start child processes (``tests/cases/child.py``); any still running at teardown is killed."""
    started: list[Child] = []

    def start(*args: str, **kwargs) -> Child:
        child = Child(*args, **kwargs)
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait(timeout=10)
