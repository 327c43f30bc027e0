"""Backups move between every pair of databases: export from one, import into another, compare every column.

Runs on a server leg (PostgreSQL or MariaDB): this test's database is one
side; the other side is a database driven by child processes — the real
``python -m django fq export`` / ``fq import`` command lines, and
:mod:`tests.backup.child` to create, fill, read and drop it. The other sides
are a SQLite file (always) and the other server (PostgreSQL from the MariaDB
leg, MariaDB from the PostgreSQL leg; skipped when it cannot be reached), so
the two server legs together cover SQLite↔PostgreSQL, SQLite↔MariaDB and
PostgreSQL↔MariaDB, both ways.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import connection

from django_fq import storage
from tests.worker.helpers import ROOT, TEST_DB_OF_VENDOR, child_env

from . import scenario
from .scenario import comparable, dump, expected_after_restore, populate

pytestmark = pytest.mark.django_db

#: ``FQ_TEST_DB`` of each database a child can drive, and the ``"database"`` its backups name.
HEADER_NAME = {"sqlite": "sqlite", "postgres": "postgresql", "mariadb": "mysql"}


@pytest.fixture(autouse=True)
def _server_leg():
    if storage.for_connection(connection).embedded:
        pytest.skip("runs on the PostgreSQL and MariaDB legs (the other side is a child's database)")


def others() -> list[str]:
    here = TEST_DB_OF_VENDOR[connection.vendor]
    return ["sqlite", *(kind for kind in ("postgres", "mariadb") if kind != here)]


@pytest.fixture(params=["sqlite", "other-server"])
def other(request, tmp_path):
    """``(kind, env)`` of the other side's child processes, its database created (and dropped after)."""
    kinds = others()
    kind = kinds[0] if request.param == "sqlite" else kinds[1]
    if kind == "sqlite":
        name = str(tmp_path / "other.sqlite3")
    else:
        base = os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq")
        name = f"{base}_xdb_{os.getpid()}"  # one per test process (pytest-xdist runs several)
    env = child_env(0, FQ_TEST_DB=kind, FQ_CHILD_DB_NAME=name)
    created = subprocess.run(
        [sys.executable, "-m", "tests.backup.child", "create", os.devnull],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if created.returncode == 3:
        pytest.skip(f"{kind} cannot be reached: {created.stderr.strip().splitlines()[-1]}")
    assert created.returncode == 0, created.stderr
    try:
        yield kind, env
    finally:
        run(env, "-m", "tests.backup.child", "drop", os.devnull)


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


def test_an_export_of_the_other_database_imports_here(other, tmp_path):
    kind, env = other
    run(env, "-m", "tests.backup.child", "populate", str(tmp_path / "source.json"))
    source = json.loads((tmp_path / "source.json").read_text())
    backup_file = tmp_path / f"{kind}.jsonl"
    proc = run(env, "-m", "django", "fq", "export", "--output", str(backup_file), "--json")
    assert json.loads(proc.stdout)["jobs"] == len(source["dump"]["jobs"])
    assert json.loads(backup_file.read_text().splitlines()[0])["database"] == HEADER_NAME[kind]

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


def test_an_export_from_here_imports_into_the_other_database(other, tmp_path):
    _kind, env = other
    populate()
    source = dump()
    backup_file = tmp_path / "here.jsonl"
    call_command("fq", "export", "--output", str(backup_file), stdout=io.StringIO())
    assert json.loads(backup_file.read_text().splitlines()[0])["database"] == storage.for_connection(connection).export_name

    proc = run(env, "-m", "django", "fq", "import", str(backup_file), "--json")
    assert json.loads(proc.stdout)["jobs_created"] == len(source["jobs"])
    assert proc.stderr == ""  # no progress bar: not a terminal
    run(env, "-m", "tests.backup.child", "dump", str(tmp_path / "target.json"))
    got = json.loads((tmp_path / "target.json").read_text())["dump"]

    exported_at = json.loads(backup_file.read_text().splitlines()[0])["exported_at"]
    assert comparable(got) == comparable(json.loads(json.dumps(expected_after_restore(source, exported_at))))
