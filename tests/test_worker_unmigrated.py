"""``fq_worker`` on a database that was never migrated says so, with the fix, in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.worker.helpers import ROOT, child_env

pytestmark = [pytest.mark.sqlite_only]


def test_burst_worker_on_an_unmigrated_database_suggests_migrate(tmp_path):
    env = child_env(0, FQ_TEST_DB="sqlite", FQ_CHILD_DB_NAME=str(tmp_path / "empty.sqlite3"))
    proc = subprocess.run(
        [sys.executable, "-m", "django", "fq_worker", "--burst", "--queue", "t.ok", "--no-reaper"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "no such table: django_fq_queue" in last and "manage.py migrate" in last, proc.stderr
    assert "Traceback" not in proc.stderr
