"""Value types shared by every layer: job states and the frozen results of the API.

All instants are integers of **epoch milliseconds** taken from the database
clock; all durations are integers of milliseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class JobState(enum.StrEnum):
    """A job's reported state (docs/reference/semantics.md §3).

    ``scheduled`` and ``ready`` are one stored state (``queued``) told apart by
    comparing ``run_at`` with the database's current time. ``waiting``: some
    dependency has not succeeded yet (docs/reference/semantics.md §9 "Dependencies").
    """

    WAITING = "waiting"
    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


STATE_NAMES = tuple(s.value for s in JobState)

#: Names of the per-queue totals reported by ``stats`` (docs/reference/semantics.md §6, §9).
TOTAL_NAMES = (
    "enqueued",
    "deduplicated",
    "claimed",
    "acked",
    "nacked",
    "released",
    "expired",
    "timed_out",
    "retried",
    "cancelled",
    "dead",
)
#: Names of the time sums and counts reported by ``stats`` (milliseconds).
TIMING_NAMES = ("wait_ms_sum", "wait_count", "run_ms_sum", "run_count")


@dataclass(frozen=True)
class QueuePolicy:
    """A queue's policy (docs/reference/semantics.md §2). Durations in milliseconds."""

    concurrency: int = 0
    max_attempts: int = 25
    backoff_ms: int = 1000
    max_backoff_ms: int = 3_600_000
    visibility_ms: int = 30_000
    idempotency_retention_ms: int = 300_000
    timeout_ms: int = 0
    ttl_ms: int = 0
    key_concurrency: int = 0
    #: Claims allowed in any window of ``rate_window_ms`` (a claim of k jobs counts k); 0 = no rate limit
    #: (docs/reference/semantics.md §9 "Rate limits").
    rate_limit: int = 0
    rate_window_ms: int = 1000
    #: Claims of one concurrency key allowed in any window of ``rate_window_ms``; 0 = none
    #: (docs/reference/semantics.md §9 "Per-key limits").
    key_rate_limit: int = 0


@dataclass(frozen=True)
class QueueInfo:
    """A queue as listed by ``queues()``: its name, policy and counts per state.

    ``paused``: claims of the queue hand out nothing (:func:`~django_fq.services.pause`);
    ``paused_at``: since when (epoch ms, database clock), ``None`` while it runs.
    """

    name: str
    policy: QueuePolicy
    counts: dict[str, int]
    created_at: int
    paused: bool = False
    paused_at: int | None = None


@dataclass(frozen=True)
class PauseResult:
    """Outcome of ``pause(queue)`` / ``resume(queue)``.

    ``paused`` is the queue's flag after the call and ``paused_at`` since when
    it is paused (epoch ms, database clock; ``None`` once resumed).
    ``changed`` is False when the queue already was in that state: nothing was
    written (pausing again keeps the first ``paused_at``).
    """

    queue: str
    paused: bool
    paused_at: int | None
    changed: bool


@dataclass(frozen=True)
class EnqueueResult:
    """Outcome of one enqueue: the job id and whether this call created it.

    ``created`` is False when an idempotency token or unique key coalesced the
    call onto an existing job, whose id is then returned. ``enqueued_at`` is
    the new job's enqueue time (epoch ms, database clock); ``None`` when the
    call created no job.
    """

    id: str
    created: bool
    enqueued_at: int | None = None


@dataclass(frozen=True)
class ClaimedJob:
    """One job handed out by ``claim``.

    ``receipt`` is the capability that settles this lease (ack/nack/release/
    extend). It is left out of ``repr`` so it never lands in logs.
    ``metadata`` is the job's metadata (a dict), ``None`` when it has none.
    ``has_dependents``: other jobs depended on this one when it was claimed,
    so its ack also releases them (docs/reference/semantics.md §9
    "Dependencies"); pass its id in ``ack_many(..., has_dependents=...)`` and
    the ack takes that path at once.
    """

    id: str
    queue: str
    payload: Any
    receipt: str = field(repr=False)
    deadline: int
    attempts: int
    max_attempts: int
    priority: int
    enqueued_at: int
    claimed_at: int
    metadata: dict | None = None
    has_dependents: bool = False


class ClaimedJobs(list):
    """What ``claim`` returns: a list of :class:`ClaimedJob`, plus when a rate limit lets the next one through.

    ``rate_wait_ms`` is 0 unless the queue's rate limit
    (docs/reference/semantics.md §9 "Rate limits") stopped this claim short of
    ``count``; then it is how long after the claim's reading of the database
    clock the next job may be claimed, and ``rate_limited_until`` that instant
    (epoch ms, database clock). A claim made earlier gets no job of the queue.
    """

    rate_wait_ms: int = 0
    rate_limited_until: int | None = None

    def __init__(self, jobs=(), *, rate_wait_ms: int = 0, rate_limited_until: int | None = None):
        super().__init__(jobs)
        self.rate_wait_ms = rate_wait_ms
        self.rate_limited_until = rate_limited_until


@dataclass(frozen=True)
class SettleResult:
    """Outcome of ack / nack / release.

    ``state`` is the job's state right after the settle; ``run_at`` is when it
    becomes eligible again (nack/release into the queue) or ``None``.
    ``replay`` is True when this call repeated an already-recorded settle with
    the same receipt and therefore changed nothing (docs/reference/semantics.md §9).
    """

    id: str
    state: str
    run_at: int | None = None
    replay: bool = False


@dataclass(frozen=True)
class JobInfo:
    """A job's metadata, as returned by ``get`` (with payload) and ``jobs`` (without).

    Never carries a receipt. ``lease_deadline`` is set while the job runs.
    ``errors`` is the history of failed attempts, newest last, each entry
    ``{"at", "attempt", "kind", "error", "worker"}``. ``metadata`` is the
    job's metadata (``{}`` when none), ``tags`` its ``"tags"`` list.
    ``progress`` (a percentage, 0–100), ``progress_message`` and
    ``progress_at`` (epoch ms, database clock) are the last progress report
    of the job's current or latest run (``None``, ``""``, ``None`` before its
    first report; a new attempt starts with none; docs/how-to/progress.md).
    ``concurrency_key``: the key whose slots the job takes in a queue with
    ``key_concurrency`` (docs/reference/semantics.md §9 "Per-key limits"), or ``None``.
    ``snoozes``: how often the job was snoozed since its enqueue or last
    ``retry`` (at most 1,000; docs/reference/semantics.md §9 "Verbs and arguments").
    ``depends_on`` (``get`` only) lists the job's dependencies and
    ``dependents`` the jobs that depend on it (the first 1,000, oldest first),
    each ``{"id", "queue", "state", "on_failure", "pending"}`` (and ``"name"``
    for a named edge: a workflow step's name): ``pending``
    while the edge still holds the dependent ``waiting``
    (docs/reference/semantics.md §9 "Dependencies").
    """

    id: str
    queue: str
    state: str
    priority: int
    run_at: int
    enqueued_at: int
    changed_at: int
    attempts: int
    max_attempts: int
    timeout_ms: int
    unique_key: str | None
    idempotency: str | None
    last_error: str
    claimed_at: int | None
    finished_at: int | None
    lease_deadline: int | None
    worker: str
    payload: Any = None
    result: Any = None
    errors: list = field(default_factory=list)
    metadata: dict = field(default_factory=dict)
    tags: list = field(default_factory=list)
    progress: float | None = None
    progress_message: str = ""
    progress_at: int | None = None
    concurrency_key: str | None = None
    snoozes: int = 0
    depends_on: list = field(default_factory=list)
    dependents: list = field(default_factory=list)


@dataclass(frozen=True)
class JobPage:
    """One page of ``jobs``: the jobs and the opaque cursor of the next page (None at the end)."""

    jobs: list[JobInfo]
    next_cursor: str | None


@dataclass(frozen=True)
class QueueStats:
    """Counts per state, totals and observed times of one queue (docs/reference/semantics.md §6).

    ``counts`` is keyed by every :class:`JobState` value; ``totals`` by
    :data:`TOTAL_NAMES`; the ``*_ms_sum`` / ``*_count`` pairs measure wait time
    (claim − max(enqueued_at, run_at)) and run time (ack − claim), in ms.
    ``paused`` / ``paused_at``: as in :class:`QueueInfo`.
    """

    queue: str
    counts: dict[str, int]
    totals: dict[str, int]
    wait_ms_sum: int
    wait_count: int
    run_ms_sum: int
    run_count: int
    paused: bool = False
    paused_at: int | None = None


@dataclass(frozen=True)
class ReapResult:
    """What one reaper pass did: leases expired (by visibility / by timeout) and jobs made dead."""

    expired: int = 0
    timed_out: int = 0
    dead: int = 0


@dataclass(frozen=True)
class PruneResult:
    """What one prune pass removed: finished jobs, expired idempotency tokens, queues past their TTL,
    history rows, and the registry rows of workers gone for an hour (``workers``; docs/admin.md "Workers")."""

    jobs: int = 0
    tokens: int = 0
    queues: int = 0
    workers: int = 0
    #: Per-minute history rows older than ``FQ_HISTORY_RETENTION_MS`` (docs/reference/history.md).
    history: int = 0


@dataclass(frozen=True)
class WorkerInfo:
    """A worker process as it registered itself (:func:`django_fq.services.workers`; docs/admin.md "Workers").

    ``worker_id`` is the id on its leases (``hostname:pid:random`` unless
    ``--worker-id``); ``queues`` the queues it serves on ``database`` (the
    alias; with ``FQ_QUEUE_DATABASES`` a worker has a row on each alias it
    serves); ``concurrency`` its runner slots and ``running`` the jobs it ran
    at its last heartbeat; ``pool`` ``threads``, ``asyncio``,
    ``threads+asyncio`` or ``processes``; ``version`` its django-fq version.
    ``started_at`` and ``heartbeat_at`` are epoch ms (database clock),
    ``heartbeat_ms`` its heartbeat interval and ``age_ms`` how old its last
    heartbeat is. ``state`` is ``live``, or ``gone`` once the heartbeat is
    older than ``STALE_BEATS`` (3) intervals: the process died or lost the
    database (its leases then expire as usual).
    """

    worker_id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    running: int
    pool: str
    version: str
    started_at: int
    heartbeat_at: int
    heartbeat_ms: int
    age_ms: int
    state: str
    database: str
