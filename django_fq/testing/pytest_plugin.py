"""The pytest plugin of django-fq: fixtures for testing jobs (docs/how-to/testing.md).

Registered as the ``django_fq`` entry point of ``pytest11``, so installing
django-fq makes the fixtures available; ``-p django_fq.testing.pytest_plugin``
loads it by hand. Importing this module imports neither Django's models nor
pytest-django: the fixtures import what they need when a test asks for them,
so projects that do not use django-fq's fixtures (or pytest-django) are not
affected.

Fixtures:

* ``fq_drain`` — :func:`django_fq.testing.drain`, the function;
* ``fq_inline`` — the inline mode on for the test (an
  :class:`~django_fq.testing.InlineMode`: its ``jobs`` say what ran);
* ``fq_worker`` — a factory: ``fq_worker("emails", concurrency=2)`` starts a
  real worker on a thread (a :class:`~django_fq.testing.WorkerThread`),
  stopped and joined at teardown. Needs committed data:
  ``@pytest.mark.django_db(transaction=True)`` (``transactional_db``);
* ``fq_assert_enqueued`` — an object with ``assert_enqueued``,
  ``assert_not_enqueued`` and ``enqueued_jobs``; calling it is ``assert_enqueued``.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def fq_drain(request: pytest.FixtureRequest):
    """:func:`django_fq.testing.drain`: run the eligible jobs of some queues in this test's thread."""
    _needs_database(request)
    from django_fq.testing import drain

    return drain


@pytest.fixture
def fq_inline(request: pytest.FixtureRequest):
    """The inline mode for this test: every enqueue's job runs when its transaction commits.

    In a ``django_db`` test (one transaction, never committed) the commit
    callbacks run only inside ``django_capture_on_commit_callbacks(execute=True)``.
    """
    _needs_database(request)
    from django_fq.testing import inline

    with inline() as mode:
        yield mode


@pytest.fixture
def fq_worker(request: pytest.FixtureRequest):
    """A factory starting real workers on threads: ``fq_worker(*queues, **worker_options)``; all stopped at teardown."""
    marker = request.node.get_closest_marker("django_db")
    in_transaction = "db" in request.fixturenames or (
        marker is not None and not (marker.kwargs.get("transaction") or (marker.args and marker.args[0]))
    )
    if in_transaction:
        pytest.fail(
            "fq_worker needs committed data: mark the test @pytest.mark.django_db(transaction=True) "
            "or use the transactional_db fixture (a worker thread cannot see a test's open transaction)"
        )
    request.getfixturevalue("transactional_db")
    from django_fq.testing import WorkerThread

    started: list[WorkerThread] = []

    def start(*queues: str, **options: Any) -> WorkerThread:
        thread = WorkerThread(queues or None, **options).start()
        started.append(thread)
        return thread

    yield start
    errors = []
    for thread in reversed(started):
        try:
            thread.stop()
        except BaseException as exc:  # noqa: BLE001 - every worker is stopped before one error is reported
            errors.append(exc)
    if started:
        _stop_listeners()
    if errors:
        raise errors[0]


def _stop_listeners() -> None:
    """Close the wakeup listener the workers started (PostgreSQL: a connection of its own to the test database).

    Left open it would keep the test database from being dropped at the end of
    the session; the next worker (or long poll) starts a new one.
    """
    from django_fq import wakeup

    wakeup.shutdown_all()


class _Assertions:
    """``fq_assert_enqueued``: the assertions of :mod:`django_fq.testing` in one object."""

    def __init__(self) -> None:
        from django_fq import testing

        self.assert_enqueued = testing.assert_enqueued
        self.assert_not_enqueued = testing.assert_not_enqueued
        self.enqueued_jobs = testing.enqueued_jobs

    def __call__(self, *args: Any, **kwargs: Any):
        return self.assert_enqueued(*args, **kwargs)


@pytest.fixture
def fq_assert_enqueued(request: pytest.FixtureRequest) -> _Assertions:
    """``fq_assert_enqueued(queue, payload, ...)`` asserts; ``.assert_not_enqueued`` and ``.enqueued_jobs`` too."""
    _needs_database(request)
    return _Assertions()


def _needs_database(request: pytest.FixtureRequest) -> None:
    """Ask pytest-django for database access when the test did not mark it (``db`` unless it chose another)."""
    names = request.fixturenames
    if any(
        n in names for n in ("db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback")
    ):
        return
    if request.node.get_closest_marker("django_db") is not None:
        return
    try:
        request.getfixturevalue("db")
    except pytest.FixtureLookupError:
        pass  # no pytest-django: the project sets up its database itself
