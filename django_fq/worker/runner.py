"""Running handlers: the runner pool interface, and the thread pool behind ``--concurrency``.

The claim loop hands each claimed job to the worker's :class:`RunnerPool`
(:meth:`RunnerPool.submit`); the pool runs the queue's handler on the job's
:class:`~django_fq.worker.JobContext` and hands the outcome on: a plain
success to the completer (acked in batches), anything else to
:meth:`Settler.settle <django_fq.worker.settle.Settler.settle>`.

What a pool must do is small (:class:`RunnerPool`): start, accept up to
``capacity`` jobs, run each through :meth:`RunnerPool.run_one`, stop. What
happens to one job — may it still start (:meth:`RunnerPool.startable`), the
handler call and its events (:meth:`RunnerPool.execute`, by default
:func:`execute`), the hand-over (:meth:`RunnerPool.end`) — is
:meth:`RunnerPool.run_one`, shared by every pool. :class:`ThreadPool`
(``concurrency`` threads) runs sync handlers;
:class:`~django_fq.worker.aio.AsyncioPool` (one event loop) runs ``async def``
ones with the same parts; :class:`~django_fq.worker.procpool.ProcessPool`
(``--pool processes``) implements the same four methods and replaces
:meth:`RunnerPool.execute`.

A Python thread cannot be killed: a handler whose lease is lost, whose
timeout passes or whose worker shuts down is *told* (``lease_lost``,
``timed_out``, ``check()``, ``sleep()``) but keeps its thread until it returns.
A child process of the process pool is killed instead.
"""

from __future__ import annotations

import abc
import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from ..exceptions import InvalidDelay, LeaseLost, PermanentFailure, RetryAfter, Snooze, _delay
from .context import set_current
from .dbconn import abandon_or_tidy, tidy_connections
from .events import JobFinished, JobStarted
from .logs import emit, error_text, since, summary
from .state import Outcome, Running

if TYPE_CHECKING:
    from .core import Worker

#: The worker's logger (the receipt mask is installed on it by :mod:`.logs`).
log = logging.getLogger("django_fq.worker")


class RunnerPool(abc.ABC):
    """Where a worker's handlers run. Subclasses decide on what (threads today).

    Args:
        worker: the :class:`~django_fq.worker.Worker` whose jobs run here.
    """

    def __init__(self, worker: Worker):
        self.worker = worker

    @abc.abstractmethod
    def start(self) -> None:
        """Get ready to run up to ``worker.concurrency`` handlers at once."""

    @abc.abstractmethod
    def submit(self, seq: int, running: Running) -> None:
        """Queue ``running`` (numbered ``seq`` in the worker's hand) to be run by :meth:`run_one`; never blocks.

        Called by the claim loop while it holds the hand's lock: it must only enqueue.
        """

    @abc.abstractmethod
    def stop(self) -> None:
        """No more jobs come: let each runner end once the jobs already submitted are done (no waiting here)."""

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads the pool started (empty for a pool without threads of its own)."""
        return []

    def execute(self, running: Running) -> Outcome:
        """Run the handler on ``running`` and return how it ended; never raises.

        The thread pool calls :meth:`Worker.execute <django_fq.worker.Worker.execute>` (a
        method, so a subclass of Worker may still wrap it) on the runner thread.
        """
        return self.worker.execute(running)

    def run_one(self, seq: int, running: Running) -> None:
        """Run one submitted job to its hand-over, on the calling runner; never raises.

        A job released at shutdown before it started is skipped; one claimed
        ahead that a stopping worker has not started is given back. Else the
        handler runs, and its outcome goes to the completer (a plain success)
        or is settled here. The slot is freed once the job is settled, unless
        the completer took it (it frees the slot once the ack is in).
        """
        outcome = None
        verdict = self.startable(running)
        if verdict is START:
            try:
                outcome = self.execute(running)
            except Exception as exc:  # a runner must survive anything
                log.exception("worker internal error")
                emit(logging.ERROR, "worker.internal_error", **running.where(), error=summary(exc))
                verdict = SKIP
        self.end(seq, running, verdict, outcome)

    def startable(self, running: Running) -> str:
        """Whether a runner picking ``running`` up may start it: :data:`START`, :data:`SKIP` or :data:`GIVE_BACK`.

        No database work: an asyncio pool asks this on its event loop. A job released at
        shutdown before it started is skipped; one claimed ahead that a stopping worker has
        not started is given back (by :meth:`end`, which may reach the database).
        """
        if running.state.lost.is_set():
            return SKIP  # released at shutdown before it started
        if not self.worker.hand.begin(running, self.worker.stopping):
            # Claimed ahead (prefetch) and not started: a stopping worker starts nothing new.
            return GIVE_BACK
        return START

    def end(self, seq: int, running: Running, verdict: str, outcome: Outcome | None) -> None:
        """Finish one job the way :meth:`startable` decided, on a thread that may use the database; never raises.

        ``outcome`` is the handler's (for :data:`START`). Rolls back a transaction the handler
        left open on this thread (the run then counts as failed), hands a plain success to the
        completer or settles the job, frees its slot (unless the completer took it) and tidies
        this thread's connections.
        """
        worker = self.worker
        handed_over = False
        tidied = False  # this thread's connections were tidied and not used since
        try:
            if verdict is GIVE_BACK:
                if worker.hand.take(running):
                    worker.settler.release(running, "shutdown")
            elif verdict is START and outcome is not None:
                if abandon_or_tidy():
                    # The handler left a transaction open: its writes are rolled back,
                    # so the run cannot count as a success.
                    error = "the handler left a database transaction open; it was rolled back"
                    outcome = Outcome("failed", error=error, summary=error, elapsed_ms=outcome.elapsed_ms)
                else:
                    tidied = running.context._reports is None  # else a last progress report may be written here
                write_last_report(worker, running)
                handed_over = worker.completer.hand_over(seq, running, outcome)
                if not handed_over:
                    tidied = False
                    worker.settle(running, outcome)
        except Exception as exc:  # a runner must survive anything
            tidied = False
            log.exception("worker internal error")
            emit(logging.ERROR, "worker.internal_error", **running.where(), error=summary(exc))
        finally:
            if not handed_over:  # else the completer frees the slot once the ack is in
                worker.hand.free([seq])
            if not tidied:
                tidy_connections()


def write_last_report(worker: Worker, running: Running) -> None:
    """Store the handler's last progress report if it is not written yet (one ``UPDATE``; none without one).

    Called once the handler returned and before the job is settled, so a finished job
    shows how far its run got (docs/how-to/progress.md); on the calling thread. Nothing
    is written once the lease is lost.
    """
    reports = running.context._reports
    if reports is None or reports.pending is None:
        return
    report = reports.take_last(timeout_s=5.0)
    if report is not None:
        try:
            if not running.state.is_lost():
                worker.heartbeat.write_progress(running, report)
        finally:
            reports.written()


#: What :meth:`RunnerPool.startable` decides about a job a runner picks up.
START, SKIP, GIVE_BACK = "start", "skip", "give back"


def job_started(worker: Worker, running: Running) -> tuple[int, float]:
    """Publish :class:`JobStarted` (if anyone listens); return the job's wait (ms) and its start (monotonic s)."""
    wait_ms = max(0, running.claimed.claimed_at - running.claimed.enqueued_at)
    running.context._writer = worker.heartbeat  # writes the handler's progress reports (JobContext.progress)
    events = worker.events
    if events.wants(JobStarted):
        events.publish(JobStarted(worker, running.context, wait_ms))
    return wait_ms, time.monotonic()


def failure_outcome(exc: BaseException, started: float) -> Outcome:
    """The :class:`Outcome` of a handler that raised ``exc`` (``started``: monotonic seconds)."""
    if isinstance(exc, LeaseLost):
        return Outcome("lost", error=str(exc), summary=exc.reason, elapsed_ms=since(started))
    if isinstance(exc, PermanentFailure):
        return Outcome("permanent", error=error_text(exc), summary=summary(exc), elapsed_ms=since(started))
    if isinstance(exc, (Snooze, RetryAfter)):
        bad = _bad_delay(exc)
        if bad is not None:
            return Outcome("failed", error=error_text(bad), summary=summary(bad), elapsed_ms=since(started))
    if isinstance(exc, Snooze):
        return Outcome("snooze", summary=str(exc), delay_ms=exc.delay_ms, elapsed_ms=since(started))
    if isinstance(exc, RetryAfter):
        return Outcome(
            "retry", error=error_text(exc), summary=summary(exc), delay_ms=exc.delay_ms, elapsed_ms=since(started)
        )
    return Outcome("failed", error=error_text(exc), summary=summary(exc), elapsed_ms=since(started))


def _bad_delay(exc: Snooze | RetryAfter) -> InvalidDelay | None:
    """The :class:`InvalidDelay` of a Snooze or RetryAfter whose ``delay_ms`` escaped the check of its ``__init__``, or ``None``.

    A subclass may skip ``__init__``, a handler may set ``delay_ms`` afterwards: unchecked,
    the settle would be refused and the job left running until its lease expires. The
    error chains the handler's exception, so the stored traceback shows where it was raised.
    """
    value = getattr(exc, "delay_ms", None)
    try:
        _delay(value)
    except InvalidDelay as refused:
        shown = repr(value) if isinstance(value, (int, float)) else type(value).__name__
        try:
            raise InvalidDelay(
                f"{type(exc).__name__} was raised with a bad delay_ms ({shown[:40]}): {refused}", field="delay_ms"
            ) from exc
        except InvalidDelay as chained:
            return chained
    return None


def job_finished(worker: Worker, running: Running, outcome: Outcome, wait_ms: int) -> None:
    """Publish :class:`JobFinished` (if anyone listens)."""
    events = worker.events
    if events.wants(JobFinished):
        error = outcome.summary if outcome.kind != "ok" else ""
        events.publish(JobFinished(worker, running.context, outcome.kind, outcome.elapsed_ms, wait_ms, error))


def execute(worker: Worker, running: Running) -> Outcome:
    """Run the handler of the job's queue (inside its middleware) on its context and publish its start and end; never raises.

    :class:`Snooze` and :class:`RetryAfter`, raised by the handler or a
    middleware, become outcomes ``snooze`` and ``retry`` (settled by
    :meth:`Settler.settle <django_fq.worker.settle.Settler.settle>`).
    """
    handler = worker.chains[running.claimed.queue]
    context = running.context
    wait_ms, started = job_started(worker, running)
    set_current(context)
    try:
        result = handler(context)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not kill a runner thread
        outcome = failure_outcome(exc, started)
    else:
        outcome = Outcome.ok(result, since(started))
    finally:
        set_current(None)
    job_finished(worker, running, outcome, wait_ms)
    return outcome


class ThreadPool(RunnerPool):
    """``worker.concurrency`` runner threads taking jobs from one queue (the default pool)."""

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self._work: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for n in range(self.worker.concurrency):
            thread = threading.Thread(target=self._runner, name=f"fq-runner-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, seq: int, running: Running) -> None:
        self._work.put((seq, running))

    def stop(self) -> None:
        for _ in self._threads:
            self._work.put(None)

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def _runner(self) -> None:
        try:
            while True:
                item = self._work.get()
                if item is None:
                    return
                self.run_one(*item)
        finally:
            connections.close_all()
