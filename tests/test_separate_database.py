"""django-fq on its own database (``FQ_DATABASE`` + ``django_fq.routers.FqRouter``), on this leg's engine.

The tests that prove it (``tests/two_dbs/``) need settings with two database
aliases, which this process's settings do not have, so this test runs them
in a pytest child with ``tests.settings_two_dbs``: two SQLite files, or two
PostgreSQL test databases named after this run's, so parallel runs and legs
never share them. It fails if any of them fails, is skipped, or is missing.
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
#: The number of tests in tests/two_dbs/ (a guard against a child that quietly collects nothing).
EXPECTED = 8


@pytest.mark.no_pooler("its child creates and drops test databases of its own through PgBouncer, which keeps server sessions on them (DROP DATABASE is refused)")
def test_two_database_suite(django_db_setup, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FQ_CHILD_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings_two_dbs",
        FQ_TEST_DB="postgres" if connection.vendor == "postgresql" else "sqlite",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if connection.vendor == "postgresql":
        env["FQ_TEST_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    report = tmp_path / "two_dbs.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "",
         f"--junitxml={report}", "tests/two_dbs"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else next(suite.iter("testsuite"))
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": EXPECTED, "failures": 0, "errors": 0, "skipped": 0}, output
