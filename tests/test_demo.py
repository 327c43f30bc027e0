"""`make demo` end to end: scripts/demo.sh on a copy of the example project (slow tier).

The demo deletes and recreates ``var/`` next to ``manage.py``, so the test runs
it on a copy (manage.py, example_project/, scripts/) in a temporary directory;
django_fq itself is imported from the installed package. On the PostgreSQL leg
the demo runs against a scratch database created for the test.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
N_EMAILS = 40

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_tree(tmp_path):
    shutil.copy2(ROOT / "manage.py", tmp_path / "manage.py")
    for name in ("example_project", "scripts"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.fixture
def demo_database_url():
    """None on SQLite; on PostgreSQL the URL of a freshly created scratch database."""
    if os.environ.get("FQ_TEST_DB", "sqlite") != "postgres":
        yield None
        return
    import psycopg

    host = os.environ.get("FQ_TEST_PG_HOST", "127.0.0.1")
    port = os.environ.get("FQ_TEST_PG_PORT", "5432")
    user = os.environ.get("FQ_TEST_PG_USER", "postgres")
    name = os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq") + "_demo"
    admin = {"host": host, "port": port, "user": user, "dbname": "postgres", "autocommit": True}
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgres://{user}@{host}:{port}/{name}"
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_demo_runs_end_to_end(demo_tree, demo_database_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    env.update(PYTHON=sys.executable, N_EMAILS=str(N_EMAILS))
    if demo_database_url:
        env["FQ_DEMO_DATABASE_URL"] = demo_database_url
    proc = subprocess.run(
        ["bash", "scripts/demo.sh"],
        cwd=demo_tree,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode})\n{out}\n{proc.stderr}"

    # The same idempotency token twice: one job, created 1 then 0.
    created = re.findall(r'\{"id": "([0-9a-f]+)", "created": ([01])\}', out)
    assert created[0][1] == "1" and created[1] == (created[0][0], "0")
    # The consumer claimed, acked, and saw its repeated ack as a replay.
    assert "ack -> state=succeeded replay=False" in out
    assert "replay=True" in out
    # The print handler ran in the worker.
    assert '[docs:native] job ' in out and '{"id": 2, "job": "print"}' in out
    # Every welcome email was sent exactly once, also after the rerun for user 1.
    assert f"{N_EMAILS} results, {N_EMAILS} created" in out
    assert f"emails written to var/emails: {N_EMAILS}; WelcomeEmail rows: {N_EMAILS}" in out
    assert '"reason": "already sent"' in out
    assert f"emails written to var/emails: {N_EMAILS} (still {N_EMAILS})" in out
    mails = "".join(p.read_text() for p in (demo_tree / "var" / "emails").glob("*.log"))
    assert mails.count("Subject: Welcome!") == N_EMAILS
    assert len(set(re.findall(r"^To: (\S+)$", mails, flags=re.M))) == N_EMAILS
