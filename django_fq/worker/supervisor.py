"""``fq_worker --processes P``: a small supervisor running P worker processes.

The supervisor starts each child with the same options (one process each,
from :meth:`WorkerOptions.child_argv <django_fq.worker.options.WorkerOptions.child_argv>`),
restarts the ones that crash, forwards stop signals, and stops everything
when a child cannot start as configured (:data:`EX_CONFIG`). A child knows
it is supervised from :data:`SUPERVISOR_ENV` and stops by itself when its
supervisor disappears.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from .logs import emit

#: Set by the supervisor in each child: the supervisor's pid (a child stops when it is orphaned).
SUPERVISOR_ENV = "FQ_WORKER_SUPERVISOR_PID"
#: Exit status of a supervised child that cannot start as configured (sysexits' EX_CONFIG): a metrics
#: port that cannot be bound, a failed system check, handlers that do not load. Not restarted.
EX_CONFIG = 78


class Supervisor:
    """Run ``processes`` worker processes, restart the ones that crash, forward stop signals.

    ``command(index)`` returns the argv of child ``index``. A child that
    exits 0 (``--burst`` finished, ``--max-jobs`` reached) is not restarted;
    one that crashes (non-zero exit, killed) is restarted after a pause that
    grows while it keeps crashing (1 s doubling to 30 s). A child that exits
    with :data:`EX_CONFIG` (78) on its first start could not start as
    configured, which a restart cannot cure: the others are stopped as on
    SIGTERM, nothing is restarted, and :meth:`run` returns 78
    (``failed_index`` names that child). A restarted child that exits 78
    (its metrics port still held by a leftover process, say) had started
    well before, so it is restarted like any crash. The first
    SIGTERM/SIGINT is forwarded to every child as SIGTERM (each then drains
    within its grace period) and no child is restarted any more; a second
    one is forwarded too (the children exit at once). Children run in their
    own process group, so a terminal's Ctrl-C reaches them only through the
    supervisor, and stop by themselves if the supervisor disappears.
    """

    RESTART_MIN_S, RESTART_MAX_S = 1.0, 30.0

    def __init__(self, command: Callable[[int], list[str]], processes: int, *, env: dict | None = None):
        self.command = command
        self.processes = processes
        self.env = dict(os.environ if env is None else env)
        self.env[SUPERVISOR_ENV] = str(os.getpid())
        self.children: dict[int, subprocess.Popen | None] = {}
        self._signals = 0
        self._restart_at: dict[int, float] = {}
        self._pause: dict[int, float] = {}
        self._finished: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        #: Index of the child that exited with EX_CONFIG on its first start, if one did.
        self.failed_index: int | None = None

    def run(self) -> int:
        """Start the children and look after them until every one has ended.

        Returns 0 when every child ended with status 0, :data:`EX_CONFIG`
        when one could not start as configured, 1 otherwise.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        emit(logging.INFO, "supervisor.start", pid=os.getpid(), processes=self.processes)
        for index in range(self.processes):
            self._start(index)
        while len(self._finished) < self.processes:
            now = time.monotonic()
            for index, child in list(self.children.items()):
                if index in self._finished:
                    continue
                stopping = self._signals or self.failed_index is not None
                if child is None:
                    if not stopping and now >= self._restart_at.get(index, 0):
                        self._start(index)
                    elif stopping:
                        self._finished[index] = 0
                    continue
                code = child.poll()
                if code is None:
                    continue
                emit(logging.INFO if code == 0 else logging.ERROR, "supervisor.child_exit", index=index, pid=child.pid, code=code)
                unstartable = code == EX_CONFIG and self._starts[index] == 1
                if unstartable and self.failed_index is None and not self._signals:
                    self.failed_index = index
                    emit(logging.ERROR, "supervisor.start_failed", index=index, code=code, action="stopping_all")
                    self._stop_children()
                if code == 0 or stopping or unstartable:
                    self._finished[index] = code
                    continue
                pause = self._pause.get(index, 0.0)
                pause = self.RESTART_MIN_S if pause == 0 else min(self.RESTART_MAX_S, pause * 2)
                if now - self._restart_at.get(index, 0) > 60:
                    pause = self.RESTART_MIN_S  # it ran a good while: not a crash loop
                self._pause[index] = pause
                self._restart_at[index] = now + pause
                self.children[index] = None
                emit(logging.WARNING, "supervisor.restart", index=index, in_s=pause)
            time.sleep(0.05)
        codes = list(self._finished.values())
        emit(logging.INFO, "supervisor.stop", codes=",".join(map(str, codes)))
        if self.failed_index is not None:
            return EX_CONFIG
        return 0 if all(c == 0 for c in codes) else 1

    def _start(self, index: int) -> None:
        child = subprocess.Popen(self.command(index), env={**self.env, "FQ_WORKER_INDEX": str(index)}, process_group=0)
        self.children[index] = child
        self._starts[index] = self._starts.get(index, 0) + 1
        self._restart_at[index] = time.monotonic()
        emit(logging.INFO, "supervisor.child_start", index=index, pid=child.pid)

    def _on_signal(self, signum: int, frame) -> None:
        self._signals += 1
        emit(logging.INFO, "supervisor.signal", signal=signal.Signals(signum).name, count=self._signals)
        self._stop_children()

    def _stop_children(self) -> None:
        """Send SIGTERM to every running child."""
        for child in self.children.values():
            if child is not None and child.poll() is None:
                try:
                    child.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass


def child_command(args: list[str]) -> list[str]:
    """argv that runs ``manage.py fq_worker <args>`` again in a fresh interpreter."""
    return [sys.executable, "-m", "django", "fq_worker", *args]

