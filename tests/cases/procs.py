"""Parent-side helpers for the case tests: child processes and DB-clock arithmetic."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from django.db import connection

from django_fq import db

ROOT = Path(__file__).resolve().parents[2]


class Child:
    """A running ``tests/cases/child.py`` process whose stdout lines are JSON reports."""

    def __init__(self, *args: str, extra_env: dict | None = None, stdin: bool = False):
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.cases.child_settings",
            FQ_CHILD_DB_NAME=str(connection.settings_dict["NAME"]),
            # The child's settings pick the same backend (tests/conftest.py's VENDORS, inverted).
            FQ_TEST_DB={"postgresql": "postgres", "mysql": "mariadb"}.get(connection.vendor, "sqlite"),
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env.pop("FQ_CHILD_SKEW_MS", None)
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cases.child", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _pump_stdout(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # end of output

    def _pump_stderr(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line)

    def report(self, timeout: float = 30.0) -> dict:
        """The next JSON report; fails with the child's stderr if none comes in time."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child sent nothing in {timeout}s; stderr:\n{self.stderr}") from None
        if line is None:
            self.proc.wait(timeout=10)
            raise AssertionError(f"child exited ({self.proc.returncode}) early; stderr:\n{self.stderr}")
        return json.loads(line)

    def until(self, event: str, timeout: float = 30.0) -> dict:
        """Skip reports until one with ``event``."""
        while True:
            msg = self.report(timeout)
            if msg.get("event") == event:
                return msg

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no settle, the connection just drops."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=5)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)


def advance_to(clock, target_ms: int) -> int:
    """Shift the DB clock so that its now is at least ``target_ms``; return the fresh reading.

    Real time only moves forward, so once the offset is set from a fresh
    reading the database's now stays at or past ``target_ms``.
    """
    now = db.db_now_ms()
    if now < target_ms:
        clock.advance(target_ms - now)
        now = db.db_now_ms()
    assert now >= target_ms
    return now


def set_offset_for(clock, target_ms: int) -> int:
    """Shift the DB clock so that a reading taken right now gives ``target_ms`` (may move it back).

    Returns the reading that was used; the database's real time keeps moving
    forward afterwards, so later readings are ``target_ms`` plus the time elapsed.
    """
    now = db.db_now_ms()
    clock.advance(target_ms - now)
    return now
