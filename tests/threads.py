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
