"""The example project's ``@task`` functions, end to end through its own ``manage.py`` (slow tier).

A copy of ``manage.py`` and ``example_project/`` in a temporary directory, on
the example's default SQLite database there: migrate, enqueue from one
process, ``fq_worker --burst`` in another, read the results from a third.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.sqlite_only]


def manage(tree: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    proc = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_example_tasks_run_on_the_worker(tmp_path):
    shutil.copy2(ROOT / "manage.py", tmp_path / "manage.py")
    shutil.copytree(ROOT / "example_project", tmp_path / "example_project", ignore=shutil.ignore_patterns("__pycache__"))
    manage(tmp_path, "migrate", "-v0")
    enqueue = (
        "import json; from example_project.demo.tasks import word_count, tally_signups;"
        "a = word_count.enqueue('to be or not to be'); b = tally_signups.enqueue('2024-01-01');"
        "c = tally_signups.enqueue('2024-01-01');"
        "print(json.dumps([a.id, b.id, c.id]))"
    )
    words, tally, tally_again = json.loads(manage(tmp_path, "shell", "-c", enqueue).strip().splitlines()[-1])
    assert tally_again == tally  # unique_key "signups-{0}" from OPTIONS["tasks"]

    out = manage(tmp_path, "fq_worker", "--burst", "--queue", "tasks:default", "--no-progress")
    assert "2 jobs ok, 0 failed" in out

    read = (
        "import json; from example_project.demo.tasks import word_count, tally_signups;"
        f"a = word_count.get_result('{words}'); b = tally_signups.get_result('{tally}');"
        "print(json.dumps([a.status, a.return_value, b.status, b.return_value]))"
    )
    status_a, value_a, status_b, value_b = json.loads(manage(tmp_path, "shell", "-c", read).strip().splitlines()[-1])
    assert (status_a, status_b) == ("SUCCESSFUL", "SUCCESSFUL")
    assert value_a == {"words": 6, "most_common": [["to", 2], ["be", 2], ["or", 1]]}
    assert value_b == {"day": "2024-01-01", "joined": 0, "attempt": 1}
