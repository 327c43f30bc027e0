"""Shared fixtures. Every test runs against the database chosen by ``FQ_TEST_DB``."""

import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
    vendor = "postgresql" if config.getoption("--ds", None) is None and _db() == "postgres" else "sqlite"
    for item in items:
        if vendor != "postgresql" and item.get_closest_marker("postgres_only"):
            item.add_marker(pytest.mark.skip(reason="PostgreSQL only (run with FQ_TEST_DB=postgres)"))
        if vendor == "postgresql" and item.get_closest_marker("sqlite_only"):
            item.add_marker(pytest.mark.skip(reason="SQLite only (run with FQ_TEST_DB=sqlite)"))


def _db():
    import os

    return os.environ.get("FQ_TEST_DB", "sqlite")


@pytest.fixture
def clock(settings):
    """Shift the database clock (inside the SQL expression) by ``clock.advance(ms)``."""

    class Clock:
        def advance(self, ms: int) -> None:
            settings.FQ_TEST_CLOCK_OFFSET_MS = getattr(settings, "FQ_TEST_CLOCK_OFFSET_MS", 0) + ms

    settings.FQ_TEST_CLOCK_OFFSET_MS = 0
    return Clock()


@pytest.fixture
def vendor():
    return connection.vendor


@pytest.fixture(autouse=True, scope="session")
def _stop_wakeup_listeners(django_db_setup):
    """The wakeup listener holds a connection to the test database: close it before the DB is dropped.

    Depending on ``django_db_setup`` makes this teardown run before the test database is destroyed.
    """
    yield
    from django_fq import wakeup

    wakeup.shutdown_all()
