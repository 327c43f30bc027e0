"""Child processes of the chaos scenarios: ``fq_worker`` and the stress actors, logging to files.

Built on :mod:`tests.worker.helpers` (the same child environment as the
worker tests), with two differences: stderr goes to a log file (a storm of
20,000 jobs and dozens of killed processes needs no reader threads, and the
files stay for a post-mortem), and a command prefix can run the child
elsewhere (``ip netns exec NS`` for the partition scenario).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.worker.helpers import ROOT, child_env

SETTINGS = "tests.chaos.settings"


class Proc:
    """A running ``python -m <args>`` with the chaos settings; stderr and stdout in ``log``."""

    def __init__(self, args: list[str], *, log: Path, prefix: tuple[str, ...] = (), env: dict | None = None, name: str = ""):
        self.args = list(args)
        self.name = name or " ".join(args[:2])
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as fh:  # the child writes through its own copy of the descriptor
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", *args],
                cwd=ROOT,
                env=child_env(0, DJANGO_SETTINGS_MODULE=SETTINGS, **(env or {})),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    #: A log line the process writes once it handles SIGTERM (``None``: from the start).
    ready: str | None = None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the process handles SIGTERM (its ``ready`` line is in the log)."""
        if self.ready is not None and self.alive():
            self.wait_for(self.ready, timeout)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (once it is ready for it) and wait; SIGKILL if it does not exit in time. Returns the exit status."""
        try:
            self.wait_ready(timeout)
        except AssertionError:
            pass  # it died or hangs while starting: the exit status tells
        self.signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.wait(10)

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        return sum(1 for line in self.text().splitlines() if rx.search(line))

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        """The first log line matching regex ``pattern``; AssertionError after ``timeout`` seconds."""
        rx = re.compile(pattern)
        give_up = time.monotonic() + timeout
        while True:
            for line in self.text().splitlines():
                if rx.search(line):
                    return line
            if time.monotonic() > give_up or not self.alive():
                raise AssertionError(f"{self.name}: no line matching {pattern!r} (exit {self.proc.poll()}); log:\n{self.text()[-3000:]}")
            time.sleep(0.05)


def worker(queue: str, log: Path, *args: str, prefix: tuple[str, ...] = (), env: dict | None = None, name: str = "") -> Proc:
    """``fq_worker --queue=queue *args``, logging at INFO (one line per job) into ``log``."""
    # As a supervisor's child: the worker stops by itself if the scenario's process dies.
    env = {"FQ_WORKER_SUPERVISOR_PID": str(os.getpid()), **(env or {})}
    proc = Proc(["django", "fq_worker", f"--queue={queue}", *args], log=log, prefix=prefix, env=env, name=name or "fq_worker")
    proc.ready = r"worker\.start "
    return proc


def actor(role: str, log: Path, *args: str, env: dict | None = None) -> Proc:
    """A stress actor: ``python -m tests.chaos.actors ROLE *args`` (see :mod:`tests.chaos.actors`)."""
    return Proc(["tests.chaos.actors", role, *args], log=log, env=env, name=f"actor {role}")


#: Log lines that must never appear in any chaos process (anything else a worker logs is expected noise of faults).
FORBIDDEN = (
    re.compile(r"database is locked", re.I),
    re.compile(r"deadlock detected", re.I),
    # MariaDB/MySQL errors 1213 and 1205: django-fq retries them in its own transactions, so none may surface.
    re.compile(r"Deadlock found when trying to get lock", re.I),
    re.compile(r"Lock wait timeout exceeded", re.I),
    re.compile(r"could not serialize", re.I),
    re.compile(r"worker\.internal_error"),
    re.compile(r"Traceback \(most recent call last\)"),
)


def forbidden_lines(procs: list[Proc], patterns=FORBIDDEN) -> list[str]:
    """Lines of the processes' logs that match one of ``patterns`` (with the process name)."""
    found = []
    for proc in procs:
        for line in proc.text().splitlines():
            if any(rx.search(line) for rx in patterns):
                found.append(f"{proc.name} pid {proc.pid}: {line.strip()[:300]}")
    return found
