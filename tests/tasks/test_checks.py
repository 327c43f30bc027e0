"""A bad ``TASKS`` setting is reported by ``manage.py check`` and stops ``fq_worker`` in one line.

Found by a new user: ``OPTIONS={"bogus": 1}`` passed ``check`` and then
``fq_worker --burst`` exited with a 43-line traceback; a Tasks queue that also
had an ``@handler`` passed ``check`` and only ``fq_worker`` refused it.
``django_fq.E005`` builds each django-fq backend, ``django_fq.E006`` (a deploy
check: ``check --deploy``) loads the handlers with the worker's own code
(:func:`django_fq.checks.load_handlers`). A review then found that running E006
with every check made ``migrate`` import worker code: a handler module that
reads a table at import stopped ``migrate`` on a fresh database, and a handler
module with a plain bug crashed every command with a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_fq import checks, handlers
from django_fq.tasks import InvalidTask

ROOT = Path(__file__).resolve().parents[2]
BACKEND = "django_fq.tasks.FqBackend"
BOGUS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"bogus": 1, "queue_prefix": "tkchk."}}}
#: ``t.ok`` has the handler ``tests.testapp.fq_handlers.record``.
CLASH = {"default": {"BACKEND": BACKEND, "QUEUES": ["ok"], "OPTIONS": {"queue_prefix": "t."}}}


@pytest.fixture(autouse=True)
def _own_handler_registry(monkeypatch):
    """Each test loads the handlers of its own ``TASKS`` into a copy of the process-wide registry.

    The apps' ``fq_handlers`` modules register their handlers only when first
    imported, so they are imported before the copy is made: the copy then
    always holds them, whichever test ran first.
    """
    handlers.autodiscover()
    monkeypatch.setattr(handlers, "_registry", dict(handlers.registered()))


def _ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_the_test_settings_pass_the_tasks_check():
    assert checks.check_tasks(None) == []


def test_an_unknown_backend_option_is_error_e005_with_the_backends_message(settings):
    settings.TASKS = BOGUS

    found = checks.check_tasks(None)

    assert _ids(found) == ["django_fq.E005"]
    assert found[0].msg.startswith("TASKS['default']: unknown OPTIONS key 'bogus' (known: ")
    assert "\n" not in found[0].msg


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"QUEUES": []}, "QUEUES must name at least one queue"),
        ({"QUEUES": ["has space"]}, "not a valid fq queue name"),
        ({"QUEUES": ["default"], "OPTIONS": {"max_attempts": 0}}, "max_attempts must be between 1 and 1000"),
    ],
)
def test_every_invalid_backend_is_reported(settings, params, message):
    settings.TASKS = {"ok": {"BACKEND": BACKEND, "QUEUES": ["x"], "OPTIONS": {"queue_prefix": "tkchk."}}, "bad": {"BACKEND": BACKEND, **params}}

    found = checks.check_tasks(None)

    assert _ids(found) == ["django_fq.E005"]
    assert found[0].msg.startswith("TASKS['bad']") and message in found[0].msg


def test_backends_of_other_frameworks_are_left_to_them(settings):
    from django_fq.tasks import FRAMEWORK

    settings.TASKS = {"default": {"BACKEND": f"{FRAMEWORK}.backends.immediate.ImmediateBackend", "OPTIONS": {"bogus": 1}}}

    assert "django_fq.E005" not in _ids(checks.check_tasks(None))


def test_a_tasks_queue_that_has_an_fq_handler_is_error_e006(settings):
    settings.TASKS = CLASH

    found = checks.check_handlers(None)

    assert _ids(found) == ["django_fq.E006"]
    assert "'t.ok'" in found[0].msg and "tests.testapp.fq_handlers.record" in found[0].msg
    assert "queue_prefix" in found[0].msg


def test_the_check_and_the_worker_refuse_a_clash_with_the_same_words(settings):
    settings.TASKS = CLASH
    [found] = checks.check_handlers(None)

    with pytest.raises(CommandError) as refused:
        call_command("fq_worker", "--burst", "--no-progress", skip_checks=True)

    assert str(refused.value) == found.msg


def test_fq_worker_turns_an_invalid_backend_into_one_line(settings):
    settings.TASKS = BOGUS

    with pytest.raises(CommandError) as refused:
        call_command("fq_worker", "--burst", "--no-progress", skip_checks=True)

    assert str(refused.value).startswith("TASKS['default']: unknown OPTIONS key 'bogus'")


def _manage(*args: str, settings: str = "tests.tasks.bad_settings", **env_vars: str) -> subprocess.CompletedProcess:
    """Run ``python -m django ARGS`` with ``settings``; on a server, against a database that exists.

    Django 6.x's model checks connect on MariaDB/MySQL, and the test settings'
    default database name (``fq``) need not exist there: the child is given
    this session's test database (made by ``django_db_setup``).
    """
    from django.db import connection

    env = dict(os.environ)
    env.setdefault("FQ_TEST_MYSQL_NAME", str(connection.settings_dict["NAME"]))
    env.update(env_vars)
    env.update(DJANGO_SETTINGS_MODULE=settings, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "django", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.usefixtures("django_db_setup")
def test_in_a_real_process_check_fails_and_fq_worker_says_one_line():
    checked = _manage("check")
    assert checked.returncode == 1
    assert "(django_fq.E005) TASKS['default']: unknown OPTIONS key 'bogus'" in checked.stderr

    for extra in ((), ("--skip-checks",)):
        worker = _manage("fq_worker", "--burst", "--no-progress", *extra)
        assert worker.returncode == 1
        assert "Traceback" not in worker.stderr
        if extra:
            assert worker.stderr.strip().splitlines() == [
                "CommandError: TASKS['default']: unknown OPTIONS key 'bogus' (known: concurrency_key, enqueue_on_commit, idempotency, "
                "idempotency_retention_ms, max_attempts, queue_prefix, tasks, timeout_ms, unique_key)"
            ]
        else:
            assert "django_fq.E005" in worker.stderr


# --- E006 is a deploy check: only check --deploy and fq_worker import the handler modules ----------------


@pytest.mark.django_db  # Django's JSONField check may probe the database for JSON support
def test_e006_runs_with_check_deploy_only(settings):
    from django.core.checks import run_checks

    settings.TASKS = CLASH

    assert "django_fq.E006" not in _ids(run_checks())
    assert "django_fq.E006" in _ids(run_checks(include_deployment_checks=True))


@pytest.mark.sqlite_only
def test_migrate_creates_a_fresh_database_whose_handler_module_reads_a_table_at_import(tmp_path):
    fresh = tmp_path / "fresh.sqlite3"

    migrated = _manage("migrate", "--noinput", settings="tests.checkapps.settings_dbapp", FQ_CHECKAPP_DB=str(fresh))

    assert migrated.returncode == 0, migrated.stderr[-1500:]
    assert "Traceback" not in migrated.stderr
    deploy = _manage("check", "--deploy", settings="tests.checkapps.settings_dbapp", FQ_CHECKAPP_DB=str(fresh))
    assert "django_fq.E006" not in deploy.stderr  # once migrated, the module imports


@pytest.mark.sqlite_only
def test_a_handler_module_with_a_plain_bug_is_e006_under_deploy_and_never_a_traceback():
    plain = _manage("check", settings="tests.checkapps.settings_typoapp")
    deploy = _manage("check", "--deploy", settings="tests.checkapps.settings_typoapp")
    worker = _manage("fq_worker", "--burst", "--no-progress", "--skip-checks", settings="tests.checkapps.settings_typoapp")

    assert plain.returncode == 0 and "Traceback" not in plain.stderr, plain.stderr[-1500:]
    assert deploy.returncode == 1 and "Traceback" not in deploy.stderr, deploy.stderr[-1500:]
    assert (
        "(django_fq.E006) cannot load the job handlers: module tests.checkapps.typoapp.fq_handlers, file "
        f"{ROOT / 'tests' / 'checkapps' / 'typoapp' / 'fq_handlers.py'}, line 5: NameError:"
    ) in deploy.stderr
    assert worker.returncode == 1 and "Traceback" not in worker.stderr, worker.stderr[-1500:]
    assert "NameError" in worker.stderr


# --- an option out of range says its range once ---------------------------------------------------


def test_an_option_out_of_range_says_its_range_once():
    from tests.tasks import sample

    with pytest.raises(InvalidTask) as out_of_range:
        sample.add.using(max_attempts=0)
    with pytest.raises(InvalidTask) as not_an_int:
        sample.add.using(max_attempts="3")

    assert str(out_of_range.value) == "tests.tasks.sample.add: max_attempts must be between 1 and 1000"
    assert str(not_an_int.value) == "tests.tasks.sample.add: max_attempts must be an integer (1–1000)"


# --- E007: a django-fq backend without the django_fq app ------------------------------------------


@pytest.mark.usefixtures("django_db_setup")
def test_a_backend_without_django_fq_installed_is_e007_with_a_hint_not_a_crash():
    """The backend is built while Django sets up (an app's models import its tasks): no RuntimeError."""
    checked = _manage("check", settings="tests.checkapps.settings_no_fq")

    assert checked.returncode == 1, checked.stderr[-1500:]
    assert "Traceback" not in checked.stderr and "RuntimeError" not in checked.stderr, checked.stderr[-1500:]
    assert (
        "(django_fq.E007) TASKS['default'] uses django_fq.tasks.FqBackend, but 'django_fq' is not in INSTALLED_APPS."
    ) in checked.stderr
    assert "HINT: add 'django_fq' to INSTALLED_APPS" in checked.stderr

    enqueued = _manage(
        "shell", "-c", "from tests.checkapps.taskapp.tasks import ping; ping.enqueue()",
        settings="tests.checkapps.settings_no_fq",
    )
    assert enqueued.returncode == 1
    assert enqueued.stderr.strip().splitlines()[-1].endswith(
        "TASKS['default']: 'django_fq' is not in INSTALLED_APPS; add 'django_fq' to INSTALLED_APPS"
    )
    assert "RuntimeError" not in enqueued.stderr


def test_the_test_settings_have_no_e007(backend):
    assert backend.check() == []
