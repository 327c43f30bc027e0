"""Backups move between SQLite and PostgreSQL: export from one, import into the other, compare every column.

Runs on the PostgreSQL leg (it needs both databases). The SQLite side is a
file database driven by child processes — the real ``python -m django fq
export`` / ``fq import`` command lines, and :mod:`tests.backup.child` to
build and read the data — and the PostgreSQL side is this test's database.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from django.core.management import call_command

from tests.worker.helpers import ROOT, child_env

from . import scenario
from .scenario import comparable, dump, expected_after_restore, populate

pytestmark = [pytest.mark.django_db, pytest.mark.postgres_only]


def sqlite_env(path) -> dict:
    """A child on the SQLite file ``path`` (the test settings' SQLite options: WAL, IMMEDIATE, busy timeout)."""
    return child_env(0, FQ_TEST_DB="sqlite", FQ_CHILD_DB_NAME=str(path))


def run(env, *argv) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_sqlite_export_imports_into_postgresql(tmp_path):
    env = sqlite_env(tmp_path / "source.sqlite3")
    run(env, "-m", "tests.backup.child", "populate", str(tmp_path / "source.json"))
    source = json.loads((tmp_path / "source.json").read_text())
    backup_file = tmp_path / "sqlite.jsonl"
    proc = run(env, "-m", "django", "fq", "export", "--output", str(backup_file), "--json")
    assert json.loads(proc.stdout)["jobs"] == len(source["dump"]["jobs"])
    assert json.loads(backup_file.read_text().splitlines()[0])["database"] == "sqlite"

    out = io.StringIO()
    call_command("fq", "import", str(backup_file), "--json", stdout=out)
    summary = json.loads(out.getvalue())
    assert summary["jobs_created"] == len(source["dump"]["jobs"]) and summary["jobs_skipped"] == 0

    got = dump()
    exported_at = json.loads(backup_file.read_text().splitlines()[0])["exported_at"]
    assert comparable(got) == comparable(expected_after_restore(source["dump"], exported_at))
    # Spot checks of what the comparison covers: exact payload text, result, history, token expiry.
    ids = source["ids"]
    assert got["jobs"][ids["ready"]]["payload"] == json.dumps(scenario.RICH, separators=(",", ":"), ensure_ascii=False)
    assert got["jobs"][ids["running"]]["state"] == "queued" and got["jobs"][ids["running"]]["attempts"] == 0
    assert got["jobs"][ids["dead"]]["errors"] == source["dump"]["jobs"][ids["dead"]]["errors"]
    assert got["tokens"]["bk:main|tok-live"] == source["dump"]["tokens"]["bk:main|tok-live"]


def test_postgresql_export_imports_into_sqlite(tmp_path):
    populate()
    source = dump()
    backup_file = tmp_path / "pg.jsonl"
    call_command("fq", "export", "--output", str(backup_file), stdout=io.StringIO())

    env = sqlite_env(tmp_path / "target.sqlite3")
    run(env, "-m", "django", "migrate", "--verbosity", "0")
    proc = run(env, "-m", "django", "fq", "import", str(backup_file), "--json")
    assert json.loads(proc.stdout)["jobs_created"] == len(source["jobs"])
    assert proc.stderr == ""  # no progress bar: not a terminal
    run(env, "-m", "tests.backup.child", "dump", str(tmp_path / "target.json"))
    got = json.loads((tmp_path / "target.json").read_text())["dump"]

    exported_at = json.loads(backup_file.read_text().splitlines()[0])["exported_at"]
    assert comparable(got) == comparable(json.loads(json.dumps(expected_after_restore(source, exported_at))))
