"""Shared fixtures. Every test runs against the database chosen by ``FQ_TEST_DB``."""

import os

import pytest
from django.db import connection

#: pytest's own ``pytester`` (tests/testing/test_plugin.py runs an inner pytest with django-fq's plugin).
pytest_plugins = ["pytester"]

#: ``FQ_TEST_DB`` → Django's ``connection.vendor``.
VENDORS = {"postgres": "postgresql", "mariadb": "mysql", "sqlite": "sqlite"}


def pytest_collection_modifyitems(config, items):
    vendor = VENDORS.get(_db(), "sqlite") if config.getoption("--ds", None) is None else "sqlite"
    store = _store_class(vendor)
    # scripts/test-matrix.sh names, on the legs of the other Django versions, the leg of this
    # database that runs the `one_django` tests; a plain pytest run (no variable) runs them all.
    one_django_elsewhere = os.environ.get("FQ_TEST_ONE_DJANGO_ON", "")
    for item in items:
        if not store.supports_row_locks and item.get_closest_marker("row_locks"):
            reason = f"needs concurrent writers with row locks ({store.__name__}.supports_row_locks is False)"
            item.add_marker(pytest.mark.skip(reason=reason))
        if vendor != "postgresql" and item.get_closest_marker("postgres_only"):
            item.add_marker(pytest.mark.skip(reason="PostgreSQL only (run with FQ_TEST_DB=postgres)"))
        if vendor != "sqlite" and item.get_closest_marker("sqlite_only"):
            item.add_marker(pytest.mark.skip(reason="SQLite only (run with FQ_TEST_DB=sqlite)"))
        if vendor != "mysql" and item.get_closest_marker("mysql_only"):
            item.add_marker(pytest.mark.skip(reason="MariaDB/MySQL only (run with FQ_TEST_DB=mariadb)"))
        if one_django_elsewhere and item.get_closest_marker("one_django"):
            item.add_marker(pytest.mark.skip(reason=f"runs once per database, on the {one_django_elsewhere} leg"))


def _store_class(vendor):
    """The Store class of this leg's backend: its ``supports_*`` flags decide capability markers.

    Read from the class, so collection needs no database connection.
    """
    from django_fq.storage import BACKENDS, SqliteStore

    return BACKENDS.get(vendor, SqliteStore)


def _db():
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
def _handlers_imported_into_the_real_registry():
    """Import every app's ``fq_handlers`` module once, before any test swaps the registry.

    A module registers its handlers only when first imported: a test that
    patches ``handlers._registry`` with an empty dict and then loads the
    handlers would otherwise import them into its own dict, and the real one
    would miss them for the rest of the process (seen in CI: which test an
    xdist worker ran first decided whether ``t.ok`` had a handler).
    """
    from django_fq import handlers

    handlers.autodiscover()


@pytest.fixture(autouse=True, scope="session")
def _stop_wakeup_listeners(django_db_setup):
    """The wakeup listener holds a connection to the test database: close it before the DB is dropped.

    Depending on ``django_db_setup`` makes this teardown run before the test database is destroyed.
    """
    yield
    from django_fq import wakeup

    wakeup.shutdown_all()
