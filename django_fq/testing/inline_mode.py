"""The inline mode: an enqueue runs its job at once, after the enqueuing transaction commits.

The job is enqueued for real (idempotency tokens, unique keys, the queue's
policy and limits all apply); when the transaction that enqueued it commits
(``transaction.on_commit`` on ``FQ_DATABASE``; at once in autocommit), the
queue is drained with :func:`~django_fq.testing.drain`: the new job, and
whatever else is eligible on that queue, is claimed, run and acked or nacked
through the worker's own path. A rolled-back enqueue runs nothing, as no
worker would ever see its job.

Turned on by the ``FQ_INLINE`` setting (``True``: every queue with a
registered handler; a list of queue names: those) or the :func:`inline`
context manager, which wins over the setting while it is open. Queues
without a handler are left alone: their jobs stay queued, as they would
with no worker serving them.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from django.db import transaction

from .. import conf
from .. import handlers as registry
from ..types import EnqueueResult
from .runs import DEFAULT_MAX_JOBS, DrainReport, JobFailed, drain

#: The services' enqueue module (``django_fq.services.enqueue`` the attribute is the function).
_ENQUEUE_MODULE = "django_fq.services.enqueue"


@dataclass
class InlineMode:
    """One inline mode: which queues it serves and what it did.

    ``queues`` is ``None`` for every queue with a handler; ``raise_errors``
    makes a failed run raise :class:`~django_fq.testing.JobFailed` from the
    commit (or from the enqueue itself, in autocommit); ``reports`` holds the
    :class:`~django_fq.testing.DrainReport` of each run, oldest first.
    """

    queues: frozenset[str] | None = None
    raise_errors: bool = True
    max_jobs: int | None = DEFAULT_MAX_JOBS
    reports: list[DrainReport] = field(default_factory=list)

    def serves(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    @property
    def jobs(self) -> list:
        """Every :class:`~django_fq.testing.DrainedJob` this mode ran, in order."""
        return [job for report in self.reports for job in report.jobs]


_lock = threading.Lock()
#: Open :func:`inline` blocks, innermost last; the setting's mode when none is open.
_stack: list[InlineMode] = []
_from_setting: InlineMode | None = None


def active() -> InlineMode | None:
    """The inline mode in force (the innermost :func:`inline` block, else ``FQ_INLINE``), or ``None``."""
    with _lock:
        return _stack[-1] if _stack else _from_setting


def _install() -> None:
    """Point the enqueue hook at :func:`_after_enqueue` while some mode is on, else clear it."""
    module = sys.modules.get(_ENQUEUE_MODULE)
    if module is None:
        import importlib

        module = importlib.import_module(_ENQUEUE_MODULE)
    module.after_enqueue = _after_enqueue if (_stack or _from_setting is not None) else None  # type: ignore[attr-defined]


def _mode_of(value: object) -> InlineMode | None:
    """The mode ``FQ_INLINE = value`` asks for (falsy: none; a string or list of names: those queues)."""
    if not value:
        return None
    if value is True:
        return InlineMode()
    if isinstance(value, str):
        return InlineMode(queues=frozenset([value]))
    if isinstance(value, Iterable):
        return InlineMode(queues=frozenset(str(q) for q in value))
    return InlineMode()


def apply_setting() -> None:
    """Read ``FQ_INLINE`` again: at app start when it is set, and whenever a test changes it (``setting_changed``, see apps.py)."""
    global _from_setting
    with _lock:
        _from_setting = _mode_of(conf.get("FQ_INLINE"))
        _install()


@contextlib.contextmanager
def inline(*queues: str, raise_errors: bool = True, max_jobs: int | None = DEFAULT_MAX_JOBS) -> Iterator[InlineMode]:
    """Run jobs inline inside this block: each enqueue's job runs when its transaction commits.

    Args:
        queues: the queues whose jobs run inline; none given: every queue
            with a registered handler.
        raise_errors: a run that did not succeed (the job was nacked, is
            dead, or its lease was lost) raises :class:`~django_fq.testing.JobFailed`
            from the commit, after the job was settled as a worker settles
            it; ``False`` only records it in the mode's ``reports``.
        max_jobs: the most jobs one commit's drain runs (see :func:`~django_fq.testing.drain`).

    Yields the :class:`InlineMode` (its ``reports`` and ``jobs`` say what ran).
    Blocks nest; the innermost one is in force.
    """
    mode = InlineMode(queues=frozenset(queues) if queues else None, raise_errors=raise_errors, max_jobs=max_jobs)
    with _lock:
        _stack.append(mode)
        _install()
    try:
        yield mode
    finally:
        with _lock:
            _stack.remove(mode)
            _install()


def _after_enqueue(queue: str, results: list[EnqueueResult]) -> None:
    """The enqueue hook: when this call created a job on a served queue, drain that queue at commit."""
    mode = active()
    if mode is None or not mode.serves(queue) or not any(r.created for r in results):
        return
    registry.autodiscover()
    if registry.get(queue) is None:
        return  # no handler: the job waits, as it would with no worker serving the queue

    def run() -> None:
        report = drain(queue, max_jobs=mode.max_jobs)
        mode.reports.append(report)
        if mode.raise_errors and report.errors:
            raise JobFailed(report) from report.errors[0].exception

    transaction.on_commit(run, using=conf.database())
