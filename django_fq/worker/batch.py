"""Batch handlers: one handler call for many jobs of a queue (``@handler("q", batch=500)``).

A batch handler receives a :class:`JobBatch` (a list of the jobs'
:class:`~django_fq.worker.JobContext`) and settles every job of it:

* it returns ``None``: every job is acked (result ``None``);
* it returns a mapping ``{job id: result}``: every job is acked, each named
  one with its result (a key that is not a job of the batch fails the batch);
* it returns a :class:`BatchResult`: the jobs it names are acked with a
  result, failed, retried later, snoozed or made dead; the others are acked;
* it raises :class:`~django_fq.exceptions.BatchFailure`: the same, as an
  exception (``errors`` and ``results`` mappings);
* any other exception fails each job of the batch as if a one-job handler had
  raised it (attempt counted, backoff, dead at ``max_attempts``).

How a batch runs (docs/how-to/batch-handlers.md):

* **Claim.** One ``claim(count=batch)`` per batch: the claim loop asks for up to
  the queue's batch size (the 32 MiB payload cap of a claim may make it
  smaller, and so may the ready count). Up to ``concurrency`` batches of a
  queue run at once, and one more is claimed ahead while they run, so the
  next claim overlaps the settle of the previous batch.
* **Settle.** The acks of a batch go to the completer as one unit, so one
  ``ack_many`` statement settles them (two if results push it past the
  statement size). Failures are nacked one by one.
* **Leases.** Each job keeps its own lease and receipt. The heartbeat thread
  extends the leases of the batch's jobs in the same pass (they were claimed
  together, so their beats fall together); a job whose lease is lost (expired,
  cancelled, timed out) is dropped from the settle alone: the others settle.
* **Timeouts.** ``timeout_ms`` stays per job: a job past it is failed with a
  ``timeout`` attempt by expiry handling and its result is dropped; the
  handler, on its thread, is told through that job's ``lease_lost`` /
  ``check()`` and keeps running for the rest of the batch.
* **Middleware.** The queue's handler middleware is called once per batch,
  with the :class:`JobBatch` in place of the job.
* **Events.** :class:`~django_fq.worker.events.JobStarted`,
  ``JobFinished`` and ``JobSettled`` are published per job, as for one-job
  handlers, so metrics and tracing see every job.

A batch handler must be a plain (sync) function and runs in the worker's
process: ``async def`` batch handlers and ``--pool processes`` are refused
when the worker starts (:func:`check_worker`).
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import connections

from .. import handlers as registry
from ..exceptions import BatchFailure, PermanentFailure, RetryAfter, Snooze, WorkerConfigError
from .dbconn import abandon_open_transactions, tidy_connections
from .logs import emit, since, summary
from .runner import failure_outcome, job_finished, job_started, write_last_report
from .state import Outcome, Running

if TYPE_CHECKING:
    from .context import JobContext
    from .core import Worker

log = logging.getLogger("django_fq.worker")

__all__ = ["BatchItemFailed", "BatchResult", "BatchRunner", "JobBatch", "batch_sizes", "check_worker", "one_at_a_time"]


class JobBatch(list):
    """The jobs one batch handler call gets: a list of :class:`~django_fq.worker.JobContext`, plus ``queue``.

    Each item has ``id``, ``payload``, ``metadata``, ``attempts``,
    ``max_attempts``, ``deadline``, ``lease_lost``, ``check()`` and
    ``progress()``, exactly as a one-job handler's ``job``. No receipt.
    """

    def __init__(self, queue: str, jobs: list[JobContext]):
        super().__init__(jobs)
        self.queue = queue

    @property
    def ids(self) -> list[str]:
        """The job ids of the batch, in claim order."""
        return [job.id for job in self]

    def lost(self) -> list[JobContext]:
        """The jobs whose lease is gone (their outcome will not be stored)."""
        return [job for job in self if job.lease_lost]

    def __repr__(self) -> str:
        return f"<JobBatch {self.queue} of {len(self)} jobs>"


def _key(job: object) -> str:
    """The job id named by ``job`` (a context or an id)."""
    if isinstance(job, str):
        return job
    named = getattr(job, "id", None)
    # Anything else names no job of the batch: its repr goes into the "not in this batch" error.
    return named if isinstance(named, str) else repr(job)


class BatchResult:
    """What a batch handler returns to settle its jobs one by one; jobs it does not name are acked.

    Each method takes a job of the batch (its context, or its id) and
    returns the ``BatchResult``, so calls chain. The last call for a job wins.
    """

    def __init__(self) -> None:
        #: job id -> ("ok", result) or ("error", exception or text)
        self._plan: dict[str, tuple[str, Any]] = {}

    def ack(self, job: object, result: Any = None) -> BatchResult:
        """Ack ``job`` with ``result`` (any JSON, the result size limit applies)."""
        self._plan[_key(job)] = ("ok", result)
        return self

    def fail(self, job: object, error: BaseException | str) -> BatchResult:
        """Fail this attempt of ``job``: retried after the queue's backoff, dead at ``max_attempts``.

        ``error`` is the text to store, or an exception settled as a one-job
        handler's (so :class:`PermanentFailure`, :class:`RetryAfter` and
        :class:`Snooze` instances keep their meaning).
        """
        self._plan[_key(job)] = ("error", error)
        return self

    def retry(self, job: object, delay_ms: int, error: str | None = None) -> BatchResult:
        """Fail this attempt of ``job`` and retry it ``delay_ms`` (0 - 30 days) later instead of the backoff."""
        return self.fail(job, RetryAfter(delay_ms, error))

    def snooze(self, job: object, delay_ms: int) -> BatchResult:
        """Put ``job`` off for ``delay_ms`` (0 - 30 days); the attempt is given back."""
        return self.fail(job, Snooze(delay_ms))

    def dead(self, job: object, error: str) -> BatchResult:
        """Make ``job`` dead at once, with ``error`` as its last error."""
        return self.fail(job, PermanentFailure(error))

    def __repr__(self) -> str:
        return f"<BatchResult naming {len(self._plan)} jobs>"


def _text_outcome(text: str, started: float) -> Outcome:
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    return Outcome("failed", error=text, summary=first[:200], elapsed_ms=since(started))


def _plan_outcomes(ids: list[str], plan: dict[str, tuple[str, Any]], started: float) -> dict[str, Outcome]:
    """Per job id of ``ids`` (the batch as claimed), the outcome of a handler's plan (unnamed jobs: acked with ``None``).

    Raises ``ValueError`` naming an id that is not a job of the batch.
    """
    known = set(ids)
    stray = [k for k in plan if k not in known]
    if stray:
        raise ValueError(f"the batch handler settled {stray[0]!r}, which is not a job of this batch")
    elapsed = since(started)
    out: dict[str, Outcome] = {}
    for job_id in ids:
        kind, value = plan.get(job_id, ("ok", None))
        if kind == "ok":
            out[job_id] = Outcome("ok", result=value, elapsed_ms=elapsed)
        elif isinstance(value, BaseException):
            out[job_id] = failure_outcome(value, started)
        else:
            out[job_id] = _text_outcome(str(value), started)
    return out


def _plan_of(returned: Any) -> dict[str, tuple[str, Any]]:
    """The per-job plan of what a batch handler returned; ``TypeError`` for a value of another kind."""
    if returned is None:
        return {}
    if isinstance(returned, BatchResult):
        return returned._plan
    if isinstance(returned, Mapping):
        return {_key(k): ("ok", v) for k, v in returned.items()}
    raise TypeError(
        f"a batch handler returns None, a mapping {{job id: result}} or a BatchResult, not {type(returned).__name__}"
    )


def _plan_of_failure(failure: BatchFailure) -> dict[str, tuple[str, Any]]:
    plan = {_key(k): ("ok", v) for k, v in failure.results.items()}
    plan.update({_key(k): ("error", v) for k, v in failure.errors.items()})
    return plan


def outcomes_of(batch: JobBatch, call: Callable[[JobBatch], Any]) -> dict[str, Outcome]:
    """Call ``call(batch)`` and turn what it returned or raised into one :class:`Outcome` per job id; never raises.

    The ids are those of ``batch`` before the call: the list is the handler's to
    change (pop, append, sort), and what it holds afterwards names no job.
    """
    ids = batch.ids
    started = time.monotonic()
    try:
        return _plan_outcomes(ids, _plan_of(call(batch)), started)
    except BatchFailure as failure:
        try:
            return _plan_outcomes(ids, _plan_of_failure(failure), started)
        except BaseException as exc:  # noqa: BLE001 - a malformed BatchFailure fails the batch
            return {job_id: failure_outcome(exc, started) for job_id in ids}
    except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not kill a runner thread
        whole = failure_outcome(exc, started)
        return dict.fromkeys(ids, whole)


class BatchItemFailed(Exception):
    """The text a batch handler gave as one job's error, raised when it runs one job at a time (:func:`one_at_a_time`)."""


def one_at_a_time(fn: Callable[[JobBatch], Any]) -> Callable[[JobContext], Any]:
    """A one-job handler calling the batch handler ``fn`` with a batch of one job, settled as ``fn`` says.

    ``django_fq.testing``'s ``drain()`` and inline mode run a batch handler
    this way (one job per call, in the calling thread). The job's result is
    returned; its error is raised: the exception ``fn`` named (or raised), or
    :class:`BatchItemFailed` with the text it gave.
    """

    def run(job: JobContext) -> Any:
        batch = JobBatch(job.queue, [job])
        try:
            plan = _plan_of(fn(batch))
        except BatchFailure as failure:
            plan = _plan_of_failure(failure)
        stray = [k for k in plan if k != job.id]
        if stray:
            raise ValueError(f"the batch handler settled {stray[0]!r}, which is not a job of this batch")
        kind, value = plan.get(job.id, ("ok", None))
        if kind == "ok":
            return value
        if isinstance(value, BaseException):
            raise value
        raise BatchItemFailed(str(value))

    run.__wrapped__ = fn  # type: ignore[attr-defined]
    return run


# --- configuration ---------------------------------------------------------------------------


def batch_sizes(worker: Worker) -> dict[str, int]:
    """``{queue: batch size}`` of the worker's queues whose handler takes batches.

    A queue's size comes from the registry (``@handler(q, batch=N)`` or its
    ``FQ_HANDLERS`` entry) when the worker runs the registered handler, or
    from a ``fq_batch`` attribute on a handler given in ``handlers=``.
    """
    sizes: dict[str, int] = {}
    for queue, fn in worker.handlers.items():
        size = size_of(queue, fn)
        if size is not None:
            sizes[queue] = size
    return sizes


def size_of(queue: str, fn: Callable) -> int | None:
    """The batch size of ``fn`` as the handler of ``queue`` (``None``: a one-job handler); ``ValueError`` for a bad one."""
    size = registry.batch_of(queue) if registry.get(queue) is fn else None
    if size is None:
        size = registry.check_batch(getattr(fn, "fq_batch", None), f"handler of {queue!r}")
    return size


def handler_problem(queue: str, fn: Callable) -> str | None:
    """Why ``fn`` cannot be the batch handler of ``queue`` (``None``: it can); the text names the queue.

    Used by the worker at start and by the system check ``django_fq.E016``.
    """
    from .aio import is_async_handler

    if is_async_handler(fn):
        return f"queue {queue!r}: a batch handler must be a plain function, not async (docs/how-to/batch-handlers.md)"
    return None


def check_worker(worker: Worker, pool: object) -> None:
    """Refuse what a batch queue cannot run with: an ``async def`` handler, ``--pool processes``.

    Raises :class:`WorkerConfigError` naming the queue.
    """
    for queue in worker.batches:
        problem = handler_problem(queue, worker.handlers[queue])
        if problem:
            raise WorkerConfigError(problem)
        if pool == "processes":
            raise WorkerConfigError(
                f"queue {queue!r} has a batch handler, which runs in the worker's process: "
                "serve it with --pool threads (docs/how-to/batch-handlers.md)"
            )


def extra_capacity(worker: Worker) -> int:
    """Jobs the worker may hold for its batch queues: per queue, ``concurrency`` running batches and one claimed ahead."""
    return sum(size * (worker.concurrency + 1) for size in worker.batches.values())


# --- running ---------------------------------------------------------------------------------


class BatchRunner:
    """Runs the batches of a worker's batch queues on ``concurrency`` threads of its own.

    The claim loop asks :meth:`room` how many jobs a claim of a batch queue
    may take (:meth:`room_outside` for the other queues) and hands each
    claimed batch to :meth:`add`.
    """

    def __init__(self, worker: Worker):
        self.worker = worker
        self.hand = worker.hand
        self.sizes = worker.batches
        self._work: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def start(self) -> None:
        for n in range(self.worker.concurrency):
            thread = threading.Thread(target=self._loop, name=f"fq-batch-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Let each thread end once the batches already added are done."""
        for _ in self._threads:
            self._work.put(None)

    def _held(self) -> dict[str, int]:
        """Jobs in hand per batch queue (one pass over the hand; a claim round is per batch, not per job)."""
        held = dict.fromkeys(self.sizes, 0)
        with self.hand.lock:
            for running in self.hand.jobs.values():
                queue = running.claimed.queue
                if queue in held:
                    held[queue] += 1
        return held

    def room(self, queue: str, free: int) -> int:
        """How many jobs the next claim of batch queue ``queue`` may take (0: wait for a batch to settle).

        ``free`` is the worker's free slots. A claim takes at most one batch, and
        none while less than a quarter of a batch fits (the next settle frees more).
        """
        size = self.sizes[queue]
        held = self._held()[queue]
        room = min(size, size * (self.worker.concurrency + 1) - held, free)
        if held and room < max(1, size // 4):
            return 0
        return max(0, room)

    def room_outside(self, free: int) -> int:
        """The free slots of the worker's other queues: ``concurrency + prefetch`` minus their jobs in hand."""
        in_batches = sum(self._held().values())
        base = self.worker.concurrency + self.worker.prefetch
        return max(0, min(free, base - (len(self.hand) - in_batches)))

    def add(self, runnings: list[Running]) -> None:
        """Record one claimed batch in the worker's hand and queue it for a batch thread."""
        items: list[tuple[int, Running]] = []
        self.hand.add(runnings, lambda seq, running: items.append((seq, running)))
        self._work.put(items)

    def _loop(self) -> None:
        try:
            while True:
                items = self._work.get()
                if items is None:
                    return
                try:
                    self.run_batch(items)
                except Exception as exc:  # a runner must survive anything
                    log.exception("worker internal error")
                    emit(
                        logging.ERROR,
                        "worker.internal_error",
                        worker=self.worker.worker_id,
                        step="batch",
                        error=summary(exc),
                    )
                    self.hand.free([seq for seq, _ in items])
        finally:
            connections.close_all()

    def run_batch(self, items: list[tuple[int, Running]]) -> None:
        """Run one batch through its handler and settle each of its jobs; frees every slot it does not hand over."""
        worker, hand = self.worker, self.hand
        live: list[tuple[int, Running]] = []
        done: list[int] = []
        for seq, running in items:
            if running.state.lost.is_set():
                done.append(seq)  # released at shutdown before it started
            elif not hand.begin(running, worker.stopping):
                if hand.take(running):  # claimed ahead, and the worker is stopping
                    worker.settler.release(running, "shutdown")
                done.append(seq)
            else:
                live.append((seq, running))
        try:
            if live:
                done.extend(self._run_live(live))
        finally:
            if done:
                hand.free(done)
            tidy_connections()

    def _run_live(self, live: list[tuple[int, Running]]) -> list[int]:
        """Call the handler on the started jobs and settle them; return the seqs the completer did not take."""
        worker = self.worker
        queue = live[0][1].claimed.queue
        batch = JobBatch(queue, [running.context for _, running in live])
        waits = [job_started(worker, running)[0] for _, running in live]
        outcomes = outcomes_of(batch, worker.chains[queue])
        if abandon_open_transactions():
            # The handler left a transaction open: its writes are rolled back, so no job succeeded.
            error = "the batch handler left a database transaction open; it was rolled back"
            outcomes = {
                k: Outcome("failed", error=error, summary=error, elapsed_ms=o.elapsed_ms) for k, o in outcomes.items()
            }
        acks: list[tuple[int, Running, Outcome]] = []
        rest: list[tuple[int, Running, Outcome]] = []
        for (seq, running), wait_ms in zip(live, waits, strict=True):
            outcome = outcomes[running.claimed.id]
            job_finished(worker, running, outcome, wait_ms)
            write_last_report(worker, running)
            (acks if outcome.kind == "ok" else rest).append((seq, running, outcome))
        taken = worker.completer.hand_over_many(acks) if acks else []
        unsettled = [seq for (seq, _, _), ok in zip(acks, taken, strict=True) if not ok]
        for (_seq, running, outcome), ok in zip(acks, taken, strict=True):
            if not ok:
                worker.settle(running, outcome)  # an unstorable result, a lost lease: judged one by one
        for seq, running, outcome in rest:
            worker.settle(running, outcome)
            unsettled.append(seq)
        return unsettled
