"""Lease verbs: claim, ack, nack, release, extend — and expiry handling.

What differs between the databases (the claim and ack statements, row locks,
RETURNING) is in :mod:`django_fq.storage`; this module validates, composes
receipts, recognises replays and decides retry or dead.

Locking rule (where rows can be locked): whoever changes a running job locks
its lease row first and the job row second. The reaper, ack, nack, release, extend and
cancel all follow it, so they never deadlock each other, and exactly one of
them wins a lease: the one that deletes the lease row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DatabaseError

from .. import db, payloads, receipts, routing, storage, validation, wakeup
from ..conf import CLAIM_PAYLOAD_CAP_BYTES
from ..exceptions import FqError, InvalidReceipt, QueueNotFound, ReceiptCancelled, SnoozeLimit
from ..models import Job, Queue
from ..storage.base import RateGate, split_by_bytes
from ..types import ClaimedJob, ClaimedJobs, SettleResult
from . import dependencies
from . import keys as slots
from ._base import (
    JOB,
    LEASE,
    POLICY_FIELDS,
    QUEUE,
    add_counters,
    backoff_ms,
    get_queue,
    history_entry,
    history_on_server,
    history_value,
    load_json,
    manager,
    policy_of,
)
from .history import note as tally_history

#: Longest pause of a long-poll claim (``wait_ms``) between attempts, in seconds.
LONG_POLL_INTERVAL_S = 0.1
#: Expired leases a claim handles for its own queue before it claims.
CLAIM_REAP_BATCH = 100

log = logging.getLogger("django_fq.services")

#: Jobs one process claims from a queue between two raises of its claim floor (where the store
#: keeps one). Each raise is one short transaction of three statements; under a long-running
#: snapshot a claim walks the dead index entries of up to about twice this many jobs
#: (docs/performance.md#claims-under-a-long-running-snapshot).
FLOOR_RAISE_JOBS = 256

_floor_lock = threading.Lock()
#: (database alias, queue id) -> jobs claimed by this process since its last raise of that floor.
_claimed_since_raise: dict[tuple[str, int], int] = {}

#: Bytes an ack row adds to the statement besides its result: seq, receipt hash, settle digest, SQL text.
_ACK_ROW_BYTES = 512


# --- claim ---------------------------------------------------------------------------


@routing.by_queue
def claim(
    queue: str,
    *,
    count: int = 1,
    visibility_ms: int | None = None,
    wait_ms: int = 0,
    worker: str = "",
) -> ClaimedJobs:
    """Take up to ``count`` eligible jobs of ``queue`` under new leases.

    Args:
        count: 1–1000 jobs at most.
        visibility_ms: lease length, 1 ms – 24 h; default: the queue's policy
            (30 000 ms unless configured). Capped per job by its timeout.
        wait_ms: 0–20 000. With 0 the call never blocks and returns ``[]`` when
            nothing is eligible; otherwise it waits up to that long for a job.
        worker: free-form worker id recorded on the lease (for inspection).

    Jobs come in claim order (higher priority first, then enqueue order), each
    with a fresh receipt, the absolute deadline (epoch ms, database clock;
    the lease is valid strictly before it), attempts (this claim included) and
    enqueue time. The queue's concurrency limit is respected and the summed
    payload sizes stay within 32 MiB (at least one job if any is eligible).
    Expired leases of this queue are handled first.

    A queue with a rate limit hands out at most ``rate_limit`` jobs in any
    window of ``rate_window_ms`` (docs/reference/semantics.md §9 "Rate
    limits"): a claim the window stops short of ``count`` returns the jobs it
    could take (maybe none), with ``rate_wait_ms`` / ``rate_limited_until`` on
    the returned :class:`~django_fq.types.ClaimedJobs` saying when the next
    one may be taken. A long poll sleeps until then (or its end) instead of
    looking again on every wakeup.

    A paused queue hands out no job (docs/reference/semantics.md §9 "Pause"). In
    a caller's REPEATABLE READ or SERIALIZABLE transaction on PostgreSQL whose
    snapshot predates a pause (or another change of the queue row), the claim
    raises the database's serialization failure (SQLSTATE 40001) instead:
    retry the transaction.

    Raises :class:`InvalidQueueName`, :class:`QueueNotFound`,
    :class:`CountOutOfRange`, :class:`VisibilityOutOfRange`, :class:`InvalidArgument`.
    """
    validation.count(count)
    if visibility_ms is not None:
        validation.visibility(visibility_ms)
    validation.integer(wait_ms, "wait_ms", 0, validation.MAX_WAIT_MS)
    worker = validation.worker_id(worker)
    validation.queue_name(queue)
    if not wait_ms:
        return _deliverable(queue, _claim_round(queue, count, visibility_ms, worker))
    give_up = time.monotonic() + wait_ms / 1000
    while True:
        mark = wakeup.listener().mark()
        jobs = _deliverable(queue, _claim_round(queue, count, visibility_ms, worker))
        remaining = give_up - time.monotonic()
        if jobs or remaining <= 0:
            return jobs
        if jobs.rate_wait_ms:
            # The rate limit's window is full: no enqueue can change that before its next slot frees.
            time.sleep(min(jobs.rate_wait_ms / 1000, remaining))
            continue
        # Woken at once by an enqueue's NOTIFY on PostgreSQL; the short poll
        # also catches delayed jobs becoming eligible, and is all SQLite has.
        wakeup.listener().wait(mark, {queue}, min(LONG_POLL_INTERVAL_S, remaining))


class _Undeliverable:
    """Stands for the payload of a claimed job that cannot be handed out; ``reason`` says why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


#: Brackets a payload text may hold and still be decoded without :func:`validation.nests_deeper`.
_DEPTH = validation.MAX_JSON_DEPTH


def _claimed_payload(text) -> Any:
    """The payload of a claimed row, or :class:`_Undeliverable` when no face could read it back.

    A row nesting deeper than ``MAX_JSON_DEPTH`` (stored before the bound, or by
    raw SQL) is judged on its text, before decoding could exhaust the stack.
    ``text`` is the body already when the payload was offloaded (:func:`_fill_bodies`);
    the marker still there means the body was not found.
    """
    if text.__class__ is str and text != payloads.OFFLOADED and text.count("[") + text.count("{") <= _DEPTH:
        # The common row, as the steps below judge it: not the marker, too few brackets to nest too deep.
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            return _Undeliverable(f"payload is not valid JSON: {exc}")
    if payloads.is_offloaded(text):
        return _Undeliverable("payload body is missing from django_fq_payload")
    if isinstance(text, (str, bytes)) and validation.nests_deeper(text, validation.MAX_JSON_DEPTH):
        return _Undeliverable(validation.too_deep_message("payload"))
    try:
        return load_json(text)
    except (ValueError, RecursionError) as exc:
        return _Undeliverable(f"payload is not valid JSON: {exc}")


def _deliverable(queue: str, jobs: ClaimedJobs) -> ClaimedJobs:
    """Drop the claimed jobs whose payload cannot be delivered, each made dead on its own.

    One poison row must not fail the claim: the other jobs of the claim are
    returned (and run) as usual (docs/reference/errors.md, "payload nests deeper").
    """
    if not any(isinstance(j.payload, _Undeliverable) for j in jobs):
        return jobs
    kept = ClaimedJobs(rate_wait_ms=jobs.rate_wait_ms, rate_limited_until=jobs.rate_limited_until)
    for job in jobs:
        if not isinstance(job.payload, _Undeliverable):
            kept.append(job)
            continue
        reason = f"{job.payload.reason}: no worker or consumer can read it, so the job is dead without running"
        try:
            nack(queue, job.receipt, error=reason, permanent=True)
        except FqError as exc:  # the lease ended meanwhile: its expiry brings the job back here
            log.warning("claim: could not settle undeliverable job %s of %s: %s", job.id, queue, exc.code)
            continue
        log.warning("claim: job %s of %s is dead: %s", job.id, queue, reason)
    return kept


def _claim_round(queue: str, count: int, visibility_ms: int | None, worker: str) -> ClaimedJobs:
    """One attempt at claiming: expiry handling for the queue first, then the claim itself."""
    conn = db.connection()
    store = storage.for_connection(conn)
    if conn.in_atomic_block and store.paused_past_snapshot(conn, queue):
        return ClaimedJobs()  # a caller's snapshot predates a pause the claim's SQL would not see (§9 "Pause")
    if not store.supports_one_statement_claim:
        facts = store.claim_facts(conn, queue)
        if facts is None:
            q = get_queue(queue)
            return db.retrying(_claim_once, q.id, queue, count, visibility_ms or q.visibility_ms, worker)
        if not facts:
            raise QueueNotFound(f"no such queue: {queue}", field="queue")
        queue_id, default_vis, ready, expired = facts
        if not ready and not expired:  # an idle poll ends here, without a transaction
            return ClaimedJobs()
        return db.retrying(_claim_once, queue_id, queue, count, visibility_ms or default_vis, worker, reap=expired)
    # The common case (no concurrency or rate limit, nothing expired) is this one round trip.
    jobs, facts, queue_id = db.retrying(_claim_statement, queue, count, visibility_ms, worker, False, atomic=False)
    if facts is None:
        _claimed(conn, queue_id, len(jobs))
        return ClaimedJobs(jobs)
    queue_id, limited, default_vis, expired = facts
    vis = visibility_ms or default_vis
    if limited:  # a concurrency or rate limit: take_jobs, under the queue row's lock
        claimed = db.retrying(_claim_once, queue_id, queue, count, vis, worker, relaxed=db.relaxed_commit(conn))
        _claimed(conn, queue_id, len(claimed))
        return claimed
    if expired:  # expired leases, or a key's held job become due (with key_concurrency)
        db.retrying(lambda: expire_leases(db.connection(), queue_id=queue_id, limit=CLAIM_REAP_BATCH))
        slots.wake(queue_id=queue_id)
    jobs, facts, _ = db.retrying(_claim_statement, queue, count, visibility_ms, worker, True, atomic=False)
    if facts is not None:  # a limit was set meanwhile: next round
        return ClaimedJobs()
    _claimed(conn, queue_id, len(jobs))
    return ClaimedJobs(jobs)


def _claimed(conn, queue_id: int, n: int) -> None:
    """Count ``n`` jobs claimed from ``queue_id``; every :data:`FLOOR_RAISE_JOBS` of them, raise its claim floor.

    Only where the store keeps a floor, and never inside a caller's transaction
    (the raise must commit on its own, at once). A raise that fails (the
    database went away, a deadlock) is logged and left to the next one: the
    floor only ever lags, which costs speed, never order.
    """
    if not n or not storage.for_connection(conn).supports_claim_floor or conn.in_atomic_block:
        return
    key = (conn.alias, queue_id)
    with _floor_lock:
        total = _claimed_since_raise.get(key, 0) + n
        due = total >= FLOOR_RAISE_JOBS
        _claimed_since_raise[key] = 0 if due else total
    if not due:
        return
    try:
        raise_claim_floor(queue_id)
    except DatabaseError as exc:
        log.warning("claim floor of queue id %s not raised: %s", queue_id, type(exc).__name__)


def raise_claim_floor(queue_id: int) -> bool:
    """Move queue ``queue_id``'s claim floor up as far as is safe; True when the floor row was written.

    One transaction of its own (call it outside any): whether the pending
    value is ripe (:meth:`~django_fq.storage.base.Store.claim_floor_ripe`),
    then the floor and the facts of one snapshot, then lock the floor row
    without waiting (held by a writer lowering it, or by another raise: leave
    it), which gives this transaction its id only now, after that snapshot; write the next floor
    (:func:`next_claim_floor`) unless the row changed in between. A queue
    without a floor row gets one at the start (which skips nothing). Does
    nothing where the store keeps no floor.
    """
    conn = db.connection()
    store = storage.for_connection(conn)
    if not store.supports_claim_floor:
        return False
    with db.write_atomic():
        # A lost raise (a crash before the log reaches disk) leaves the older, lower floor: safe.
        db.relax_commit(conn)
        ripe = store.claim_floor_ripe(conn, queue_id)
        facts = store.claim_floor_facts(conn, queue_id) if ripe is not None else None
        if ripe is None or facts is None:
            store.create_claim_floor(conn, queue_id)
            return False
        row = facts["row"]
        if row["pend_xmax"] != ripe[0]:  # changed between the two reads: the next raise decides
            return False
        new = next_claim_floor(row, {**facts, "ripe": ripe[1]})
        if new is None:
            return False
        return store.write_claim_floor(conn, queue_id=queue_id, seen=row, new=new)


def next_claim_floor(row: dict, facts: dict) -> dict | None:
    """The floor to write after ``row`` (the floor row), given ``facts`` of a snapshot; None: as it is.

    ``facts`` as :meth:`~django_fq.storage.base.Store.claim_floor_facts` returns
    them, plus ``ripe``. The returned ``pending`` says whether the write sets
    a pending value; its ``pend_xmax`` is then the raising transaction's id
    ``xid``, assigned by that write, after the snapshot. The snapshot's candidate: the first queued job at the floor's
    priority from its seq on (due or not: a delayed job becoming due writes
    nothing), or, with none, one past every seq the snapshot sees; and the
    earliest lease deadline from ``lease_from`` on, never past the
    statement's start. A candidate is not used at once: a transaction in
    progress at its snapshot may still commit a job below it (an enqueue takes
    its seq inside its transaction, after its first lock) or a lease below it.
    It waits as the pending value, with ``pend_xmax`` = ``xid``, until a later
    raise finds it ripe (``facts["ripe"]``: every transaction of this database
    with an id at or below ``xid`` had ended before that raise's snapshot), so
    what they wrote is visible there, and the candidate is lowered to what that
    snapshot finds. Jobs
    made queued with an old seq lower the floor and the pending value in
    their own transaction (:meth:`~django_fq.storage.base.Store.lower_claim_floors`).
    """
    first = facts["first_seq"]
    cand_seq = first if first is not None else max(row["seq"], (facts["max_seq"] or 0) + 1)
    lease_min = facts["lease_min"]
    started = facts["started_ms"]
    cand_lease = started if lease_min is None else min(lease_min, started)
    seq, lease_from = row["seq"], row["lease_from"]
    pend_xmax = row["pend_xmax"]
    if pend_xmax is not None:
        if not facts["ripe"]:
            return None  # keep waiting for the same transactions, not for newer ones
        seq = min(row["pend_seq"], cand_seq)
        lease_from = min(row["pend_lease_from"], cand_lease)
    pending = cand_seq > seq or cand_lease > lease_from
    new = {
        "seq": seq,
        "lease_from": lease_from,
        "pend_seq": cand_seq if pending else None,
        "pend_lease_from": cand_lease if pending else None,
        "pending": pending,
    }
    if not pending and pend_xmax is None and seq == row["seq"] and lease_from == row["lease_from"]:
        return None
    return new


def _claim_statement(
    queue: str, count: int, visibility_ms: int | None, worker: str, after_reap: bool
) -> tuple[list[ClaimedJob], tuple | None, int]:
    """Run the store's one-statement claim (:meth:`~django_fq.storage.base.Store.claim_statement`).

    Returns ``(jobs, None, queue_id)``, or ``([], (id, limited, visibility_ms, expired), queue_id)``
    when the queue needs the slower path (a concurrency or rate limit, or
    expired leases unless ``after_reap``). Raises :class:`QueueNotFound`.
    """
    conn = db.connection()
    pairs = receipts.new_secrets(count)
    rows = storage.for_connection(conn).claim_statement(
        conn,
        queue_name=queue,
        count=count,
        visibility_ms=visibility_ms,
        worker=worker,
        after_reap=after_reap,
        cap=CLAIM_PAYLOAD_CAP_BYTES,
        hashes=[digest for _, digest in pairs],
        relaxed=db.relaxed_commit(conn),
    )
    if not rows:
        raise QueueNotFound(f"no such queue: {queue}", field="queue")
    queue_id, limited, default_vis, expired, vis = rows[0][:5]
    if vis is None:  # not claimed here: the caller takes the slower path
        return [], (queue_id, limited, default_vis, expired), queue_id
    rows = sorted((r[5:] for r in rows if r[5] is not None), key=lambda r: (-r[6], r[0]))
    if any(payloads.is_offloaded(r[2]) for r in rows):
        rows = _fill_bodies(conn, rows)
    jobs = []
    waits: list[int] = []
    for (
        _seq,
        uid,
        payload,
        generation,
        attempts,
        max_attempts,
        priority,
        enqueued_at,
        timeout_ms,
        claimed,
        rn,
        meta,
        has_dependents,
        wait,
    ) in rows:
        waits.append(wait)
        deadline = claimed + vis if not timeout_ms else min(claimed + vis, claimed + timeout_ms)
        # ClaimedJob(...) with every field given, without the frozen __init__'s setattr per field.
        job = _new_claimed(ClaimedJob)
        job.__dict__.update(
            id=uid,
            queue=queue,
            payload=_claimed_payload(payload),
            receipt=receipts.compose(uid, generation, *pairs[rn - 1]),
            deadline=deadline,
            attempts=attempts,
            max_attempts=max_attempts,
            priority=priority,
            enqueued_at=enqueued_at,
            claimed_at=claimed,
            metadata=None if meta is None else validation.stored_json(meta, "metadata"),
            has_dependents=bool(has_dependents),
        )
        jobs.append(job)
    if jobs:
        tally_history(conn, queue_id, jobs[0].claimed_at, waits=waits)
    return jobs, None, queue_id


#: Makes the claim's ClaimedJob and the one-statement ack's SettleResult instances.
_new_claimed = object.__new__


def _fill_bodies(conn, rows: list) -> list:
    """Claim rows (tuples: uid at 1, payload at 2) with each offloaded payload replaced by its body.

    One statement after the claim (docs/explanation/storage.md#large-payloads); the
    bodies of running jobs are never deleted, and their size counted in the claim's cap.
    """
    found = [{"uid": r[1], "payload": r[2]} for r in rows]
    payloads.fill(conn, found, latest=True)
    return [(r[0], r[1], f["payload"], *r[3:]) for r, f in zip(rows, found, strict=True)]


def _claim_once(
    queue_id: int, queue: str, count: int, vis: int, worker: str, relaxed: bool = False, reap: bool = True
) -> ClaimedJobs:
    """Claim in the caller's transaction: expired leases of the queue first, then up to ``count`` jobs.

    ``vis`` is the lease length (ms). ``reap=False``: the store's claim facts,
    read just before, found no expired lease (Store.claim_facts). A rate limit
    is applied by the store under the claim's lock (:class:`RateGate`); the
    wait it reports is returned on the :class:`ClaimedJobs`. Raises :class:`QueueNotFound`.
    """
    conn = db.connection()
    if relaxed:
        db.relax_commit(conn)
    if reap:
        expire_leases(conn, queue_id=queue_id, limit=CLAIM_REAP_BATCH)
    with conn.cursor() as cur:
        read = f"SELECT concurrency, rate_limit, rate_window_ms, key_concurrency, key_rate_limit FROM {QUEUE} WHERE id = %s"
        cur.execute(read, [queue_id])
        row = cur.fetchone()
        store = storage.for_connection(conn)
        if (row is None or not any((row[0], row[1], row[3], row[4]))) and store.may_read_stale(conn):
            # A caller's older snapshot may predate a configure() that set a limit (or the
            # queue): read the newest commit. Shared, so other claims and enqueues of an
            # unlimited queue pass; a limit read here (or in the snapshot) makes take_jobs
            # lock the row for update and count the live leases.
            cur.execute(f"{read}{store.fresh_read_sql(conn)}", [queue_id])
            row = cur.fetchone()
        if row is None:
            raise QueueNotFound(f"no such queue: {queue}", field="queue")
        if reap and (row[3] > 0 or row[4] > 0):
            # Held jobs of keys with room that became due: admitted before the jobs are taken.
            due = store.due_keys(conn, now=db.now_sql(conn), queue_id=queue_id, limit=slots.WAKE_BATCH)
            if due:
                slots.admit(conn, queue_id=queue_id, queue=None, keys=[k for _, k in due], create=False, skip_locked=True)
        gate = RateGate(limit=row[1], window_ms=row[2])
        rows = storage.for_connection(conn).take_jobs(
            conn,
            queue_id=queue_id,
            count=count,
            concurrency=row[0],
            worker=worker,
            cap=CLAIM_PAYLOAD_CAP_BYTES,
            rate=gate,
        )
        jobs = _rate_waited(gate, len(rows))
        if not rows:
            return jobs
        if row[4] > 0:
            # A per-key rate limit: each keyed claim holds its key's token for one window (services.keys).
            store.log_key_claims(conn, queue_id=queue_id, seqs=[r["seq"] for r in rows])
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        payloads.fill(conn, rows, latest=True)  # no round trip unless some payload was offloaded
        leases, lease_params = [], []
        wait_sum = 0
        waits: list[int] = []
        for r in rows:
            receipt, digest = receipts.new(r["uid"], r["generation"])
            claimed = r["claimed_at"]
            timeout_at = claimed + r["timeout_ms"] if r["timeout_ms"] else None
            deadline = claimed + vis if timeout_at is None else min(claimed + vis, timeout_at)
            leases.append("(%s, %s, %s, %s, %s, %s, %s, %s)")
            lease_params += [r["seq"], queue_id, r["generation"], digest, claimed, deadline, timeout_at, worker]
            wait = max(0, claimed - max(r["enqueued_at"], r["run_at"]))
            waits.append(wait)
            wait_sum += wait
            jobs.append(
                ClaimedJob(
                    id=r["uid"],
                    queue=queue,
                    payload=_claimed_payload(r["payload"]),
                    receipt=receipt,
                    deadline=deadline,
                    attempts=r["attempts"],
                    max_attempts=r["max_attempts"],
                    priority=r["priority"],
                    enqueued_at=r["enqueued_at"],
                    claimed_at=claimed,
                    metadata=None if r["metadata"] is None else validation.stored_json(r["metadata"], "metadata"),
                    has_dependents=bool(r["has_dependents"]),
                )
            )
        cur.execute(
            f"INSERT INTO {LEASE} (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, timeout_at, "
            f"worker) VALUES {', '.join(leases)}",
            lease_params,
        )
    add_counters(conn, queue_id, claimed=len(jobs), wait_ms_sum=wait_sum, wait_count=len(jobs))
    tally_history(conn, queue_id, rows[0]["claimed_at"], waits=waits)
    return jobs


def _rate_waited(gate: RateGate, taken: int) -> ClaimedJobs:
    """The (still empty) result of a claim that took ``taken`` jobs through ``gate``, with the wait it reports.

    A wait only when the rate limit stopped the claim: the window admitted
    fewer jobs than asked for, and every admitted job was taken (otherwise the
    queue ran out of eligible jobs first, and the next job may come sooner).
    """
    if gate.limit <= 0 or gate.free_at is None or gate.now is None or taken < gate.allowed:
        return ClaimedJobs()
    return ClaimedJobs(rate_wait_ms=max(0, gate.free_at - gate.now), rate_limited_until=gate.free_at)


# --- settling a lease ------------------------------------------------------------------


@routing.by_queue
def ack(queue: str, receipt: str, *, result=None) -> SettleResult:
    """Mark the job held by ``receipt`` succeeded and store ``result`` (any JSON, size-capped).

    Repeating the same ack (same receipt, same result) returns the recorded
    outcome with ``replay=True`` and changes nothing.

    Raises :class:`InvalidReceipt` (expired, forged, malformed, settled,
    older generation, other queue), :class:`ReceiptCancelled`,
    :class:`InvalidJson` / :class:`PayloadTooLarge` (field ``result``).
    """
    text = None if result is None else validation.json_text(result, "result")[0]
    outcome = _ack(queue, [(receipt, text, settle_digest("ack", text))])[0]
    if isinstance(outcome, FqError):
        raise outcome
    return outcome


@routing.by_queue
def ack_many(
    queue: str, acks: Iterable[tuple[str, object]], *, has_dependents: Iterable[str] = ()
) -> list[SettleResult | InvalidReceipt]:
    """Acknowledge many leases of ``queue`` in one transaction.

    ``acks`` is a sequence of ``(receipt, result)`` pairs (``result`` any JSON
    or ``None``). Returns, in the same order, a :class:`SettleResult` for each
    pair that succeeded (or replayed) and the :class:`InvalidReceipt` /
    :class:`ReceiptCancelled` instance for each that did not — one bad receipt
    does not fail the others. An invalid ``result`` raises for the whole call
    before anything is written (field ``acks[i].result``).

    The results travel in as many statements as the store's statement budget
    needs (:meth:`Store.statement_budget <django_fq.storage.base.Store.statement_budget>`:
    256 MiB of escaped results on PostgreSQL, ``max_allowed_packet`` on
    MariaDB/MySQL). On PostgreSQL, outside a transaction of the caller's, each
    such run commits on its own (each ack stands alone: a crash between runs
    leaves the later ones to expire and run again, as for single acks).

    ``has_dependents``: ids of jobs whose claim said other jobs depend on them
    (:attr:`ClaimedJob.has_dependents <django_fq.types.ClaimedJob>`). A hint
    only, never a change of outcome: on PostgreSQL those go straight to the
    transaction that acks them and releases their dependents, instead of
    first through the one-statement ack, which leaves such jobs out.
    """
    items = []
    for i, (receipt, result) in enumerate(acks):
        try:
            text = None if result is None else validation.json_text(result, "result")[0]
        except FqError as exc:
            exc.field = f"acks[{i}].result"
            raise
        items.append((receipt, text, settle_digest("ack", text)))
    return _ack(queue, items, set(has_dependents)) if items else []


def _ack(queue: str, items: list[tuple[str, str | None, str]], hinted: set[str] | None = None) -> list:
    """Settle ``(receipt, result_text, args_digest)`` items as succeeded, in one transaction.

    ``hinted``: job ids known to have dependents (see :func:`ack_many`).
    """
    validation.queue_name(queue)  # the one-statement ack takes the name as it is
    conn = db.connection()
    store = storage.for_connection(conn)
    if store.supports_one_statement_ack:
        # The results travel in one statement per run: runs cut to the store's statement budget
        # (a batch of large results would otherwise pass PostgreSQL's 1 GB message limit).
        budget = store.statement_budget(conn)
        sizes = [_ACK_ROW_BYTES + 2 * len((text or "").encode()) for _, text, _ in items] if budget else []
        results: list = []
        for run in split_by_bytes(items, sizes, budget) if budget else [items]:
            ran: list = [None] * len(run)
            plain = [i for i, it in enumerate(run) if not hinted or _job_id_of(it[0]) not in hinted]
            if plain:
                fast = db.retrying(_ack_matching_pg, queue, [run[i] for i in plain], atomic=False)
                for i, outcome in zip(plain, fast, strict=True):
                    ran[i] = outcome
            rest = [i for i, r in enumerate(ran) if r is None]
            if rest:
                # Replays, stale or forged receipts, expired leases, a missing queue: judged one by one.
                judged = _ack_judged(queue, [run[i] for i in rest])
                for i, outcome in zip(rest, judged, strict=True):
                    ran[i] = outcome
            results.extend(ran)
        return _replay_repeats(items, results)
    return _replay_repeats(items, _ack_judged(queue, items))


def _job_id_of(receipt: object) -> str | None:
    parsed = receipts.parse(receipt)
    return parsed.job_id if parsed is not None else None


def _ack_judged(queue: str, items: list[tuple[str, str | None, str]]) -> list:
    """Ack ``items`` in one transaction, judging each receipt (replay, expired, stale, forged)."""
    relaxed = db.relaxed_commit(db.connection())

    def apply_locked_for(items):
        # The store's one-statement ack under the lease locks taken here: it judges the deadlines.
        requests = [(r, "ack", args) for r, _, args in items]
        conn = db.connection()
        # The locking statement finds the queue by name and relaxes the commit itself: the
        # hand-off to a released dependent waits for two round trips fewer (docs/performance.md#workflows).
        found = _locked_leases(conn, None, requests, judge=False, lock_jobs=True, relax=relaxed, queue_name=queue)
        live = [(i, lease) for i, lease in enumerate(found) if isinstance(lease, dict)]
        if live:
            queue_id = live[0][1]["queue_id"]
            store = storage.for_connection(conn)
            ack_args: dict[str, Any] = {
                "queue_id": queue_id,
                "seqs": [lease["job_id"] for _, lease in live],
                "results": [items[i][1] for i, _ in live],
                "args": [items[i][2] for i, _ in live],
            }
            if any(lease["has_dependents"] for _, lease in live):
                # Their release in the same statement (its snapshot follows the job locks just taken);
                # a released keyed job enters its key's admission first, so it takes its place in
                # claim order among the held before the slots freed below admit any.
                acked, keyed, in_batches = store.ack_locked_releasing(conn, channel=db.NOTIFY_CHANNEL, **ack_args)
                dependencies.admit_keyed(conn, keyed)
                # A batch member carries the flag too (its callback waits on it): counted here, as
                # dependencies.finished() counts the members the other ack paths finish. The
                # statement above found their batches (no lookup of its own).
                if in_batches:
                    from .. import batches  # imports the services (as dependencies.finished() does)

                    batches.settle(conn, (), "succeeded", found=in_batches)
            else:
                acked = store.ack_locked(conn, **ack_args)
            if acked:
                runs = list(acked.values())
                tally_history(conn, queue_id, runs[0][1], succeeded=len(runs), runs=[r for r, _ in runs])
            for i, lease in live:
                if lease["job_id"] not in acked:  # its deadline passed before the locks were granted
                    found[i] = InvalidReceipt("invalid or expired receipt: the lease has expired", field="receipt")
            freed = [lease["concurrency_key"] for _, lease in live if lease["job_id"] in acked]
            slots.give_back(conn, queue_id=queue_id, queue=queue, freed=freed)
        return [
            SettleResult(id=lease["uid"], state="succeeded") if isinstance(lease, dict) else lease for lease in found
        ]

    if storage.for_connection(db.connection()).supports_one_statement_ack:
        return db.retrying(apply_locked_for, items)

    q = get_queue(queue)
    requests = [(r, "ack", args) for r, _, args in items]

    def apply():
        conn = db.connection()
        if relaxed:
            db.relax_commit(conn)
        found = _locked_leases(conn, q.id, requests, lock_jobs=True)
        live = [(i, lease) for i, lease in enumerate(found) if isinstance(lease, dict)]
        if live:
            now = live[0][1]["now"]
            seqs = [lease["job_id"] for _, lease in live]
            store = storage.for_connection(conn)
            with conn.cursor() as cur:
                store.delete_leases(cur, seqs)
            acks = [(lease["job_id"], items[i][1], lease["receipt_hash"], items[i][2]) for i, lease in live]
            # The results travel in the statement: as many UPDATEs as the store's statement size needs.
            sizes = [_ACK_ROW_BYTES + 2 * len((a[1] or "").encode()) for a in acks]
            for run in split_by_bytes(acks, sizes, store.statement_budget(conn)):
                store.mark_acked(conn, now=now, acks=run)
            runs = [max(0, now - lease["claimed_at"]) for _, lease in live]
            add_counters(conn, q.id, acked=len(live), active=-len(live), run_ms_sum=sum(runs), run_count=len(live))
            tally_history(conn, q.id, now, succeeded=len(live), runs=runs)
            # In the ack's transaction (semantics §9); the flag was read under the job rows' locks.
            # Released first: a dependent of the same key then takes its place in claim order among the held.
            flagged = [lease["job_id"] for _, lease in live if lease["has_dependents"]]
            if flagged:
                dependencies.finished(conn, flagged, "succeeded")
            slots.give_back(conn, queue_id=q.id, queue=queue, freed=[lease["concurrency_key"] for _, lease in live])
        return [
            SettleResult(id=lease["uid"], state="succeeded") if isinstance(lease, dict) else lease for lease in found
        ]

    return db.retrying(apply)


def _replay_repeats(items: list[tuple[str, str | None, str]], results: list) -> list:
    """An exact repeat of an ack earlier in the same batch is a replay of it, as in a later call."""
    first: dict[tuple[str, str], int] = {}
    for i, (receipt, _, args) in enumerate(items):
        if not isinstance(receipt, str):
            continue  # not a receipt at all: its InvalidReceipt stands
        j = first.setdefault((receipt, args), i)
        if j != i and isinstance(results[j], SettleResult) and type(results[i]) is InvalidReceipt:
            results[i] = SettleResult(id=results[j].id, state=results[j].state, run_at=results[j].run_at, replay=True)
    return results


def _ack_matching_pg(queue: str, items: list[tuple[str, str | None, str]]) -> list:
    """PostgreSQL: ack in one statement every item whose receipt matches a live lease.

    Returns per item a :class:`SettleResult`, or ``None`` for an item this
    statement did not settle (malformed, stale or forged receipt, expired
    lease, repeat, replay); the caller judges those one by one. A receipt
    matches when its job, generation and secret hash equal the lease's; the
    secret hashes are compared by the database, which learns nothing about a
    secret from how much of its SHA-256 digest matched. The time that decides
    "still live" is read after every lease lock is granted (docs/reference/semantics.md §5: a lease is
    valid strictly before its deadline). Outside the caller's transaction the
    statement commits on its own, without waiting for the WAL flush
    (:func:`django_fq.db.relaxed_commit`).
    """
    conn = db.connection()
    fast: dict[tuple[str, int, str], int] = {}
    for i, (receipt, _, _) in enumerate(items):
        parsed = receipts.parse(receipt)
        if parsed is not None:
            fast.setdefault((parsed.job_id, parsed.generation, parsed.secret_hash), i)
    out: list = [None] * len(items)
    if not fast:
        return out
    acked = storage.for_connection(conn).ack_matching(
        conn,
        queue_name=queue,
        # One JSON text: psycopg encodes it far faster than five arrays.
        requests_json=json.dumps(
            [
                {"uid": k[0], "gen": k[1], "hash": k[2], "result": items[i][1], "args": items[i][2]}
                for k, i in fast.items()
            ],
            ensure_ascii=False,
        ),
        relaxed=db.relaxed_commit(conn),
    )
    if acked:
        runs = list(acked.values())
        tally_history(conn, runs[0][2], runs[0][1], succeeded=len(runs), runs=[r[0] for r in runs])
    for key, i in fast.items():
        if key[0] in acked:
            # SettleResult(id=..., state="succeeded") without the frozen __init__ (one per acked job).
            settled = out[i] = _new_claimed(SettleResult)
            settled.__dict__.update(id=key[0], state="succeeded", run_at=None, replay=False)
    return out


@routing.by_queue
def nack(
    queue: str,
    receipt: str,
    *,
    delay_ms: int | None = None,
    error: str | None = None,
    permanent: bool = False,
) -> SettleResult:
    """Record a failed attempt of the job held by ``receipt``.

    The job is rescheduled ``delay_ms`` (0 – 30 days) after now, or after the
    queue's backoff ``min(max_backoff_ms, backoff_ms * 2**(attempts-1))`` when
    omitted. When attempts ≥ max_attempts, or ``permanent`` is true, it
    becomes ``dead`` instead (dead wins over any delay). ``error`` (text, cut
    to 64 KiB) is stored as the last error and in the history.

    Raises :class:`InvalidReceipt`, :class:`ReceiptCancelled`, :class:`InvalidDelay`.
    """
    if delay_ms is not None:
        validation.integer(delay_ms, "delay_ms", 0, validation.MAX_NACK_DELAY_MS, validation.InvalidDelay)
    message = validation.error_text(error)
    q = get_queue(queue)
    args = settle_digest("nack", delay_ms, message, bool(permanent))

    relaxed = db.relaxed_commit(db.connection())

    def apply():
        conn = db.connection()
        if relaxed:
            db.relax_commit(conn)
        lease = _locked_lease(conn, q.id, receipt, "nack", args)
        if isinstance(lease, SettleResult):
            return lease
        _end_lease(conn, lease)
        outcome = fail_attempt(
            conn,
            lease,
            kind="nack",
            error=message,
            base_ms=lease["now"],
            delay_ms=delay_ms,
            permanent=permanent,
            settled_op="nack",
            settled_args=args,
        )
        return SettleResult(id=lease["uid"], **outcome)

    return db.retrying(apply)


@routing.by_queue
def release(queue: str, receipt: str, *, error: str | None = None, delay_ms: int | None = None) -> SettleResult:
    """End the lease and make the job eligible again, giving the attempt back.

    ``delay_ms`` ``None`` (a worker shutting down): the job is ready now, and
    its history gets an entry of kind ``release`` (text ``error``, default
    "released"). ``delay_ms`` 0 – 30 days (a snooze, see
    :class:`~django_fq.Snooze`): the job is scheduled that long after now
    (database clock), and the entry's kind is ``snooze`` (default text
    "snoozed"). Either way the job's attempts go down by one and the
    ``released`` total goes up. A snooze adds one to the job's ``snoozes``;
    a job snoozed :data:`~django_fq.validation.MAX_SNOOZES` (1,000) times
    since its enqueue or last ``retry`` cannot be snoozed again:
    :class:`SnoozeLimit`, nothing written, the lease still held (the worker
    then nacks the attempt). Raises :class:`InvalidReceipt`,
    :class:`ReceiptCancelled`, :class:`InvalidDelay` (field ``delay_ms``), :class:`SnoozeLimit`.
    """
    if delay_ms is not None:
        validation.integer(delay_ms, "delay_ms", 0, validation.MAX_NACK_DELAY_MS, validation.InvalidDelay)
    kind = "release" if delay_ms is None else "snooze"
    message = validation.error_text(error) or ("released" if delay_ms is None else "snoozed")
    q = get_queue(queue)
    args = settle_digest("release", message) if delay_ms is None else settle_digest("release", message, delay_ms)

    relaxed = db.relaxed_commit(db.connection())

    def apply():
        conn = db.connection()
        if relaxed:
            db.relax_commit(conn)
        store = storage.for_connection(conn)
        lease = _locked_lease(conn, q.id, receipt, "release", args)
        if isinstance(lease, SettleResult):
            return lease
        now = lease["now"]
        run_at = now + (delay_ms or 0)
        history = () if history_on_server(conn) else ("errors",)
        job = _fresh_job(conn, lease["job_id"], "attempts", "priority", "snoozes", *history, policy=False)
        if delay_ms is not None and job.snoozes >= validation.MAX_SNOOZES:
            raise SnoozeLimit(
                f"snooze limit reached: job {lease['uid']} was snoozed {job.snoozes} times "
                f"(at most {validation.MAX_SNOOZES} since it was enqueued or retried)",
                field="delay_ms",
            )
        _end_lease(conn, lease)
        outcome = {"state": "scheduled" if run_at > now else "ready", "run_at": run_at}
        # A snoozed keyed job waits held, without its slot, in a queue with a key limit (read
        # under the key's lock, after the lease's: a configure() of it is done or waits); with a
        # per-key rate limit even without a delay: it needs a rate token again.
        key = lease.get("concurrency_key")
        limits = store.lock_keys(conn, q.id, [key], create=False)[0] if key is not None else None
        held = limits is not None and limits.on and (run_at > now or limits.rate > 0)
        manager(Job).filter(seq=lease["job_id"]).update(
            state="held" if held else "queued",
            run_at=run_at,
            changed_at=now,
            attempts=max(0, job.attempts - 1),
            snoozes=job.snoozes + (delay_ms is not None),
            last_error=message,
            errors=history_value(
                conn, job.errors if history else None, history_entry(now, job.attempts, kind, message, lease["worker"])
            ),
            settled_hash=lease["receipt_hash"],
            settled_op="release",
            settled_args=args,
            settled_outcome=outcome,
        )
        if held:
            slots.give_back(conn, queue_id=q.id, queue=queue, freed=[key])
        else:
            store.lower_claim_floors(conn, [(q.id, job.priority, lease["job_id"])])
        add_counters(conn, q.id, released=1)
        db.notify(conn, queue)
        return SettleResult(id=lease["uid"], **outcome)

    return db.retrying(apply)


@routing.by_queue
def extend(queue: str, receipt: str, *, visibility_ms: int) -> int:
    """Move the lease's deadline to now + ``visibility_ms`` (1 ms – 24 h); return it (epoch ms).

    The new deadline never passes the job's timeout (claim time + timeout_ms).
    Raises :class:`InvalidReceipt`, :class:`ReceiptCancelled`, :class:`VisibilityOutOfRange`.
    """
    validation.visibility(visibility_ms)
    q = get_queue(queue)

    relaxed = db.relaxed_commit(db.connection())

    def apply():
        conn = db.connection()
        if relaxed:
            db.relax_commit(conn)
        lease = _locked_lease(conn, q.id, receipt, "extend")
        deadline = lease["now"] + visibility_ms
        if lease["timeout_at"] is not None:
            deadline = min(deadline, lease["timeout_at"])
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {LEASE} SET deadline = %s WHERE job_id = %s", [deadline, lease["job_id"]])
        return deadline

    return db.retrying(apply)


@routing.by_queue
def report_progress(queue: str, receipt: str, progress: float, message: str | None = "") -> tuple[float, str]:
    """Store the progress of the running job ``receipt`` names: a percentage and a short message.

    ``progress`` is a finite number from 0 to 100; ``message`` at most 200
    characters without NUL (``""`` by default; ``None`` is ``""``). The job's ``progress``,
    ``progress_message`` and ``progress_at`` (epoch ms, database clock) are
    written only while this receipt's lease is live, so a run that lost its
    lease never overwrites the next run's report. One ``UPDATE`` (one round
    trip) per call: each call writes, and throttling is the caller's (the
    worker's :meth:`JobContext.progress <django_fq.worker.JobContext.progress>`
    writes at most once a second per job; docs/how-to/progress.md). Returns
    the ``(progress, message)`` stored, as validation normalised them.

    Raises :class:`InvalidArgument` (field ``progress`` or ``message``),
    :class:`QueueNotFound`, :class:`InvalidReceipt` (not a receipt of this
    queue's running job, or its lease expired), :class:`ReceiptCancelled`;
    nothing is written then.
    """
    value, text = validation.progress(progress, message)
    validation.queue_name(queue)
    parsed = receipts.parse(receipt)
    if parsed is None:
        raise InvalidReceipt(field="receipt")
    conn = db.connection()
    store = storage.for_connection(conn)
    written = db.retrying(
        store.write_progress,
        conn,
        now=db.now_sql(conn),
        queue_name=queue,
        uid=parsed.job_id,
        generation=parsed.generation,
        receipt_hash=parsed.secret_hash,
        progress=value,
        message=text,
        atomic=False,
    )
    if not written:
        # Refused: say why (off the write path: only a refused report pays for these reads).
        q = get_queue(queue)
        raise _replay_or_error(conn, q.id, parsed, "progress", None)
    return value, text


def _locked_lease(conn, queue_id: int, receipt: str, op: str, args: str | None = None):
    """Find and lock the live lease ``receipt`` names, or answer a replay, or raise.

    Returns the lease row (with ``now``: the database time of the check), or
    a :class:`SettleResult` flagged ``replay`` when ``op`` with the same
    arguments (digest ``args``) repeats the recorded settle of this receipt.
    """
    found = _locked_leases(conn, queue_id, [(receipt, op, args)])[0]
    if isinstance(found, FqError):
        raise found
    return found


def _locked_leases(
    conn,
    queue_id: int | None,
    requests: Sequence[tuple[str, str, str | None]],
    *,
    judge: bool = True,
    lock_jobs: bool = False,
    relax: bool = False,
    queue_name: str | None = None,
) -> list:
    """Batch form of :func:`_locked_lease` for ``(receipt, op, args)`` requests.

    Returns per request: the locked live lease row (a dict), a replay
    :class:`SettleResult`, or the :class:`InvalidReceipt` to raise. Leases are
    locked in job order, so concurrent batches cannot deadlock. With
    ``judge=False`` (only where the store has the one-statement ack) the deadline is not checked here: the
    caller's next statement must check it, under the locks taken here.
    ``lock_jobs`` (the ack): the job rows are locked too, and each lease row
    says whether its job ``has_dependents`` (see the store's ``lock_leases``).
    ``relax``: the transaction's commit skips the log flush, set by the locking
    statement where the store can (:func:`django_fq.db.relax_commit`).
    ``queue_id`` None with ``queue_name`` (stores with the one-statement ack):
    the lock finds the queue by name; the queue row is read on its own only
    when no lease was found (:class:`QueueNotFound` for a missing queue, as
    with an id looked up first).
    """
    parsed = [receipts.parse(r) for r, _, _ in requests]
    uids = sorted({p.job_id for p in parsed if p is not None})
    rows: dict[str, dict] = {}
    if uids:
        found = storage.for_connection(conn).lock_leases(
            conn, queue_id, uids, judge=judge, lock_jobs=lock_jobs, relax=relax, queue_name=queue_name
        )
        rows = {r["uid"]: {"live": 1, **r} for r in found}
    if queue_id is None:
        if rows:
            queue_id = int(next(iter(rows.values()))["queue_id"])
        else:
            queue_id = get_queue(str(queue_name)).id
    out: list = []
    taken: set[str] = set()
    for p, (_, op, args) in zip(parsed, requests, strict=True):
        if p is None:
            out.append(InvalidReceipt(field="receipt"))
            continue
        lease = rows.get(p.job_id)
        if (
            lease is not None
            and p.job_id not in taken
            and lease["generation"] == p.generation
            and receipts.matches(lease["receipt_hash"], p.secret_hash)
        ):
            if not lease["live"]:
                out.append(InvalidReceipt("invalid or expired receipt: the lease has expired", field="receipt"))
            else:
                taken.add(p.job_id)  # the same receipt twice in one batch settles once
                out.append(lease)
            continue
        out.append(_replay_or_error(conn, queue_id, p, op, args))
    return out


def settle_digest(op: str, *args) -> str:
    """A short digest of a settle's operation and arguments, to recognise an exact repeat."""
    if args == (None,):  # an ack without a result: the same digest every time
        found = _BARE_DIGESTS.get(op)
        if found is None:
            found = _BARE_DIGESTS[op] = _digest(op, None)
        return found
    return _digest(op, *args)


_BARE_DIGESTS: dict[str, str] = {}


def _digest(op: str, *args) -> str:
    raw = json.dumps([op, *args], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()[:32]


def _replay_or_error(conn, queue_id: int, parsed, op: str, args: str | None):
    """The replay :class:`SettleResult` of an exact repeat, else the error to raise.

    The settle recorded on the job is that of its newest ended lease: lease
    ``generation`` when none is live, the one before while a newer lease is
    held. A receipt naming another generation is not a repeat, even with the
    right secret (its generation was edited): it is invalid.
    """
    store = storage.for_connection(conn)
    sql = (
        f"SELECT j.settled_hash, j.settled_op, j.settled_args, j.settled_outcome, j.generation - CASE WHEN "
        f"EXISTS (SELECT 1 FROM {LEASE} l WHERE l.job_id = j.seq) THEN 1 ELSE 0 END "
        f"FROM {JOB} j WHERE j.uid = %s AND j.queue_id = %s"
    )
    with conn.cursor() as cur:
        cur.execute(sql, [parsed.job_id, queue_id])
        row = cur.fetchone()
        if (row is None or row[4] < parsed.generation) and store.may_read_stale(conn):
            # No settle of this receipt's lease recorded yet: in a caller's snapshot older than
            # the claim or the settle, read the newest commit (a locking read, on this miss only).
            cur.execute(f"{sql}{store.fresh_read_sql(conn)}", [parsed.job_id, queue_id])
            row = cur.fetchone()
    if row and row[4] == parsed.generation and receipts.matches(row[0], parsed.secret_hash):
        if row[1] == "cancel":
            return ReceiptCancelled(field="receipt")
        if row[1] == op and args is not None and row[2] == args:
            outcome: Any = load_json(row[3]) or {}
            return SettleResult(id=parsed.job_id, state=outcome.get("state"), run_at=outcome.get("run_at"), replay=True)
    return InvalidReceipt(field="receipt")


def _end_lease(conn, lease: dict) -> None:
    with conn.cursor() as cur:
        cur.execute(f"DELETE FROM {LEASE} WHERE job_id = %s", [lease["job_id"]])


def _fresh_job(conn, seq: int, *fields: str, policy: bool = True) -> Job:
    """Job ``seq`` with ``fields`` as last committed (plus its queue's backoff policy with ``policy``).

    The job is written next by the caller. In a caller's transaction whose
    snapshot may be older (:meth:`~django_fq.storage.base.Store.may_read_stale`),
    a plain read would judge attempts and history from before the claims and
    failures committed since: the row is then read ``FOR UPDATE`` (the newest
    commit), alone, since a locking read over the join would lock the queue row
    too; the policy is then a plain read of its own. Raises ``Job.DoesNotExist``.
    """
    if not storage.for_connection(conn).may_read_stale(conn):
        if not policy:
            return manager(Job).only(*fields).get(seq=seq)
        # Every policy field: policy_of() reads them all, and each deferred one would be a query.
        related = ("queue__id", *(f"queue__{f}" for f in POLICY_FIELDS))
        return manager(Job).select_related("queue").only(*fields, *related).get(seq=seq)
    job = manager(Job).select_for_update().only(*fields, "queue_id").get(seq=seq)
    if policy:
        job.queue = manager(Queue).only("id", *POLICY_FIELDS).get(id=job.queue_id)
    return job


def fail_attempt(
    conn,
    lease: dict,
    *,
    kind: str,
    error: str,
    base_ms: int,
    delay_ms: int | None = None,
    permanent: bool = False,
    settled_op: str,
    settled_args: str | None = None,
    requeued: list | None = None,
    freed: list | None = None,
) -> dict:
    """Apply a failed attempt to a job whose lease was just ended by the caller.

    ``kind`` is ``nack``, ``expired`` or ``timeout``. The job becomes dead when
    ``permanent`` or out of attempts, else queued at ``base_ms`` + (``delay_ms``
    or the backoff). Records history, last error, settle data and counters.
    A job queued again keeps its sequence number, so the queue's claim floor
    comes down to it: here, or by the caller when it passes ``requeued`` (a
    list this appends ``(queue_id, priority, seq)`` to, for one statement over a batch).
    In a queue with ``key_concurrency``, a keyed job going back with a delay is
    held (docs/reference/semantics.md §9 "Per-key limits"), with ``key_rate_limit``
    any keyed job going back, and a keyed job held or dead gives its key's
    slot back: here, or by the caller when it passes ``freed`` (a list this
    appends ``(queue_id, key)`` to).
    Returns the outcome ``{"state", "run_at"}``.
    """
    # The history is not read where the store appends to it in the database.
    history = () if history_on_server(conn) else ("errors",)
    job = _fresh_job(conn, lease["job_id"], "attempts", "max_attempts", "priority", "concurrency_key", *history)
    # Read after the lease lock: a configure() of the limit is done (and seen) or waits for this.
    key = job.concurrency_key if job.queue.key_concurrency > 0 or job.queue.key_rate_limit > 0 else None
    held = False
    dead = permanent or job.attempts >= job.max_attempts
    now = lease["now"]
    entry = history_entry(now, job.attempts, kind, error, lease.get("worker", ""))
    changes = {
        "changed_at": now,
        "last_error": error,
        "errors": history_value(conn, job.errors if history else None, entry),
        "settled_hash": lease["receipt_hash"],
        "settled_op": settled_op,
    }
    outcome: dict[str, Any]
    if dead:
        outcome = {"state": "dead", "run_at": None}
        changes.update(state="dead", finished_at=now)
    else:
        delay = backoff_ms(policy_of(job.queue), job.attempts) if delay_ms is None else delay_ms
        run_at = base_ms + delay
        outcome = {"state": "scheduled" if run_at > now else "ready", "run_at": run_at}
        # A delayed keyed job waits held, without its slot: the key's ready jobs go first. With a
        # per-key rate limit it is held even when due: admitted again only with a free rate token.
        held = key is not None and (run_at > now or slots.requeue_held(job.queue))
        changes.update(state="held" if held else "queued", run_at=run_at)
    changes["settled_outcome"] = outcome
    changes["settled_args"] = settled_args
    manager(Job).filter(seq=lease["job_id"]).update(**changes)
    if dead:
        dependencies.finished(conn, [lease["job_id"]], "dead")
    if key is not None and (dead or held):
        if freed is None:
            slots.give_back(conn, queue_id=job.queue.id, queue=None, freed=[key])
        else:
            freed.append((job.queue.id, key))
    if not dead and not held:
        lowered = (job.queue.id, job.priority, lease["job_id"])
        if requeued is None:
            storage.for_connection(conn).lower_claim_floors(conn, [lowered])
        else:
            requeued.append(lowered)
    totals = {"nack": "nacked", "expired": "expired", "timeout": "timed_out"}
    add_counters(conn, job.queue.id, **{totals[kind]: 1}, dead=int(dead), active=-int(dead))
    # Every failed attempt counts as failed, the last one of a dead job too; dead counts the job that
    # went dead (docs/reference/history.md), as the dashboard's last-hour chart counts attempts.
    tally_history(conn, job.queue.id, now, failed=1, dead=int(dead))
    return outcome


# --- expiry handling ------------------------------------------------------------------------


def expire_leases(conn, *, queue_id: int | None = None, limit: int = 1000) -> tuple[int, int, int]:
    """End up to ``limit`` leases whose deadline has passed (database clock), as failed attempts.

    A lease that reached its job's timeout counts as a timeout, any other as
    an expiry; both follow the backoff/dead rule of :func:`nack`, with the
    backoff counted from the lease deadline. Leases locked by a concurrent
    settle are skipped (that settle decides). Returns ``(expired, timed_out, dead)``.
    """
    store = storage.for_connection(conn)
    ended = store.end_expired_leases(conn, queue_id=queue_id, limit=limit)
    expired = timed_out = dead = 0
    requeued: list = []
    freed: list = []
    for lease in ended:
        timeout = lease["timeout_at"] is not None and lease["deadline"] >= lease["timeout_at"]
        kind = "timeout" if timeout else "expired"
        error = "timeout: the job ran past its timeout_ms" if timeout else "lease expired without ack or nack"
        outcome = fail_attempt(
            conn,
            lease,
            kind=kind,
            error=error,
            base_ms=lease["deadline"],
            settled_op="expire",
            requeued=requeued,
            freed=freed,
        )
        timed_out += timeout
        expired += not timeout
        dead += outcome["state"] == "dead"
    store.lower_claim_floors(conn, requeued)  # one statement for the batch, in its transaction
    for qid in sorted({qid for qid, _ in freed}):  # the key slots, in key order per queue
        slots.give_back(conn, queue_id=qid, queue=None, freed=[k for q, k in freed if q == qid])
    return expired, timed_out, dead
