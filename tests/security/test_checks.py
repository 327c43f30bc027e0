"""The system checks that warn about unsafe settings (``django_fq.E020``, ``W010``–``W013``) and the worker's WAL check."""

from __future__ import annotations

import logging

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import connection

from django_fq import security_checks

pytestmark = pytest.mark.django_db


def _ids(messages) -> set[str]:
    return {m.id for m in messages}


def _deploy_ids() -> set[str]:
    """The django-fq ids ``manage.py check --deploy`` reports."""
    return {m.id for m in django_checks.run_checks(include_deployment_checks=True) if m.id.startswith("django_fq.")}


def test_the_test_settings_pass_every_check():
    assert _ids(security_checks.check_api_settings()) == set()
    assert _ids(security_checks.check_deployment()) == set()


def test_deploy_checks_run_only_with_deploy():
    plain = {m.id for m in django_checks.run_checks() if m.id.startswith("django_fq.W01")}
    assert plain == set()
    assert django_checks.registry.registry.tag_exists("security", include_deployment_checks=True)


# --- W010: DEBUG with the API mounted ----------------------------------------------------------------------


def test_debug_with_the_api_mounted_warns(settings):
    settings.DEBUG = True
    settings.ROOT_URLCONF = "tests.api.urls"
    assert "django_fq.W010" in _deploy_ids()


def test_debug_without_the_api_is_left_to_django(settings):
    settings.DEBUG = True
    settings.ROOT_URLCONF = "tests.security.urls_without_api"
    assert "django_fq.W010" not in _deploy_ids()


def test_the_api_is_found_wherever_it_is_mounted():
    assert security_checks.api_is_mounted("tests.api.urls")  # twice, one of them under another namespace
    assert not security_checks.api_is_mounted("tests.security.urls_without_api")


def test_production_settings_do_not_warn(settings):
    settings.DEBUG = False
    settings.ROOT_URLCONF = "tests.api.urls"
    assert "django_fq.W010" not in _deploy_ids()


# --- W011: permission classes that open the API ------------------------------------------------------------


@pytest.mark.parametrize(
    "classes",
    [
        [],
        ["rest_framework.permissions.AllowAny"],
        ["rest_framework.permissions.IsAuthenticatedOrReadOnly"],
        ["rest_framework.permissions.AllowAny", "rest_framework.permissions.IsAuthenticatedOrReadOnly"],
    ],
    ids=["empty", "allow-any", "read-only", "both"],
)
def test_open_permission_classes_warn(settings, classes):
    settings.FQ_API_PERMISSION_CLASSES = classes
    assert "django_fq.W011" in _deploy_ids()


@pytest.mark.parametrize(
    "classes",
    [
        None,
        ["django_fq.api.permissions.HasQueuePermission"],
        ["tests.api.auth.OwnQueuesOnly"],
        ["rest_framework.permissions.AllowAny", "django_fq.api.permissions.HasQueuePermission"],
        ["rest_framework.permissions.IsAdminUser"],
    ],
    ids=["default", "default-named", "subclass", "allow-any-and-ours", "admin-only"],
)
def test_permission_classes_that_check_someone_do_not_warn(settings, classes):
    if classes is None:
        if hasattr(settings, "FQ_API_PERMISSION_CLASSES"):
            del settings.FQ_API_PERMISSION_CLASSES
    else:
        settings.FQ_API_PERMISSION_CLASSES = classes
    assert "django_fq.W011" not in _deploy_ids()


# --- W012: large payloads ----------------------------------------------------------------------------------


def test_payload_limit_above_8_mib_warns(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
    assert "django_fq.W012" not in _deploy_ids()
    settings.FQ_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024 + 1
    assert "django_fq.W012" in _deploy_ids()


# --- W013: the test clock ------------------------------------------------------------------------------------


def test_test_clock_offset_warns(settings):
    settings.FQ_TEST_CLOCK_OFFSET_MS = 1000
    assert "django_fq.W013" in _deploy_ids()


# --- E020: API settings that would break every request ---------------------------------------------------------


@pytest.mark.parametrize("name", security_checks.API_INT_SETTINGS)
@pytest.mark.parametrize("value", ["1MB", 0, -5, True, 1.5])
def test_api_settings_must_be_positive_integers(settings, name, value):
    setattr(settings, name, value)
    found = [m for m in django_checks.run_checks() if m.id == "django_fq.E020"]
    assert len(found) == 1 and name in found[0].msg


def test_api_settings_that_are_positive_integers_pass(settings):
    for name in security_checks.API_INT_SETTINGS:
        setattr(settings, name, 1000)
    assert _ids(security_checks.check_api_settings()) == set()


# --- fq_worker runs the WAL check of its database ------------------------------------------------------------


@pytest.fixture
def quiet_worker_logger():
    """``fq_worker`` sets up its logger; put it back as it was."""
    logger = logging.getLogger("django_fq.worker")
    saved = (logger.level, list(logger.handlers))
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]


def _start_worker(**options):
    """Run ``fq_worker`` for a queue without a handler: past the checks, it stops with a one-line error.

    ``call_command`` skips system checks unless told otherwise; the command line runs them.
    """
    call_command("fq_worker", "--queue", "sec:no-handler", "--burst", **{"skip_checks": False, **options})


@pytest.mark.sqlite_only
@pytest.mark.django_db(transaction=True)  # the journal mode cannot change inside a transaction
def test_fq_worker_refuses_a_sqlite_database_without_wal(settings, quiet_worker_logger):
    with pytest.raises(CommandError, match="handler"):
        _start_worker()  # WAL: the checks pass
    with connection.cursor() as cur:
        cur.execute("PRAGMA journal_mode=DELETE")
        assert cur.fetchone()[0] == "delete"
    try:
        with pytest.raises(SystemCheckError, match=r"django_fq\.E004"):
            _start_worker()
        settings.SILENCED_SYSTEM_CHECKS = ["django_fq.E004"]
        with pytest.raises(CommandError, match="handler"):
            _start_worker()
        settings.SILENCED_SYSTEM_CHECKS = []
        with pytest.raises(CommandError, match="handler"):
            _start_worker(skip_checks=True)
    finally:
        with connection.cursor() as cur:
            cur.execute("PRAGMA journal_mode=WAL")


@pytest.mark.postgres_only
def test_fq_worker_checks_pass_on_postgresql(quiet_worker_logger):
    with pytest.raises(CommandError, match="handler"):
        _start_worker()
