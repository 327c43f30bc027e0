"""Without a server's driver installed, django-fq still imports, checks and migrates on SQLite.

The demo and test-quick venvs have neither mysqlclient nor psycopg. Every
store module is imported whatever the database, so none may import a driver
at import time: only Django's backend imports its driver, and only when a
database uses it. Found by ``make package-check``: the COPY enqueue's
driver probe, imported at module level, stopped a SQLite site without
psycopg at ``django.setup()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
MISSING = {missing!r}
for name in MISSING:
    sys.modules[name] = None  # as if not installed: importing it raises ImportError
import django
django.setup()
import importlib
from django.core.management import call_command
from django_fq import checks, storage
from django_fq.storage import mysql, postgres
importlib.import_module("django_fq.migrations.0003_mysql_schema")
call_command("check", verbosity=0)
assert not [m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in MISSING]
print("ok")
"""


@pytest.mark.parametrize("missing", [("MySQLdb",), ("psycopg", "psycopg2")], ids=["no-mysqlclient", "no-psycopg"])
def test_django_fq_needs_no_server_driver_on_sqlite(tmp_path, missing):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "FQ_TEST_DB": "sqlite", "FQ_TEST_SQLITE_DIR": str(tmp_path)}
    script = SCRIPT.format(missing=missing)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
