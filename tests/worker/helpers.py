"""Helpers of the worker tests: real ``fq_worker`` processes, handler event files, lease sampling."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import connection, connections

from django_fq import db, services
from django_fq.models import Lease, Queue

ROOT = Path(__file__).resolve().parents[2]


#: The ``FQ_TEST_DB`` value (tests/settings.py) of each Django ``connection.vendor``.
TEST_DB_OF_VENDOR = {"postgresql": "postgres", "sqlite": "sqlite", "mysql": "mariadb"}


def child_env(clock_offset_ms: int | None = None, **extra: str) -> dict:
    """Environment of a child process on this test's database (and DB clock offset)."""
    env = dict(os.environ)
    if clock_offset_ms is None:
        clock_offset_ms = int(getattr(settings, "FQ_TEST_CLOCK_OFFSET_MS", 0) or 0)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.worker_settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        FQ_CHILD_DB_NAME=str(connection.settings_dict["NAME"]),
        FQ_CHILD_CLOCK_OFFSET_MS=str(clock_offset_ms),
        FQ_TEST_DB=TEST_DB_OF_VENDOR[connection.vendor],
    )
    env.pop("FQ_TEST_WORKER_FAULTS", None)
    env.pop("FQ_WORKER_SUPERVISOR_PID", None)
    env.update(extra)
    return env


class WorkerProc:
    """A running ``python -m django fq_worker …`` whose stderr lines are collected as they come."""

    def __init__(self, *args: str, clock_offset_ms: int | None = None, env: dict | None = None, **popen):
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "fq_worker", *args],
            cwd=ROOT,
            env=child_env(clock_offset_ms, **(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=popen.pop("stdout", subprocess.PIPE),
            stderr=popen.pop("stderr", subprocess.PIPE),
            text=True,
            **popen,
        )
        self.lines: list[str] = []
        self.out: list[str] = []
        self._cv = threading.Condition()
        self._readers = []
        if self.proc.stderr is not None:
            self._readers.append(threading.Thread(target=self._pump, args=(self.proc.stderr, self.lines), daemon=True))
        if self.proc.stdout is not None:
            self._readers.append(threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True))
        for t in self._readers:
            t.start()

    def _pump(self, stream, into: list) -> None:
        for line in stream:
            with self._cv:
                into.append(line)
                self._cv.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stderr(self) -> str:
        with self._cv:
            return "".join(self.lines)

    @property
    def stdout(self) -> str:
        with self._cv:
            return "".join(self.out)

    def wait_for(self, pattern: str, timeout: float = 30.0, start: int = 0) -> str:
        """The first stderr line (from index ``start``) matching regex ``pattern``; fails after ``timeout``."""
        rx = re.compile(pattern)
        give_up = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines[start:]:
                    if rx.search(line):
                        return line
                remaining = give_up - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._readers_alive()):
                    raise AssertionError(f"no line matching {pattern!r} (exit {self.proc.poll()}); stderr:\n{''.join(self.lines)}")
                self._cv.wait(min(remaining, 0.1))

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        with self._cv:
            return sum(1 for line in self.lines if rx.search(line))

    def _readers_alive(self) -> bool:
        return any(t.is_alive() for t in self._readers)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=5)
        return code

    def alive(self) -> bool:
        return self.proc.poll() is None


class Events:
    """The JSON-lines file the ``t.ctl*`` handlers append to (``start``/``end``/``lost`` records)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def read(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return [json.loads(line) for line in fh if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def of(self, ev: str, job_id: str | None = None) -> list[dict]:
        return [e for e in self.read() if e["ev"] == ev and (job_id is None or e["id"] == job_id)]

    def wait_for(self, ev: str, job_id: str | None = None, *, n: int = 1, timeout: float = 30.0) -> list[dict]:
        """Wait until at least ``n`` records ``ev`` (of ``job_id``) exist; return them."""
        give_up = time.monotonic() + timeout
        while True:
            found = self.of(ev, job_id)
            if len(found) >= n:
                return found
            if time.monotonic() > give_up:
                raise AssertionError(f"waited {timeout}s for {n} {ev!r} event(s) of {job_id}; have: {self.read()}")
            time.sleep(0.01)


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (returned); fail after ``timeout`` seconds."""
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def live_leases(queue: str) -> int:
    """Leases of ``queue`` whose deadline is still ahead (database clock, this test's offset)."""
    with connections["default"].cursor() as cur:
        cur.execute(
            f"SELECT COUNT(*) FROM {Lease._meta.db_table} l JOIN {Queue._meta.db_table} q ON q.id = l.queue_id "
            f"WHERE q.name = %s AND l.deadline > {db.now_sql()}",
            [queue],
        )
        return cur.fetchone()[0]


class LeaseSampler:
    """Samples ``live_leases`` (and stats' running count) of a queue on a thread until stopped."""

    def __init__(self, queue: str, interval: float = 0.005):
        self.queue = queue
        self.interval = interval
        self.samples: list[int] = []
        self.running: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        if self.error is not None and exc[0] is None:
            raise self.error
        return False

    def _run(self) -> None:
        from django_fq import services as fq

        try:
            while not self._stop.is_set():
                self.samples.append(live_leases(self.queue))
                self.running.append(fq.stats(self.queue).counts["running"])
                time.sleep(self.interval)
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()


def touch(path: Path) -> None:
    Path(path).write_text("open")


def record_claims(monkeypatch) -> list[tuple[int, int]]:
    """Wrap ``services.claim`` (as the worker calls it): the returned list gets ``(count asked, jobs got)`` per call."""
    asks: list[tuple[int, int]] = []
    real = services.claim

    def recording(queue, *, count, **kwargs):
        jobs = real(queue, count=count, **kwargs)
        asks.append((count, len(jobs)))
        return jobs

    monkeypatch.setattr(services, "claim", recording)
    return asks
