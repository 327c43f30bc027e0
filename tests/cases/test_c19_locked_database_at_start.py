"""C19 — a worker started while another process holds SQLite's write lock.

The lock is held with ``BEGIN IMMEDIATE`` on a second connection to the test
database file for longer than the worker's busy timeout. The worker must log
that it waits for the database, not exit with a start-up check's false error
(Django's JSON-support probe fails when it cannot get the lock), and it runs
the job once the lock is released (docs/reliability.md, "A locked database").
"""

from __future__ import annotations

import sqlite3

import pytest
from django.db import connection

from django_fq import services as fq
from tests.worker.helpers import WorkerProc


@pytest.mark.sqlite_only
@pytest.mark.django_db(transaction=True)
def test_c19_a_worker_started_under_a_held_write_lock_waits_and_then_works():
    job = fq.enqueue("t.ok", {"n": 1})
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")
    try:
        worker = WorkerProc(
            "--queue=t.ok", "--burst", "--no-progress",
            env={"FQ_CHILD_SQLITE_TIMEOUT": "0.2"},  # far shorter than the lock is held
        )
        worker.wait_for(r"worker\.db_wait", timeout=60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert worker.wait(timeout=120) == 0, worker.stderr
    assert "does not support JSONFields" not in worker.stderr
    assert "Traceback" not in worker.stderr
    assert "1 jobs ok" in worker.stdout
    assert fq.get("t.ok", job.id).state == "succeeded"
