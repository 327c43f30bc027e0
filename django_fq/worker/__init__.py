"""The worker behind ``manage.py fq_worker``: claim jobs, run their handlers, settle them.

The worker is a client of :mod:`django_fq.services` like any other: it never
touches the models or SQL itself, so every guarantee (exclusive leases,
concurrency limits, receipts, replays) comes from the services and holds
across any number of workers and hosts.

Where each part lives (one module each; docs/explanation/worker.md tells why):

* :mod:`.core` — :class:`Worker`: checks its arguments, assembles the parts, ``run()``, shutdown.
* :mod:`.loop` — the claim loop (main thread): free slots, fair claims per queue, waits, when to stop;
  with queues on several database aliases, one loop per alias on a thread of its own.
* :mod:`.runner` — the runner pool interface and :class:`~.runner.ThreadPool` (``--concurrency`` threads).
* :mod:`.aio` — :class:`~.aio.AsyncioPool`: ``async def`` handlers on one event loop (docs/how-to/async-handlers.md).
* :mod:`.batch` — batch handlers (``@handler(q, batch=N)``): one call, one claim and one ``ack_many`` per batch.
* :mod:`.completer` — acks plain successes in batches (one ``ack_many`` per queue and batch).
* :mod:`.settle` — acks/nacks one run, releases at shutdown, retries a settle the database dropped.
* :mod:`.heartbeat` — extends the leases in hand; marks a lost one (``LeaseLost`` in the handler).
* :mod:`.reaper` — expired leases, counter folding, pruning, periodic jobs.
* :mod:`.presence` — the worker's row in the worker registry: start, one heartbeat per interval, shutdown.
* :mod:`.state` — the jobs in hand and the counts (one lock), the claim loop's doorbell.
* :mod:`.context` — :class:`JobContext` and :func:`current_job`: what a handler sees.
* :mod:`.events` — what the worker tells subscribers (metrics subscribe; so can you).
* :mod:`.options` — :class:`WorkerOptions`: every ``fq_worker`` option, declared once.
* :mod:`.supervisor` — ``--processes``: the children, restarts, signals.
* :mod:`.logs`, :mod:`.dbconn` — log lines (receipts masked) and per-thread database connections.

Thread safety, and what it means for handlers
---------------------------------------------

Handlers of one process run concurrently on different threads, so a handler
must not rely on module-level mutable state without a lock. Database access
from a handler is safe: Django gives every thread its own connection, the
worker closes a runner's connection when it is found broken and when the
thread ends, and recycles it after ``CONN_MAX_AGE`` seconds when that is a
positive number (with ``0`` or ``None`` a runner keeps its connection for its
life, like a persistent connection).

A Python thread cannot be killed. When a job's lease is lost, its timeout
passes, or the worker shuts down, the handler is *told* (``lease_lost``,
``timed_out``, :meth:`JobContext.check`, :meth:`JobContext.sleep`) but keeps
running until it returns. Long handlers should call ``check()`` between
steps. A job past its ``timeout_ms`` is failed by expiry handling (its lease
deadline never passes the timeout), recorded as a ``timeout`` attempt.

Receipts never leave the worker: a handler gets a :class:`JobContext` (id,
queue, payload, attempt, deadline, …) without one, no ``repr`` shows one, no
log line contains one, and receipt-shaped text that still reaches the
worker's logger is masked. Payloads are not logged either. Events carry no
receipt either.

A database error (connection dropped, server restarted, SQLite busy past its
retries) never ends the loop: it is logged, the broken connection is closed,
and the step is retried after a growing pause.

Log lines go to the ``django_fq.worker`` logger as ``event key=value ...``
(the fields are also attached to the record as ``record.fq``).
"""

from __future__ import annotations

from ..exceptions import LeaseLost, PermanentFailure, WorkerConfigError
from .context import JobContext, LeaseState, current_job
from .core import Worker, make_worker_id
from .dbconn import is_db_error
from .events import (
    EVENT_TYPES,
    Events,
    JobFinished,
    JobsClaimed,
    JobSettled,
    JobStarted,
    LeaseLostEvent,
    WorkerStarted,
    WorkerStopped,
    WorkerStopping,
)
from .logs import ReceiptMaskingFilter, emit, log
from .loop import MAX_CLAIM
from .options import MAX_PREFETCH, WorkerOptions
from .runner import RunnerPool, ThreadPool
from .settle import SETTLE_RETRY_S
from .state import Outcome, Running, WorkerStats
from .supervisor import EX_CONFIG, SUPERVISOR_ENV, Supervisor, child_command

#: The names of before the split into a package, for code (and tests) that imported them.
_LeaseState = LeaseState
_Running = Running

__all__ = [
    "EVENT_TYPES",
    "EX_CONFIG",
    "MAX_CLAIM",
    "MAX_PREFETCH",
    "SETTLE_RETRY_S",
    "SUPERVISOR_ENV",
    "Events",
    "JobContext",
    "JobFinished",
    "JobSettled",
    "JobStarted",
    "JobsClaimed",
    "LeaseLost",
    "LeaseLostEvent",
    "LeaseState",
    "Outcome",
    "PermanentFailure",
    "ReceiptMaskingFilter",
    "RunnerPool",
    "Running",
    "Supervisor",
    "ThreadPool",
    "Worker",
    "WorkerConfigError",
    "WorkerOptions",
    "WorkerStarted",
    "WorkerStats",
    "WorkerStopped",
    "WorkerStopping",
    "child_command",
    "current_job",
    "emit",
    "is_db_error",
    "log",
    "make_worker_id",
]
