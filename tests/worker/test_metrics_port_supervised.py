"""``fq_worker --processes P --metrics-port PORT`` when a worker's port cannot be bound, and the supervisor's
rule behind it: a child that fails to start with exit status 78 (EX_CONFIG) is not restarted; the
supervisor stops the others and exits non-zero. An ordinary crash is still restarted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from django_fq.worker import EX_CONFIG, Supervisor

from .test_metrics_endpoint import FAST, free_ports

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_taken_port_of_one_supervised_worker_stops_the_whole_command(workers):
    """docs/operations/metrics.md: a port that cannot be bound stops the worker at once, under --processes too
    (it was restarted for ever, so even a --burst run never ended)."""
    base = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        proc = workers("--queue=t.ok", "--processes=2", f"--metrics-port={base}", "--burst", "--grace=1", *FAST)
        try:
            code = proc.wait(timeout=25)
        except subprocess.TimeoutExpired:
            code = None
    assert code is not None, "the supervisor keeps restarting the child whose port is taken:\n" + proc.stderr[-1500:]
    assert code == 1, proc.stderr
    assert f"--metrics-port: cannot listen on 127.0.0.1:{base + 1}" in proc.stderr
    assert "supervisor.restart" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_supervised_worker_that_cannot_bind_its_port_exits_78(workers):
    """The port may be taken between the supervisor's check and the child's bind: the child says so (exit 78)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"FQ_WORKER_SUPERVISOR_PID": str(os.getpid()), "FQ_WORKER_INDEX": "1"}
        proc = workers("--queue=t.ok", f"--metrics-port={port - 1}", "--burst", *FAST, env=env)
        assert proc.wait(timeout=60) == EX_CONFIG, proc.stderr
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# A child that runs until SIGTERM, then exits 0 (as a worker does after draining).
_UNTIL_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "open(sys.argv[1], 'a').write('started\\n')\n"
    "time.sleep(60)\n"
    "sys.exit(5)\n"
)


def _supervise(command, processes: int) -> tuple[int, float]:
    """``Supervisor(command, processes).run()`` in this process (its signal handlers restored after): code, seconds."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    try:
        code = Supervisor(command, processes).run()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return code, time.monotonic() - started


def test_supervisor_stops_the_others_and_fails_when_a_child_exits_78(tmp_path):
    marks = tmp_path / "running"

    def command(index: int) -> list[str]:
        if index == 1:
            return _python(f"import sys, time; time.sleep(0.3); sys.exit({EX_CONFIG})")
        return [*_python(_UNTIL_SIGTERM), str(marks)]

    code, took = _supervise(command, 2)
    assert code == EX_CONFIG
    assert took < 10  # no restart pauses, and child 0 was stopped instead of running its 60 s
    assert marks.read_text() == "started\n"  # child 0 was not started again either


def test_supervisor_still_restarts_a_child_that_crashed(tmp_path):
    runs = tmp_path / "runs"
    # Exit 1 on the first run, 0 on the second.
    crash_once = f"import sys; f = open({str(runs)!r}, 'a+'); f.seek(0); n = len(f.read()); f.write('x'); sys.exit(0 if n else 1)"

    code, took = _supervise(lambda index: _python(crash_once), 1)
    assert code == 0
    assert runs.read_text() == "xx"
    assert took >= Supervisor.RESTART_MIN_S


def test_a_child_that_exits_78_after_a_restart_is_restarted_again(tmp_path):
    """Exit 78 ends the command only on a child's first start; a restarted child had started well before (a review)."""
    runs = tmp_path / "runs"
    # Run 1 crashes (exit 1), run 2 cannot bind its port (78: still held by a leftover), run 3 ends its burst (0).
    script = (
        f"import sys; f = open({str(runs)!r}, 'a+'); f.seek(0); n = len(f.read()); f.write('x'); "
        f"sys.exit([1, {EX_CONFIG}, 0][min(n, 2)])"
    )

    code, took = _supervise(lambda index: _python(script), 1)

    assert code == 0
    assert runs.read_text() == "xxx"
    assert took >= Supervisor.RESTART_MIN_S * 3  # two restart pauses: 1 s, then 2 s
