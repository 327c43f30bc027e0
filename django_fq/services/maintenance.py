"""Maintenance verbs: reap (expire leases), prune (finished jobs, expired tokens), fold counters."""

from __future__ import annotations

from django.db.models import Sum

from .. import conf, db
from ..models import CounterDelta, Queue
from ..types import TIMING_NAMES, TOTAL_NAMES, PruneResult, ReapResult
from ._base import JOB, TOKEN, get_queue, manager
from .leases import expire_leases

#: Rows handled per transaction by reap and prune, so no pass holds locks for long.
BATCH = 1000


def reap(queue: str | None = None, *, limit: int = 10_000) -> ReapResult:
    """Handle leases past their deadline (database clock) as failed attempts.

    Each becomes ready/scheduled again after its backoff (counted from the
    deadline) or dead when out of attempts; a lease past the job's timeout is
    recorded as a timeout. ``queue`` limits the pass to one queue; ``limit``
    caps the leases handled in this call (in transactions of 1000).
    Raises :class:`QueueNotFound` for an unknown ``queue``.
    """
    queue_id = get_queue(queue).id if queue is not None else None
    expired = timed_out = dead = 0
    while expired + timed_out < limit:
        step = min(BATCH, limit - expired - timed_out)
        e, t, d = db.retrying(lambda: expire_leases(db.connection(), queue_id=queue_id, limit=step))
        expired, timed_out, dead = expired + e, timed_out + t, dead + d
        if e + t < step:
            break
    return ReapResult(expired=expired, timed_out=timed_out, dead=dead)


def prune(*, retention_ms: int | None = None, limit: int = 100_000) -> PruneResult:
    """Delete succeeded/cancelled jobs finished more than ``retention_ms`` ago and expired tokens.

    ``retention_ms`` defaults to ``FQ_FINISHED_RETENTION_MS`` (7 days). Dead
    jobs are kept until retried, cancelled or their queue is deleted. Deletes
    in batches of 1000, at most ``limit`` rows of each kind per call. Also
    folds counter deltas (:func:`fold_counters`).
    """
    retention = conf.get("FQ_FINISHED_RETENTION_MS") if retention_ms is None else retention_ms
    conn = db.connection()
    now = db.now_sql(conn)
    lock = " FOR UPDATE SKIP LOCKED" if db.is_postgres(conn) else ""

    def batch(sql, params):
        def run():
            with db.connection().cursor() as cur:
                cur.execute(sql, params)
                return cur.rowcount

        return db.retrying(run)

    jobs = tokens = 0
    job_sql = (
        f"DELETE FROM {JOB} WHERE seq IN (SELECT seq FROM {JOB} WHERE state IN ('succeeded', 'cancelled') "
        f"AND finished_at <= {now} - %s LIMIT %s{lock})"
    )
    while jobs < limit:
        n = batch(job_sql, [int(retention), min(BATCH, limit - jobs)])
        jobs += n
        if n < BATCH:
            break
    token_sql = f"DELETE FROM {TOKEN} WHERE id IN (SELECT id FROM {TOKEN} WHERE expires_at <= {now} LIMIT %s{lock})"
    while tokens < limit:
        n = batch(token_sql, [min(BATCH, limit - tokens)])
        tokens += n
        if n < BATCH:
            break
    fold_counters()
    return PruneResult(jobs=jobs, tokens=tokens)


def fold_counters() -> int:
    """Add pending :class:`CounterDelta` rows into their queues' totals; return rows folded.

    Per queue, in one transaction: lock the queue row, sum and delete the
    deltas seen, add the sums. Deltas committed meanwhile wait for the next fold.
    """
    names = TOTAL_NAMES + TIMING_NAMES
    folded = 0
    for queue_id in set(manager(CounterDelta).values_list("queue_id", flat=True).distinct()):

        def apply(queue_id=queue_id):
            qs = manager(Queue).filter(id=queue_id)
            if db.is_postgres():
                qs = qs.select_for_update()
            q = qs.first()
            if q is None:
                return 0
            ids = list(manager(CounterDelta).filter(queue_id=queue_id).values_list("id", flat=True)[:10_000])
            if not ids:
                return 0
            rows = manager(CounterDelta).filter(id__in=ids)
            sums = rows.aggregate(**{n: Sum(n) for n in names})
            for n in names:
                setattr(q, n, getattr(q, n) + (sums[n] or 0))
            rows.delete()
            q.save(using=db.connection().alias, update_fields=list(names))
            return len(ids)

        folded += db.retrying(apply)
    return folded
