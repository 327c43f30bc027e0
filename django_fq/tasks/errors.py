"""Exception classes named by ``TaskError.exception_class_path`` for failures that raised nothing.

A task's own exceptions are reported with their real class path. Some failed
attempts have no exception behind them — the lease expired (the worker died
or lost its database), the job ran past its timeout, an operator cancelled
it, or an error text was recorded by something other than the Tasks runner
(``fq nack --error`` by hand, say). Their :class:`TaskError` entries name one of
these classes, so ``TaskError.exception_class`` always resolves.
"""

from __future__ import annotations


class TaskAttemptError(Exception):
    """Base class of the failures below."""


class LeaseExpired(TaskAttemptError):
    """The attempt's lease expired before the worker settled it (worker killed, stalled or disconnected)."""


class TaskTimedOut(TaskAttemptError):
    """The attempt ran past the job's ``timeout_ms``."""


class TaskCancelled(TaskAttemptError):
    """The job was cancelled (``fq cancel``, the admin, or ``services.cancel``)."""


class TaskFailed(TaskAttemptError):
    """An attempt failed with an error text whose exception class is unknown."""


def class_path(cls: type) -> str:
    """``module.QualName`` of a class, the form ``TaskError.exception_class_path`` uses."""
    return f"{cls.__module__}.{cls.__qualname__}"
