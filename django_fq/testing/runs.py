"""``drain()``: run the eligible jobs of some queues in the calling thread, through the worker's own claim, run and settle.

A :class:`~django_fq.worker.Worker` is built (``burst``, no reaper, one job at
a time) with a runner pool that runs nothing by itself: :func:`drain` claims
one job per queue and round with the worker's claim step
(``Worker.claim_into``: ``services.claim`` with the queue's visibility), runs
it with ``Worker.execute`` (the handler gets a real
:class:`~django_fq.worker.JobContext`, :func:`~django_fq.worker.current_job`
works, the worker's events are published) and settles it with
``Worker.settle`` (ack with the result; nack with the error text and
traceback, so the queue's backoff, ``max_attempts`` and dead jobs apply;
:class:`~django_fq.PermanentFailure` is dead at once). An ``async def``
handler is awaited in its async chain through ``async_to_sync``, so its
async ORM calls come back to the calling thread. A run's last progress report
is stored before the settle, as a worker's runner stores it.

Everything happens on the calling thread's database connection, so it works
inside a test's transaction (pytest-django's ``django_db``, Django's
``TestCase``): the jobs the test enqueued are visible, and what the handlers
write stays in the test's transaction. There is no heartbeat thread (it would
need a connection of its own, which cannot see the test's rows): a handler has
its queue's ``visibility_ms`` to finish, as a lease that is never extended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, transaction

from .. import conf, services
from .. import handlers as registry
from ..exceptions import FqError, QueueNotFound, WorkerConfigError
from ..worker import Worker, batch, current_job, make_worker_id
from ..worker.aio import execute_async, is_async_handler
from ..worker.context import set_current
from ..worker.dbconn import abandon_open_transactions
from ..worker.runner import RunnerPool, write_last_report
from ..worker.state import Outcome, Running, WorkerStats

#: The most jobs one :func:`drain` runs unless told otherwise: a handler that keeps enqueueing
#: work for itself (a chain that never ends) stops the drain here instead of running forever.
DEFAULT_MAX_JOBS = 1000
#: Scheduled jobs moved per page when ``run_scheduled`` (``services.jobs``' own page limit).
_PAGE = 1000


@dataclass(frozen=True)
class DrainedJob:
    """One run of a handler during a drain.

    ``outcome`` is ``succeeded`` (acked), ``retry`` (nacked; the job is
    queued again, eligible at ``run_at``, epoch ms, database clock), ``dead``
    (nacked with no attempt left, or :class:`~django_fq.PermanentFailure`)
    or ``not_settled`` (the lease was gone when the handler returned: it ran
    past its visibility, or the job was cancelled meanwhile). ``error`` is
    the text stored for the attempt (message and traceback; ``""`` for a
    success); ``exception`` the exception the handler raised, if it raised.
    """

    id: str
    queue: str
    attempt: int
    outcome: str
    payload: Any = None
    result: Any = None
    error: str = ""
    exception: BaseException | None = field(default=None, repr=False)
    run_at: int | None = None


@dataclass
class DrainReport:
    """What a :func:`drain` ran, in the order it ran them.

    ``jobs`` is every run; ``succeeded``, ``failed`` (retry scheduled),
    ``dead`` and ``not_settled`` are its parts. ``stats`` are the worker's own
    counts (``ok``, ``failed``, ``settle_errors``, ``claimed``).
    ``reached_max_jobs`` is True when the drain stopped at ``max_jobs`` with
    work possibly left.
    """

    jobs: list[DrainedJob] = field(default_factory=list)
    stats: WorkerStats = field(default_factory=WorkerStats)
    reached_max_jobs: bool = False

    def _of(self, outcome: str) -> list[DrainedJob]:
        return [j for j in self.jobs if j.outcome == outcome]

    @property
    def succeeded(self) -> list[DrainedJob]:
        """Runs that were acked."""
        return self._of("succeeded")

    @property
    def failed(self) -> list[DrainedJob]:
        """Runs that were nacked with attempts left (the job is queued again)."""
        return self._of("retry")

    @property
    def dead(self) -> list[DrainedJob]:
        """Runs that left the job dead (last attempt failed, or ``PermanentFailure``)."""
        return self._of("dead")

    @property
    def not_settled(self) -> list[DrainedJob]:
        """Runs whose lease was gone when the handler returned (nothing was settled)."""
        return self._of("not_settled")

    @property
    def errors(self) -> list[DrainedJob]:
        """Every run that did not succeed."""
        return [j for j in self.jobs if j.outcome != "succeeded"]

    def __len__(self) -> int:
        return len(self.jobs)

    def __str__(self) -> str:
        lines = [
            f"{len(self.jobs)} job(s) run: {len(self.succeeded)} succeeded, {len(self.failed)} failed (retry), "
            f"{len(self.dead)} dead, {len(self.not_settled)} not settled"
        ]
        for job in self.errors:
            first = job.error.strip().splitlines()[0] if job.error.strip() else "(no error text)"
            lines.append(f"  {job.queue} {job.id} attempt {job.attempt}: {job.outcome}: {first}")
        return "\n".join(lines)


class JobFailed(AssertionError):
    """Jobs run by :func:`drain` (``raise_errors=True``) or by the inline mode failed.

    An :class:`AssertionError`, so a test fails with it like with a failed
    ``assert``; ``report`` is the :class:`DrainReport`; the first failure's
    exception (when the handler raised one) is the ``__cause__``.
    """

    def __init__(self, report: DrainReport):
        self.report = report
        super().__init__(str(report))


class _CallerPool(RunnerPool):
    """A runner pool with no threads: the claim step hands jobs in, :func:`drain` runs them on its own thread."""

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self.pending: list[tuple[int, Running]] = []

    def start(self) -> None:
        return None

    def submit(self, seq: int, running: Running) -> None:
        self.pending.append((seq, running))

    def stop(self) -> None:
        return None


def _one_at_a_time_if_batch(queue: str, fn: Callable) -> Callable:
    """``fn``, or for a batch handler a one-job handler calling it with batches of one job."""
    try:
        size = batch.size_of(queue, fn)
    except ValueError as exc:
        raise WorkerConfigError(str(exc)) from None
    return fn if size is None else batch.one_at_a_time(fn)


def _guarded(handler: Callable, raised: dict[str, BaseException]) -> Callable:
    """``handler`` keeping what it raised (by job id), each call in a savepoint when a transaction is open.

    Inside the caller's transaction (a ``django_db`` test) a database error in
    the handler would leave the whole transaction unusable (PostgreSQL:
    "current transaction is aborted"), and the nack with it: a savepoint
    rolled back on an exception keeps the transaction, as autocommit keeps
    a worker's connection in production. The writes of a handler that raised
    are undone with it.
    """

    if is_async_handler(handler):
        # An async def handler stays async, so the worker builds its async chain and awaits it
        # (_run); the savepoint is taken around the whole run there, on the test's thread.
        async def arun(job):
            try:
                return await handler(job)
            except BaseException as exc:
                raised[job.id] = exc
                raise

        arun.__wrapped__ = handler  # type: ignore[attr-defined]
        return arun

    def run(job):
        try:
            conn = connections[conf.database()]
            if conn.in_atomic_block:
                with transaction.atomic(using=conn.alias):
                    return handler(job)
            return handler(job)
        except BaseException as exc:
            raised[job.id] = exc
            raise

    run.__wrapped__ = handler  # type: ignore[attr-defined]
    return run


def _make_scheduled_ready(queues: Iterable[str]) -> int:
    """Make every scheduled job of ``queues`` ready now (``services.requeue``: the database's clock); return how many."""
    moved = 0
    for queue in queues:
        try:
            while True:
                page = services.jobs(queue, state="scheduled", count=_PAGE)
                for info in page.jobs:
                    services.requeue(queue, info.id)
                    moved += 1
                if page.next_cursor is None or not page.jobs:
                    break
        except QueueNotFound:
            continue
    return moved


def drain(
    *queues: str,
    max_jobs: int | None = DEFAULT_MAX_JOBS,
    raise_errors: bool = False,
    run_scheduled: bool = False,
    handlers: dict[str, Callable] | None = None,
) -> DrainReport:
    """Run every eligible job of ``queues`` in the calling thread until none is left; report each run.

    Args:
        queues: queue names; none given: every queue with a registered
            handler (``@handler`` in the installed apps' ``fq_handlers``
            modules, ``FQ_HANDLERS``, the Tasks backends' queues).
        max_jobs: stop after this many runs (default 1000; ``None``: no limit).
            The report's ``reached_max_jobs`` says so.
        raise_errors: after the drain, raise :class:`JobFailed` if any run
            did not succeed (the jobs are settled first, as a worker settles
            them).
        run_scheduled: before each round, make the scheduled jobs of
            ``queues`` ready now (``services.requeue``, docs/reference/semantics.md
            §6: ``run_at`` becomes the database's now): delayed jobs and
            retries waiting out their backoff run too, so a failing job runs
            until it is dead. Without it only jobs eligible now run, as in a
            worker's ``--burst`` run (§7).
        handlers: ``{queue: callable}`` instead of the registry.

    Jobs run one at a time: one is claimed (one job per queue and round,
    the queues in turn), run and settled before the next claim, so a job
    enqueued by a handler runs in the same drain. Returns the
    :class:`DrainReport`.

    Raises :class:`~django_fq.WorkerConfigError` (a queue without a handler,
    an invalid name, ``max_jobs`` below 1), :class:`JobFailed` (with
    ``raise_errors``).
    """
    if handlers is None:
        registry.autodiscover()
        known = registry.registered()
    else:
        known = dict(handlers)
    raised: dict[str, BaseException] = {}
    # A batch handler runs here one job per call (docs/how-to/batch-handlers.md#testing).
    known = {q: _one_at_a_time_if_batch(q, fn) for q, fn in known.items()}
    worker = Worker(
        list(queues) or None,
        handlers={q: _guarded(fn, raised) for q, fn in known.items()},
        burst=True,
        concurrency=1,
        reaper=False,
        max_jobs=max_jobs,
        worker_id=f"drain:{make_worker_id()}",
        pool=_CallerPool,
    )
    pool = worker.pool
    assert isinstance(pool, _CallerPool)
    report = DrainReport(stats=worker.stats)
    outer = current_job()  # a drain run from a handler (the inline mode) gives the outer job its context back
    try:
        while True:
            if run_scheduled:
                _make_scheduled_ready(worker.queues)
            got = 0
            for queue in worker.queues:
                if max_jobs is not None and worker.stats.claimed >= max_jobs:
                    report.reached_max_jobs = True
                    break
                if not worker.claim_into(queue, 1):
                    continue
                got += 1
                while pool.pending:
                    seq, running = pool.pending.pop(0)
                    report.jobs.append(_run(worker, seq, running, raised))
            if report.reached_max_jobs or not got:
                break
    finally:
        set_current(outer)
    if raise_errors and report.errors:
        first = report.errors[0]
        raise JobFailed(report) from first.exception
    return report


def _execute_async(worker: Worker, running: Running, chain: Callable, in_transaction: bool) -> Outcome:
    """Await an async handler's chain as the worker's event loop does; its ORM calls run on this thread.

    ``async_to_sync`` from this thread sends the handler's ``sync_to_async`` calls (Django's
    async ORM) back to it, so they use the test's connection and see its transaction. Inside
    that transaction the run is in a savepoint, rolled back when it did not succeed (as
    :func:`_guarded` does for a sync handler).
    """
    if not in_transaction:
        return async_to_sync(execute_async)(worker, running, chain)
    alias = conf.database()
    with transaction.atomic(using=alias):
        outcome = async_to_sync(execute_async)(worker, running, chain)
        if outcome.kind != "ok":
            transaction.set_rollback(True, using=alias)  # this savepoint only: the test's transaction goes on
    return outcome


def _run(worker: Worker, seq: int, running: Running, raised: dict[str, BaseException]) -> DrainedJob:
    """Run one claimed job with the worker's own steps and settle it; what happened."""
    claimed = running.claimed
    worker.hand.begin(running, False)
    # Outside a transaction a worker's runner checks that the handler closed every transaction it
    # opened (RunnerPool.run_one); inside the test's transaction that check cannot tell them apart.
    in_transaction = connections[conf.database()].in_atomic_block
    try:
        chain = worker.chains[claimed.queue]
        if is_async_handler(chain):
            outcome = _execute_async(worker, running, chain, in_transaction)
        else:
            # The handler runs here. By keyword: the SQL audit reads the first argument of an .execute() call as SQL.
            outcome = worker.execute(running=running)
        if not in_transaction and abandon_open_transactions():
            error = "the handler left a database transaction open; it was rolled back"
            outcome = Outcome("failed", error=error, summary=error, elapsed_ms=outcome.elapsed_ms)
        # No heartbeat thread runs here: the run's last progress report is stored now, as a worker
        # stores it before the settle.
        write_last_report(worker, running)
        settled = worker.settle(running, outcome)
    finally:
        worker.hand.free([seq])
    exc = raised.pop(claimed.id, None)
    base = {"id": claimed.id, "queue": claimed.queue, "attempt": claimed.attempts, "payload": claimed.payload}
    if settled is None:
        return DrainedJob(**base, outcome="not_settled", error=outcome.error or "lease lost", exception=exc)
    if settled.state == "succeeded":
        return DrainedJob(**base, outcome="succeeded", result=outcome.result)
    error = outcome.error
    if not error:  # the settle turned a success into a failure (a result that cannot be stored): read what it stored
        try:
            error = services.get(claimed.queue, claimed.id).last_error
        except FqError:
            error = ""
    kind = "dead" if settled.state == "dead" else "retry"
    return DrainedJob(**base, outcome=kind, error=error, exception=exc, run_at=settled.run_at)
