"""``fq_worker --metrics-port``: a real worker process scraped over HTTP on 127.0.0.1."""

from __future__ import annotations

import re
import signal
import socket
import sys
import time
import urllib.request

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_fq import services as fq
from tests.metrics.helpers import samples, value

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return samples(response.read().decode())


def port_of(proc) -> int:
    line = proc.wait_for(r"worker.metrics addr=127.0.0.1 port=\d+")
    return int(re.search(r"port=(\d+)", line).group(1))


def settled(found: dict, result: str) -> float:
    return value(found, "fq_worker_settles_total", result=result)


def test_a_worker_process_reports_what_it_did(workers):
    fq.configure("t.fail", max_attempts=1)
    started = time.time()
    proc = workers("--queue=t.ok", "--queue=t.fail", "--queue=t.perm", "--concurrency=2", "--metrics-port=0", *FAST)
    port = port_of(proc)
    proc.wait_for(r"worker.start ")

    idle = scrape(port)
    assert value(idle, "fq_worker_up") == 1
    assert value(idle, "fq_worker_threads") == 2
    assert value(idle, "fq_worker_threads_busy") == 0
    assert value(idle, "fq_worker_jobs_in_hand") == 0
    info = [labels for (name, labels) in idle if name == "fq_worker_info"]
    assert len(info) == 1 and dict(info[0])["queues"] == "t.ok,t.fail,t.perm"
    assert f":{proc.pid}:" in dict(info[0])["worker"]
    assert any(name == "process_cpu_seconds_total" for name, _ in idle)  # the client's own process metrics

    ok = [fq.enqueue("t.ok", {"n": n}).id for n in range(3)]
    failing = fq.enqueue("t.fail", {}).id
    permanent = fq.enqueue("t.perm", {}).id
    wait_until(lambda: all(fq.get("t.ok", i).state == "succeeded" for i in ok), what="the t.ok jobs")
    wait_until(
        lambda: fq.get("t.fail", failing).state == "dead" and fq.get("t.perm", permanent).state == "dead",
        what="the failures",
    )
    # The database has the outcome a moment before the completer thread counts its ack.
    found = wait_until(
        lambda: (f := scrape(port)) and settled(f, "acked") == 3 and settled(f, "nacked") == 2 and f,
        what="settle counts",
    )

    assert value(found, "fq_worker_jobs_total", queue="t.ok", outcome="ok") == 3
    assert value(found, "fq_worker_jobs_total", queue="t.fail", outcome="failed") == 1
    assert value(found, "fq_worker_jobs_total", queue="t.perm", outcome="permanent") == 1
    assert value(found, "fq_worker_claimed_total", queue="t.ok") == 3
    assert value(found, "fq_worker_claimed_total", queue="t.fail") == 1
    assert value(found, "fq_worker_run_seconds_count", queue="t.ok") == 3
    assert value(found, "fq_worker_run_seconds_bucket", queue="t.ok", le="+Inf") == 3
    assert value(found, "fq_worker_wait_seconds_count", queue="t.ok") == 3
    assert value(found, "fq_worker_wait_seconds_count", queue="t.perm") == 1
    assert settled(found, "not_settled") == 0 and settled(found, "released") == 0
    assert value(found, "fq_worker_threads_busy") == 0
    assert value(found, "fq_worker_last_heartbeat_timestamp_seconds") >= started
    # The same work seen from the database, as the exporter view reports it.
    assert fq.stats("t.ok").totals["acked"] == 3 and fq.stats("t.fail").totals["dead"] == 1

    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr


def test_a_busy_thread_and_the_job_in_hand_show_while_the_handler_runs(workers, events, gate):
    proc = workers("--queue=t.ctl", "--concurrency=3", "--grace=60", "--metrics-port=0", *FAST)
    port = port_of(proc)
    job = fq.enqueue("t.ctl", {"events": events.path, "gate": str(gate)}).id
    events.wait_for("start", job)
    found = scrape(port)
    assert value(found, "fq_worker_threads_busy") == 1
    assert value(found, "fq_worker_jobs_in_hand") == 1
    assert value(found, "fq_worker_up") == 1
    proc.signal(signal.SIGTERM)  # drains: the job may finish, nothing new is claimed
    proc.wait_for(r"worker.draining ")
    draining = scrape(port)
    assert value(draining, "fq_worker_up") == 0
    assert value(draining, "fq_worker_threads_busy") == 1
    gate.write_text("open")
    assert proc.wait(timeout=30) == 0, proc.stderr
    assert fq.get("t.ctl", job).state == "succeeded"


def free_ports(n: int) -> int:
    """A port P such that P..P+n-1 were free a moment ago."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            base = first.getsockname()[1]
            if base + n - 1 > 65535:
                continue
            held = []
            try:
                for p in range(base + 1, base + n):
                    s = socket.socket()
                    held.append(s)
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
            finally:
                for s in held:
                    s.close()
        return base
    raise AssertionError("no run of free ports")


@pytest.mark.slow
def test_supervised_processes_listen_on_consecutive_ports(workers):
    base = free_ports(2)
    supervisor = workers("--queue=t.ok", "--processes=2", f"--metrics-port={base}", "--grace=1", *FAST)
    pids = []
    for index in (0, 1):
        pids.append(
            int(re.search(r"pid=(\d+)", supervisor.wait_for(rf"supervisor.child_start index={index} ")).group(1))
        )
    for port in (base, base + 1):
        supervisor.wait_for(rf"worker.metrics addr=127.0.0.1 port={port} ")
    seen = {}
    for port in (base, base + 1):
        # The exporter listens a moment before the worker starts serving (fq_worker_up 0 until then).
        found = wait_until(lambda port=port: _scrape_when_up(port), what=f"the worker on port {port} up")
        worker = dict(next(labels for (name, labels) in found if name == "fq_worker_info"))["worker"]
        seen[port] = int(worker.split(":")[-2])
    assert sorted(seen.values()) == sorted(pids)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.stderr


def _scrape_when_up(port: int):
    """The samples of ``port`` once its worker reports itself up; ``None`` before that."""
    found = _try_scrape(port)
    return found if found and value(found, "fq_worker_up") == 1 else None


def _try_scrape(port: int):
    try:
        return scrape(port)
    except OSError:
        return None


def test_a_port_in_use_is_a_one_line_error(workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = workers("--queue=t.ok", f"--metrics-port={port}", *FAST)
        assert proc.wait(timeout=60) != 0
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--metrics-port=-1"], "--metrics-port must be between 0 and 65535"),
        (["--metrics-port=65536"], "--metrics-port must be between 0 and 65535"),
        (["--metrics-port=65535", "--processes=2"], "PORT+P-1 at most 65535"),
    ],
)
def test_bad_metrics_options_are_refused(argv, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("fq_worker", "--queue=t.ok", "--burst", *argv)


def test_without_prometheus_client_the_option_is_refused(monkeypatch):
    monkeypatch.delitem(sys.modules, "django_fq.metrics.worker", raising=False)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(CommandError, match=re.escape("--metrics-port needs the prometheus-client package")):
        call_command("fq_worker", "--queue=t.ok", "--burst", "--metrics-port=0")
