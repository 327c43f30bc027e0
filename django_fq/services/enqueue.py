"""Enqueue verbs: ``enqueue`` and ``enqueue_many``.

One code path serves both: a batch is validated whole, then written in a
handful of statements inside one transaction (the caller's, if one is open).
Order of decisions per item (docs/reference/semantics.md §9): a live idempotency token returns its
original job; then ``unique_key`` coalesces onto an active job; then the
queue-full limit is checked; then the job is inserted.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from django.db import IntegrityError

from .. import conf, db, validation
from ..exceptions import InvalidArgument, InvalidTime, QueueFull
from ..types import EnqueueResult
from ._base import (
    COUNTER,
    JOB,
    QUEUE,
    TOKEN,
    add_counters,
    counter_sums,
    get_or_create_queue,
    get_queue,
    policy_of,
)
from .queues import POLICY_BOUNDS

#: Keys an enqueue envelope may carry (the REST body and ``enqueue_many`` items).
ENVELOPE_KEYS = frozenset(
    {
        "payload",
        "priority",
        "delay_ms",
        "at",
        "idempotency",
        "idempotency_retention_ms",
        "unique_key",
        "max_attempts",
        "timeout_ms",
    }
)
_CHUNK = 500  # rows per INSERT: well under SQLite's and PostgreSQL's parameter limits
#: (database alias, queue name) pairs this process has seen exist. Only a hint: the one-statement
#: enqueue still looks the queue up itself and reports a queue deleted since.
_seen_queues: set[tuple[str, str]] = set()
_SEEN_QUEUES_MAX = 10_000


class _Item(NamedTuple):
    """One validated envelope (a tuple: built 20,000 times per bulk call, so it must be cheap)."""

    payload: str
    size: int
    priority: int
    delay_ms: int | None
    at: int | None
    token: str | None
    retention_ms: int | None
    unique_key: str | None
    max_attempts: int | None
    timeout_ms: int | None


def enqueue(
    queue: str,
    payload,
    *,
    priority: int = 0,
    delay_ms: int | None = None,
    at=None,
    idempotency: str | None = None,
    idempotency_retention_ms: int | None = None,
    unique_key: str | None = None,
    max_attempts: int | None = None,
    timeout_ms: int | None = None,
    create_queue: bool = True,
) -> EnqueueResult:
    """Add one job to ``queue`` (created with the default policy if missing).

    Args:
        payload: any JSON value; at most ``FQ_MAX_PAYLOAD_BYTES`` (default
            1 MiB) of compact UTF-8 JSON.
        priority: 32-bit signed int; higher is claimed first.
        delay_ms: 0 – 10 years; the job becomes eligible that long after now
            (database clock). Exclusive with ``at``.
        at: epoch milliseconds (int) or an aware ``datetime``, within 10 years.
        idempotency: token (1–255 chars); within its retention a repeat returns
            the original job id with ``created=False`` and changes nothing.
        idempotency_retention_ms: 1 ms – 30 days; default: the queue's policy.
        unique_key: coalesce onto the queue's scheduled/ready/running job
            holding this key, if any.
        max_attempts: 1–1000; default: the queue's policy (copied now).
        timeout_ms: 0 – 7 days (0 = none); default: the queue's policy.
        create_queue: ``False`` raises :class:`QueueNotFound` (and writes
            nothing) when ``queue`` does not exist, instead of creating it.
            The REST API passes ``False`` for users who may not create queues
            (``FQ_API_CREATE_QUEUES``).

    Runs inside the caller's ``transaction.atomic()`` when there is one: a
    rollback leaves no job and no token, and wakes no worker.

    Raises :class:`InvalidQueueName`, :class:`InvalidJson`,
    :class:`PayloadTooLarge`, :class:`InvalidDelay`, :class:`DelayAndAt`,
    :class:`InvalidTime`, :class:`InvalidArgument`, :class:`QueueFull`,
    :class:`TooManyQueues` (creating the queue would pass ``FQ_MAX_QUEUES``),
    :class:`QueueNotFound` (only with ``create_queue=False``).
    """
    validation.queue_name(queue)
    item = parse_options(
        {
            "payload": payload,
            "priority": priority,
            "delay_ms": delay_ms,
            "at": at,
            "idempotency": idempotency,
            "idempotency_retention_ms": idempotency_retention_ms,
            "unique_key": unique_key,
            "max_attempts": max_attempts,
            "timeout_ms": timeout_ms,
        }
    )
    return _write(queue, [item], batch=False, create=create_queue)[0]


def enqueue_many(queue: str, items: Iterable[Mapping], *, create_queue: bool = True) -> list[EnqueueResult]:
    """Add many jobs in one transaction, all or nothing.

    ``items`` are envelopes: mappings with a ``"payload"`` key and any of the
    options of :func:`enqueue` (``priority``, ``delay_ms``, ``at``,
    ``idempotency``, ``idempotency_retention_ms``, ``unique_key``,
    ``max_attempts``, ``timeout_ms``). Returns one :class:`EnqueueResult` per
    item, in input order. Items of one batch sharing a token or unique key
    coalesce onto the first of them. An invalid item fails the whole batch
    (the error's ``field`` is prefixed with ``items[i].``) and writes nothing.
    ``create_queue`` and the errors: as for :func:`enqueue`.
    """
    validation.queue_name(queue)
    limit = conf.max_payload_bytes()
    parsed = [_parse_item(i, raw, limit) for i, raw in enumerate(items)]
    if not parsed:
        return []
    return _write(queue, parsed, batch=True, create=create_queue)


def _write(queue: str, items: list[_Item], *, batch: bool, create: bool = True) -> list[EnqueueResult]:
    """Write a batch; if the queue was deleted under it (a foreign-key error at commit), write it again.

    The second attempt re-creates the queue, as any enqueue into a missing queue does.
    Inside the caller's transaction the error is theirs to handle.
    """
    conn = db.connection()
    owned = not conn.in_atomic_block
    if conn.vendor == "postgresql" and all(it.token is None and it.unique_key is None and it.at is None for it in items):
        known = (conn.alias, queue)
        if known not in _seen_queues:
            # Not seen by this process yet: make sure it exists before sending the rows,
            # so a bulk enqueue into a new queue does not ship (and parse) its rows twice.
            _find_queue(queue, create)
        done, found = db.retrying(_insert_plain_pg, conn, queue, items, atomic=False)
        if not found:  # deleted since: create it again, then the same one statement
            _seen_queues.discard(known)
            _find_queue(queue, create)
            done, found = db.retrying(_insert_plain_pg, conn, queue, items, atomic=False)
        if found:
            if len(_seen_queues) >= _SEEN_QUEUES_MAX:
                _seen_queues.clear()  # queue names made up on the fly: keep the hint small
            _seen_queues.add(known)
        if done is not None:
            return done
    try:
        return db.retrying(_write_batch, queue, items, batch=batch, create=create)
    except IntegrityError as exc:
        if not owned or "foreign key" not in str(exc).lower():
            raise
        return db.retrying(_write_batch, queue, items, batch=batch, create=create)


def _find_queue(queue: str, create: bool):
    """The queue row, created if missing when ``create`` (else :class:`QueueNotFound`)."""
    return get_or_create_queue(queue) if create else get_queue(queue)


# The whole plain enqueue in one statement: look the queue up, check the
# queue-full limit against the counters, insert the rows in input order, add
# to a free counter shard (or a new one), and notify idle workers. Outside the
# caller's transaction autocommit makes it atomic: one round trip per call.
# The rows travel as one JSON text (the C encoder writes it; PostgreSQL parses
# it), much cheaper than encoding one array per column in Python.
_PLAIN_PG = """
WITH q AS (SELECT id, max_attempts, timeout_ms FROM {queue} WHERE name = %s FOR KEY SHARE),
c AS (SELECT {now} AS t),
cap AS (SELECT COALESCE(SUM(active), 0) AS active FROM {counter} WHERE queue_id = (SELECT id FROM q)),
ins AS (
    INSERT INTO {job} (uid, queue_id, state, priority, run_at, enqueued_at, changed_at, attempts, max_attempts,
        generation, timeout_ms, payload, payload_size, last_error, errors, unique_key, idempotency, worker)
    SELECT u.uid, q.id, 'queued', u.priority, c.t + u.delay_ms, c.t, c.t, 0, COALESCE(u.max_attempts, q.max_attempts),
        0, COALESCE(u.timeout_ms, q.timeout_ms), u.payload, u.size, '', '[]', NULL, NULL, ''
    FROM json_to_recordset(%s::json)
        AS u(o integer, uid text, priority integer, delay_ms bigint, max_attempts integer, timeout_ms bigint,
             payload text, size integer)
    CROSS JOIN q CROSS JOIN c CROSS JOIN cap
    WHERE cap.active + %s <= %s
    ORDER BY u.o
    RETURNING 1
),
bump AS (
    UPDATE {counter} SET enqueued = enqueued + %s, active = active + %s
    WHERE id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM q) LIMIT 1 FOR UPDATE SKIP LOCKED)
    AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
),
shard AS (
    INSERT INTO {counter} (queue_id, enqueued, active) SELECT id, %s, %s FROM q
    WHERE NOT EXISTS (SELECT 1 FROM bump) AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
),
wake AS (SELECT pg_notify(%s, %s) WHERE EXISTS (SELECT 1 FROM ins))
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM bump) + (SELECT count(*) FROM shard), (SELECT count(*) FROM wake),
    (SELECT count(*) FROM q), (SELECT t FROM c)
"""


def _insert_plain_pg(conn, queue: str, items: list[_Item]) -> tuple[list[EnqueueResult] | None, bool]:
    """PostgreSQL, items without token, unique key or ``at``: enqueue them in one statement.

    Returns ``(results, True)``; or, with nothing written, ``(None, False)``
    when the queue does not exist yet, ``(None, True)`` when the batch does not
    fit under ``FQ_MAX_JOBS_PER_QUEUE`` (the general path then raises
    :class:`QueueFull` with the numbers).
    """
    n = len(items)
    uids = [secrets.token_hex(16) for _ in items]
    sql = _PLAIN_PG.format(queue=QUEUE, counter=COUNTER, job=JOB, now=db.now_sql(conn))
    params = [
        queue,
        json.dumps(
            [
                {
                    "o": i,
                    "uid": uid,
                    "priority": it.priority,
                    "delay_ms": it.delay_ms or 0,
                    "max_attempts": it.max_attempts,
                    "timeout_ms": it.timeout_ms,
                    "payload": it.payload,
                    "size": it.size,
                }
                for i, (uid, it) in enumerate(zip(uids, items, strict=True))
            ],
            ensure_ascii=False,
        ),
        n,
        int(conf.get("FQ_MAX_JOBS_PER_QUEUE")),
        n,
        n,
        n,
        n,
        db.NOTIFY_CHANNEL,
        queue,
    ]
    with db.hot_cursor(conn) as cur:
        cur.execute(sql, params)
        inserted, _, _, found, enqueued_at = cur.fetchone()
    if inserted != n:
        return None, bool(found)
    return [EnqueueResult(uid, True, int(enqueued_at)) for uid in uids], True


def _parse_item(index: int, raw, limit: int) -> _Item:
    try:
        if type(raw) is dict and len(raw) == 1 and "payload" in raw:
            # The common bulk envelope, {"payload": ...}: only the payload to check.
            text, size = validation.json_text(raw["payload"], "payload", limit)
            return _Item(text, size, 0, None, None, None, None, None, None, None)
        prefix = f"items[{index}]."
        if not isinstance(raw, Mapping) or "payload" not in raw:
            raise InvalidArgument(f"{prefix}payload is required", field=f"{prefix}payload")
        extra = set(raw) - ENVELOPE_KEYS
        if extra:
            name = sorted(map(str, extra))[0]
            raise InvalidArgument(f"unknown enqueue option: {name}", field=f"{prefix}{name}")
        return parse_options(raw, limit)
    except InvalidArgument as exc:
        prefix = f"items[{index}]."
        if not str(exc.field).startswith(prefix):
            exc.field = f"{prefix}{exc.field}"
        exc.message = f"{prefix}{exc.message}" if not exc.message.startswith(prefix) else exc.message
        exc.args = (exc.message,)
        raise


def parse_options(raw: Mapping, limit: int | None = None) -> _Item:
    """Validate one envelope; raise the first :class:`InvalidArgument` found.

    ``limit``: the payload size limit in bytes (default ``FQ_MAX_PAYLOAD_BYTES``).
    """
    text, size = validation.json_text(raw["payload"], "payload", limit)
    delay, at = validation.schedule(raw.get("delay_ms"), raw.get("at"))
    prio = raw.get("priority")
    prio = 0 if prio is None else validation.integer(prio, "priority", validation.MIN_PRIORITY, validation.MAX_PRIORITY)
    retention = raw.get("idempotency_retention_ms")
    if retention is not None:
        validation.integer(retention, "idempotency_retention_ms", *POLICY_BOUNDS["idempotency_retention_ms"])
    attempts = raw.get("max_attempts")
    if attempts is not None:
        validation.integer(attempts, "max_attempts", *POLICY_BOUNDS["max_attempts"])
    timeout = raw.get("timeout_ms")
    if timeout is not None:
        validation.integer(timeout, "timeout_ms", *POLICY_BOUNDS["timeout_ms"])
    return _Item(
        payload=text,
        size=size,
        priority=prio,
        delay_ms=delay,
        at=at,
        token=validation.key(raw.get("idempotency"), "idempotency"),
        retention_ms=retention,
        unique_key=validation.key(raw.get("unique_key"), "unique_key"),
        max_attempts=attempts,
        timeout_ms=timeout,
    )


def _write_batch(queue: str, items: list[_Item], *, batch: bool, create: bool = True) -> list[EnqueueResult]:
    conn = db.connection()
    db.take_write_lock(conn, queue)
    q = get_or_create_queue(queue, lock=True) if create else get_queue(queue, lock=True)
    pol = policy_of(q)
    now = db.now_sql(conn)
    if any(it.at is not None for it in items):
        _check_horizon(conn, now, items, batch)

    uids = [secrets.token_hex(16) for _ in items]
    first_by_token: dict[str, int] = {}
    for i, it in enumerate(items):
        if it.token is not None:
            first_by_token.setdefault(it.token, i)

    live_tokens = _claim_tokens(conn, now, q.id, pol, items, uids, first_by_token)

    # Resolve each item to an existing job, an earlier item, or a new job (one result per item, in order).
    results: list[EnqueueResult] = []
    keys = {it.unique_key for it in items if it.unique_key is not None and it.token not in live_tokens}
    active_keys = _active_keys(conn, q.id, keys)
    key_owner: dict[str, int] = {}
    token_fixups: dict[str, str] = {}
    new: list[int] = []
    for i, it in enumerate(items):
        if it.token is not None:
            if it.token in live_tokens:
                results.append(EnqueueResult(live_tokens[it.token], False))
                continue
            first = first_by_token[it.token]
            if first != i:
                results.append(EnqueueResult(results[first].id, False))
                continue
        if it.unique_key is not None:
            if it.unique_key in active_keys:
                target = active_keys[it.unique_key]
            elif it.unique_key in key_owner:
                target = uids[key_owner[it.unique_key]]
            else:
                key_owner[it.unique_key] = i
                target = None
            if target is not None:
                results.append(EnqueueResult(target, False))
                if it.token is not None:
                    token_fixups[it.token] = target
                continue
        results.append(EnqueueResult(uids[i], True))
        new.append(i)

    if new:
        _check_capacity(conn, q.id, len(new))
        _lock_keys(conn, q.id, {items[i].unique_key for i in new})
        created = _insert_jobs(conn, now, q.id, pol, items, uids, new)
        for i in new:
            if uids[i] in created:
                continue
            # A concurrent enqueue committed an active job with this unique key first.
            key = items[i].unique_key
            target = _active_keys(conn, q.id, {key}).get(key) if key is not None else None
            if target is None:
                created |= _insert_jobs(conn, now, q.id, pol, items, uids, [i])
                if uids[i] in created:
                    continue
                raise InvalidArgument("unique_key is contended; try again", field="unique_key")
            results[i] = EnqueueResult(target, False)
            token = items[i].token
            if token is not None:
                token_fixups[token] = target
            for token, uid in token_fixups.items():  # followers' tokens pointed at the loser
                if uid == uids[i]:
                    token_fixups[token] = target
            for j in range(len(items)):  # later items that followed this one
                if j != i and results[j].id == uids[i]:
                    results[j] = EnqueueResult(target, False)
    for token, target in token_fixups.items():
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {TOKEN} SET job_uid = %s WHERE queue_id = %s AND token = %s", [target, q.id, token])

    if new:  # the new jobs' enqueue times, as the database wrote them
        results = [EnqueueResult(r.id, True, created[r.id]) if r.created else r for r in results]
    n_created = sum(1 for r in results if r.created)
    add_counters(conn, q.id, enqueued=n_created, deduplicated=len(items) - n_created, active=n_created)
    if n_created:
        db.notify(conn, queue)
    return results


def _check_horizon(conn, now: str, items: list[_Item], batch: bool) -> None:
    """``at`` must lie within 10 years of the database's now (the error names the first item past it)."""
    latest = max(it.at for it in items if it.at is not None)
    with conn.cursor() as cur:
        cur.execute(f"SELECT {now} + %s", [validation.MAX_DELAY_MS])
        horizon = cur.fetchone()[0]
    if latest > horizon:
        index = next(i for i, it in enumerate(items) if it.at is not None and it.at > horizon)
        field = f"items[{index}].at" if batch else "at"
        raise InvalidTime(f"{field} must be within 10 years from now", field=field)


def _claim_tokens(conn, now, queue_id, pol, items, uids, first_by_token) -> dict[str, str]:
    """Insert (or take over expired) tokens; return ``{token: job uid}`` of the live ones we do not own."""
    if not first_by_token:
        return {}
    tokens = sorted(first_by_token)  # a fixed order: concurrent batches cannot deadlock
    marks = ", ".join(["%s"] * len(tokens))
    with conn.cursor() as cur:
        cur.execute(f"SELECT token FROM {TOKEN} WHERE queue_id = %s AND token IN ({marks})", [queue_id, *tokens])
        existing = {r[0] for r in cur.fetchall()}
    rows, params = [], []
    for token in tokens:
        it = items[first_by_token[token]]
        rows.append("(%s, %s, %s, (SELECT t FROM c), (SELECT t FROM c) + %s)")
        params += [queue_id, token, uids[first_by_token[token]], it.retention_ms or pol.idempotency_retention_ms]
    with conn.cursor() as cur:
        cur.execute(
            f"WITH c AS (SELECT {now} AS t) "
            f"INSERT INTO {TOKEN} (queue_id, token, job_uid, created_at, expires_at) VALUES {', '.join(rows)} "
            f"ON CONFLICT (queue_id, token) DO UPDATE SET job_uid = excluded.job_uid, "
            f"created_at = excluded.created_at, expires_at = excluded.expires_at "
            f"WHERE {TOKEN}.expires_at <= excluded.created_at RETURNING token",
            params,
        )
        owned = {r[0] for r in cur.fetchall()}
        added = len(owned - existing)
        if added:
            limit = int(conf.get("FQ_MAX_TOKENS_PER_QUEUE"))
            if counter_sums(conn, queue_id, ("token_rows",))["token_rows"] + added > limit:
                raise QueueFull(
                    f"queue full: {limit} idempotency tokens (FQ_MAX_TOKENS_PER_QUEUE)", field="idempotency"
                )
            add_counters(conn, queue_id, token_rows=added)
        others = [t for t in tokens if t not in owned]
        if not others:
            return {}
        marks = ", ".join(["%s"] * len(others))
        cur.execute(f"SELECT token, job_uid FROM {TOKEN} WHERE queue_id = %s AND token IN ({marks})", [queue_id, *others])
        return dict(cur.fetchall())


def _active_keys(conn, queue_id: int, keys: set) -> dict[str, str]:
    """``{unique_key: uid}`` of the queue's scheduled/ready/running jobs holding one of ``keys``."""
    wanted = sorted(k for k in keys if k is not None)
    if not wanted:
        return {}
    marks = ", ".join(["%s"] * len(wanted))
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT unique_key, uid FROM {JOB} WHERE queue_id = %s AND state IN ('queued', 'running') "
            f"AND unique_key IN ({marks})",
            [queue_id, *wanted],
        )
        return dict(cur.fetchall())


def _lock_keys(conn, queue_id: int, keys: set) -> None:
    """PostgreSQL: take the unique keys' transaction locks in sorted order before inserting.

    Jobs are inserted in input order (their enqueue order), so two batches
    holding the same keys in opposite orders would wait on each other's
    index entries; locking the keys first, sorted, makes them queue up instead.
    """
    ordered = sorted(k for k in keys if k is not None)
    if len(ordered) < 2 or conn.vendor != "postgresql":
        return
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(k)) FROM unnest(%s::text[]) AS k ORDER BY k",
            [queue_id, ordered],
        )


def _check_capacity(conn, queue_id: int, adding: int) -> None:
    """Raise :class:`QueueFull` if ``adding`` jobs would pass ``FQ_MAX_JOBS_PER_QUEUE`` active jobs."""
    limit = int(conf.get("FQ_MAX_JOBS_PER_QUEUE"))
    active = counter_sums(conn, queue_id, ("active",))["active"]
    if active + adding > limit:
        raise QueueFull(f"queue full: {active} of {limit} jobs active (FQ_MAX_JOBS_PER_QUEUE)", field="queue")


def _insert_jobs(conn, now, queue_id, pol, items, uids, indexes) -> dict[str, int]:
    """Insert the jobs of ``indexes``; return ``{uid: enqueued_at}`` of those inserted (unique-key conflicts skip)."""
    created: dict[str, int] = {}
    for start in range(0, len(indexes), _CHUNK):
        rows, params = [], []
        for i in indexes[start : start + _CHUNK]:
            it = items[i]
            run_at = "%s" if it.at is not None else "(SELECT t FROM c) + %s"
            rows.append(
                f"(%s, %s, 'queued', %s, {run_at}, (SELECT t FROM c), (SELECT t FROM c), 0, %s, 0, %s, %s, %s, "
                f"'', '[]', %s, %s, '')"
            )
            params += [
                uids[i],
                queue_id,
                it.priority,
                it.at if it.at is not None else (it.delay_ms or 0),
                it.max_attempts or pol.max_attempts,
                pol.timeout_ms if it.timeout_ms is None else it.timeout_ms,
                it.payload,
                it.size,
                it.unique_key,
                it.token,
            ]
        with conn.cursor() as cur:
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) INSERT INTO {JOB} (uid, queue_id, state, priority, run_at, "
                f"enqueued_at, changed_at, attempts, max_attempts, generation, timeout_ms, payload, payload_size, "
                f"last_error, errors, unique_key, idempotency, worker) VALUES {', '.join(rows)} "
                f"ON CONFLICT DO NOTHING RETURNING uid, enqueued_at",
                params,
            )
            created.update((r[0], int(r[1])) for r in cur.fetchall())
    return created
