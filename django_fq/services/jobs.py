"""Inspection and repair verbs: get, jobs, stats, retry, cancel, wait."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import time

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from .. import batches, db, payloads, routing, storage, validation
from ..exceptions import InvalidArgument, InvalidCursor, InvalidState, JobNotFound, WaitTimeout
from ..models import ACTIVE, QUEUED_STATES, Job, Lease
from ..types import STATE_NAMES, TIMING_NAMES, TOTAL_NAMES, JobInfo, JobPage, JobState, QueueStats
from . import dependencies
from . import keys as slots
from ._base import add_counters, append_history, counter_sums, get_queue, history_entry, manager, reported_state
from .queues import counts

FINAL_STATES = frozenset({"succeeded", "dead", "cancelled"})
_LIST_FIELDS = (
    "uid", "state", "priority", "run_at", "enqueued_at", "changed_at", "attempts", "max_attempts",
    "timeout_ms", "unique_key", "idempotency", "last_error", "claimed_at", "finished_at", "worker", "metadata", "tags",
    "progress", "progress_message", "progress_at", "concurrency_key", "snoozes",
)  # fmt: skip


def _reported():
    return reported_state()  # a held job (waiting for a slot of its concurrency key) reports as a queued one


def _info(row: dict, queue: str, *, full: bool) -> JobInfo:
    extra = {}
    if full:
        extra = {
            # A stored document too deep to show comes back as a stand-in (docs/reference/errors.md).
            "payload": validation.stored_json(row["payload"], "payload"),
            "result": validation.stored_json(row["result"], "result"),
            "errors": list(row["errors"] or []),
        }
    return JobInfo(
        id=row["uid"],
        queue=queue,
        state=row["reported"],
        priority=row["priority"],
        run_at=row["run_at"],
        enqueued_at=row["enqueued_at"],
        changed_at=row["changed_at"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        timeout_ms=row["timeout_ms"],
        unique_key=row["unique_key"],
        idempotency=row["idempotency"],
        last_error=row["last_error"],
        claimed_at=row["claimed_at"],
        finished_at=row["finished_at"],
        lease_deadline=row["lease_deadline"],
        worker=row["worker"],
        metadata=_metadata(row["metadata"]),
        tags=row["tags"].strip("|").split("|") if row["tags"] else [],
        progress=row["progress"],
        progress_message=row["progress_message"],
        progress_at=row["progress_at"],
        concurrency_key=row["concurrency_key"],
        snoozes=row["snoozes"],
        **extra,
    )


def _metadata(text: str | None) -> dict:
    """Stored metadata text as a dict (``{}`` when none; the stand-in of :func:`validation.stored_json` if unreadable)."""
    if text is None:
        return {}
    value = validation.stored_json(text, "metadata")
    return value if isinstance(value, dict) else {validation.UNREADABLE_KEY: "metadata is not a JSON object"}


def _job_rows(queue_id: int):
    return (
        manager(Job)
        .filter(queue_id=queue_id)
        .annotate(reported=_reported(), lease_deadline=F("lease__deadline"))
    )


@routing.by_queue
def get(queue: str, job_id: str) -> JobInfo:
    """A job's metadata, payload, result and error history — never its receipt.

    Raises :class:`QueueNotFound`, :class:`JobNotFound` (also for a job of
    another queue, or one already pruned).
    """
    q = get_queue(queue)
    if not validation.job_id(job_id):
        raise job_not_found(queue, job_id)
    rows = list(
        _job_rows(q.id)
        .filter(uid=job_id)
        .values(*_LIST_FIELDS, "reported", "lease_deadline", "payload", "result", "errors", "seq", "has_dependents")
    )
    if not rows:
        raise job_not_found(queue, job_id)
    if payloads.fill(db.connection(), rows) and not _job_rows(q.id).filter(uid=job_id).exists():
        # The body is gone with its job (pruned, its queue deleted after the row was read). A job
        # still there without its body (made dead for it) is shown with the stand-in payload.
        raise job_not_found(queue, job_id)
    info = _info(rows[0], queue, full=True)
    edges = dependencies.edges_of(rows[0]["seq"], dependents=rows[0]["has_dependents"])
    return dataclasses.replace(info, **edges) if edges else info


# Listing orders (docs/reference/semantics.md §9): each is a tuple of (field, descending?) ending in seq.
_ORDERS = {
    "ready": (("priority", True), ("seq", False)),
    "scheduled": (("run_at", False), ("priority", True), ("seq", False)),
    None: (("seq", True),),
}
_NEWEST_FIRST = (("changed_at", True), ("seq", True))


#: The cursor of the first page besides ``None``: what FQ.JOBS and Redis SCAN users write.
FIRST_PAGE = "0"


@routing.by_queue
def jobs(
    queue: str,
    *,
    state: str | None = None,
    cursor: str | None = None,
    count: int = validation.DEFAULT_PAGE,
    tag: str | None = None,
) -> JobPage:
    """One page of a queue's jobs (metadata only, no payloads).

    ``state`` (optional) is a reported state name. Order: ready jobs in claim
    order; scheduled by run_at, then claim order; running/succeeded/dead/
    cancelled newest first by last transition; no state: newest enqueued
    first. ``cursor`` is the opaque ``next_cursor`` of the previous page;
    ``None`` or ``"0"`` is the first page (``"0"`` as with FQ.JOBS and Redis
    SCAN). ``count`` is 1–1000 (default 20). ``tag`` (optional, 1–64
    characters from ``[A-Za-z0-9:._-]``) keeps the jobs whose metadata
    ``"tags"`` hold it (exact, case-sensitive); a cursor of a tag-filtered
    listing pages on with the same ``tag``.

    Raises :class:`QueueNotFound`, :class:`InvalidArgument` (fields ``state``, ``tag``),
    :class:`InvalidCursor`, :class:`CountOutOfRange`.
    """
    q = get_queue(queue)
    if state is not None and state not in STATE_NAMES:
        raise InvalidArgument(f"state must be one of {', '.join(STATE_NAMES)}", field="state")
    validation.integer(count, "count", 1, validation.MAX_PAGE, validation.CountOutOfRange)
    if tag is not None:
        validation.tag(tag)
    order = _ORDERS.get(state, _NEWEST_FIRST)
    qs = _job_rows(q.id)
    if tag is not None:
        qs = storage.for_connection(db.connection()).filter_tag(qs, tag)
    if state is not None:
        qs = qs.filter(reported=state)
        if state in ("scheduled", "ready", "running"):
            qs = qs.filter(state="running") if state == "running" else qs.filter(state__in=QUEUED_STATES)
        else:
            qs = qs.filter(state=state)
    if cursor is not None and cursor != FIRST_PAGE:
        qs = qs.filter(_after(_decode_cursor(cursor, state, len(order)), order))
    qs = qs.order_by(*[("-" if desc else "") + name for name, desc in order])
    rows = list(qs.values(*_LIST_FIELDS, "seq", "reported", "lease_deadline")[: count + 1])
    more = len(rows) > count
    rows = rows[:count]
    next_cursor = _encode_cursor(state, [rows[-1][name] for name, _ in order]) if more else None
    return JobPage(jobs=[_info(r, queue, full=False) for r in rows], next_cursor=next_cursor)


def _after(key: list, order) -> Q:
    """Keyset condition: rows strictly after ``key`` in ``order``."""
    cond = Q()
    for i in range(len(order) - 1, -1, -1):
        name, desc = order[i]
        step = Q(**{f"{name}__{'lt' if desc else 'gt'}": key[i]})
        cond = step if i == len(order) - 1 else step | (Q(**{name: key[i]}) & cond)
    return cond


def _encode_cursor(state, key: list) -> str:
    raw = json.dumps([state, key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: object, state, width: int) -> list:
    try:
        if not isinstance(cursor, str) or len(cursor) > 512:
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        got_state, key = json.loads(raw)
        if got_state != state or not isinstance(key, list) or len(key) != width:
            raise ValueError
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in key):
            raise ValueError
        return key
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursor(field="cursor") from None


@routing.by_queue
def stats(queue: str) -> QueueStats:
    """Counts per state, totals and observed wait/run times (sums and counts, ms) of ``queue``.

    Totals are sums over the queue's counter shards.
    Raises :class:`QueueNotFound`.
    """
    q = get_queue(queue)
    values = counter_sums(db.connection(), q.id)
    return QueueStats(
        queue=queue,
        counts=counts(q.id),
        totals={n: values[n] for n in TOTAL_NAMES},
        **{n: values[n] for n in TIMING_NAMES},
        paused=bool(q.paused),
        paused_at=q.paused_at,
    )


@routing.by_queue
def retry(queue: str, job_id: str) -> JobInfo:
    """Make a dead job ready again now with attempts and snoozes reset to 0 (its old receipts stay invalid).

    Raises :class:`JobNotFound`, :class:`InvalidState` (not dead, or its
    unique_key is now held by another active job, named in the error).
    """
    retry_job(queue, job_id)
    return get(queue, job_id)


def retry_job(queue: str, job_id: str) -> None:
    """:func:`retry` without reading the job back (for callers that repair many jobs: the admin's bulk actions)."""
    get_queue(queue)  # QueueNotFound before any transaction

    def apply():
        conn = db.connection()
        # Held shared, as an enqueue holds it: a configure() of key_concurrency waits (services.keys).
        q = get_queue(queue, lock=True)
        job = _lock_job(q.id, queue, job_id)
        if job.state != "dead":
            state = _job_rows(q.id).filter(seq=job.seq).values_list("reported", flat=True).get()
            raise InvalidState(f"only dead jobs can be retried; this job is {state}", field="job_id", state=state)
        try:
            with transaction.atomic(using=conn.alias):
                # A keyed job of a queue with a key limit waits held, then is admitted in order.
                keyed = job.concurrency_key is not None and (q.key_concurrency > 0 or q.key_rate_limit > 0)
                manager(Job).filter(seq=job.seq).update(
                    state="held" if keyed else "queued",
                    attempts=0,
                    snoozes=0,
                    run_at=db.DbNow(),
                    changed_at=db.DbNow(),
                    finished_at=None,
                )
                if keyed:
                    slots.admit(conn, queue_id=q.id, queue=queue, keys=[job.concurrency_key])
                else:
                    # It keeps its sequence number, which the claim floor may have passed.
                    storage.for_connection(conn).lower_claim_floors(conn, [(q.id, job.priority, job.seq)])
        except IntegrityError:
            # refused=True: the holder exists in the newest commit, which a caller's older
            # snapshot may not show (the store then reads that commit).
            key = job.unique_key
            store = storage.for_connection(conn)
            other = None if key is None else store.active_jobs_by_key(conn, q.id, [key], refused=True).get(key)
            raise InvalidState(
                f"unique_key {job.unique_key!r} is held by active job {other}", field="job_id", holder=other
            ) from None
        add_counters(conn, q.id, retried=1, active=1)
        if job.has_dependents:  # a member of a batch is unfinished again (docs/reference/semantics.md §9 "Batches")
            batches.unsettle(conn, [job.seq], "dead")
        db.notify(conn, queue)

    db.retrying(apply)


@routing.by_queue
def requeue(queue: str, job_id: str) -> JobInfo:
    """Make a scheduled job (delayed, or waiting out a retry backoff) ready now.

    A ready job is left as it is. Attempts and history are unchanged. Raises
    :class:`JobNotFound`, :class:`InvalidState` (running or finished: use
    :func:`retry` for a dead job).
    """
    requeue_job(queue, job_id)
    return get(queue, job_id)


def requeue_job(queue: str, job_id: str) -> None:
    """:func:`requeue` without reading the job back (for callers that repair many jobs)."""
    q = get_queue(queue)

    def apply():
        conn = db.connection()
        job = _lock_job(q.id, queue, job_id)
        if job.state not in QUEUED_STATES:
            raise InvalidState(f"only scheduled or ready jobs can be requeued; this job is {job.state}", field="job_id", state=job.state)
        # Still queued: the claim floor never passes a queued job, due or not, so it needs no lowering.
        moved = manager(Job).filter(seq=job.seq, run_at__gt=db.DbNow()).update(run_at=db.DbNow(), changed_at=db.DbNow())
        if moved and job.state == "held":  # due now: admitted if its key has room
            slots.admit(conn, queue_id=q.id, queue=queue, keys=[job.concurrency_key])
        if moved:
            db.notify(conn, queue)

    db.retrying(apply)


@routing.by_queue
def cancel(queue: str, job_id: str) -> JobInfo:
    """Take a waiting, scheduled, ready, running or dead job out of the work: state ``cancelled``.

    A running job's lease ends at once and its receipt then raises
    :class:`ReceiptCancelled`. Raises :class:`JobNotFound`,
    :class:`InvalidState` (already succeeded or cancelled). Its dependents are
    cancelled too, or released, as their edges' ``on_failure`` says
    (docs/reference/semantics.md §9 "Dependencies").
    """
    cancel_job(queue, job_id)
    return get(queue, job_id)


def cancel_job(queue: str, job_id: str) -> None:
    """:func:`cancel` without reading the job back (for callers that repair many jobs)."""
    q = get_queue(queue)

    def apply():
        conn = db.connection()
        for _ in range(5):
            lease = _lock_lease_of(q.id, job_id)
            job = _lock_job(q.id, queue, job_id)
            if job.state in ("succeeded", "cancelled"):
                raise InvalidState(f"a {job.state} job cannot be cancelled", field="job_id", state=job.state)
            if job.state == "running" and lease is None:
                continue  # a claim committed between our two reads; lock its lease first
            break
        else:  # pragma: no cover - needs five claims racing one cancel
            raise InvalidState("the job keeps changing; try again", field="job_id")
        changes = {}
        if lease is not None:
            manager(Lease).filter(job_id=job.seq).delete()
            changes = {"settled_hash": lease.receipt_hash, "settled_op": "cancel", "settled_outcome": {"state": "cancelled", "run_at": None}}
        now = db.db_now_ms()
        manager(Job).filter(seq=job.seq).update(
            state="cancelled",
            finished_at=now,
            changed_at=now,
            errors=append_history(job.errors, history_entry(now, job.attempts, "cancel", "cancelled", job.worker)),
            **changes,
        )
        add_counters(conn, q.id, cancelled=1, active=-int(job.state in ACTIVE))
        if job.state in ("queued", "running") and job.concurrency_key is not None:
            # Its slot goes to the key's next held job (the limit is read under the key's lock:
            # nothing without one). A waiting or held job has no slot.
            slots.give_back(conn, queue_id=q.id, queue=queue, freed=[job.concurrency_key])
        if job.state == "dead" and job.has_dependents:  # a dead batch member now counts as cancelled
            batches.unsettle(conn, [job.seq], "dead")
        dependencies.finished(conn, [job.seq], "cancelled")  # its dependents, by their edges' policies

    db.retrying(apply)


#: Stored states a job may be deleted in: those prune deletes (docs/reference/semantics.md §9: cancel, then prune).
DELETABLE = ("succeeded", "cancelled")


def delete_finished(queue: str, job_id: str) -> None:
    """Delete a succeeded or cancelled job now, as prune would once its retention has passed.

    Its offloaded body, edges and batch membership go with it; counters are
    unchanged (a finished job counts in none). Raises :class:`JobNotFound`,
    :class:`InvalidState` (the job is not finished: cancel it first; or an
    unfinished job or an open batch still waits on it).
    """
    q = get_queue(queue)

    def apply():
        conn = db.connection()
        job = _lock_job(q.id, queue, job_id)
        if job.state not in DELETABLE:
            state = _job_rows(q.id).filter(seq=job.seq).values_list("reported", flat=True).get()
            raise InvalidState(
                f"only succeeded or cancelled jobs can be deleted (cancel it first); this job is {state}",
                field="job_id",
                state=state,
            )
        if not storage.for_connection(conn).delete_finished_jobs(conn, q.id, [job.seq]):
            raise InvalidState(
                "an unfinished job or an open batch still waits on this job; it is deleted once they are done",
                field="job_id",
                state=job.state,
            )

    db.retrying(apply)


def job_not_found(queue: str, job_id: object) -> JobNotFound:
    """The one "job not found" error: ``no job <id> in queue <queue>``, or, for a malformed id, that it is none.

    A malformed value is not echoed (it could be anything, a receipt pasted
    in the wrong place included).
    """
    if validation.job_id(job_id):
        return JobNotFound(f"no job {job_id} in queue {queue}", field="job_id")
    return JobNotFound("not a job id: job ids are 32 lowercase hex characters", field="job_id")


def _lock_job(queue_id: int, queue: str, job_id: object) -> Job:
    if not validation.job_id(job_id):
        raise job_not_found(queue, job_id)
    qs = manager(Job).filter(queue_id=queue_id, uid=job_id)
    if storage.for_connection(db.connection()).supports_row_locks:
        qs = qs.select_for_update()
    job = qs.first()
    if job is None:
        raise job_not_found(queue, job_id)
    return job


def _lock_lease_of(queue_id: int, job_id: object) -> Lease | None:
    if not validation.job_id(job_id):
        return None  # _lock_job raises JobNotFound
    conn = db.connection()
    if storage.for_connection(conn).supports_row_locks and not conn.features.has_select_for_update_of:
        # FOR UPDATE without OF (MySQL) would lock the joined job row too, before _lock_job
        # does: look the job up first, then lock only the lease row.
        seq = manager(Job).filter(queue_id=queue_id, uid=job_id).values_list("seq", flat=True).first()
        if seq is None:
            return None
        return manager(Lease).filter(queue_id=queue_id, job_id=seq).select_for_update().first()
    qs = manager(Lease).filter(queue_id=queue_id, job__uid=job_id)
    if storage.for_connection(conn).supports_row_locks:
        qs = qs.select_for_update(of=("self",))
    return qs.first()


@routing.by_queue
def wait(queue: str, job_id: str, *, timeout_ms: int) -> JobInfo:
    """Block until the job succeeded, died or was cancelled; return it (with result and errors).

    Polls the database (10 ms, growing to 500 ms). ``timeout_ms`` is 0 – 24 h.
    Raises :class:`WaitTimeout` when the job is not final in time,
    :class:`JobNotFound`, :class:`QueueNotFound`.
    """
    validation.integer(timeout_ms, "timeout_ms", 0, validation.DAY_MS)
    give_up = time.monotonic() + timeout_ms / 1000
    pause = 0.01
    while True:
        info = get(queue, job_id)
        if info.state in FINAL_STATES:
            return info
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"job {job_id} is still {info.state} after {timeout_ms} ms", field="timeout_ms", state=info.state)
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, 0.5)


__all__ = ["JobState", "cancel", "get", "jobs", "requeue", "retry", "stats", "wait"]
