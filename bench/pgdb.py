"""A fresh PostgreSQL database for a stand-alone bench script (``drain_cpu.py``, ``keys.py``), with Django set up on it."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def psql(sql: str) -> None:
    """Run one statement as ``postgres`` on the local server."""
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", sql], check=True, capture_output=True)


def fresh(db_name: str) -> None:
    """Drop and create ``db_name``, point ``bench.settings`` at it, set Django up and migrate."""
    if not db_name.replace("_", "").isalnum():
        raise SystemExit(f"bad database name {db_name!r}")
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["FQ_BENCH_DB"] = "postgres"
    os.environ["FQ_BENCH_PG_NAME"] = db_name
    drop(db_name)
    psql(f'CREATE DATABASE "{db_name}"')
    sys.path.insert(0, REPO)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def drop(db_name: str) -> None:
    psql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
