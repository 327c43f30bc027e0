"""Running a step of a test on another thread, with a connection of its own.

Django gives each thread its own connection, in autocommit: what such a step
commits is what another session sees, which is what the concurrency tests
(stale snapshots, lock waits, races) need from "elsewhere".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def elsewhere(fn: Callable[[], Any], *, timeout_s: float = 60) -> Any:
    """Run ``fn`` on a new thread (its own connection, autocommit) and return its value.

    Waits up to ``timeout_s`` seconds for it (an ``AssertionError`` if it is
    still running then), re-raises here what it raised, and closes the
    thread's connections when it ends.
    """
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"{fn!r} still running after {timeout_s} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def in_threads(n: int, target: Callable[[int], Any], *, timeout_s: float = 60) -> list:
    """Run ``target(i)`` for i in 0..n-1 on ``n`` real threads at once, each with its own connection.

    Returns their values in order; re-raises here the first error one raised;
    fails if a thread is still running after ``timeout_s`` seconds.
    """
    results: list = [None] * n
    errors: list = []

    def run(i):
        try:
            results[i] = target(i)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results
