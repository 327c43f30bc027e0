"""Test helpers for projects using django-fq (docs/how-to/testing.md).

* :func:`drain` runs every eligible job of some queues in the calling thread,
  through the worker's own claim → handler → ack/nack path, and returns a
  :class:`DrainReport` (what succeeded, failed, died, and why);
* :func:`inline` and the ``FQ_INLINE`` setting: an enqueue runs its job at
  once, after the enqueuing transaction commits;
* :func:`assert_enqueued`, :func:`assert_not_enqueued` and
  :func:`enqueued_jobs` read the jobs from the database, in the test's
  transaction;
* the pytest plugin :mod:`django_fq.testing.pytest_plugin` (fixtures
  ``fq_drain``, ``fq_inline``, ``fq_worker``, ``fq_assert_enqueued``).

Nothing here is imported by django-fq at run time, except the inline mode's
setting hook when ``FQ_INLINE`` is set.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import EnqueuedJob, assert_enqueued, assert_not_enqueued, enqueued_jobs
    from .inline_mode import InlineMode, inline
    from .runs import DEFAULT_MAX_JOBS, DrainedJob, DrainReport, JobFailed, drain
    from .threads import WorkerThread, worker_thread

#: Where each name lives. Imported on first use, so that loading the pytest plugin (a submodule)
#: imports no Django models: pytest loads it before Django is set up.
_HOMES = {
    "EnqueuedJob": "assertions",
    "assert_enqueued": "assertions",
    "assert_not_enqueued": "assertions",
    "enqueued_jobs": "assertions",
    "InlineMode": "inline_mode",
    "inline": "inline_mode",
    "DEFAULT_MAX_JOBS": "runs",
    "DrainedJob": "runs",
    "DrainReport": "runs",
    "JobFailed": "runs",
    "drain": "runs",
    "WorkerThread": "threads",
    "worker_thread": "threads",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "DEFAULT_MAX_JOBS",
    "DrainReport",
    "DrainedJob",
    "EnqueuedJob",
    "InlineMode",
    "JobFailed",
    "WorkerThread",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued_jobs",
    "inline",
    "worker_thread",
]
