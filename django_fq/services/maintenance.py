"""Maintenance verbs: reap (expire leases), prune (finished jobs, expired tokens), fold counters."""

from __future__ import annotations

from .. import batches, conf, db, routing, storage, validation
from ..types import PruneResult, ReapResult
from . import history
from . import keys as slots
from ._base import COUNTER_NAMES, add_counters, get_queue
from .leases import expire_leases
from .queues import expire_idle_queues
from .workers import prune_workers

#: Rows handled per transaction by reap and prune, so no pass holds locks for long.
BATCH = 1000


def _sum_fields(cls):
    """A combiner for :func:`routing.every_alias`: the field-wise sum of the dataclass answers of each alias."""

    def combine(answers):
        return cls(**{f: sum(getattr(a, f) for _alias, a in answers) for f in cls.__dataclass_fields__})

    return combine


@routing.every_alias(_sum_fields(ReapResult))
def reap(queue: str | None = None, *, limit: int = 10_000) -> ReapResult:
    """Handle leases past their deadline (database clock) as failed attempts.

    Each becomes ready/scheduled again after its backoff (counted from the
    deadline) or dead when out of attempts; a lease past the job's timeout is
    recorded as a timeout. ``queue`` limits the pass to one queue; ``limit``
    caps the leases handled in this call (in transactions of 1000). A pass
    over all queues also merges counter shards (:func:`fold_counters`). Held
    jobs of keys with room whose time has come are admitted
    (:func:`~django_fq.services.keys.wake`). Raises :class:`QueueNotFound` for an unknown ``queue``.
    """
    validation.integer(limit, "limit", 1, 10**9)
    queue_id = get_queue(queue).id if queue is not None else None
    expired = timed_out = dead = 0
    while expired + timed_out < limit:
        step = min(BATCH, limit - expired - timed_out)
        e, t, d = db.retrying(lambda step=step: expire_leases(db.connection(), queue_id=queue_id, limit=step))
        expired, timed_out, dead = expired + e, timed_out + t, dead + d
        if e + t < step:
            break
    # Held jobs of keys with room that became due (a delay, a retry backoff) are admitted now
    # (up to WAKE_BATCH keys a queue per pass; the reaper passes again within a second).
    slots.wake(queue_id=queue_id)
    if queue_id is None:
        fold_counters()
    return ReapResult(expired=expired, timed_out=timed_out, dead=dead)


@routing.every_alias(_sum_fields(PruneResult))
def prune(*, retention_ms: int | None = None, limit: int = 100_000) -> PruneResult:
    """Delete queues past their time to live, succeeded/cancelled jobs finished more than ``retention_ms`` ago, and expired tokens.

    ``retention_ms`` defaults to ``FQ_FINISHED_RETENTION_MS`` (7 days). Dead
    jobs are kept until retried, cancelled or their queue is deleted. Queues
    first (:func:`~django_fq.services.queues.expire_idle_queues`: empty and
    idle for their ``ttl_ms``), so that the activity their finished jobs show
    is recorded before those jobs go. Per-minute history rows older than
    ``FQ_HISTORY_RETENTION_MS`` (8 days) go too. Deletes in batches of 1000, at most
    ``limit`` rows of each kind per call. Also merges counter shards
    (:func:`fold_counters`) and deletes the registry rows of workers gone for
    an hour (:func:`~django_fq.services.workers.prune_workers`).
    """
    retention = conf.get("FQ_FINISHED_RETENTION_MS") if retention_ms is None else retention_ms
    validation.integer(retention, "retention_ms", 0, 10 * 3653 * validation.DAY_MS)
    validation.integer(limit, "limit", 1, 10**9)
    queues = len(expire_idle_queues(limit=min(limit, 10_000)))
    conn = db.connection()
    now = db.now_sql(conn)
    store = storage.for_connection(conn)

    def job_batch(size):
        return store.prune_jobs(db.connection(), now=now, retention_ms=int(retention), limit=size)

    def token_batch(size):
        conn = db.connection()
        gone = store.prune_tokens(conn, now=now, limit=size)
        for queue_id in set(gone):
            add_counters(conn, queue_id, token_rows=-gone.count(queue_id))
        return len(gone)

    def batch_batch(size):
        return batches.prune(db.connection(), retention_ms=int(retention), limit=size)

    jobs = tokens = 0
    while db.retrying(batch_batch, BATCH) == BATCH:
        pass  # finished and cancelled batches past the retention (their members stay, as finished jobs)
    while jobs < limit:
        n = db.retrying(job_batch, min(BATCH, limit - jobs))
        jobs += n
        if n < BATCH:
            break
    while tokens < limit:
        n = db.retrying(token_batch, min(BATCH, limit - tokens))
        tokens += n
        if n < BATCH:
            break
    # Per-minute history past FQ_HISTORY_RETENTION_MS (docs/reference/history.md), as bounded as the rest.
    minutes = history.prune_history(limit=limit)
    fold_counters()
    return PruneResult(
        jobs=jobs, tokens=tokens, queues=queues, workers=db.retrying(prune_workers, atomic=False), history=minutes
    )


@routing.every_alias(lambda answers: sum(n for _alias, n in answers))
def fold_counters() -> int:
    """Merge each queue's counter shards into one; return the shards removed.

    Shards held by a running transaction are skipped (PostgreSQL ``SKIP
    LOCKED``), so this never waits; totals are unchanged by a fold.
    """
    conn = db.connection()
    store = storage.for_connection(conn)
    removed = 0
    queue_ids = store.queues_with_shards(conn)

    def fold(queue_id):
        return store.fold_shards(db.connection(), queue_id, COUNTER_NAMES)

    for queue_id in queue_ids:
        removed += db.retrying(fold, queue_id)
    return removed
