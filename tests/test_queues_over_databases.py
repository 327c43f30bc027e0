"""Queues over several databases (``FQ_QUEUE_DATABASES``), on this leg's engine plus a SQLite file.

The tests that prove it (``tests/multi_dbs/``) need settings with three aliases that hold
queues, which this process's settings do not have, so this test runs them in a pytest
child with ``tests.settings_multi_dbs``: on the PostgreSQL leg two PostgreSQL test databases
named after this run's and one SQLite file; on the MariaDB leg two MariaDB databases and one
SQLite file; on the SQLite leg three files. It fails if any of them fails, is skipped, or is
missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
#: The number of tests in tests/multi_dbs/ (a guard against a child that quietly collects nothing).
EXPECTED = 30
_DB_OF_VENDOR = {"postgresql": "postgres", "mysql": "mariadb", "sqlite": "sqlite"}


@pytest.mark.no_pooler(
    "its child creates and drops test databases of its own through PgBouncer, which keeps server sessions on them (DROP DATABASE is refused)"
)
def test_queues_over_three_databases_suite(django_db_setup, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FQ_CHILD_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings_multi_dbs",
        FQ_TEST_DB=_DB_OF_VENDOR[connection.vendor],
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if connection.vendor != "sqlite":
        env["FQ_TEST_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    report = tmp_path / "multi_dbs.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "",
         f"--junitxml={report}", "tests/multi_dbs"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    output = proc.stdout[-8000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else next(suite.iter("testsuite"))
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": EXPECTED, "failures": 0, "errors": 0, "skipped": 0}, output
