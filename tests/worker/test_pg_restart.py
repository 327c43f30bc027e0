"""PostgreSQL restarted under load: the workers log it, reconnect and finish every job (slow tier).

This test restarts the local PostgreSQL cluster (``pg_ctlcluster … restart``),
which ends every session of every database on it: it is marked ``slow`` so it
never runs alongside the fast suites (``make test-slow`` runs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from django.db import Error as DbError
from django.db import connection

from django_fq import services as fq

from .helpers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.postgres_only]

Q = "t.ctl"
FAST = ("--poll-interval=10", "--max-poll-interval=100", "--reaper-interval=100")


def _cluster() -> tuple[str, str]:
    """(version, name) of the local cluster that serves the tests."""
    if not shutil.which("pg_ctlcluster") or not os.path.isdir("/etc/postgresql"):
        pytest.skip("needs a Debian-style PostgreSQL cluster (pg_ctlcluster)")
    versions = sorted(os.listdir("/etc/postgresql"))
    return versions[-1], "main"


def _succeeded() -> int:
    """Succeeded jobs, reconnecting this test's own session if the restart ended it."""
    try:
        return fq.stats(Q).counts["succeeded"]
    except DbError:
        connection.close()
        return -1


def test_postgres_restart_under_load_loses_no_job(workers, events):
    version, name = _cluster()
    total = 400
    fq.configure(Q, backoff_ms=0)
    results = fq.enqueue_many(Q, [{"payload": {"events": events.path, "sleep_ms": 50, "n": n}} for n in range(total)])
    ids = [r.id for r in results]
    supervisor = workers(f"--queue={Q}", "--processes=2", "--concurrency=4", "--visibility=3000", "--grace=5", *FAST)
    wait_until(lambda: _succeeded() >= 40, timeout=60, what="the workers to get going")

    restart = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart", "-m", "fast"],
        capture_output=True, text=True, timeout=120,
    )
    assert restart.returncode == 0, restart.stderr
    connection.close()
    restarted_at = time.monotonic()

    wait_until(lambda: _succeeded() == total, timeout=180, interval=0.2, what="every job to succeed")
    assert supervisor.alive()
    # The outage was seen and survived.
    assert supervisor.count(r"worker.db_error ") >= 1
    assert supervisor.count(r"worker.reconnected ") >= 1
    assert supervisor.count(r"supervisor.child_exit ") == 0  # no worker process died

    states = {fq.get(Q, i).state for i in ids}
    assert states == {"succeeded"}
    ran = {e["id"] for e in events.of("end")}
    assert ran == set(ids)
    counts = fq.stats(Q).counts
    assert counts["ready"] == counts["running"] == counts["scheduled"] == counts["dead"] == 0
    assert time.monotonic() - restarted_at < 180

    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0, supervisor.stderr
