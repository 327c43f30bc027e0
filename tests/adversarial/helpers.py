"""Tools of the adversarial tests: run a call on another thread (own connection), see PostgreSQL lock waits."""

from __future__ import annotations

import threading
import time

from django.db import connections


class Background:
    """Run ``fn`` on a thread with its own database connection; keep its value or exception."""

    def __init__(self, fn, name: str = "adv-background"):
        self.fn = fn
        self.value = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()

    def start(self) -> Background:
        self.thread.start()
        return self

    def join(self, timeout: float = 30.0) -> Background:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.thread.name} still running after {timeout}s"
        return self


def run_elsewhere(fn, timeout: float = 30.0) -> Background:
    """Run ``fn`` on another thread (another connection) and wait for it."""
    return Background(fn).start().join(timeout)


def pg_lock_waiters() -> int:
    """Sessions of this test database waiting for a heavyweight lock right now (PostgreSQL)."""
    with connections["default"].cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cur.fetchone()[0]


def wait_for_lock_waiter(n: int = 1, timeout: float = 10.0, thread: Background | None = None) -> None:
    """Block until ``n`` other sessions wait on a lock (the racing call reached its blocking point).

    Uses a connection of its own (the calling thread may be inside a transaction it must not disturb).
    """
    result = {}

    def look():
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if thread is not None and not thread.thread.is_alive():
                result["ok"] = "finished"
                return
            if pg_lock_waiters() >= n:
                result["ok"] = "waiting"
                return
            time.sleep(0.01)

    run_elsewhere(look, timeout + 5)
    assert result.get("ok"), f"no session started waiting for a lock within {timeout}s"


__all__ = ["Background", "pg_lock_waiters", "run_elsewhere", "wait_for_lock_waiter"]
