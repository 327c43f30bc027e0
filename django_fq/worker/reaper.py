"""The reaper: expired leases, counter folding, pruning and periodic jobs, every ``reaper_interval_ms``.

Each round (:meth:`Reaper.round`) runs ``services.reap()`` (expire abandoned
leases, record timed-out attempts, fold the counter shards),
``services.prune()`` every ``prune_interval_ms`` (0 disables), and
``django_fq.scheduler.run_due()`` when that module exists (periodic jobs:
their cron ticks). The claim loop runs one round before its first claim, so
a ``--burst`` run reaps too; then a thread of its own runs them until the
worker stops. ``--no-reaper`` (``Worker(reaper=False)``) runs none.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.db import connections

from .. import routing, services
from ..services import history
from .dbconn import drop_connection, is_db_error
from .logs import emit, summary

if TYPE_CHECKING:
    from .core import Worker

#: The worker's logger (the receipt mask is installed on it by :mod:`.logs`).
log = logging.getLogger("django_fq.worker")

_UNSET = object()


class Reaper:
    """The maintenance rounds of one worker."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.interval_s = worker.reaper_interval_s
        self.prune_interval_s = worker.prune_interval_s
        self._next_prune = 0.0
        self._scheduler: Any = _UNSET  # the module, None, or not looked for yet
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="fq-reaper", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        failing = False
        try:
            while not self.worker.done.wait(self.interval_s or 0.001):
                try:
                    self.round()
                except Exception as exc:
                    if not is_db_error(exc):
                        log.exception("reaper round failed")
                    elif not failing:
                        emit(logging.ERROR, "worker.db_error", worker=self.worker.worker_id, step="reap", error=summary(exc))
                    failing = True
                    drop_connection()
                    continue
                if failing:
                    emit(logging.WARNING, "worker.reconnected", worker=self.worker.worker_id, step="reap")
                    failing = False
        finally:
            connections.close_all()

    def round(self) -> None:
        """Expire abandoned leases (and fold counters); prune and run due periodic jobs when due.

        With ``FQ_QUEUE_DATABASES``, one pass per database alias of the served queues
        (``worker.aliases``); an alias whose database fails does not stop the others'
        passes, and the first error is raised once they ran.
        """
        aliases = self.worker.aliases
        if not aliases:
            self._round(prune_due=self._prune_due())
            return
        prune_due = self._prune_due()
        failed: BaseException | None = None
        for alias in aliases:
            with routing.using(alias):
                try:
                    self._round(prune_due=prune_due)
                except Exception as exc:
                    if not is_db_error(exc):
                        raise
                    failed = failed or exc
        if failed is not None:
            raise failed

    def round_for(self, alias: str) -> None:
        """Expire abandoned leases (and fold counters) on ``alias`` alone, and run its due periodic jobs; no pruning.

        The first round of one claim loop of several (one per alias), made before its
        first claim; pruning waits for the reaper thread's rounds.
        """
        with routing.using(alias):
            self._round(prune_due=False)

    def _prune_due(self) -> bool:
        if self.prune_interval_s and time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + self.prune_interval_s
            return True
        return False

    def _round(self, *, prune_due: bool) -> None:
        history.flush_due()  # the minutes this process tallied that are over (docs/reference/history.md)
        reaped = services.reap()
        if reaped.expired or reaped.timed_out:
            emit(logging.INFO, "reaper.pass", expired=reaped.expired, timed_out=reaped.timed_out, dead=reaped.dead)
        if prune_due:
            pruned = services.prune()
            if pruned.jobs or pruned.tokens or pruned.queues or pruned.workers or pruned.history:
                emit(
                    logging.INFO, "reaper.prune", jobs=pruned.jobs, tokens=pruned.tokens, queues=pruned.queues,
                    workers=pruned.workers, history=pruned.history,
                )  # fmt: skip
        scheduler = self.scheduler_module()
        if scheduler is not None:
            try:
                enqueued = scheduler.run_due()
            except Exception as exc:  # a broken schedule must not stop the reaper
                emit(logging.ERROR, "scheduler.error", error=summary(exc))
                if is_db_error(exc):
                    raise
            else:
                if enqueued:
                    emit(logging.INFO, "scheduler.enqueued", jobs=enqueued)

    def scheduler_module(self) -> ModuleType | None:
        """``django_fq.scheduler`` if it exists (periodic jobs), else ``None``; import errors are logged once."""
        if self._scheduler is _UNSET:
            self._scheduler = None
            try:
                if importlib.util.find_spec("django_fq.scheduler") is not None:
                    module = importlib.import_module("django_fq.scheduler")
                    if callable(getattr(module, "run_due", None)):
                        self._scheduler = module
            except Exception as exc:  # noqa: BLE001
                emit(logging.ERROR, "scheduler.error", error=f"cannot import django_fq.scheduler: {summary(exc)}")
        return self._scheduler

