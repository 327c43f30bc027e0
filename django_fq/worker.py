"""The worker behind ``manage.py fq_worker``: claim jobs, run their handlers on threads, settle them.

The worker is a client of :mod:`django_fq.services` like any other: it never
touches the models or SQL itself, so every guarantee (exclusive leases,
concurrency limits, receipts, replays) comes from the services and holds
across any number of workers and hosts.

How one worker process is organised
-----------------------------------

* **Main thread** — the claim loop. Each round it counts its free slots
  (``concurrency`` minus jobs in hand) and claims that many jobs in one
  ``claim`` call per queue (at most 1000). Several queues are served fairly:
  the queue a round starts with rotates, and a round gives each queue its
  share of the free slots, so a busy queue cannot starve a small one. When a
  round finds nothing the thread sleeps until an enqueue is notified
  (PostgreSQL LISTEN/NOTIFY through :mod:`django_fq.wakeup`), a job finishes,
  a stop is requested, or the poll interval passes. The poll interval starts
  at ``poll_interval_ms`` and doubles while idle up to ``max_poll_interval_ms``
  (reset when work is found); on PostgreSQL polling is only the safety net
  (delayed jobs becoming due, a notification lost while reconnecting).
* **Runner threads** (``concurrency`` of them) — each takes a claimed job,
  runs the queue's handler and settles the lease in :meth:`Worker.settle`:
  the handler returns → ``ack`` (its return value is the result); raises
  :class:`~django_fq.exceptions.PermanentFailure` → dead at once; raises
  anything else → ``nack`` with the text and traceback.
* **Heartbeat thread** — extends each running job's lease every
  ``heartbeat_fraction`` (1/3) of its visibility, so a job may run far longer
  than its lease while its worker is alive and connected. When an extend is
  refused (the lease expired, was taken by a newer claim, or the job was
  cancelled), or the lease's deadline passed without a successful extend,
  or the job's own ``timeout_ms`` was reached, the job's context is marked
  lost at once: ``current_job().lease_lost`` turns true and
  ``current_job().check()`` raises :class:`LeaseLost`. The worker then never
  settles that run: the reaper, the canceller or the newer claim decides.
* **Reaper thread** (unless disabled) — ``services.reap()`` every
  ``reaper_interval_ms`` (which also folds the counter shards),
  ``services.prune()`` every ``prune_interval_ms``, and
  ``django_fq.scheduler.run_due()`` when that module exists (periodic jobs).

Thread safety, and what it means for handlers
---------------------------------------------

Handlers of one process run concurrently on different threads, so a handler
must not rely on module-level mutable state without a lock. Database access
from a handler is safe: Django gives every thread its own connection, the
worker closes a runner's connection when it is found broken and when the
thread ends, and recycles it after ``CONN_MAX_AGE`` seconds when that is a
positive number (with ``0`` or ``None`` a runner keeps its connection for its
life, like a persistent connection). The worker's own state (the jobs in
hand, counters) is guarded by one lock; a job's context is written by the
heartbeat thread and read by the handler through thread-safe primitives.

A Python thread cannot be killed. When a job's lease is lost, its timeout
passes, or the worker shuts down, the handler is *told* (``lease_lost``,
``timed_out``, :meth:`JobContext.check`, :meth:`JobContext.sleep`) but keeps
running until it returns. Long handlers should call ``check()`` between
steps. A job past its ``timeout_ms`` is failed by expiry handling (its lease
deadline never passes the timeout), recorded as a ``timeout`` attempt.

Receipts never leave the worker: a handler gets a :class:`JobContext` (id,
queue, payload, attempt, deadline, …) without one, no ``repr`` shows one, no
log line contains one, and receipt-shaped text that still reaches the
worker's logger is masked. Payloads are not logged either.

Shutdown, crashes and outages
-----------------------------

* :meth:`Worker.request_stop` (SIGTERM/SIGINT in ``fq_worker``): no claim is
  made any more; running jobs get ``grace_s`` seconds to finish (and are
  settled normally); the rest are released with ``error="shutdown"``
  (ready again at once, the attempt given back) and :meth:`Worker.run`
  returns. A second signal ends the process at once; the leases then expire.
* ``kill -9`` loses nothing: the leases expire and the reaper requeues.
* A database error (connection dropped, server restarted, SQLite busy past
  its retries) never ends the loop: it is logged, the broken connection is
  closed, and the step is retried after a growing pause. A settle whose
  outcome is unknown (the connection dropped during ``ack``) is repeated
  with the same receipt and arguments: the services answer an exact repeat
  with the recorded outcome flagged as a replay, so retrying is safe.

Log lines go to the ``django_fq.worker`` logger as ``event key=value ...``
(the fields are also attached to the record as ``record.fq``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import os
import queue as queue_module
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import Error as DjangoDbError
from django.db import OperationalError, connections

from . import conf, services, validation, wakeup
from . import handlers as registry
from .exceptions import (
    FqError,
    InvalidArgument,
    InvalidJson,
    InvalidReceipt,
    LeaseLost,
    PayloadTooLarge,
    PermanentFailure,
    QueueNotFound,
    ReceiptCancelled,
    WorkerConfigError,
)
from .types import ClaimedJob, SettleResult

log = logging.getLogger("django_fq.worker")
_T = TypeVar("_T")

#: Anything shaped like a receipt (``fq1.<job>.<generation>.<secret>``), masked in log lines.
_RECEIPT_TEXT = re.compile(r"fq1\.[0-9A-Za-z_.\-]+")
#: Longest exception message repeated in a log line (the full text goes into the job's error).
_LOG_MESSAGE_CHARS = 200
#: Pause after a database error of the claim loop, doubling up to the cap (seconds).
_ERROR_BACKOFF_S, _ERROR_BACKOFF_MAX_S = 0.25, 10.0
#: How long a settle whose outcome is unknown is retried before the lease is left to expire (seconds).
SETTLE_RETRY_S = 120.0
#: How often policies (the default visibility of each queue) are read again (seconds).
_POLICY_TTL_S = 30.0
#: Consecutive failed claim rounds after which a ``burst`` run gives up (a long-running worker never does).
_BURST_DB_FAILURES = 5
#: Most jobs one claim call asks for (docs/reference/semantics.md §5).
MAX_CLAIM = 1000
#: A claim that got fewer jobs than it asked for makes the next claim of that queue ask for
#: twice as many as it got, at least _MIN_ASK; one that got all it asked for, _ASK_GROWTH times
#: as many (up to the free slots). A claim prepares a receipt secret for every job it asks for,
#: so an idle worker woken for one job should not prepare hundreds; a burst of work is back to
#: full batches within a few round trips (2, 8, 32, 128, ...).
_MIN_ASK = 2
_ASK_GROWTH = 4
#: Most jobs a worker may claim ahead of its runner threads.
MAX_PREFETCH = 10_000
#: Most jobs one ``ack_many`` call of the completer settles.
_ACK_BATCH = 500
#: Environment variable naming test-only faults to inject (see :meth:`Worker._inject`).
FAULTS_ENV = "FQ_TEST_WORKER_FAULTS"
#: Set by the supervisor in each child: the supervisor's pid (a child stops when it is orphaned).
SUPERVISOR_ENV = "FQ_WORKER_SUPERVISOR_PID"
#: Exit status of a supervised child that cannot start as configured (sysexits' EX_CONFIG): a metrics
#: port that cannot be bound, a failed system check, handlers that do not load. Not restarted.
EX_CONFIG = 78


def make_worker_id() -> str:
    """A worker id for leases and logs: ``hostname:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class ReceiptMaskingFilter(logging.Filter):
    """Mask receipt-shaped text in a log record (defence in depth: the worker never logs one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "fq1." in message:
            record.msg = _RECEIPT_TEXT.sub("fq1.[masked]", message)
            record.args = None
        return True


if not any(isinstance(f, ReceiptMaskingFilter) for f in log.filters):
    log.addFilter(ReceiptMaskingFilter())


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return json.dumps(text, ensure_ascii=False)


def emit(level: int, event: str, **fields: Any) -> None:
    """Log ``event key=value ...`` on the worker's logger (``None`` values are left out)."""
    if not log.isEnabledFor(level):
        return
    kept = {k: v for k, v in fields.items() if v is not None}
    line = " ".join([event, *(f"{k}={_fmt(v)}" for k, v in kept.items())])
    log.log(level, line, extra={"fq": {"event": event, **kept}})


# --- what a handler sees ----------------------------------------------------------------------


class _LeaseState:
    """The part of a lease a handler may observe: deadline and loss. Holds no receipt."""

    __slots__ = ("deadline", "expires_mono", "lost", "reason", "at_timeout")

    def __init__(self, deadline: int, expires_mono: float = math.inf):
        self.deadline = deadline
        #: Earliest local (monotonic) time at which the deadline may have passed.
        self.expires_mono = expires_mono
        self.lost = threading.Event()
        self.reason: str | None = None
        #: The deadline is the job's timeout: it cannot be extended, and passing it is a timeout.
        self.at_timeout = False

    def mark_lost(self, reason: str) -> bool:
        """Record the loss (the first reason wins); False if it was already lost."""
        if self.lost.is_set():
            return False
        self.reason = reason
        self.lost.set()
        return True

    def is_lost(self) -> bool:
        return self.lost.is_set() or time.monotonic() >= self.expires_mono

    def lost_reason(self) -> str | None:
        if self.lost.is_set():
            return self.reason
        if time.monotonic() >= self.expires_mono:
            return "timeout" if self.at_timeout else "expired"
        return None

    def __repr__(self) -> str:
        return f"<lease deadline={self.deadline} lost={self.lost_reason()}>"


#: The end of the worker's "no handler" errors: where a new user registers one.
_WHERE_HANDLERS_GO = (
    "register one with @handler('<queue>') in the fq_handlers module of an installed app, "
    "or in FQ_HANDLERS (see docs/quickstart.md)"
)


class JobContext:
    """What a handler gets about the job it runs (also from :func:`current_job`).

    Attributes: ``id``, ``queue``, ``payload``, ``attempts`` (also
    ``attempt``: this run included), ``max_attempts``, ``enqueued_at`` and
    ``claimed_at`` (epoch ms, database clock) and ``deadline`` (the current
    end of the lease, moved by each heartbeat). ``lease_lost``,
    ``lost_reason`` and ``timed_out`` say whether this run still holds its
    lease; :meth:`check` and :meth:`sleep` raise :class:`LeaseLost` once it
    does not. The receipt is deliberately not here: only the worker settles
    the job.
    """

    __slots__ = ("id", "queue", "payload", "attempts", "max_attempts", "enqueued_at", "claimed_at", "_lease")

    def __init__(
        self,
        *,
        id: str,
        queue: str,
        payload: Any,
        attempts: int,
        max_attempts: int,
        deadline: int,
        enqueued_at: int,
        claimed_at: int | None = None,
        lease: _LeaseState | None = None,
    ):
        self.id = id
        self.queue = queue
        self.payload = payload
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.enqueued_at = enqueued_at
        self.claimed_at = claimed_at
        self._lease = lease if lease is not None else _LeaseState(deadline)

    @classmethod
    def from_claim(cls, claimed: ClaimedJob, lease: _LeaseState | None = None) -> JobContext:
        """The context of a freshly claimed job (everything but its receipt)."""
        return cls(
            id=claimed.id,
            queue=claimed.queue,
            payload=claimed.payload,
            attempts=claimed.attempts,
            max_attempts=claimed.max_attempts,
            deadline=claimed.deadline,
            enqueued_at=claimed.enqueued_at,
            claimed_at=claimed.claimed_at,
            lease=lease,
        )

    @property
    def attempt(self) -> int:
        """The number of this run (1 for the first claim)."""
        return self.attempts

    @property
    def deadline(self) -> int:
        """The lease's current deadline (epoch ms, database clock); valid strictly before it."""
        return self._lease.deadline

    @property
    def lease_lost(self) -> bool:
        """True once this run no longer holds the job's lease (its result will not be stored)."""
        return self._lease.is_lost()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (see :class:`LeaseLost`), or ``None`` while it is held."""
        return self._lease.lost_reason()

    @property
    def timed_out(self) -> bool:
        """True once the job ran past its ``timeout_ms``."""
        return self._lease.lost_reason() == "timeout"

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease was lost; call it between the steps of a long job."""
        reason = self._lease.lost_reason()
        if reason is not None:
            raise LeaseLost(reason)

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking at once (with :class:`LeaseLost`) if the lease is lost."""
        give_up = time.monotonic() + max(0.0, seconds)
        while True:
            self.check()
            now = time.monotonic()
            if now >= give_up:
                return
            self._lease.lost.wait(min(give_up, self._lease.expires_mono) - now)

    def __repr__(self) -> str:
        return f"JobContext(id={self.id!r}, queue={self.queue!r}, attempt={self.attempts}/{self.max_attempts})"


_local = threading.local()


def current_job() -> JobContext | None:
    """The context of the job the calling thread runs for the worker, or ``None`` outside a handler."""
    return getattr(_local, "job", None)


# --- bookkeeping --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How one run of a handler ended, before settling.

    ``kind`` is ``ok`` (``result`` holds the return value), ``failed`` or
    ``permanent`` (``error`` holds the text to store: message + traceback,
    ``summary`` a one-line version for the log) or ``lost`` (the handler
    raised :class:`LeaseLost`).
    """

    kind: str
    result: Any = None
    error: str = ""
    summary: str = ""
    elapsed_ms: int = 0


@dataclass
class WorkerStats:
    """Counts of what a worker did.

    ``ok`` acked, ``failed`` nacked, ``settle_errors`` settles refused (the
    lease was gone or the job cancelled when the handler finished) or
    skipped because the lease was known to be lost, ``timed_out`` those of
    ``settle_errors`` whose lease ended at the job's own ``timeout_ms`` (the
    attempt is recorded as failed by the reaper step), ``released`` jobs
    given back at shutdown, ``claimed`` jobs claimed.
    """

    ok: int = 0
    failed: int = 0
    settle_errors: int = 0
    timed_out: int = 0
    released: int = 0
    claimed: int = 0

    @property
    def jobs(self) -> int:
        """Jobs run to the end of their handler (whatever the outcome)."""
        return self.ok + self.failed + self.settle_errors


class _Running:
    """A job in hand: its claim (with the receipt — never shown to the handler) and its lease timing."""

    __slots__ = (
        "claimed",
        "visibility_ms",
        "claim_start",
        "claim_end",
        "state",
        "context",
        "capped",
        "next_beat",
        "settling",
        "started",
        "begun",
    )

    def __init__(self, claimed: ClaimedJob, visibility_ms: int, claim_start: float, claim_end: float, fraction: float):
        self.claimed = claimed
        self.visibility_ms = visibility_ms
        self.claim_start = claim_start
        self.claim_end = claim_end
        self.state = _LeaseState(claimed.deadline, self.local_time_of(claimed.deadline))
        self.context = JobContext.from_claim(claimed, self.state)
        # The claim caps the first deadline at the job's timeout: a shorter lease than asked means
        # the deadline *is* the timeout, and extending cannot move it.
        self.capped = claimed.deadline - claimed.claimed_at < visibility_ms
        self.state.at_timeout = self.capped
        self.next_beat = claim_start + visibility_ms / 1000 * fraction
        self.settling = False
        self.started = time.monotonic()
        self.begun = False  # a runner thread took it (guarded by Worker._lock)

    def local_time_of(self, db_ms: int) -> float:
        """Earliest local monotonic time at which the database clock can read ``db_ms``.

        ``claimed_at`` was read by the database while the claim call ran, so
        at local time ``claim_start`` the database clock was at most
        ``claimed_at``: it reaches ``db_ms`` no earlier than this.
        """
        return self.claim_start + (db_ms - self.claimed.claimed_at) / 1000

    def where(self) -> dict:
        c = self.claimed
        return {"job": c.id, "queue": c.queue, "attempt": f"{c.attempts}/{c.max_attempts}"}


def is_db_error(exc: BaseException) -> bool:
    """True for errors of the database layer (connection lost, server restarting, locked, ...)."""
    if isinstance(exc, DjangoDbError):
        return True
    module = type(exc).__module__ or ""
    return module.startswith(("psycopg", "sqlite3", "_sqlite3"))


def _drop_connection() -> None:
    """Close this thread's django-fq connection after a database error (it reconnects on next use)."""
    try:
        connections[conf.database()].close()
    except Exception:  # noqa: BLE001 - closing a dead connection may fail too
        pass


def _abandon_open_transactions() -> bool:
    """Roll back and drop this thread's connections still inside an ``atomic()`` block; True if any.

    Called after a handler returns: nothing the worker does is inside a
    transaction at that point, so an open block is one the handler entered and
    never left. Keeping it would make the next job on this thread write into it.
    """
    found = False
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            continue
        found = True
        conn.in_atomic_block = False
        conn.atomic_blocks.clear()
        conn.savepoint_ids.clear()
        conn.needs_rollback = False
        conn.commit_on_exit = True
        try:
            conn.close()  # ends the server-side transaction without committing it
        except Exception:  # noqa: BLE001
            conn.connection = None
    return found


def _tidy_connections() -> None:
    """Between two jobs: close this thread's connections that are broken, left in a bad state, or too old.

    Like Django's ``close_old_connections`` but a ``CONN_MAX_AGE`` of 0 does
    not close after every job (a runner thread's connection is reused);
    a positive ``CONN_MAX_AGE`` still recycles it.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        try:
            if conn.in_atomic_block:
                continue  # never close under a transaction the handler left open (it would be a bug there)
            if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
                conn.close()
            elif conn.errors_occurred and not conn.is_usable():
                conn.close()
            elif conn.errors_occurred:
                conn.errors_occurred = False
            elif conn.settings_dict.get("CONN_MAX_AGE") and conn.close_at is not None and time.monotonic() >= conn.close_at:
                conn.close()
        except Exception:  # noqa: BLE001
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


# --- the worker ------------------------------------------------------------------------------------


class Worker:
    """Serve ``queues`` with their registered handlers until stopped.

    Args:
        queues: queue names to serve; ``None`` or empty serves every queue with
            a registered handler. A queue without a handler is a
            :class:`WorkerConfigError`.
        concurrency: jobs run at once (runner threads), 1–1000.
        prefetch: jobs claimed ahead of a free runner thread, 0–10000 (default 0).
            Their leases run (and are extended) while they wait, so keep it
            small unless jobs are short: it lets tiny jobs be claimed in
            large batches without hundreds of threads.
        visibility_ms: lease length of each claim; ``None`` uses each queue's policy.
        poll_interval_ms: first pause when a round found no work; doubles while
            idle up to ``max_poll_interval_ms``.
        reaper_interval_ms: run ``services.reap()`` this often (``reaper=False`` disables).
        prune_interval_ms: run ``services.prune()`` this often (0 disables), with the reaper.
        grace_s: after a stop request, how long running jobs may still finish.
        heartbeat_fraction: extend a lease each time this fraction of its visibility passed.
        burst: return once nothing is eligible and no job is running.
        max_jobs: claim at most this many jobs, then return when they are done.
        worker_id: id recorded on leases; default ``hostname:pid:random``. At most
            200 characters of text that encodes as UTF-8, without NUL.
        handlers: ``{queue: callable}`` to use instead of the registry (tests, embedding).
        install_signals: handle SIGTERM/SIGINT (only from the main thread).
        supervisor_pid: stop gracefully when the parent process is no longer this pid.

    Raises:
        WorkerConfigError: a queue without a handler or with an invalid name, an invalid
            ``worker_id``, ``visibility_ms`` outside 1 ms - 24 h, ``max_jobs`` below 1,
            ``concurrency``/``prefetch``/``heartbeat_fraction`` out of range.
    """

    def __init__(
        self,
        queues: Iterable[str] | None = None,
        *,
        concurrency: int = 1,
        prefetch: int = 0,
        visibility_ms: int | None = None,
        poll_interval_ms: int = 200,
        max_poll_interval_ms: int = 1000,
        reaper_interval_ms: int = 1000,
        prune_interval_ms: int = 60_000,
        reaper: bool = True,
        grace_s: float = 30.0,
        heartbeat_fraction: float = 1 / 3,
        burst: bool = False,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        handlers: dict[str, Callable] | None = None,
        install_signals: bool = False,
        supervisor_pid: int | None = None,
    ):
        known = registry.registered() if handlers is None else dict(handlers)
        wanted = list(dict.fromkeys(queues or ()))
        # What reaches the database is checked here, once: a value every claim would refuse
        # must stop the worker at start, not make each claim fail while jobs stay ready.
        for name in wanted:
            if not isinstance(name, str) or not validation.QUEUE_NAME.fullmatch(name):
                raise WorkerConfigError(f"invalid queue name {name!r}: use 1-200 characters from [A-Za-z0-9:._-]")
        if worker_id is not None:
            try:
                validation.worker_id(worker_id)
            except InvalidArgument:
                raise WorkerConfigError(
                    "worker_id must be at most 200 characters of valid text (UTF-8, no NUL)"
                ) from None
        if visibility_ms is not None:
            try:
                validation.visibility(visibility_ms)
            except InvalidArgument as exc:
                raise WorkerConfigError(f"visibility_ms: {exc.message}") from None
        if max_jobs is not None and (not isinstance(max_jobs, int) or max_jobs < 1):
            raise WorkerConfigError("max_jobs must be at least 1")
        if not wanted:
            wanted = sorted(known)
            if not wanted:
                raise WorkerConfigError(f"no handlers are registered, so there is no queue to serve; {_WHERE_HANDLERS_GO}")
        missing = [q for q in wanted if q not in known]
        if missing:
            raise WorkerConfigError(
                f"no handler is registered for queue(s): {', '.join(missing)}; {_WHERE_HANDLERS_GO}"
            )
        if not 1 <= concurrency <= MAX_CLAIM:
            raise WorkerConfigError(f"concurrency must be between 1 and {MAX_CLAIM}")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise WorkerConfigError(f"prefetch must be between 0 and {MAX_PREFETCH}")
        if not 0 < heartbeat_fraction < 1:
            raise WorkerConfigError("heartbeat_fraction must be between 0 and 1")
        self.queues: list[str] = wanted
        self.handlers: dict[str, Callable] = {q: known[q] for q in wanted}
        self.concurrency = concurrency
        self.prefetch = prefetch
        #: Jobs in hand at most: running, plus claimed ahead and waiting for a runner thread.
        self.capacity = concurrency + prefetch
        self._claim_floor = max(1, self.capacity // 4)
        #: Per queue: the most the next claim asks for (absent: as many as there are free slots).
        self._ask: dict[str, int] = {}
        self.visibility_ms = visibility_ms
        self.poll_interval_s = max(0, poll_interval_ms) / 1000
        self.max_poll_interval_s = max(self.poll_interval_s, max_poll_interval_ms / 1000)
        self.reaper_interval_s = max(0, reaper_interval_ms) / 1000
        self.prune_interval_s = max(0, prune_interval_ms) / 1000
        self.reaper = reaper
        self.grace_s = max(0.0, grace_s)
        self.heartbeat_fraction = heartbeat_fraction
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or make_worker_id()
        self.install_signals = install_signals
        self.supervisor_pid = supervisor_pid
        self.stats = WorkerStats()

        self._lock = threading.Lock()  # guards _running, stats
        self._cv = threading.Condition()  # wakes the main thread: notify, job finished, stop
        self._beat_cv = threading.Condition()  # wakes the heartbeat thread: new job, stop
        self._beat_dirty = False
        #: When the heartbeat thread wakes next by itself (monotonic seconds; guarded by _beat_cv);
        #: infinity while it is awake, as it may have looked at the jobs in hand already.
        self._beat_next = math.inf
        self._running: dict[int, _Running] = {}
        self._seq = 0
        self._work: queue_module.SimpleQueue = queue_module.SimpleQueue()
        # Finished jobs waiting for the completer thread's next ack_many batch.
        self._acks: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._stop_reason = ""
        self._stop_requested_at: float | None = None
        self._done = threading.Event()  # the loops of helper threads end
        self._notified = False
        self._rr = 0
        self._policies: dict[str, tuple[int, float]] = {}
        self._signals = 0
        self._listener: wakeup.Listener | None = None
        self._queue_set = set(self.queues)
        self._faults = _parse_faults(os.environ.get(FAULTS_ENV, ""))
        self._next_prune = 0.0
        self._scheduler = _UNSET

    # --- public control -----------------------------------------------------------------------

    def request_stop(self, reason: str = "stopped") -> None:
        """Stop claiming now; running jobs get ``grace_s`` to finish (safe from any thread or a signal handler)."""
        if not self._stopping:
            self._stop_reason = reason
            self._stop_requested_at = time.monotonic()
            self._stopping = True
        self._wake()

    def stop(self) -> None:
        """Same as :meth:`request_stop`."""
        self.request_stop("stopped")

    @property
    def running_count(self) -> int:
        """Jobs in hand (claimed and not yet settled or released)."""
        with self._lock:
            return len(self._running)

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Serve until stopped, out of work (``burst``) or past ``max_jobs``; return the counts."""
        if self.install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        self._listener = wakeup.listener()
        self._listener.subscribe(self._on_notify)
        emit(
            logging.INFO,
            "worker.start",
            worker=self.worker_id,
            pid=os.getpid(),
            queues=",".join(self.queues),
            concurrency=self.concurrency,
            visibility_ms=self.visibility_ms or "policy",
            burst=self.burst,
            reaper=self.reaper,
            wakeup="listen" if self._listener.active else "poll",
        )
        reason = "stopped"
        try:
            self._start_threads()
            reason = self._loop()
        finally:
            self._finish()
            emit(
                logging.INFO,
                "worker.stop",
                worker=self.worker_id,
                reason=reason,
                ok=self.stats.ok,
                failed=self.stats.failed,
                not_settled=self.stats.settle_errors,
                timed_out=self.stats.timed_out,
                released=self.stats.released,
            )
        return self.stats

    def _loop(self) -> str:
        poll = self.poll_interval_s
        backoff = 0.0
        failures = 0
        failing_since: float | None = None
        if self.reaper:
            try:
                self._reaper_round()  # once before the first claim, so a burst run reaps too
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                emit(logging.ERROR, "worker.db_error", worker=self.worker_id, step="reap", error=_summary(exc))
                _drop_connection()
        while True:
            self._check_parent()
            if self._stopping:
                return self._stop_reason
            allowance = self._allowance()
            if allowance is not None and allowance <= 0:
                if self.running_count == 0:
                    return "max jobs reached"
                self._wait(0.5, until_slot=True)
                continue
            running = self.running_count
            if running >= self.capacity or (running and self.capacity - running < self._claim_floor):
                # Claim in batches: while jobs are still running, wait until a
                # quarter of the slots are free instead of claiming one by one.
                self._wait(0.5, until_slot=True)
                continue
            with self._cv:
                self._notified = False
            try:
                got, more = self._claim_round()
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                failures += 1
                if self.burst and failures >= _BURST_DB_FAILURES:
                    raise
                backoff = min(_ERROR_BACKOFF_MAX_S, max(_ERROR_BACKOFF_S, backoff * 2))
                failing_since = failing_since or time.monotonic()
                emit(logging.ERROR, "worker.db_error", worker=self.worker_id, step="claim", retry_in_s=backoff, error=_summary(exc))
                _drop_connection()
                self._wait(backoff)
                continue
            if failing_since is not None:
                emit(logging.WARNING, "worker.reconnected", worker=self.worker_id, step="claim", after_s=time.monotonic() - failing_since)
                failing_since, backoff, failures = None, 0.0, 0
            if got:
                poll = self.poll_interval_s
                if more or self.burst or self.running_count >= self.capacity:
                    continue  # a queue gave all it was asked for (it may have more), or no slot is free
                # Queues are drained for now; a finished job, a notification or the poll brings the next round.
                self._wait(poll)
                continue
            # A burst run is done when a claim made while it held no job found nothing. A claim
            # made while jobs were in hand can come back empty because of them (a concurrency
            # limit they fill, a retry their nack is about to make ready): look again once they finish.
            if self.burst and running == 0 and self.running_count == 0:
                return "nothing left to do"
            emit(logging.DEBUG, "worker.idle", worker=self.worker_id, wait_s=poll)
            woke = self._wait(poll)
            if not woke:
                poll = min(self.max_poll_interval_s, max(poll * 2, 0.001))

    def _allowance(self) -> int | None:
        """Jobs still allowed by ``max_jobs`` (``None``: no limit)."""
        if self.max_jobs is None:
            return None
        with self._lock:
            return self.max_jobs - self.stats.claimed

    def _wait(self, timeout: float, *, until_slot: bool = False) -> bool:
        """Sleep up to ``timeout`` on the worker's condition; True if woken by a notification or stop."""
        give_up = time.monotonic() + timeout
        with self._cv:
            while not self._stopping:
                if until_slot:
                    free = self.capacity - len(self._running)
                    if free >= self._claim_floor or (free > 0 and not self._running):
                        return True
                elif self._notified:
                    return True
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return False
                # Short slices so an orphaned child notices its supervisor is gone.
                self._cv.wait(min(remaining, 1.0))
                self._check_parent()
            return True

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()
        with self._beat_cv:
            self._beat_dirty = True
            self._beat_cv.notify_all()

    def _on_notify(self, queue: str | None) -> None:
        if queue is None or queue in self._queue_set:
            with self._cv:
                self._notified = True
                self._cv.notify_all()

    def _check_parent(self) -> None:
        if self.supervisor_pid and not self._stopping and os.getppid() != self.supervisor_pid:
            emit(logging.WARNING, "worker.orphaned", worker=self.worker_id, supervisor=self.supervisor_pid)
            self.request_stop("supervisor gone")

    def _on_signal(self, signum: int, frame) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            emit(logging.INFO, "worker.signal", worker=self.worker_id, signal=name, action="graceful", grace_s=self.grace_s, running=len(self._running))
            self.request_stop(f"signal {name}")
            return
        emit(logging.WARNING, "worker.forced_exit", worker=self.worker_id, signal=name, running=len(self._running))
        for handler in log.handlers + logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(128 + signum)

    # --- claiming ---------------------------------------------------------------------------

    def _claim_round(self) -> tuple[int, bool]:
        """One fair pass over the queues, each claiming its share of the free slots.

        Returns the jobs claimed, and whether some queue gave all it was asked for (it may have more).
        """
        n = len(self.queues)
        start = self._rr
        self._rr = (self._rr + 1) % n
        got, more = 0, False
        for i in range(n):
            if self._stopping:
                break
            free = self.capacity - self.running_count
            allowance = self._allowance()
            if allowance is not None:
                free = min(free, allowance)
            if free <= 0:
                break
            name = self.queues[(start + i) % n]
            share = min(MAX_CLAIM, -(-free // (n - i)), self._ask.get(name, MAX_CLAIM))
            taken = self.claim_into(name, share)
            self._ask[name] = share * _ASK_GROWTH if taken == share else max(_MIN_ASK, 2 * taken)
            got += taken
            more = more or taken == share
        return got, more

    def _visibility_for(self, queue: str) -> int | None:
        """The lease length to ask for on ``queue``; ``None`` when the queue does not exist."""
        if self.visibility_ms is not None:
            return self.visibility_ms
        cached = self._policies.get(queue)
        if cached is not None and time.monotonic() - cached[1] < _POLICY_TTL_S:
            return cached[0]
        try:
            vis = services.policy(queue).visibility_ms
        except QueueNotFound:
            self._policies.pop(queue, None)
            return None
        self._policies[queue] = (vis, time.monotonic())
        return vis

    def claim_into(self, queue: str, count: int) -> int:
        """Claim up to ``count`` jobs of ``queue`` in one call and hand them to the runner threads."""
        vis = self._visibility_for(queue)
        if vis is None:
            return 0
        start = time.monotonic()
        try:
            jobs = services.claim(queue, count=count, visibility_ms=vis, worker=self.worker_id)
        except QueueNotFound:
            self._policies.pop(queue, None)
            return 0
        end = time.monotonic()
        if not jobs:
            return 0
        emit(logging.INFO, "worker.claim", worker=self.worker_id, queue=queue, asked=count, got=len(jobs))
        if self._stopping:
            # The stop came while claiming: these jobs never started, give them back at once.
            for claimed in jobs:
                self._release(_Running(claimed, vis, start, end, self.heartbeat_fraction), "shutdown")
            return 0
        soonest = math.inf  # when the new jobs first need the heartbeat thread: a beat, or the lease's end
        with self._lock:
            self.stats.claimed += len(jobs)
            for claimed in jobs:
                self._seq += 1
                running = _Running(claimed, vis, start, end, self.heartbeat_fraction)
                soonest = min(soonest, running.state.expires_mono if running.capped else running.next_beat)
                self._running[self._seq] = running
                self._work.put((self._seq, running))
        with self._beat_cv:
            # Wake the heartbeat thread only when it would otherwise sleep past that moment:
            # with leases of seconds it rarely does, and a needless wake-up competes with
            # the runner threads that are starting the jobs just claimed.
            if soonest < self._beat_next:
                self._beat_dirty = True
                self._beat_cv.notify_all()
        return len(jobs)

    # --- running and settling ------------------------------------------------------------------

    def _start_threads(self) -> None:
        for n in range(self.concurrency):
            self._spawn(self._runner, f"fq-runner-{n}")
        self._spawn(self._completer_loop, "fq-completer")
        self._spawn(self._heartbeat_loop, "fq-heartbeat")
        if self.reaper:
            self._spawn(self._reaper_loop, "fq-reaper")

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _runner(self) -> None:
        try:
            while True:
                item = self._work.get()
                if item is None:
                    return
                seq, running = item
                handed_over = False
                try:
                    if running.state.lost.is_set():
                        continue  # released at shutdown before it started
                    with self._lock:
                        start = not self._stopping and not running.settling
                        running.begun = start
                    if not start:
                        # Claimed ahead (prefetch) and not started: a stopping worker
                        # starts nothing new, it gives the job back at once.
                        if self._take(running):
                            self._release(running, "shutdown")
                        continue
                    outcome = self.execute(running)
                    if _abandon_open_transactions():
                        # The handler left a transaction open: its writes are rolled back,
                        # so the run cannot count as a success.
                        error = "the handler left a database transaction open; it was rolled back"
                        outcome = Outcome("failed", error=error, summary=error, elapsed_ms=outcome.elapsed_ms)
                    handed_over = self._queue_ack(seq, running, outcome)
                    if not handed_over:
                        self.settle(running, outcome)
                except Exception as exc:  # a runner thread must survive anything
                    log.exception("worker internal error")
                    emit(logging.ERROR, "worker.internal_error", **running.where(), error=_summary(exc))
                finally:
                    if not handed_over:  # else the completer frees the slot once the ack is in
                        self._free_slots([seq])
                    _tidy_connections()
        finally:
            connections.close_all()

    def _free_slots(self, seqs: list[int]) -> None:
        with self._lock:
            for seq in seqs:
                self._running.pop(seq, None)
        with self._cv:
            # A finished job frees a slot and may have made work eligible (a retry): look again.
            self._notified = True
            self._cv.notify_all()

    def _queue_ack(self, seq: int, running: _Running, outcome: Outcome) -> bool:
        """Hand a successful run to the completer thread, which acks in batches; False: settle it here.

        Only a plain success whose result can be stored goes to the batch; a
        failure, a lost lease or an unstorable result takes :meth:`settle`.
        """
        if outcome.kind != "ok" or running.state.lost_reason() is not None:
            return False
        if outcome.result is not None:
            try:
                validation.json_text(outcome.result, "result")
            except (InvalidJson, PayloadTooLarge):
                return False  # settle() turns it into a failed attempt with a clear error
        if not self._take(running):
            return False  # released at shutdown meanwhile; settle() sees that too
        self._acks.put((seq, running, outcome))
        return True

    def _completer_loop(self) -> None:
        """Ack finished jobs in batches: everything that finished while the previous batch was in flight.

        No job waits for a timer: a lone job is acked at once, and under load a
        batch forms by itself while the database answers the previous one.
        """
        try:
            while True:
                item = self._acks.get()
                if item is None:
                    return
                batch = [item]
                while len(batch) < _ACK_BATCH:
                    try:
                        more = self._acks.get_nowait()
                    except queue_module.Empty:
                        break
                    if more is None:
                        self._acks.put(None)  # finish this batch, then stop
                        break
                    batch.append(more)
                by_queue: dict[str, list] = {}
                for entry in batch:
                    by_queue.setdefault(entry[1].claimed.queue, []).append(entry)
                for queue_name, entries in by_queue.items():
                    try:
                        self._ack_batch(queue_name, entries)
                    except Exception as exc:  # the completer must survive anything
                        log.exception("worker internal error")
                        emit(logging.ERROR, "worker.internal_error", worker=self.worker_id, step="ack", error=_summary(exc))
                    finally:
                        self._free_slots([seq for seq, _, _ in entries])
                        _tidy_connections()
        finally:
            connections.close_all()

    def _ack_batch(self, queue_name: str, entries: list) -> None:
        """Ack ``entries`` of one queue with one ``ack_many``; log and count each like :meth:`settle`."""
        pending = []
        for _seq, running, outcome in entries:
            reason = running.state.lost_reason()
            if reason is not None:  # the lease went away after the handler returned
                self._count_lost(reason)
                emit(logging.WARNING, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, reason=f"lease_lost:{reason}")
            else:
                pending.append((running, outcome))
        if not pending:
            return
        pairs = [(r.claimed.receipt, o.result) for r, o in pending]
        try:
            results = self._settle_call(pending[0][0], "ack", lambda: services.ack_many(queue_name, pairs))
        except _SettleAbandoned as exc:
            self._count("settle_errors", len(pending))
            for running, outcome in pending:
                emit(logging.ERROR, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, reason=f"database unavailable: {exc}")
            return
        except QueueNotFound as exc:
            self._count("settle_errors", len(pending))
            for running, outcome in pending:
                emit(logging.ERROR, "job.not_settled", **running.where(), ms=outcome.elapsed_ms, code=exc.code, reason=exc.message)
            return
        for (running, outcome), settled in zip(pending, results, strict=True):
            where = running.where()
            if isinstance(settled, ReceiptCancelled):
                self._count("settle_errors")
                emit(logging.WARNING, "job.cancelled", **where, ms=outcome.elapsed_ms, code=settled.code, detail="cancelled while it ran; not settled")
            elif isinstance(settled, FqError):
                self._count("settle_errors")
                emit(logging.WARNING, "job.not_settled", **where, ms=outcome.elapsed_ms, code=settled.code, reason=settled.message)
            else:
                self._count("ok")
                emit(logging.INFO, "job.acked", **where, ms=outcome.elapsed_ms, replay=settled.replay or None)

    def execute(self, running: _Running) -> Outcome:
        """Run the handler of the job's queue on its context; never raises."""
        handler = self.handlers[running.claimed.queue]
        context = running.context
        started = time.monotonic()
        _local.job = context
        try:
            result = handler(context)
        except LeaseLost as exc:
            return Outcome("lost", error=str(exc), summary=exc.reason, elapsed_ms=_since(started))
        except PermanentFailure as exc:
            return Outcome("permanent", error=_error_text(exc), summary=_summary(exc), elapsed_ms=_since(started))
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not kill a runner thread
            return Outcome("failed", error=_error_text(exc), summary=_summary(exc), elapsed_ms=_since(started))
        finally:
            _local.job = None
        return Outcome("ok", result=result, elapsed_ms=_since(started))

    def _take(self, running: _Running) -> bool:
        """Reserve the right to settle ``running`` (once: the runner, or shutdown's release)."""
        with self._lock:
            if running.settling:
                return False
            running.settling = True
            return True

    def settle(self, running: _Running, outcome: Outcome) -> SettleResult | None:
        """Settle one finished job: ack or nack it according to ``outcome``; log and count it.

        This is the single place where a finished job's lease is settled. A
        run whose lease is known to be lost is not settled at all. A refused
        settle (expired, cancelled, ...) is logged and counted, never raised.
        A database error is retried with the same arguments (a repeat is
        answered as a replay) until the outcome is known.
        """
        expired = running.state.lost_reason()
        if expired is not None and not running.state.lost.is_set():
            # The handler saw the deadline pass before the heartbeat thread did:
            # record the loss now, so it is logged like any other.
            self._lost(running, expired)
        if not self._take(running):
            return None  # released at shutdown meanwhile
        where = running.where()
        claimed = running.claimed
        reason = running.state.lost_reason() or (outcome.summary if outcome.kind == "lost" else None)
        if reason is not None:
            self._count_lost(reason)
            emit(logging.WARNING, "job.not_settled", **where, ms=outcome.elapsed_ms, reason=f"lease_lost:{reason}")
            return None
        try:
            if outcome.kind == "ok":
                try:
                    settled = self._settle_call(running, "ack", lambda: services.ack(claimed.queue, claimed.receipt, result=outcome.result))
                except (InvalidJson, PayloadTooLarge) as exc:
                    # The handler succeeded but its return value cannot be stored.
                    error = f"the handler's return value cannot be stored as the job's result: {exc.message}"
                    outcome = Outcome("failed", error=error, summary=error, elapsed_ms=outcome.elapsed_ms)
                else:
                    self._count("ok")
                    emit(logging.INFO, "job.acked", **where, ms=outcome.elapsed_ms, replay=settled.replay or None)
                    return settled
            permanent = outcome.kind == "permanent"
            settled = self._settle_call(
                running, "nack", lambda: services.nack(claimed.queue, claimed.receipt, error=outcome.error, permanent=permanent)
            )
        except ReceiptCancelled as exc:
            self._count("settle_errors")
            emit(logging.WARNING, "job.cancelled", **where, ms=outcome.elapsed_ms, code=exc.code, detail="cancelled while it ran; not settled")
            return None
        except InvalidReceipt as exc:
            self._count("settle_errors")
            emit(logging.WARNING, "job.not_settled", **where, ms=outcome.elapsed_ms, code=exc.code, reason=exc.message)
            return None
        except FqError as exc:
            self._count("settle_errors")
            emit(logging.ERROR, "job.not_settled", **where, ms=outcome.elapsed_ms, code=exc.code, reason=exc.message)
            return None
        except _SettleAbandoned as exc:
            self._count("settle_errors")
            emit(logging.ERROR, "job.not_settled", **where, ms=outcome.elapsed_ms, reason=f"database unavailable: {exc}")
            return None
        self._count("failed")
        emit(
            logging.WARNING,
            "job.nacked",
            **where,
            ms=outcome.elapsed_ms,
            permanent=permanent or None,
            state=settled.state,
            run_at=settled.run_at,
            replay=settled.replay or None,
            error=outcome.summary,
        )
        return settled

    def _settle_call(self, running: _Running, op: str, call: Callable[[], _T]) -> _T:
        """Run a settle; on a database error close the connection and repeat it until the answer is known."""
        give_up = time.monotonic() + SETTLE_RETRY_S
        pause = 0.05
        tries = 0
        while True:
            tries += 1
            try:
                result = self._inject(op, call)
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                _drop_connection()
                if time.monotonic() + pause > give_up:
                    raise _SettleAbandoned(_summary(exc)) from exc
                emit(logging.WARNING, "job.settle_retry", **running.where(), op=op, tries=tries, retry_in_s=pause, error=_summary(exc))
                time.sleep(pause)
                pause = min(2.0, pause * 2)
                continue
            if tries > 1:
                outcomes = result if isinstance(result, list) else [result]
                replay = any(getattr(r, "replay", False) for r in outcomes)
                emit(logging.WARNING, "worker.reconnected", worker=self.worker_id, step=op, tries=tries, replay=replay)
            return result

    def _inject(self, op: str, call: Callable[[], _T]) -> _T:
        """Test hook: ``FQ_TEST_WORKER_FAULTS`` can drop the connection around the first settles.

        ``ack_before=N``: the first N acks fail before reaching the database;
        ``ack_after=N``: the first N acks commit, then the reply is "lost".
        Unset in production; nothing happens then.
        """
        if not self._faults:
            return call()
        with self._lock:
            before = self._faults.get(f"{op}_before", 0)
            after = self._faults.get(f"{op}_after", 0)
            if before:
                self._faults[f"{op}_before"] = before - 1
            elif after:
                self._faults[f"{op}_after"] = after - 1
        if before:
            _drop_connection()
            raise OperationalError(f"test fault: connection lost before the {op} reached the database")
        result = call()
        if after:
            _drop_connection()
            raise OperationalError(f"test fault: connection lost after the {op} committed")
        return result

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def _count_lost(self, reason: str) -> None:
        """Count a job whose lease was gone when its handler ended (``reason`` as :meth:`_lost` got it)."""
        with self._lock:
            self.stats.settle_errors += 1
            if reason == "timeout":
                self.stats.timed_out += 1

    # --- heartbeat ------------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        pending_reaps: list[tuple[float, str]] = []
        failing = False
        try:
            while not self._done.is_set():
                with self._beat_cv:
                    self._beat_dirty = False
                now = time.monotonic()
                with self._lock:
                    held = [r for r in self._running.values() if not r.settling and not r.state.lost.is_set()]
                wake = now + 1.0
                for running in held:
                    state = running.state
                    if now >= state.expires_mono:
                        reason = "timeout" if running.capped else "expired"
                        if self._lost(running, reason) and reason == "timeout":
                            slack = running.claim_end - running.claim_start
                            pending_reaps.append((state.expires_mono + slack + 0.05, running.claimed.queue))
                        continue
                    if not running.capped:
                        if now >= running.next_beat:
                            failing = self._beat(running, failing)
                        wake = min(wake, running.next_beat)
                    wake = min(wake, state.expires_mono)
                for due, queue in list(pending_reaps):
                    if now >= due:
                        pending_reaps.remove((due, queue))
                        self._reap_queue(queue)
                    else:
                        wake = min(wake, due)
                with self._beat_cv:
                    if not self._done.is_set() and not self._beat_dirty:
                        pause = max(0.005, wake - time.monotonic())
                        self._beat_next = time.monotonic() + pause
                        self._beat_cv.wait(pause)
                    self._beat_next = math.inf
        finally:
            connections.close_all()

    def _beat(self, running: _Running, failing: bool) -> bool:
        """Extend one lease; return whether the database is failing."""
        claimed = running.claimed
        started = time.monotonic()
        try:
            deadline = services.extend(claimed.queue, claimed.receipt, visibility_ms=running.visibility_ms)
        except ReceiptCancelled:
            self._lost(running, "cancelled")
            return failing
        except InvalidReceipt:
            self._lost(running, "invalid_receipt")
            return failing
        except QueueNotFound:
            self._lost(running, "queue_deleted")
            return failing
        except Exception as exc:
            if not is_db_error(exc):
                log.exception("heartbeat failed")
            elif not failing:
                emit(logging.ERROR, "worker.db_error", worker=self.worker_id, step="extend", error=_summary(exc))
            _drop_connection()
            # Try again soon; the lease counts as lost once its deadline may have passed.
            running.next_beat = time.monotonic() + min(1.0, max(0.02, running.visibility_ms / 10_000))
            return True
        if failing:
            emit(logging.WARNING, "worker.reconnected", worker=self.worker_id, step="extend")
        # An uncapped extend reads the database clock no earlier than this bound; a deadline
        # below ``bound + visibility`` was cut at the job's timeout.
        bound = claimed.claimed_at + (started - running.claim_end) * 1000
        with self._lock:
            if deadline < bound + running.visibility_ms - 2:
                running.capped = running.state.at_timeout = True
            if deadline > running.state.deadline:
                running.state.deadline = deadline
                running.state.expires_mono = running.local_time_of(deadline)
        running.next_beat = started + running.visibility_ms / 1000 * self.heartbeat_fraction
        return False

    def _lost(self, running: _Running, reason: str) -> bool:
        """Tell the handler its lease is gone (unless the job is being settled already)."""
        with self._lock:
            if running.settling:
                return False
            first = running.state.mark_lost(reason)
        if first:
            level = logging.INFO if reason == "shutdown" else logging.WARNING
            event = "job.timeout" if reason == "timeout" else "job.lease_lost"
            emit(level, event, **running.where(), reason=reason, deadline=running.state.deadline)
        return first

    def _reap_queue(self, queue: str) -> None:
        """Record a timed-out job's failure promptly (the same as the reaper would)."""
        try:
            services.reap(queue)
        except QueueNotFound:
            pass
        except Exception as exc:
            if not is_db_error(exc):
                raise
            _drop_connection()

    # --- reaper ------------------------------------------------------------------------------

    def _reaper_loop(self) -> None:
        failing = False
        try:
            while not self._done.wait(self.reaper_interval_s or 0.001):
                try:
                    self._reaper_round()
                except Exception as exc:
                    if not is_db_error(exc):
                        log.exception("reaper round failed")
                    elif not failing:
                        emit(logging.ERROR, "worker.db_error", worker=self.worker_id, step="reap", error=_summary(exc))
                    failing = True
                    _drop_connection()
                    continue
                if failing:
                    emit(logging.WARNING, "worker.reconnected", worker=self.worker_id, step="reap")
                    failing = False
        finally:
            connections.close_all()

    def _reaper_round(self) -> None:
        """Expire abandoned leases (and fold counters); prune and run due periodic jobs when due."""
        reaped = services.reap()
        if reaped.expired or reaped.timed_out:
            emit(logging.INFO, "reaper.pass", expired=reaped.expired, timed_out=reaped.timed_out, dead=reaped.dead)
        if self.prune_interval_s and time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + self.prune_interval_s
            pruned = services.prune()
            if pruned.jobs or pruned.tokens:
                emit(logging.INFO, "reaper.prune", jobs=pruned.jobs, tokens=pruned.tokens)
        scheduler = self._scheduler_module()
        if scheduler is not None:
            try:
                enqueued = scheduler.run_due()
            except Exception as exc:  # a broken schedule must not stop the reaper
                emit(logging.ERROR, "scheduler.error", error=_summary(exc))
                if is_db_error(exc):
                    raise
            else:
                if enqueued:
                    emit(logging.INFO, "scheduler.enqueued", jobs=enqueued)

    def _scheduler_module(self):
        """``django_fq.scheduler`` if it exists (periodic jobs), else ``None``; import errors are logged once."""
        if self._scheduler is _UNSET:
            self._scheduler = None
            try:
                if importlib.util.find_spec("django_fq.scheduler") is not None:
                    module = importlib.import_module("django_fq.scheduler")
                    if callable(getattr(module, "run_due", None)):
                        self._scheduler = module
            except Exception as exc:  # noqa: BLE001
                emit(logging.ERROR, "scheduler.error", error=f"cannot import django_fq.scheduler: {_summary(exc)}")
        return self._scheduler

    # --- shutdown -----------------------------------------------------------------------------

    def _finish(self) -> None:
        """Let running jobs finish within the grace period, release the rest, stop the helper threads."""
        # Jobs claimed ahead that no runner thread has started: give them back now,
        # not after the running ones finish (another worker can take them at once).
        with self._lock:
            waiting = [r for r in self._running.values() if not r.begun and not r.settling]
            for running in waiting:
                running.settling = True
        for running in waiting:
            self._release(running, "shutdown")
        if waiting:
            with self._lock:
                for seq in [k for k, r in self._running.items() if r in waiting]:
                    self._running.pop(seq, None)
        if self.running_count:
            give_up = (self._stop_requested_at or time.monotonic()) + self.grace_s
            emit(logging.INFO, "worker.draining", worker=self.worker_id, running=self.running_count, grace_s=max(0.0, give_up - time.monotonic()))
            with self._cv:
                while self._running and time.monotonic() < give_up:
                    self._cv.wait(min(0.1, give_up - time.monotonic()))
        with self._lock:
            left = [r for r in self._running.values() if not r.settling]
        for running in left:
            if self._take(running):
                self._release(running, "shutdown")
        self._done.set()
        for _ in range(self.concurrency):
            self._work.put(None)
        self._acks.put(None)
        with self._beat_cv:
            self._beat_dirty = True
            self._beat_cv.notify_all()
        for thread in self._threads:
            if thread.name in ("fq-completer", "fq-heartbeat", "fq-reaper"):
                thread.join(timeout=10)
        if self._listener is not None:
            self._listener.unsubscribe(self._on_notify)
        connections.close_all()

    def _release(self, running: _Running, reason: str) -> None:
        """Give a job back: ready now, attempt not counted (``services.release``); tell its handler."""
        running.state.mark_lost(reason)
        claimed = running.claimed
        for attempt in range(5):
            try:
                services.release(claimed.queue, claimed.receipt, error=reason)
            except InvalidReceipt as exc:
                emit(logging.WARNING, "job.not_released", **running.where(), code=exc.code, reason=exc.message)
                return
            except FqError as exc:
                emit(logging.ERROR, "job.not_released", **running.where(), code=exc.code, reason=exc.message)
                return
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                _drop_connection()
                if attempt == 4:
                    emit(logging.ERROR, "job.not_released", **running.where(), reason=f"database unavailable: {_summary(exc)}")
                    return
                time.sleep(0.2 * 2**attempt)
                continue
            self._count("released")
            emit(logging.INFO, "job.released", **running.where(), reason=reason)
            return


class _SettleAbandoned(Exception):
    """The database stayed unreachable for a whole settle retry window."""


_UNSET = object()


def _parse_faults(text: str) -> dict[str, int]:
    faults: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        faults[name.strip()] = int(count or 1)
    return faults


# --- several processes -----------------------------------------------------------------------------


class Supervisor:
    """Run ``processes`` worker processes, restart the ones that crash, forward stop signals.

    ``command(index)`` returns the argv of child ``index``. A child that
    exits 0 (``--burst`` finished, ``--max-jobs`` reached) is not restarted;
    one that crashes (non-zero exit, killed) is restarted after a pause that
    grows while it keeps crashing (1 s doubling to 30 s). A child that exits
    with :data:`EX_CONFIG` (78) on its first start could not start as
    configured, which a restart cannot cure: the others are stopped as on
    SIGTERM, nothing is restarted, and :meth:`run` returns 78
    (``failed_index`` names that child). A restarted child that exits 78
    (its metrics port still held by a leftover process, say) had started
    well before, so it is restarted like any crash. The first
    SIGTERM/SIGINT is forwarded to every child as SIGTERM (each then drains
    within its grace period) and no child is restarted any more; a second
    one is forwarded too (the children exit at once). Children run in their
    own process group, so a terminal's Ctrl-C reaches them only through the
    supervisor, and stop by themselves if the supervisor disappears.
    """

    RESTART_MIN_S, RESTART_MAX_S = 1.0, 30.0

    def __init__(self, command: Callable[[int], list[str]], processes: int, *, env: dict | None = None):
        self.command = command
        self.processes = processes
        self.env = dict(os.environ if env is None else env)
        self.env[SUPERVISOR_ENV] = str(os.getpid())
        self.children: dict[int, subprocess.Popen | None] = {}
        self._signals = 0
        self._restart_at: dict[int, float] = {}
        self._pause: dict[int, float] = {}
        self._finished: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        #: Index of the child that exited with EX_CONFIG on its first start, if one did.
        self.failed_index: int | None = None

    def run(self) -> int:
        """Start the children and look after them until every one has ended.

        Returns 0 when every child ended with status 0, :data:`EX_CONFIG`
        when one could not start as configured, 1 otherwise.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        emit(logging.INFO, "supervisor.start", pid=os.getpid(), processes=self.processes)
        for index in range(self.processes):
            self._start(index)
        while len(self._finished) < self.processes:
            now = time.monotonic()
            for index, child in list(self.children.items()):
                if index in self._finished:
                    continue
                stopping = self._signals or self.failed_index is not None
                if child is None:
                    if not stopping and now >= self._restart_at.get(index, 0):
                        self._start(index)
                    elif stopping:
                        self._finished[index] = 0
                    continue
                code = child.poll()
                if code is None:
                    continue
                emit(logging.INFO if code == 0 else logging.ERROR, "supervisor.child_exit", index=index, pid=child.pid, code=code)
                unstartable = code == EX_CONFIG and self._starts[index] == 1
                if unstartable and self.failed_index is None and not self._signals:
                    self.failed_index = index
                    emit(logging.ERROR, "supervisor.start_failed", index=index, code=code, action="stopping_all")
                    self._stop_children()
                if code == 0 or stopping or unstartable:
                    self._finished[index] = code
                    continue
                pause = self._pause.get(index, 0.0)
                pause = self.RESTART_MIN_S if pause == 0 else min(self.RESTART_MAX_S, pause * 2)
                if now - self._restart_at.get(index, 0) > 60:
                    pause = self.RESTART_MIN_S  # it ran a good while: not a crash loop
                self._pause[index] = pause
                self._restart_at[index] = now + pause
                self.children[index] = None
                emit(logging.WARNING, "supervisor.restart", index=index, in_s=pause)
            time.sleep(0.05)
        codes = list(self._finished.values())
        emit(logging.INFO, "supervisor.stop", codes=",".join(map(str, codes)))
        if self.failed_index is not None:
            return EX_CONFIG
        return 0 if all(c == 0 for c in codes) else 1

    def _start(self, index: int) -> None:
        child = subprocess.Popen(self.command(index), env={**self.env, "FQ_WORKER_INDEX": str(index)}, process_group=0)
        self.children[index] = child
        self._starts[index] = self._starts.get(index, 0) + 1
        self._restart_at[index] = time.monotonic()
        emit(logging.INFO, "supervisor.child_start", index=index, pid=child.pid)

    def _on_signal(self, signum: int, frame) -> None:
        self._signals += 1
        emit(logging.INFO, "supervisor.signal", signal=signal.Signals(signum).name, count=self._signals)
        self._stop_children()

    def _stop_children(self) -> None:
        """Send SIGTERM to every running child."""
        for child in self.children.values():
            if child is not None and child.poll() is None:
                try:
                    child.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass


def child_command(args: list[str]) -> list[str]:
    """argv that runs ``manage.py fq_worker <args>`` again in a fresh interpreter."""
    return [sys.executable, "-m", "django", "fq_worker", *args]


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= _LOG_MESSAGE_CHARS else line[: _LOG_MESSAGE_CHARS - 1] + "…"


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception cannot even describe itself."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return "<exception message could not be rendered>"


def _summary(exc: BaseException) -> str:
    """``Type: first line of the message`` for a log line."""
    message = _first_line(_text_of(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _error_text(exc: BaseException) -> str:
    """What a failed run stores: ``Type: message``, then the full traceback."""
    message = _text_of(exc)
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    try:
        trace = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001
        trace = "".join(traceback.format_tb(exc.__traceback__))
    return head + "\n\n" + trace
