"""``fq export | head``: a reader that stops early ends the export quietly (no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.worker.helpers import ROOT, child_env

pytestmark = [pytest.mark.sqlite_only]


def test_export_into_a_closed_pipe_exits_without_a_traceback(tmp_path):
    env = child_env(0, FQ_TEST_DB="sqlite", FQ_CHILD_DB_NAME=str(tmp_path / "db.sqlite3"))
    enqueue = (
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); from django_fq import services as fq; "
        # About 200 KB of export: more than a pipe's 64 KiB buffer, so the writer meets the closed end.
        "fq.enqueue_many('pipe', [{'payload': {'i': i, 'pad': 'x' * 500}} for i in range(400)])"
    )
    subprocess.run([sys.executable, "-c", enqueue], cwd=ROOT, env=env, check=True, timeout=120)
    # `fq export | head -1`: the reader closes the pipe after one line.
    export = subprocess.Popen(
        [sys.executable, "-m", "django", "fq", "export"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    first = export.stdout.readline()
    export.stdout.close()
    _, err = export.communicate(timeout=120)
    assert b'"format":"django-fq"' in first
    assert export.returncode == 1
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()


def test_export_to_dev_stdout_through_a_pipe_is_a_backup_and_nothing_else(tmp_path):
    """``fq export -o /dev/stdout | gzip``: the summary line goes to stderr, not into the backup (from a review)."""
    env = child_env(0, FQ_TEST_DB="sqlite", FQ_CHILD_DB_NAME=str(tmp_path / "db.sqlite3"))
    setup = (
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); from django_fq import services as fq; fq.enqueue('pipe', {'n': 1})"
    )
    subprocess.run([sys.executable, "-c", setup], cwd=ROOT, env=env, check=True, timeout=120)

    def fq(*args):
        return subprocess.run([sys.executable, "-m", "django", "fq", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    exported = fq("export", "-o", "/dev/stdout")  # stdout is a pipe here

    assert exported.returncode == 0, exported.stderr
    assert all(line.startswith("{") for line in exported.stdout.splitlines())
    assert "exported 1 queue(s), 1 job(s)" in exported.stderr
    backup = tmp_path / "backup.jsonl"
    backup.write_text(exported.stdout)
    restored = fq("import", "--dry-run", str(backup))
    assert restored.returncode == 0, restored.stderr
