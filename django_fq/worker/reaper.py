"""The reaper: expired leases, counter folding, pruning and periodic jobs, every ``reaper_interval_ms``.

Each round (:meth:`Reaper.round`) runs ``services.reap()`` (expire abandoned
leases, record timed-out attempts, fold the counter shards),
``services.prune()`` every ``prune_interval_ms`` (0 disables), and
``django_fq.scheduler.run_due()`` when that module exists (periodic jobs:
their cron ticks). The claim loop runs one round before its first claim, so
a ``--burst`` run reaps too; then a thread of its own (``fq-reaper``) runs
them until the worker stops. ``--no-reaper`` (``Worker(reaper=False)``) runs none.

Queues on several database aliases (``FQ_QUEUE_DATABASES``): one thread per
alias of the served queues (``fq-reaper-ALIAS``), each running
:meth:`Reaper.round_for` its alias with its own connection and its own prune
schedule, so a database that is down, or that accepts connections and never
answers, delays no other alias's expiries. Each thread writes its alias's
history minutes; the first alias's also writes those of the aliases no served
queue is on. Its failures are logged ``worker.db_error step=reap
database=ALIAS`` (as the claim loop of that alias logs its own). With every
served queue on one alias there is one thread, as without the setting.
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
    """The maintenance rounds of one worker, on one thread (``fq-reaper``) or one per database alias.

    With the served queues on two database aliases or more (``worker.aliases``,
    ``FQ_QUEUE_DATABASES``), :meth:`start` runs one thread per alias
    (``fq-reaper-ALIAS``), each with its own connection and prune schedule, so a
    database that is down or does not answer holds up only its own alias's rounds.
    """

    def __init__(self, worker: Worker):
        self.worker = worker
        self.interval_s = worker.reaper_interval_s
        self.prune_interval_s = worker.prune_interval_s
        #: Per alias (``None``: the one thread's rounds over every alias), when the next prune is due (monotonic s).
        self._next_prune: dict[str | None, float] = {}
        self._scheduler: Any = _UNSET  # the module, None, or not looked for yet
        self._scheduler_lock = threading.Lock()
        #: The reaper's threads, started by :meth:`start`: one, or one per alias of the served queues.
        self.threads: list[threading.Thread] = []

    @property
    def thread(self) -> threading.Thread | None:
        """The first of :attr:`threads` (the only one with a single alias), ``None`` before :meth:`start`."""
        return self.threads[0] if self.threads else None

    def start(self) -> None:
        """Start the rounds: ``fq-reaper``, or ``fq-reaper-ALIAS`` per alias when the queues span two or more.

        Each thread runs a round every ``reaper_interval_ms`` until ``worker.done`` is
        set, and closes its connections when it ends.
        """
        aliases = self.worker.aliases
        plan: list[tuple[str | None, str]] = (
            [(alias, f"fq-reaper-{alias}") for alias in aliases] if len(aliases) > 1 else [(None, "fq-reaper")]
        )
        for alias, name in plan:
            thread = threading.Thread(target=self._loop, args=(alias,), name=name, daemon=True)
            self.threads.append(thread)
            thread.start()

    def _loop(self, alias: str | None) -> None:
        """Rounds until the worker is done: :meth:`round` (``alias`` None) or :meth:`round_for` ``alias``.

        A database error is logged once per outage (``worker.db_error step=reap``, plus
        ``database=ALIAS`` for one thread of several), the connection dropped and the
        next round tried at the usual interval; the first round that succeeds again logs
        ``worker.reconnected``.
        """
        where: dict[str, str] = {"database": alias} if alias is not None else {}
        failing = False
        try:
            while not self.worker.done.wait(self.interval_s or 0.001):
                try:
                    if alias is None:
                        self.round()
                    else:
                        self.round_for(alias, prune=self._prune_due(alias))
                except Exception as exc:
                    if not is_db_error(exc):
                        log.exception("reaper round failed")
                    elif not failing:
                        emit(
                            logging.ERROR,
                            "worker.db_error",
                            worker=self.worker.worker_id,
                            step="reap",
                            **where,
                            error=summary(exc),
                        )
                    failing = True
                    drop_connection()
                    continue
                if failing:
                    emit(logging.WARNING, "worker.reconnected", worker=self.worker.worker_id, step="reap", **where)
                    failing = False
        finally:
            connections.close_all()

    def round(self) -> None:
        """Expire abandoned leases (and fold counters); prune and run due periodic jobs when due.

        With ``FQ_QUEUE_DATABASES``, one pass per database alias of the served queues
        (``worker.aliases``), one after the other on the calling thread; an alias whose
        database fails does not stop the others' passes, and the first error is raised
        once they ran. (A running worker with two aliases or more does not call it: each
        alias has its thread, running :meth:`round_for`.)
        """
        aliases = self.worker.aliases
        prune_due = self._prune_due(None)
        if len(aliases) <= 1:
            if aliases:
                with routing.using(aliases[0]):
                    self._round(prune_due=prune_due)
            else:
                self._round(prune_due=prune_due)
            return
        failed: BaseException | None = None
        for alias in aliases:
            try:
                self.round_for(alias, prune=prune_due)
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                failed = failed or exc
        if failed is not None:
            raise failed

    def round_for(self, alias: str, *, prune: bool = False) -> None:
        """One round on database alias ``alias`` alone: expire leases, fold counters, run its due periodic jobs.

        ``prune``: also run ``services.prune()`` on it. Writes the history minutes that
        are over of ``alias``; the round of the first served alias also writes those of
        every alias that no served queue is on (:func:`history.flush_due
        <django_fq.services.history.flush_due>`). Called by the alias's reaper thread, and
        (``prune=False``) by its claim loop before its first claim. Raises the database's
        error (the caller logs it and drops the connection).
        """
        with routing.using(alias):
            self._round(prune_due=prune, alias=alias)

    def _prune_due(self, key: str | None) -> bool:
        """Whether a prune is due on ``key``'s schedule (an alias, ``None``: :meth:`round`'s); if so, the next is set."""
        if self.prune_interval_s and time.monotonic() >= self._next_prune.get(key, 0.0):
            self._next_prune[key] = time.monotonic() + self.prune_interval_s
            return True
        return False

    def _flush_history(self, alias: str | None) -> None:
        """Write the history minutes that are over: every alias's, or (one alias's round) that alias's share."""
        if alias is None:
            history.flush_due()
            return
        served = self.worker.aliases
        if served and alias == served[0]:
            # The first alias's round also writes the aliases no other reaper thread of this worker has.
            history.flush_due(exclude=set(served) - {alias})
        else:
            history.flush_due(aliases={alias})

    def _round(self, *, prune_due: bool, alias: str | None = None) -> None:
        where: dict[str, str] = {"database": alias} if alias is not None else {}
        self._flush_history(alias)  # the minutes this process tallied that are over (docs/reference/history.md)
        reaped = services.reap()
        if reaped.expired or reaped.timed_out:
            emit(
                logging.INFO,
                "reaper.pass",
                expired=reaped.expired,
                timed_out=reaped.timed_out,
                dead=reaped.dead,
                **where,
            )
        if prune_due:
            pruned = services.prune()
            if pruned.jobs or pruned.tokens or pruned.queues or pruned.workers or pruned.history:
                emit(
                    logging.INFO, "reaper.prune", jobs=pruned.jobs, tokens=pruned.tokens, queues=pruned.queues,
                    workers=pruned.workers, history=pruned.history, **where,
                )  # fmt: skip
        scheduler = self.scheduler_module()
        if scheduler is not None:
            try:
                enqueued = scheduler.run_due()  # inside routing.using(alias): that alias's entries only
            except Exception as exc:  # a broken schedule must not stop the reaper
                emit(logging.ERROR, "scheduler.error", **where, error=summary(exc))
                if is_db_error(exc):
                    raise
            else:
                if enqueued:
                    emit(logging.INFO, "scheduler.enqueued", jobs=enqueued, **where)

    def scheduler_module(self) -> ModuleType | None:
        """``django_fq.scheduler`` if it exists (periodic jobs), else ``None``; import errors are logged once."""
        with self._scheduler_lock:  # one look (and one logged import error) for every reaper thread
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
