"""Every public exception lives in django_fq.exceptions (docs/reference/errors.md), and the modules that
raised it before re-export the very same class, so existing imports and ``except`` clauses keep working."""

import pytest

from django_fq import backup, checks, exceptions, handlers, scheduler, worker, workflows


@pytest.mark.parametrize(
    "module, name",
    [
        (worker, "LeaseLost"),
        (worker, "WorkerConfigError"),
        (backup, "ImportConflict"),
        (scheduler, "ScheduleError"),
        (checks, "HandlerLoadError"),
        (handlers, "HandlerImportError"),
        (workflows, "InvalidWorkflow"),
    ],
)
def test_public_exception_lives_in_exceptions_and_is_re_exported(module, name):
    home = getattr(exceptions, name)
    assert getattr(module, name) is home
    assert home.__module__ == "django_fq.exceptions"


def test_bases_are_unchanged():
    # Moving a class must not change what an ``except`` clause catches.
    assert issubclass(exceptions.WorkerConfigError, ValueError)
    assert issubclass(exceptions.ImportConflict, exceptions.FqError)
    assert exceptions.ImportConflict.code == "import_conflict" and exceptions.ImportConflict.status == 409
    for name in ("LeaseLost", "ScheduleError", "HandlerLoadError", "HandlerImportError"):
        assert not issubclass(getattr(exceptions, name), exceptions.FqError), name
    assert exceptions.TooManyQueues.__module__ == "django_fq.exceptions"
