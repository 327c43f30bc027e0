"""``fq health`` answers 3 (unknown) whenever it cannot do its job: usage mistakes and a wrong ``FQ_DATABASE``.

A monitoring system reads 1 as WARNING and 2 as CRITICAL (someone is paged), so
neither may stand for "the check itself could not run". The other operations
keep their own exit statuses (2 for a malformed command line, 1 for an error).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_fq import services as fq

from .test_health import run

pytestmark = pytest.mark.django_db

Q = "h:errors"
USAGE_MISTAKES = [
    ["--bogus"],  # an unknown option
    ["--bogus", "--json"],
    [Q, "extra"],  # one positional argument too many
    ["--bogus", "--max-dead", "1"],
]


def cli(*argv: str, settings_module: str | None = None) -> subprocess.CompletedProcess:
    """``python -m django fq *argv`` in a child process on this test's database."""
    from tests.worker.helpers import ROOT, child_env

    env = child_env() if settings_module is None else child_env(DJANGO_SETTINGS_MODULE=settings_module)
    return subprocess.run(
        [sys.executable, "-m", "django", "fq", *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


# --- usage mistakes ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_usage_mistake_on_the_real_command_line_exits_3():
    fq.configure(Q)
    for argv in [*USAGE_MISTAKES, ["--bogus", "health"], ["--json", "health", "--bogus"]]:
        full = argv if "health" in argv else ["health", *argv]
        done = cli(*full)
        assert done.returncode == 3, (full, done.returncode, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr, full
        line = done.stderr.strip()
        assert "\n" not in line, full
        if "--json" in full:
            d = json.loads(line)
            assert d["code"] == "usage" and "unrecognized arguments" in d["message"], full
        else:
            # (``python -m django`` names the program ``__main__.py``, manage.py ``manage.py``)
            assert " fq health: error: unrecognized arguments: " in line, line
            assert line.endswith(" fq health --help)"), line


@pytest.mark.parametrize("argv", USAGE_MISTAKES)
def test_every_usage_mistake_in_call_command_exits_3(argv, capsys):
    fq.configure(Q)
    r = run(*argv)
    assert r.code == 3, r
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and "Traceback" not in err
    if "--json" in argv:
        assert json.loads(err)["code"] == "usage"


@pytest.mark.django_db(transaction=True)
def test_other_operations_keep_exit_2_for_a_malformed_command_line():
    fq.configure(Q)
    for argv in (["stats", Q, "--bogus"], ["stats", Q, "extra"], ["--bogus", "queues"], ["heath"]):
        done = cli(*argv)
        assert done.returncode == 2, (argv, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
    with pytest.raises(CommandError, match="unrecognized arguments"):
        call_command("fq", "stats", Q, "--bogus", stdout=io.StringIO(), stderr=io.StringIO())


# --- FQ_DATABASE names no database -------------------------------------------------------------------------


def test_fq_database_naming_a_missing_alias_is_unknown_in_call_command(settings):
    """``call_command`` skips the system checks: the missing alias shows when the queues are read."""
    fq.configure(Q)
    settings.FQ_DATABASE = "queue"  # a typo, or an alias only production has
    r = run()
    assert r.code == 3 and r.out == ""
    assert r.err.startswith("fq health: error: FQ_DATABASE='queue' is not in DATABASES") and r.err.count("\n") == 1
    r = run("--json")
    assert r.code == 3
    assert json.loads(r.err) == {
        "code": "configuration",
        "message": "FQ_DATABASE='queue' is not in DATABASES",
        "field": "FQ_DATABASE",
    }


@pytest.mark.django_db(transaction=True)
def test_fq_database_naming_a_missing_alias_on_the_real_command_line_exits_3():
    """With the system checks (django_fq.E002) and without them (--skip-checks): one line, exit 3."""
    for extra in ([], ["--skip-checks"], ["--json"]):
        done = cli("health", *extra, settings_module="tests.metrics.settings_bad_fq_database")
        assert done.returncode == 3, (extra, done.returncode, done.stderr[-500:])
        assert done.stdout == "" and "Traceback" not in done.stderr, extra
        line = done.stderr.strip()
        assert "\n" not in line, (extra, line)
        assert "FQ_DATABASE='queue' is not in DATABASES" in line, (extra, line)


@pytest.mark.django_db(transaction=True)
def test_other_operations_with_a_missing_fq_database_alias_print_one_line_and_exit_1():
    for argv in (["stats", Q, "--skip-checks"], ["queues", "--skip-checks"], ["queues", "--skip-checks", "--json"]):
        done = cli(*argv, settings_module="tests.metrics.settings_bad_fq_database")
        assert done.returncode == 1, (argv, done.returncode, done.stderr[-500:])
        assert "Traceback" not in done.stderr, argv
        line = done.stderr.strip()
        assert "\n" not in line and "FQ_DATABASE='queue' is not in DATABASES" in line, (argv, line)
