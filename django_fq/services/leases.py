"""Lease verbs: claim, ack, nack, release, extend — and expiry handling.

Locking rule (PostgreSQL): whoever changes a running job locks its lease row
first and the job row second. The reaper, ack, nack, release, extend and
cancel all follow it, so they never deadlock each other, and exactly one of
them wins a lease: the one that deletes the lease row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .. import db, receipts, validation, wakeup
from ..conf import CLAIM_PAYLOAD_CAP_BYTES
from ..exceptions import FqError, InvalidReceipt, QueueNotFound, ReceiptCancelled
from ..models import Job
from ..types import ClaimedJob, SettleResult
from ._base import (
    COUNTER,
    JOB,
    LEASE,
    QUEUE,
    add_counters,
    append_history,
    backoff_ms,
    fetch_dicts,
    get_queue,
    history_entry,
    load_json,
    manager,
    policy_of,
)

#: Longest pause of a long-poll claim (``wait_ms``) between attempts, in seconds.
LONG_POLL_INTERVAL_S = 0.1
#: Expired leases a claim handles for its own queue before it claims.
CLAIM_REAP_BATCH = 100

log = logging.getLogger("django_fq.services")


# --- claim ---------------------------------------------------------------------------


def claim(
    queue: str,
    *,
    count: int = 1,
    visibility_ms: int | None = None,
    wait_ms: int = 0,
    worker: str = "",
) -> list[ClaimedJob]:
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
        # Woken at once by an enqueue's NOTIFY on PostgreSQL; the short poll
        # also catches delayed jobs becoming eligible, and is all SQLite has.
        wakeup.listener().wait(mark, {queue}, min(LONG_POLL_INTERVAL_S, remaining))


class _Undeliverable:
    """Stands for the payload of a claimed job that cannot be handed out; ``reason`` says why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def _claimed_payload(text) -> Any:
    """The payload of a claimed row, or :class:`_Undeliverable` when no face could read it back.

    A row nesting deeper than ``MAX_JSON_DEPTH`` (stored before the bound, or by
    raw SQL) is judged on its text, before decoding could exhaust the stack.
    """
    if isinstance(text, (str, bytes)) and validation.nests_deeper(text, validation.MAX_JSON_DEPTH):
        return _Undeliverable(validation.too_deep_message("payload"))
    try:
        return load_json(text)
    except (ValueError, RecursionError) as exc:
        return _Undeliverable(f"payload is not valid JSON: {exc}")


def _deliverable(queue: str, jobs: list[ClaimedJob]) -> list[ClaimedJob]:
    """Drop the claimed jobs whose payload cannot be delivered, each made dead on its own.

    One poison row must not fail the claim: the other jobs of the claim are
    returned (and run) as usual (docs/reference/errors.md, "payload nests deeper").
    """
    if not any(isinstance(j.payload, _Undeliverable) for j in jobs):
        return jobs
    kept = []
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


def _claim_round(queue: str, count: int, visibility_ms: int | None, worker: str) -> list[ClaimedJob]:
    """One attempt at claiming: expiry handling for the queue first, then the claim itself."""
    conn = db.connection()
    if not db.is_postgres(conn):
        q = get_queue(queue)
        return db.retrying(_claim_once, q.id, queue, count, visibility_ms or q.visibility_ms, worker)
    # The common case (no concurrency limit, nothing expired) is this one round trip.
    jobs, facts = db.retrying(_claim_pg, queue, count, visibility_ms, worker, False, atomic=False)
    if facts is None:
        return jobs
    queue_id, concurrency, default_vis, expired = facts
    vis = visibility_ms or default_vis
    if concurrency > 0:
        return db.retrying(_claim_once, queue_id, queue, count, vis, worker, relaxed=db.relaxed_commit(conn))
    if expired:
        db.retrying(lambda: expire_leases(db.connection(), queue_id=queue_id, limit=CLAIM_REAP_BATCH))
    jobs, facts = db.retrying(_claim_pg, queue, count, visibility_ms, worker, True, atomic=False)
    if facts is not None:  # a concurrency limit was set meanwhile: next round
        return []
    return jobs


# The claim on PostgreSQL as one statement (autocommit makes it atomic): look the
# queue up; if it has no concurrency limit and no expired lease to handle first
# (``go``), lock up to n eligible jobs in claim order (FOR UPDATE SKIP LOCKED), keep
# those within the payload cap, mark them running, write their leases and add to
# the counters. Every row carries the queue's facts, so the caller can take the
# slower path when ``go`` was empty; no row at all: no such queue.
_CLAIM_PG = """
WITH q AS (
    SELECT id, concurrency, visibility_ms,
        EXISTS (SELECT 1 FROM {lease} l WHERE l.queue_id = {queue}.id AND l.deadline <= {now}) AS expired
    FROM {queue} WHERE name = %(name)s),
go AS (
    SELECT id, COALESCE(%(vis)s::bigint, visibility_ms) AS vis FROM q
    WHERE concurrency = 0 AND (NOT expired OR %(after_reap)s::boolean)),
c AS (SELECT {now} AS t{relax}),
h AS (SELECT string_to_array(%(hashes)s, ',') AS a),
picked AS (
    SELECT seq, priority, payload_size FROM {job}
    WHERE queue_id = (SELECT id FROM go) AND state = 'queued' AND run_at <= (SELECT t FROM c)
    ORDER BY priority DESC, seq LIMIT %(n)s FOR UPDATE SKIP LOCKED),
ranked AS (
    SELECT seq, ROW_NUMBER() OVER w AS rn, SUM(payload_size) OVER w AS cum
    FROM picked WINDOW w AS (ORDER BY priority DESC, seq ROWS UNBOUNDED PRECEDING)),
taken AS (
    UPDATE {job} j SET state = 'running', attempts = j.attempts + 1, generation = j.generation + 1,
        claimed_at = c.t, changed_at = c.t, worker = %(w)s
    FROM ranked, c WHERE j.seq = ranked.seq AND ranked.cum <= %(cap)s
    RETURNING j.seq, j.uid, j.payload, j.generation, j.attempts, j.max_attempts, j.priority,
        j.enqueued_at, j.run_at, j.timeout_ms, j.claimed_at, ranked.rn),
leases AS (
    INSERT INTO {lease} (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, timeout_at, worker)
    SELECT seq, (SELECT id FROM go), generation, (SELECT a FROM h)[rn], claimed_at,
        CASE WHEN timeout_ms > 0 THEN LEAST(claimed_at + (SELECT vis FROM go), claimed_at + timeout_ms)
             ELSE claimed_at + (SELECT vis FROM go) END,
        CASE WHEN timeout_ms > 0 THEN claimed_at + timeout_ms END, %(w)s
    FROM taken),
totals AS (
    SELECT COUNT(*) AS k, COALESCE(SUM(GREATEST(0, claimed_at - GREATEST(enqueued_at, run_at))), 0) AS wait
    FROM taken),
shard AS (
    UPDATE {counter} s SET claimed = s.claimed + totals.k, wait_ms_sum = s.wait_ms_sum + totals.wait,
        wait_count = s.wait_count + totals.k
    FROM totals WHERE totals.k > 0
        AND s.id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM go) LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING s.id),
spare AS (
    INSERT INTO {counter} (queue_id, claimed, wait_ms_sum, wait_count)
    SELECT (SELECT id FROM go), k, wait, k FROM totals WHERE k > 0 AND NOT EXISTS (SELECT 1 FROM shard))
SELECT q.id, q.concurrency, q.visibility_ms, q.expired, (SELECT vis FROM go), seq, uid, payload, generation,
    attempts, max_attempts, priority, enqueued_at, timeout_ms, claimed_at, rn
FROM q LEFT JOIN taken ON true
"""


def _claim_pg(
    queue: str, count: int, visibility_ms: int | None, worker: str, after_reap: bool
) -> tuple[list[ClaimedJob], tuple | None]:
    """Run :data:`_CLAIM_PG`; return ``(jobs, None)``, or ``([], (id, concurrency, visibility_ms, expired))``
    when the queue needs the slower path (a concurrency limit, or expired leases unless ``after_reap``).

    Raises :class:`QueueNotFound`.
    """
    conn = db.connection()
    pairs = receipts.new_secrets(count)
    # Autocommit: this statement is its own transaction, and set_config(..., true)
    # relaxes just that transaction's commit (see db.relaxed_commit).
    relax = " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed" if db.relaxed_commit(conn) else ""
    sql = _CLAIM_PG.format(now=db.now_sql(conn), relax=relax, queue=QUEUE, job=JOB, lease=LEASE, counter=COUNTER)
    with db.hot_cursor(conn) as cur:
        cur.execute(
            sql,
            {
                "name": queue,
                "after_reap": after_reap,
                "n": count,
                "w": worker,
                "cap": CLAIM_PAYLOAD_CAP_BYTES,
                "vis": visibility_ms,
                "hashes": ",".join(digest for _, digest in pairs),  # hex: one text, not an array to encode
            },
        )
        rows = cur.fetchall()
    if not rows:
        raise QueueNotFound(f"no such queue: {queue}", field="queue")
    queue_id, concurrency, default_vis, expired, vis = rows[0][:5]
    if vis is None:  # not claimed here: the caller takes the slower path
        return [], (queue_id, concurrency, default_vis, expired)
    rows = sorted((r[5:] for r in rows if r[5] is not None), key=lambda r: (-r[6], r[0]))
    jobs = []
    for _seq, uid, payload, generation, attempts, max_attempts, priority, enqueued_at, timeout_ms, claimed, rn in rows:
        deadline = claimed + vis if not timeout_ms else min(claimed + vis, claimed + timeout_ms)
        jobs.append(
            ClaimedJob(
                id=uid,
                queue=queue,
                payload=_claimed_payload(payload),
                receipt=receipts.compose(uid, generation, pairs[rn - 1][0]),
                deadline=deadline,
                attempts=attempts,
                max_attempts=max_attempts,
                priority=priority,
                enqueued_at=enqueued_at,
                claimed_at=claimed,
            )
        )
    return jobs, None


def _claim_once(queue_id: int, queue: str, count: int, vis: int, worker: str, relaxed: bool = False) -> list[ClaimedJob]:
    conn = db.connection()
    if relaxed:
        db.relax_commit(conn)
    expire_leases(conn, queue_id=queue_id, limit=CLAIM_REAP_BATCH)
    now = db.now_sql(conn)
    with conn.cursor() as cur:
        cur.execute(f"SELECT concurrency FROM {QUEUE} WHERE id = %s", [queue_id])
        row = cur.fetchone()
        if row is None:
            raise QueueNotFound(f"no such queue: {queue}", field="queue")
        concurrency = row[0]
        returning = "seq, uid, payload, generation, attempts, max_attempts, priority, enqueued_at, run_at, timeout_ms, claimed_at"
        if db.is_postgres(conn):
            if concurrency > 0:
                # Re-read the limit under the lock: a configure() that committed
                # meanwhile must not be overruled by the value read above. NO KEY
                # UPDATE still serializes claims and configure, but does not wait
                # for enqueues, which hold the row FOR KEY SHARE until they commit.
                cur.execute(f"SELECT concurrency FROM {QUEUE} WHERE id = %s FOR NO KEY UPDATE", [queue_id])
                concurrency = cur.fetchone()[0]
                if concurrency > 0:  # 0 now means unlimited
                    cur.execute(f"SELECT COUNT(*) FROM {LEASE} WHERE queue_id = %s", [queue_id])
                    count = min(count, concurrency - cur.fetchone()[0])
                    if count <= 0:
                        return []
            picked = list(
                manager(Job)
                .filter(queue_id=queue_id, state="queued", run_at__lte=db.DbNow())
                .order_by("-priority", "seq")
                .select_for_update(skip_locked=True)
                .values_list("seq", "payload_size")[:count]
            )
            seqs: list[int] = []
            total = 0
            for seq, size in picked:
                if seqs and total + size > CLAIM_PAYLOAD_CAP_BYTES:
                    break
                seqs.append(seq)
                total += size
            if not seqs:
                return []
            marks = ", ".join(["%s"] * len(seqs))
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) UPDATE {JOB} SET state = 'running', attempts = attempts + 1, "
                f"generation = generation + 1, claimed_at = c.t, changed_at = c.t, worker = %s "
                f"FROM c WHERE seq IN ({marks}) RETURNING {returning}",
                [worker, *seqs],
            )
        else:
            # One statement takes the write lock and the jobs at once, whatever
            # the transaction mode, so two processes can never take one job.
            limit, params = "%s", [count]
            if concurrency > 0:
                limit = f"MAX(0, MIN(%s, %s - (SELECT COUNT(*) FROM {LEASE} WHERE queue_id = %s)))"
                params = [count, concurrency, queue_id]
            cur.execute(
                f"UPDATE {JOB} SET state = 'running', attempts = attempts + 1, generation = generation + 1, "
                f"claimed_at = {now}, changed_at = {now}, worker = %s WHERE seq IN ("
                f"SELECT seq FROM (SELECT seq, SUM(payload_size) OVER (ORDER BY priority DESC, seq "
                f"ROWS UNBOUNDED PRECEDING) AS cum FROM (SELECT seq, priority, payload_size FROM {JOB} "
                f"WHERE queue_id = %s AND state = 'queued' AND run_at <= {now} ORDER BY priority DESC, seq "
                f"LIMIT {limit})) WHERE cum <= %s) RETURNING {returning}",
                [worker, queue_id, *params, CLAIM_PAYLOAD_CAP_BYTES],
            )
        rows = fetch_dicts(cur)
        if not rows:
            return []
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        jobs, leases, lease_params = [], [], []
        wait_sum = 0
        for r in rows:
            receipt, digest = receipts.new(r["uid"], r["generation"])
            claimed = r["claimed_at"]
            timeout_at = claimed + r["timeout_ms"] if r["timeout_ms"] else None
            deadline = claimed + vis if timeout_at is None else min(claimed + vis, timeout_at)
            leases.append("(%s, %s, %s, %s, %s, %s, %s, %s)")
            lease_params += [r["seq"], queue_id, r["generation"], digest, claimed, deadline, timeout_at, worker]
            wait_sum += max(0, claimed - max(r["enqueued_at"], r["run_at"]))
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
                )
            )
        cur.execute(
            f"INSERT INTO {LEASE} (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, timeout_at, "
            f"worker) VALUES {', '.join(leases)}",
            lease_params,
        )
    add_counters(conn, queue_id, claimed=len(jobs), wait_ms_sum=wait_sum, wait_count=len(jobs))
    return jobs


# --- settling a lease ------------------------------------------------------------------


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


def ack_many(queue: str, acks: Iterable[tuple[str, object]]) -> list[SettleResult | InvalidReceipt]:
    """Acknowledge many leases of ``queue`` in one transaction.

    ``acks`` is a sequence of ``(receipt, result)`` pairs (``result`` any JSON
    or ``None``). Returns, in the same order, a :class:`SettleResult` for each
    pair that succeeded (or replayed) and the :class:`InvalidReceipt` /
    :class:`ReceiptCancelled` instance for each that did not — one bad receipt
    does not fail the others. An invalid ``result`` raises for the whole call
    before anything is written (field ``acks[i].result``).
    """
    items = []
    for i, (receipt, result) in enumerate(acks):
        try:
            text = None if result is None else validation.json_text(result, "result")[0]
        except FqError as exc:
            exc.field = f"acks[{i}].result"
            raise
        items.append((receipt, text, settle_digest("ack", text)))
    return _ack(queue, items) if items else []


def _ack(queue: str, items: list[tuple[str, str | None, str]]) -> list:
    """Settle ``(receipt, result_text, args_digest)`` items as succeeded, in one transaction."""
    validation.queue_name(queue)  # the PostgreSQL statement takes the name as it is
    if db.is_postgres():
        results = db.retrying(_ack_matching_pg, queue, items, atomic=False)
        rest = [i for i, r in enumerate(results) if r is None]
        if rest:
            # Replays, stale or forged receipts, expired leases, a missing queue: judged one by one.
            judged = _ack_judged(queue, [items[i] for i in rest])
            for i, outcome in zip(rest, judged, strict=True):
                results[i] = outcome
        return _replay_repeats(items, results)
    return _replay_repeats(items, _ack_judged(queue, items))


def _ack_judged(queue: str, items: list[tuple[str, str | None, str]]) -> list:
    """Ack ``items`` in one transaction, judging each receipt (replay, expired, stale, forged)."""
    q = get_queue(queue)

    requests = [(r, "ack", args) for r, _, args in items]

    relaxed = db.relaxed_commit(db.connection())

    def apply_pg_for(items):
        requests = [(r, "ack", args) for r, _, args in items]
        conn = db.connection()
        if relaxed:
            db.relax_commit(conn)
        found = _locked_leases(conn, q.id, requests, judge=False)
        live = [(i, lease) for i, lease in enumerate(found) if isinstance(lease, dict)]
        if live:
            with db.hot_cursor(conn) as cur:
                cur.execute(
                    _ACK_PG.format(now=db.now_sql(conn), job=JOB, lease=LEASE, counter=COUNTER),
                    {
                        "q": q.id,
                        "seqs": [lease["job_id"] for _, lease in live],
                        "results": [items[i][1] for i, _ in live],
                        "args": [items[i][2] for i, _ in live],
                    },
                )
                acked = {r[0] for r in cur.fetchall()}
            for i, lease in live:
                if lease["job_id"] not in acked:  # its deadline passed before the locks were granted
                    found[i] = InvalidReceipt("invalid or expired receipt: the lease has expired", field="receipt")
        return [
            SettleResult(id=lease["uid"], state="succeeded") if isinstance(lease, dict) else lease for lease in found
        ]

    if db.is_postgres():
        return db.retrying(apply_pg_for, items)

    def apply():
        conn = db.connection()
        found = _locked_leases(conn, q.id, requests)
        live = [(i, lease) for i, lease in enumerate(found) if isinstance(lease, dict)]
        if live:
            now = live[0][1]["now"]
            seqs = [lease["job_id"] for _, lease in live]
            marks = ", ".join(["%s"] * len(seqs))
            rows = ", ".join(["(%s, %s, %s, %s)"] * len(live))
            values = []
            for i, lease in live:
                values += [lease["job_id"], items[i][1], lease["receipt_hash"], items[i][2]]
            with conn.cursor() as cur:
                cur.execute(f"DELETE FROM {LEASE} WHERE job_id IN ({marks})", seqs)
                cur.execute(
                    f"UPDATE {JOB} SET state = 'succeeded', result = v.column2, settled_hash = v.column3, "
                    f"settled_args = v.column4, settled_op = 'ack', settled_outcome = '{_ACKED_JSON}', "
                    f"finished_at = %s, changed_at = %s FROM (VALUES {rows}) AS v WHERE {JOB}.seq = v.column1",
                    [now, now, *values],
                )
            run_ms = sum(max(0, now - lease["claimed_at"]) for _, lease in live)
            add_counters(conn, q.id, acked=len(live), active=-len(live), run_ms_sum=run_ms, run_count=len(live))
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


_ACKED_JSON = '{"state":"succeeded","run_at":null}'


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
    relax = ", (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed" if db.relaxed_commit(conn) else ""
    sql = _ACK_MATCHING_PG.format(
        now=db.now_sql(conn), relax=relax, queue=QUEUE, job=JOB, lease=LEASE, counter=COUNTER
    )
    with db.hot_cursor(conn) as cur:
        cur.execute(
            sql,
            {
                "queue": queue,
                # One JSON text: psycopg encodes it far faster than five arrays.
                "req": json.dumps(
                    [
                        {"uid": k[0], "gen": k[1], "hash": k[2], "result": items[i][1], "args": items[i][2]}
                        for k, i in fast.items()
                    ],
                    ensure_ascii=False,
                ),
            },
        )
        acked = {r[0] for r in cur.fetchall()}
    for key, i in fast.items():
        if key[0] in acked:
            out[i] = SettleResult(id=key[0], state="succeeded")
    return out


# What both ack statements do once ``v`` (seq, result, args: the leases to end,
# locked) and ``c`` (now, read after the locks) are known: end the leases still
# live, mark their jobs succeeded, add to the queue's counters (queue id: ``q``).
_ACK_TAIL = (
    """
gone AS (
    DELETE FROM {lease} l USING v, c WHERE l.job_id = v.seq AND l.deadline > c.t
    RETURNING l.job_id, l.claimed_at, l.receipt_hash),
done AS (
    UPDATE {job} j SET state = 'succeeded', result = v.result, settled_hash = gone.receipt_hash,
        settled_args = v.args, settled_op = 'ack', settled_outcome = '"""
    + _ACKED_JSON.replace("{", "{{").replace("}", "}}")
    + """',
        finished_at = c.t, changed_at = c.t
    FROM gone JOIN v ON v.seq = gone.job_id CROSS JOIN c WHERE j.seq = gone.job_id),
totals AS (SELECT COUNT(*) AS k, COALESCE(SUM(GREATEST(0, c.t - gone.claimed_at)), 0) AS run FROM gone, c),
shard AS (
    UPDATE {counter} s SET acked = s.acked + totals.k, active = s.active - totals.k,
        run_ms_sum = s.run_ms_sum + totals.run, run_count = s.run_count + totals.k
    FROM totals WHERE totals.k > 0
        AND s.id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM q) LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING s.id),
spare AS (
    INSERT INTO {counter} (queue_id, acked, active, run_ms_sum, run_count)
    SELECT (SELECT id FROM q), k, -k, run, k FROM totals WHERE k > 0 AND NOT EXISTS (SELECT 1 FROM shard))
"""
)

# The common ack on PostgreSQL as one statement: lock the leases the receipts
# name (in job order), read the clock once the locks are held, then the tail.
_ACK_MATCHING_PG = (
    """
WITH q AS (SELECT id FROM {queue} WHERE name = %(queue)s),
r AS (SELECT * FROM json_to_recordset(%(req)s::json) AS r(uid text, gen bigint, hash text, result text, args text)),
v AS (
    SELECT l.job_id AS seq, r.uid, r.result, r.args
    FROM r JOIN {job} j ON j.uid = r.uid JOIN {lease} l ON l.job_id = j.seq
    WHERE l.queue_id = (SELECT id FROM q) AND l.generation = r.gen AND l.receipt_hash = r.hash
    ORDER BY l.job_id FOR UPDATE OF l),
c AS (SELECT {now} AS t FROM (SELECT COUNT(*) FROM v) AS after_locks{relax}),"""
    + _ACK_TAIL
    + """SELECT v.uid FROM gone JOIN v ON v.seq = gone.job_id
"""
)

# Ack on PostgreSQL in one statement, under the lease locks the transaction
# already holds: end the leases still live now, mark their jobs succeeded,
# add to the counters. Returns the jobs acked.
_ACK_PG = (
    """
WITH q AS (SELECT %(q)s::bigint AS id),
c AS (SELECT {now} AS t),
v AS (SELECT * FROM unnest(%(seqs)s::bigint[], %(results)s::text[], %(args)s::text[]) AS v(seq, result, args)),"""
    + _ACK_TAIL
    + """SELECT job_id FROM gone
"""
)


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


def release(queue: str, receipt: str, *, error: str | None = None) -> SettleResult:
    """End the lease and make the job ready again now, giving the attempt back.

    Used by a worker shutting down: the job's attempts go down by one, a
    history entry (``error``, default "released") and a ``released`` total are
    recorded. Raises :class:`InvalidReceipt`, :class:`ReceiptCancelled`.
    """
    message = validation.error_text(error) or "released"
    q = get_queue(queue)
    args = settle_digest("release", message)

    relaxed = db.relaxed_commit(db.connection())

    def apply():
        conn = db.connection()
        if relaxed:
            db.relax_commit(conn)
        lease = _locked_lease(conn, q.id, receipt, "release", args)
        if isinstance(lease, SettleResult):
            return lease
        now = lease["now"]
        _end_lease(conn, lease)
        job = manager(Job).only("attempts", "errors").get(seq=lease["job_id"])
        outcome = {"state": "ready", "run_at": now}
        manager(Job).filter(seq=lease["job_id"]).update(
            state="queued",
            run_at=now,
            changed_at=now,
            attempts=max(0, job.attempts - 1),
            last_error=message,
            errors=append_history(job.errors, history_entry(now, job.attempts, "release", message, lease["worker"])),
            settled_hash=lease["receipt_hash"],
            settled_op="release",
            settled_args=args,
            settled_outcome=outcome,
        )
        add_counters(conn, q.id, released=1)
        db.notify(conn, queue)
        return SettleResult(id=lease["uid"], **outcome)

    return db.retrying(apply)


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


def _locked_leases(conn, queue_id: int, requests: Sequence[tuple[str, str, str | None]], *, judge: bool = True) -> list:
    """Batch form of :func:`_locked_lease` for ``(receipt, op, args)`` requests.

    Returns per request: the locked live lease row (a dict), a replay
    :class:`SettleResult`, or the :class:`InvalidReceipt` to raise. Leases are
    locked in job order, so concurrent batches cannot deadlock. With
    ``judge=False`` (PostgreSQL only) the deadline is not checked here: the
    caller's next statement must check it, under the locks taken here.
    """
    parsed = [receipts.parse(r) for r, _, _ in requests]
    uids = sorted({p.job_id for p in parsed if p is not None})
    rows: dict[str, dict] = {}
    if uids:
        now = db.now_sql(conn)
        columns = "l.job_id, l.generation, l.receipt_hash, l.claimed_at, l.deadline, l.timeout_at, l.worker, j.uid"
        match = f"FROM {LEASE} l JOIN {JOB} j ON j.seq = l.job_id WHERE l.queue_id = %s AND j.uid = ANY(%s)"
        with db.hot_cursor(conn) as cur:
            if db.is_postgres(conn):
                # Lock first, then judge the deadline: a verdict computed while
                # waiting for the lock would be stale once the lock is granted.
                locking = f"SELECT {columns if not judge else 'l.job_id'} {match} ORDER BY l.job_id FOR UPDATE OF l"
                cur.execute(locking, [queue_id, uids])
            else:
                match = match.replace("= ANY(%s)", f"IN ({', '.join(['%s'] * len(uids))})")
            if judge:
                cur.execute(
                    f"SELECT {columns}, CASE WHEN l.deadline > {now} THEN 1 ELSE 0 END AS live, {now} AS now {match}",
                    [queue_id, uids] if db.is_postgres(conn) else [queue_id, *uids],
                )
            rows = {r["uid"]: {"live": 1, **r} for r in fetch_dicts(cur)}
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
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT j.settled_hash, j.settled_op, j.settled_args, j.settled_outcome, j.generation - CASE WHEN "
            f"EXISTS (SELECT 1 FROM {LEASE} l WHERE l.job_id = j.seq) THEN 1 ELSE 0 END "
            f"FROM {JOB} j WHERE j.uid = %s AND j.queue_id = %s",
            [parsed.job_id, queue_id],
        )
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
) -> dict:
    """Apply a failed attempt to a job whose lease was just ended by the caller.

    ``kind`` is ``nack``, ``expired`` or ``timeout``. The job becomes dead when
    ``permanent`` or out of attempts, else queued at ``base_ms`` + (``delay_ms``
    or the backoff). Records history, last error, settle data and counters.
    Returns the outcome ``{"state", "run_at"}``.
    """
    job = manager(Job).select_related("queue").only(
        "attempts", "max_attempts", "errors", "queue__backoff_ms", "queue__max_backoff_ms", "queue__id"
    ).get(seq=lease["job_id"])
    dead = permanent or job.attempts >= job.max_attempts
    now = lease["now"]
    changes = {
        "changed_at": now,
        "last_error": error,
        "errors": append_history(job.errors, history_entry(now, job.attempts, kind, error, lease.get("worker", ""))),
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
        changes.update(state="queued", run_at=run_at)
    changes["settled_outcome"] = outcome
    changes["settled_args"] = settled_args
    manager(Job).filter(seq=lease["job_id"]).update(**changes)
    totals = {"nack": "nacked", "expired": "expired", "timeout": "timed_out"}
    add_counters(conn, job.queue.id, **{totals[kind]: 1}, dead=int(dead), active=-int(dead))
    return outcome


# --- expiry handling ------------------------------------------------------------------------


def expire_leases(conn, *, queue_id: int | None = None, limit: int = 1000) -> tuple[int, int, int]:
    """End up to ``limit`` leases whose deadline has passed (database clock), as failed attempts.

    A lease that reached its job's timeout counts as a timeout, any other as
    an expiry; both follow the backoff/dead rule of :func:`nack`, with the
    backoff counted from the lease deadline. Leases locked by a concurrent
    settle are skipped (that settle decides). Returns ``(expired, timed_out, dead)``.
    """
    now = db.now_sql(conn)
    where = "queue_id = %s AND " if queue_id is not None else ""
    params = [queue_id] if queue_id is not None else []
    skip = " FOR UPDATE SKIP LOCKED" if db.is_postgres(conn) else ""
    with conn.cursor() as cur:
        cur.execute(
            f"DELETE FROM {LEASE} WHERE job_id IN (SELECT job_id FROM {LEASE} WHERE {where}deadline <= {now} "
            f"ORDER BY deadline LIMIT %s{skip}) RETURNING job_id, queue_id, generation, receipt_hash, claimed_at, "
            f"deadline, timeout_at, worker, {now} AS now",
            [*params, limit],
        )
        ended = fetch_dicts(cur)
    expired = timed_out = dead = 0
    for lease in ended:
        timeout = lease["timeout_at"] is not None and lease["deadline"] >= lease["timeout_at"]
        kind = "timeout" if timeout else "expired"
        error = "timeout: the job ran past its timeout_ms" if timeout else "lease expired without ack or nack"
        outcome = fail_attempt(
            conn, lease, kind=kind, error=error, base_ms=lease["deadline"], settled_op="expire"
        )
        timed_out += timeout
        expired += not timeout
        dead += outcome["state"] == "dead"
    return expired, timed_out, dead
