"""Maintenance verbs: reap (expire leases), prune (finished jobs, expired tokens), fold counters."""

from __future__ import annotations

from .. import conf, db, storage, validation
from ..types import PruneResult, ReapResult
from ._base import COUNTER, COUNTER_NAMES, JOB, TOKEN, add_counters, get_queue
from .leases import expire_leases

#: Rows handled per transaction by reap and prune, so no pass holds locks for long.
BATCH = 1000


def reap(queue: str | None = None, *, limit: int = 10_000) -> ReapResult:
    """Handle leases past their deadline (database clock) as failed attempts.

    Each becomes ready/scheduled again after its backoff (counted from the
    deadline) or dead when out of attempts; a lease past the job's timeout is
    recorded as a timeout. ``queue`` limits the pass to one queue; ``limit``
    caps the leases handled in this call (in transactions of 1000). A pass
    over all queues also merges counter shards (:func:`fold_counters`).
    Raises :class:`QueueNotFound` for an unknown ``queue``.
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
    if queue_id is None:
        fold_counters()
    return ReapResult(expired=expired, timed_out=timed_out, dead=dead)


def prune(*, retention_ms: int | None = None, limit: int = 100_000) -> PruneResult:
    """Delete succeeded/cancelled jobs finished more than ``retention_ms`` ago and expired tokens.

    ``retention_ms`` defaults to ``FQ_FINISHED_RETENTION_MS`` (7 days). Dead
    jobs are kept until retried, cancelled or their queue is deleted. Deletes
    in batches of 1000, at most ``limit`` rows of each kind per call. Also
    merges counter shards (:func:`fold_counters`).
    """
    retention = conf.get("FQ_FINISHED_RETENTION_MS") if retention_ms is None else retention_ms
    validation.integer(retention, "retention_ms", 0, 10 * 3653 * validation.DAY_MS)
    validation.integer(limit, "limit", 1, 10**9)
    conn = db.connection()
    now = db.now_sql(conn)
    lock = storage.for_connection(conn).skip_locked_sql

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
    token_sql = (
        f"DELETE FROM {TOKEN} WHERE id IN (SELECT id FROM {TOKEN} WHERE expires_at <= {now} LIMIT %s{lock}) "
        f"RETURNING queue_id"
    )

    def token_batch(size):
        conn = db.connection()
        with conn.cursor() as cur:
            cur.execute(token_sql, [size])
            gone = [r[0] for r in cur.fetchall()]
        for queue_id in set(gone):
            add_counters(conn, queue_id, token_rows=-gone.count(queue_id))
        return len(gone)

    while tokens < limit:
        n = db.retrying(token_batch, min(BATCH, limit - tokens))
        tokens += n
        if n < BATCH:
            break
    fold_counters()
    return PruneResult(jobs=jobs, tokens=tokens)


def fold_counters() -> int:
    """Merge each queue's counter shards into one; return the shards removed.

    Shards held by a running transaction are skipped (PostgreSQL ``SKIP
    LOCKED``), so this never waits; totals are unchanged by a fold.
    """
    names = COUNTER_NAMES
    removed = 0
    with db.connection().cursor() as cur:
        cur.execute(f"SELECT queue_id FROM {COUNTER} GROUP BY queue_id HAVING COUNT(*) > 1")
        queue_ids = [r[0] for r in cur.fetchall()]
    skip = storage.for_connection(db.connection()).skip_locked_sql
    cols = ", ".join(names)

    def fold(queue_id):
        with db.connection().cursor() as cur:
            cur.execute(f"SELECT id, {cols} FROM {COUNTER} WHERE queue_id = %s ORDER BY id{skip}", [queue_id])
            rows = cur.fetchall()
            if len(rows) < 2:
                return 0
            keep, rest = rows[0], rows[1:]
            sums = [sum(r[i] for r in rows) for i in range(1, len(names) + 1)]
            sets = ", ".join(f"{n} = %s" for n in names)
            cur.execute(f"UPDATE {COUNTER} SET {sets} WHERE id = %s", [*sums, keep[0]])
            marks = ", ".join(["%s"] * len(rest))
            cur.execute(f"DELETE FROM {COUNTER} WHERE id IN ({marks})", [r[0] for r in rest])
            return len(rest)

    for queue_id in queue_ids:
        removed += db.retrying(fold, queue_id)
    return removed
