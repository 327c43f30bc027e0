"""Shared fixtures. Every test runs against the database chosen by ``FQ_TEST_DB``."""

import os

import pytest
from django.db import connection

#: pytest's own ``pytester`` (tests/testing/test_plugin.py runs an inner pytest with django-fq's plugin).
pytest_plugins = ["pytester"]

#: ``FQ_TEST_DB`` → Django's ``connection.vendor``.
VENDORS = {"postgres": "postgresql", "mariadb": "mysql", "sqlite": "sqlite"}


#: Tests whose subject is django-fq's engine on the database (worker processes, claims under
#: kills and races, the contract's cases, property runs, tracing and middleware around a run),
#: not Django's own surface (admin, REST, Tasks, commands, checks, models), which every leg tests.
#: On the legs of the other Django versions make test leaves these (and tests marked
#: ``one_django``) to this database's Django 6.x leg; ``every_django`` keeps a smoke test on all.
ENGINE_TESTS = (
    "tests/worker/",
    "tests/chaos/",
    "tests/cases/",
    "tests/property/",
    "tests/adversarial/",
    "tests/tracing/",
    "tests/middleware/",
    "tests/backup/test_cross_db.py",
    "tests/backup/test_import_races.py",
    "tests/metrics/test_health_errors.py",
    "tests/services/test_mysql_stale_snapshot_locks.py",
    "tests/test_worker.py",
    "tests/test_scheduler.py",
    "tests/test_receipt_deadline_after_lock_wait.py",
)
#: Tests of the code itself (an audit of the SQL text, the vendor-branch rule): no database and
#: no Django version changes their answer, so make test runs them on one leg, dj6-sqlite.
CODE_ONLY_TESTS = ("tests/security/test_sql.py::test_every_raw", "tests/storage/test_vendor_branches.py")
#: The leg of scripts/test-matrix.sh that runs CODE_ONLY_TESTS.
CODE_ONLY_LEG = "dj6-sqlite"


def pytest_collection_modifyitems(config, items):
    vendor = VENDORS.get(_db(), "sqlite") if config.getoption("--ds", None) is None else "sqlite"
    store = _store_class(vendor)
    # scripts/test-matrix.sh names the leg it runs (FQ_TEST_LEG) and, on the legs of the other
    # Django versions, the leg of this database that runs the engine tests; a plain pytest run
    # (no variables) runs every test.
    one_django_elsewhere = os.environ.get("FQ_TEST_ONE_DJANGO_ON", "")
    leg = os.environ.get("FQ_TEST_LEG", "")
    kept, engine, code_only = [], [], []
    # make test-pgbouncer: the default alias goes through PgBouncer in transaction mode (tests/settings.py).
    pooled = vendor == "postgresql" and os.environ.get("FQ_TEST_PG_POOLER") == "transaction"
    for item in items:
        path = item.nodeid
        if (
            one_django_elsewhere
            and not item.get_closest_marker("every_django")
            and (item.get_closest_marker("one_django") or path.startswith(ENGINE_TESTS))
        ):
            engine.append(item)
        elif leg and leg != CODE_ONLY_LEG and path.startswith(CODE_ONLY_TESTS):
            code_only.append(item)
        else:
            kept.append(item)
    if engine or code_only:
        config.hook.pytest_deselected(items=engine + code_only)
        items[:] = kept
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
        if pooled and (mark := item.get_closest_marker("no_pooler")):
            why = mark.args[0] if mark.args else "needs a server session of its own"
            item.add_marker(pytest.mark.skip(reason=f"not through a transaction pooler: {why}"))


def pytest_terminal_summary(terminalreporter, config):
    """Say which tests this leg of scripts/test-matrix.sh left to another one (where they ran).

    Written from the variables, not from collection: under pytest-xdist the
    controller collects nothing.
    """
    leg = os.environ.get("FQ_TEST_LEG", "")
    engine_on = os.environ.get("FQ_TEST_ONE_DJANGO_ON", "")
    if engine_on:
        terminalreporter.write_line(f"{leg}: the engine tests (ENGINE_TESTS, one_django) run on {engine_on}")
    if leg and leg != CODE_ONLY_LEG:
        terminalreporter.write_line(f"{leg}: the code-only tests (CODE_ONLY_TESTS) run on {CODE_ONLY_LEG}")


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
def _listen_alias_on_the_test_database(django_db_setup):
    """Behind a transaction pooler the listener's ``direct`` alias (tests/settings.py) must reach the test database.

    pytest-django sets up only the aliases the tests ask for, so the ``MIRROR``
    of ``direct`` is never applied: point it at ``default``'s test database here
    (in place: every thread's new connection reads this dict).
    """
    from django.db import connections

    if "direct" in connections.settings:
        connections.settings["direct"]["NAME"] = connections.settings["default"]["NAME"]


@pytest.fixture(autouse=True, scope="session")
def _stop_wakeup_listeners(django_db_setup):
    """The wakeup listener holds a connection to the test database: close it before the DB is dropped.

    Depending on ``django_db_setup`` makes this teardown run before the test database is destroyed.
    """
    yield
    from django_fq import wakeup

    wakeup.shutdown_all()


@pytest.fixture(autouse=True)
def _history_tally_discarded():
    """The process's unwritten history minutes (django_fq.services.history) belong to one test's database.

    Forgotten before and after each test, so a minute tallied in one test
    is never written into the next test's tables.
    """
    from django_fq.services import history

    history.TALLY.discard()
    yield
    history.TALLY.discard()
