"""The pytest plugin, loaded by ``-p`` in an inner pytest (pytest's ``pytester``) as a project would load it.

The inner run is a child process on this run's database server, with a test
database of its own (``<name>_plugin``: it must not drop the outer run's).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "django_fq.testing.pytest_plugin"

INNER_TESTS = """
import pytest
from django.db import transaction

from django_fq import services as fq
from django_fq.handlers import handler
from django_fq.testing import JobFailed

SEEN = []


@handler("plug.ok")
def ok(job):
    SEEN.append(job.payload)
    return {"double": job.payload["n"] * 2}


@handler("plug.fail")
def fail(job):
    raise ValueError("nope")


@pytest.mark.django_db
def test_drain_in_a_django_db_test(fq_drain, fq_assert_enqueued):
    fq.enqueue("plug.ok", {"n": 2})
    fq_assert_enqueued("plug.ok", {"n": 2})
    report = fq_drain("plug.ok")
    assert [j.result for j in report.succeeded] == [{"double": 4}]
    fq_assert_enqueued.assert_not_enqueued("plug.ok")


@pytest.mark.django_db(transaction=True)
def test_inline_runs_at_commit_and_a_rollback_runs_nothing(fq_inline):
    with transaction.atomic():
        job = fq.enqueue("plug.ok", {"n": 5}).id
    assert fq.get("plug.ok", job).result == {"double": 10}
    try:
        with transaction.atomic():
            fq.enqueue("plug.ok", {"n": 6})
            raise KeyError("roll back")
    except KeyError:
        pass
    assert [j.payload for j in fq_inline.jobs] == [{"n": 5}]
    fq.configure("plug.fail", backoff_ms=60_000)
    with pytest.raises(JobFailed, match="ValueError: nope"):
        fq.enqueue("plug.fail", {})


@pytest.mark.django_db(transaction=True)
def test_the_worker_fixture(fq_worker):
    worker = fq_worker("plug.ok")
    job = fq.enqueue("plug.ok", {"n": 21}).id
    assert worker.wait("plug.ok", job).result == {"double": 42}


@pytest.mark.django_db
def test_the_worker_fixture_refuses_the_tests_transaction(fq_worker):
    pass  # the fixture fails the test before it starts
"""


def _inner_env(monkeypatch) -> None:
    """The inner run: this checkout first on the path, this run's database, a test database of its own.

    Plugins are named (``-p``), none is autoloaded: where django-fq is installed with its entry
    point, pytest would load the plugin a second time and refuse it ("already registered").
    """
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
    if connection.vendor != "sqlite":  # SQLite's file name has the inner process's pid in it
        base = os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq")
        monkeypatch.setenv("FQ_TEST_PG_TEST_NAME", f"{base}_{os.getpid()}_plugin")


@pytest.mark.no_pooler("its child creates and drops a test database of its own through PgBouncer, which keeps server sessions on it (DROP DATABASE is refused)")
def test_the_plugin_fixtures_work_in_a_project_that_loads_it_with_p(pytester, monkeypatch):
    _inner_env(monkeypatch)
    pytester.makepyfile(test_inner=INNER_TESTS)

    result = pytester.runpytest_subprocess(
        "-p", "django", "-p", PLUGIN, "-p", "no:cacheprovider", "--create-db", "-q", timeout=300
    )  # fmt: skip

    result.assert_outcomes(passed=3, errors=1)  # the refusal is an error of the fixture
    result.stdout.fnmatch_lines(["*fq_worker needs committed data*"])


def test_the_plugin_loads_without_pytest_django_and_without_django(pytester, monkeypatch):
    _inner_env(monkeypatch)
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_nothing_of_django_is_imported_by_the_plugin():
            assert "django_fq.testing.pytest_plugin" in sys.modules
            assert "django.db.models" not in sys.modules
        """
    )

    result = pytester.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider", "-q", timeout=120)

    result.assert_outcomes(passed=1)


@pytest.mark.no_pooler("its child creates and drops a test database of its own through PgBouncer, which keeps server sessions on it (DROP DATABASE is refused)")
def test_an_installed_django_fq_loads_the_plugin_through_its_entry_point(pytester, monkeypatch, tmp_path):
    """What ``pip install django-fq`` gives: the entry point of the distribution's metadata, no ``-p``."""
    _inner_env(monkeypatch)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    meta = tmp_path / "site" / "django_fq-0.1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: django-fq\nVersion: 0.1.0\n")
    (meta / "entry_points.txt").write_text(f"[pytest11]\ndjango_fq = {PLUGIN}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(meta.parent), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(
        test_ep="""
        import pytest
        from django_fq import services as fq

        @pytest.mark.django_db
        def test_drain_fixture(fq_drain):
            fq.enqueue("ep.q", {"n": 1})
            assert [j.result for j in fq_drain("ep.q", handlers={"ep.q": lambda job: job.payload["n"]}).jobs] == [1]
        """
    )

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--create-db", "-q", timeout=300)

    result.assert_outcomes(passed=1)


def test_the_entry_point_is_declared_for_pytest11():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {"django_fq": PLUGIN}


@pytest.mark.skipif(
    not os.environ.get("FQ_TEST_WHEEL"), reason="set FQ_TEST_WHEEL to a built wheel (make package-check builds one)"
)
def test_the_built_wheel_registers_the_entry_point():
    with zipfile.ZipFile(os.environ["FQ_TEST_WHEEL"]) as wheel:
        [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = wheel.read(name).decode()
    assert "[pytest11]" in text and f"django_fq = {PLUGIN}" in text
