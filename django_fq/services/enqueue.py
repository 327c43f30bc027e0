"""Enqueue verbs: ``enqueue`` and ``enqueue_many``.

One code path serves both: a batch is validated whole, then written in a
handful of statements inside one transaction (the caller's, if one is open).
Order of decisions per item (docs/reference/semantics.md §9): a live idempotency token returns its
original job; then ``unique_key`` coalesces onto an active job; then the
queue-full limit is checked; then the job is inserted.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, cast

from django.db import IntegrityError

from .. import batches, conf, db, middleware, payloads, routing, storage, validation
from ..exceptions import EnqueueRefused, InvalidArgument, InvalidTime
from ..types import EnqueueResult
from . import dependencies, history
from . import keys as slots
from ._base import (
    add_counters,
    check_queue_room,
    get_or_create_queue,
    get_queue,
    max_jobs_per_queue,
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
        "metadata",
        "concurrency_key",
        "depends_on",
        "batch",
    }
)
_CHUNK = 500  # rows per INSERT: well under SQLite's and PostgreSQL's parameter limits
#: (database alias, queue name) pairs this process has seen exist. Only a hint: the one-statement
#: enqueue still looks the queue up itself and reports a queue deleted since.
_seen_queues: set[tuple[str, str]] = set()
_SEEN_QUEUES_MAX = 10_000
#: Called as ``after_enqueue(queue, results)`` after every enqueue call, when set; ``None`` in
#: production. Only the test helpers' inline mode sets it (django_fq.testing.inline), so the
#: enqueue path pays one global read for it.
after_enqueue: Callable[[str, list[EnqueueResult]], None] | None = None


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
    metadata: str | None = None  # compact JSON text of a non-empty object
    tags: str | None = None  # the tags column: "|a|b|"
    concurrency_key: str | None = None
    depends_on: tuple[dependencies.Edge, ...] | None = None  # docs/how-to/workflows.md
    batch: str | None = None  # the id of the open batch the job joins (django_fq.batches)


#: An envelope with a payload only: every option after ``size`` at its default. ``_new_item(_Item, (text,
#: size, *_NO_OPTIONS))`` skips NamedTuple's keyword-handling ``__new__`` (a Python function) per item.
_NO_OPTIONS = (0, None, None, None, None, None, None, None, None, None, None, None, None)
_new_item = tuple.__new__


@routing.by_queue
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
    metadata: dict | None = None,
    concurrency_key: str | None = None,
    depends_on: list | None = None,
    batch: str | None = None,
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
        metadata: a JSON object (``dict``) of at most ``FQ_MAX_METADATA_BYTES``
            (default 4096) bytes of compact UTF-8 JSON, readable by the handler
            as ``job.metadata``; its key ``"tags"`` is an optional list of at
            most 16 distinct tags of 1–64 characters from ``[A-Za-z0-9:._-]``
            (``jobs(..., tag=...)`` filters on them). ``FQ_ENQUEUE_MIDDLEWARE``
            may add to it. A duplicate (idempotency token, unique key) keeps
            the first job's metadata.
        concurrency_key: 1–200 characters (no NUL), compared byte for byte;
            with the queue's ``key_concurrency`` K > 0, at most K jobs of one
            key run at once (docs/reference/semantics.md §9 "Per-key limits").
            A duplicate keeps the first job's key. A job that is ``waiting``
            for dependencies takes no slot until the last one succeeds.
        depends_on: jobs (of any queue of this database) that must succeed
            before this one runs: a list of at most 1,000 job ids, each an id
            or ``{"id": ID, "on_failure": "cancel" | "run" | "wait"}`` (what
            the job does when that dependency goes dead or is cancelled;
            default ``cancel``). Until then the job is ``waiting``
            (docs/how-to/workflows.md). A duplicate (token, unique key) keeps
            the first job's dependencies.
        batch: the id of an open batch of this queue the job joins
            (:mod:`django_fq.batches`; docs/how-to/workflows.md "Batches"). A
            duplicate (token, unique key) joins nothing.
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
    :class:`QueueNotFound` (only with ``create_queue=False``),
    :class:`EnqueueRefused` (an enqueue middleware refused the job),
    :class:`InvalidDependency` (field ``depends_on[i]``: malformed, or no such job),
    :class:`BatchNotFound` (field ``batch``: no such batch in this queue),
    :class:`InvalidState` (field ``batch``: the batch is sealed, finished or cancelled).
    """
    validation.queue_name(queue)
    raw = {
        "payload": payload,
        "priority": priority,
        "delay_ms": delay_ms,
        "at": at,
        "idempotency": idempotency,
        "idempotency_retention_ms": idempotency_retention_ms,
        "unique_key": unique_key,
        "max_attempts": max_attempts,
        "timeout_ms": timeout_ms,
        "metadata": metadata,
        "concurrency_key": concurrency_key,
        "depends_on": depends_on,
        "batch": batch,
    }
    chain = middleware.enqueue_chain()
    if chain is not None:
        options = {k: v for k, v in raw.items() if v is not None and k not in ("payload", "metadata", "depends_on", "batch")}
        raw["metadata"] = middleware.run_enqueue_middleware(chain, queue, payload, metadata, options)
    item = parse_options(raw)
    results = _write(queue, [item], batch=False, create=create_queue)
    if after_enqueue is not None:
        after_enqueue(queue, results)
    return results[0]


@routing.by_queue
def enqueue_many(queue: str, items: Iterable[Mapping], *, create_queue: bool = True) -> list[EnqueueResult]:
    """Add many jobs in one transaction, all or nothing.

    ``items`` are envelopes: mappings with a ``"payload"`` key and any of the
    options of :func:`enqueue` (``priority``, ``delay_ms``, ``at``,
    ``idempotency``, ``idempotency_retention_ms``, ``unique_key``,
    ``max_attempts``, ``timeout_ms``, ``metadata``, ``concurrency_key``, ``depends_on``, ``batch``). ``FQ_ENQUEUE_MIDDLEWARE``
    runs for each item (a refusal fails the whole batch: its ``field`` is
    ``items[i]``). Returns one :class:`EnqueueResult` per
    item, in input order. Items of one batch sharing a token or unique key
    coalesce onto the first of them. An invalid item fails the whole batch
    (the error's ``field`` is prefixed with ``items[i].``) and writes nothing.
    ``create_queue`` and the errors: as for :func:`enqueue`.
    """
    parsed = _parse_batch(queue, items)
    if not parsed:
        return []
    results = _write(queue, parsed, batch=True, create=create_queue)
    if after_enqueue is not None:
        after_enqueue(queue, results)
    return results


def _parse_batch(queue: str, items: Iterable[Mapping]) -> list[_Item]:
    """The items of ``enqueue_many``, through the enqueue middleware and validated (errors name ``items[i]``)."""
    validation.queue_name(queue)
    limit = conf.max_payload_bytes()
    chain = middleware.enqueue_chain()
    encode = validation.batch_encoder()  # this call's own: one C encoder for all its payloads
    if chain is None:
        parsed = [_parse_item(i, raw, limit, encode) for i, raw in enumerate(items)]
    else:
        parsed = [_parse_item(i, _through(chain, queue, i, raw), limit, encode) for i, raw in enumerate(items)]
    dependencies.check_total((f"items[{i}].", it.depends_on) for i, it in enumerate(parsed))
    return parsed


def enqueue_steps(
    queue: str, items: Sequence[Mapping], *, uids: list[str], fresh: dependencies.Fresh, create_queue: bool = True
) -> list[EnqueueResult]:
    """``enqueue_many`` for the workflow builder: the jobs' ids given, dependencies on jobs of the same write allowed.

    ``uids``: one id per item (32 lowercase hex characters, new): the job's id
    when the item creates one. An item's ``depends_on`` may name ids of
    ``fresh.uids``, jobs this transaction inserts (in this call or another,
    before or after it): such an item is inserted held, its edges left in
    ``fresh`` for :func:`~django_fq.services.dependencies.attach_fresh`, which
    the caller runs once every one of them is inserted, in the same
    transaction; its other dependencies are locked and read here, as
    ``enqueue_many`` does. The caller runs ``after_enqueue`` (the inline
    mode's hook) after that. Must run inside a transaction. Raises the errors
    of ``enqueue_many`` (fields ``items[i]....``).
    """
    parsed = _parse_batch(queue, items)
    if not parsed:
        return []
    routing.check_transaction(queue)
    return _write_batch(queue, parsed, batch=True, create=create_queue, uids=uids, fresh=fresh)


def _write(queue: str, items: list[_Item], *, batch: bool, create: bool = True) -> list[EnqueueResult]:
    """Write a batch; if the queue was deleted under it (a foreign-key error at commit), write it again.

    The second attempt re-creates the queue, as any enqueue into a missing queue does.
    Inside the caller's transaction the error is theirs to handle. A transaction open on
    another database alias that holds queues is refused (:func:`django_fq.routing.check_transaction`).
    """
    routing.check_transaction(queue)
    conn = db.connection()
    owned = not conn.in_atomic_block
    store = storage.for_connection(conn)
    # A large payload goes to the side table in a second statement of the jobs' transaction
    # (payloads.split): the general path writes it; the one-statement enqueue has no room for it.
    offload = conf.payload_offload_bytes()
    if store.supports_one_statement_enqueue and all(
        it.token is None and it.unique_key is None and it.at is None and it.concurrency_key is None
        and it.depends_on is None and it.batch is None and it.size <= offload
        for it in items
    ):
        known = (conn.alias, queue)
        if known not in _seen_queues:
            # Not seen by this process yet: make sure it exists before sending the rows,
            # so a bulk enqueue into a new queue does not ship (and parse) its rows twice.
            _find_queue(queue, create)
        done, found = db.retrying(_insert_plain, conn, queue, items, atomic=False)
        if not found:  # deleted since: create it again, then the same one statement
            _seen_queues.discard(known)
            _find_queue(queue, create)
            done, found = db.retrying(_insert_plain, conn, queue, items, atomic=False)
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


def _insert_plain(conn, queue: str, items: list[_Item]) -> tuple[list[EnqueueResult] | None, bool]:
    """Items without token, unique key or ``at``: enqueue them in one statement (the store's).

    Returns ``(results, True)``; or, with nothing written, ``(None, False)``
    when the queue does not exist yet, ``(None, True)`` when the batch does not
    fit under ``FQ_MAX_JOBS_PER_QUEUE`` (the general path then raises
    :class:`QueueFull` with the numbers).
    """
    done, found = storage.for_connection(conn).enqueue_plain(
        conn, queue, items, now=db.now_sql(conn), max_jobs=max_jobs_per_queue(), channel=db.NOTIFY_CHANNEL
    )
    if done:
        history.note(conn, queue, done[0].enqueued_at, enqueued=len(done))
    return done, found


def _through(chain, queue: str, index: int, raw):
    """Envelope ``raw`` (item ``index``) with the metadata the enqueue middleware ``chain`` leaves."""
    if not isinstance(raw, Mapping) or "payload" not in raw:
        return raw  # _parse_item reports it
    options = {k: v for k, v in raw.items() if k not in ("payload", "metadata", "depends_on", "batch") and v is not None}
    try:
        meta = middleware.run_enqueue_middleware(chain, queue, raw["payload"], raw.get("metadata"), options)
    except EnqueueRefused as exc:
        if exc.field is None:
            exc.field = f"items[{index}]"
        raise
    return {**raw, "metadata": meta}


def _parse_item(index: int, raw, limit: int, encode=None) -> _Item:
    try:
        if type(raw) is dict and len(raw) == 1 and "payload" in raw:
            # The common bulk envelope, {"payload": ...}: only the payload to check.
            text, size = validation.json_text(raw["payload"], "payload", limit, encode)
            return _new_item(_Item, (text, size, *_NO_OPTIONS))
        prefix = f"items[{index}]."
        if not isinstance(raw, Mapping) or "payload" not in raw:
            raise InvalidArgument(f"{prefix}payload is required", field=f"{prefix}payload")
        extra = set(raw) - ENVELOPE_KEYS
        if extra:
            name = sorted(map(str, extra))[0]
            raise InvalidArgument(f"unknown enqueue option: {name}", field=f"{prefix}{name}")
        return parse_options(raw, limit, encode)
    except InvalidArgument as exc:
        prefix = f"items[{index}]."
        if not str(exc.field).startswith(prefix):
            exc.field = f"{prefix}{exc.field}"
        exc.message = f"{prefix}{exc.message}" if not exc.message.startswith(prefix) else exc.message
        exc.args = (exc.message,)
        raise


def parse_options(raw: Mapping, limit: int | None = None, encode=None) -> _Item:
    """Validate one envelope; raise the first :class:`InvalidArgument` found.

    ``limit``: the payload size limit in bytes (default ``FQ_MAX_PAYLOAD_BYTES``);
    ``encode``: the batch's :func:`validation.batch_encoder`, if any.
    """
    text, size = validation.json_text(raw["payload"], "payload", limit, encode)
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
    meta = raw.get("metadata")
    meta_text, tags = validation.metadata(meta) if meta is not None else (None, None)
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
        metadata=meta_text,
        tags=tags,
        concurrency_key=validation.concurrency_key(raw.get("concurrency_key")),
        depends_on=dependencies.parse(raw.get("depends_on")),
        batch=_batch_id(raw.get("batch")),
    )


def _batch_id(value: object) -> str | None:
    """The ``batch`` option: ``None`` or a batch id (32 lowercase hex characters)."""
    if value is None:
        return None
    if not validation.job_id(value):
        raise InvalidArgument("batch is not a batch id (32 lowercase hex characters)", field="batch")
    return cast(str, value)


def _write_batch(
    queue: str,
    items: list[_Item],
    *,
    batch: bool,
    create: bool = True,
    room: bool = True,
    uids: list[str] | None = None,
    fresh: dependencies.Fresh | None = None,
) -> list[EnqueueResult]:
    """Write ``items`` into ``queue`` in the current transaction. ``room=False``: skip the queue-full
    check (a batch's callback, enqueued by the ack of the batch's last member). ``uids`` and
    ``fresh``: those of :func:`enqueue_steps`."""
    conn = db.connection()
    db.take_write_lock(conn, queue)
    q = get_or_create_queue(queue, lock=True) if create else get_queue(queue, lock=True)
    pol = policy_of(q)
    now = db.now_sql(conn)
    in_batch: dict[str, str] = {}  # batch id -> the field of the first item naming it (for the errors)
    for i, it in enumerate(items):
        if it.batch is not None and it.batch not in in_batch:
            in_batch[it.batch] = f"items[{i}].batch" if batch else "batch"
    batch_pks = batches.resolve(conn, q.id, in_batch) if in_batch else {}
    if any(it.at is not None for it in items):
        _check_horizon(conn, now, items, batch)

    uids = list(uids) if uids is not None else [secrets.token_hex(16) for _ in items]
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

    with_deps = {i: deps for i in new if (deps := items[i].depends_on)}
    wanted = [(f"items[{i}]." if batch else "", deps) for i, deps in with_deps.items()]
    skip = fresh.uids if fresh is not None else frozenset()
    if not wanted:
        found = {}
    else:  # (skip only when there is some: the plain enqueue's call stays what it was)
        found = dependencies.check(conn, wanted, skip=skip) if skip else dependencies.check(conn, wanted)
    # Dependents of jobs this write inserts (a workflow's): their edges wait for attach_fresh.
    later = {i for i, deps in with_deps.items() if any(e.id in skip for e in deps)} if skip else set()
    # A job that will wait for dependencies (or be cancelled by one) is inserted held: outside the
    # claim index until attach() makes it waiting, and no slot of its key (its release admits it).
    now_known = {i: deps for i, deps in with_deps.items() if i not in later}
    states: dict[int, str] = dict.fromkeys([*dependencies.parked(now_known, found), *later], "held")
    keyed_new: list[int] = []
    if new:
        if room:
            check_queue_room(conn, q.id, jobs=len(new))
        _lock_keys(conn, q.id, {items[i].unique_key for i in new})
        keyed_new = [i for i in new if items[i].concurrency_key is not None and i not in states]
        if keyed_new:  # admitted to their key's slots, or held (services.keys)
            admission, key_policy, key_rows = slots.plan_enqueue(
                conn,
                queue_id=q.id,
                limited=q.key_concurrency > 0 or q.key_rate_limit > 0,
                jobs=_due(conn, now, items, keyed_new),
            )
            states.update(admission)
        created = _insert_jobs(conn, now, q.id, pol, items, uids, new, states)
        for i in new:
            if uids[i] in created:
                continue
            # A concurrent enqueue committed an active job with this unique key first.
            key = items[i].unique_key
            target = _active_keys(conn, q.id, {key}, refused=True).get(key) if key is not None else None
            if target is None:
                created |= _insert_jobs(conn, now, q.id, pol, items, uids, [i], states)
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
    store = storage.for_connection(conn)
    for token, target in token_fixups.items():
        store.point_token(conn, q.id, token, target)
    if batch_pks:  # before attach: a member it cancels at once is counted in its batch
        made = {r.id for r in results if r.created}
        joined: dict[int, tuple[str, list[str]]] = {}
        for i in new:
            it = items[i]
            if it.batch is not None and uids[i] in made:
                joined.setdefault(batch_pks[it.batch], (in_batch[it.batch], []))[1].append(uids[i])
        batches.join(conn, joined)
    if wanted:  # the created jobs' edges; a job coalesced onto another keeps that one's dependencies
        made = {r.id for r in results if r.created}
        jobs = [(uids[i], q.id, deps) for i, deps in now_known.items() if uids[i] in made]
        if jobs:
            dependencies.attach(conn, now=now, jobs=jobs, found=found)
        if later:
            assert fresh is not None
            fresh.jobs += [(uids[i], q.id, with_deps[i]) for i in sorted(later) if uids[i] in made]
            fresh.found.update(found)
    if keyed_new:  # after attach: the key's held jobs are only the ones admission holds
        admitted = Counter(
            items[i].concurrency_key for i in keyed_new if states[i] == "queued" and uids[i] in created
        )
        slots.finish_enqueue(conn, queue_id=q.id, queue=queue, policy=key_policy, rows=key_rows, admitted=admitted)

    if new:  # the new jobs' enqueue times, as the database wrote them
        results = [EnqueueResult(r.id, True, created[r.id]) if r.created else r for r in results]
    n_created = sum(1 for r in results if r.created)
    add_counters(conn, q.id, enqueued=n_created, deduplicated=len(items) - n_created, active=n_created)
    if n_created:
        history.note(conn, q.id, max(created.values()), enqueued=n_created)
        db.notify(conn, queue)
    return results


def _check_horizon(conn, now: str, items: list[_Item], batch: bool) -> None:
    """``at`` must lie within 10 years of the database's now (the error names the first item past it)."""
    latest = max(it.at for it in items if it.at is not None)
    horizon = storage.for_connection(conn).clock_plus(conn, now, validation.MAX_DELAY_MS)
    if latest > horizon:
        index = next(i for i, it in enumerate(items) if it.at is not None and it.at > horizon)
        field = f"items[{index}].at" if batch else "at"
        raise InvalidTime(f"{field} must be within 10 years from now", field=field)


def _claim_tokens(conn, now, queue_id, pol, items, uids, first_by_token) -> dict[str, str]:
    """Insert (or take over expired) tokens; return ``{token: job uid}`` of the live ones we do not own."""
    if not first_by_token:
        return {}
    tokens = sorted(first_by_token)  # a fixed order: concurrent batches cannot deadlock
    rows = [
        (t, uids[first_by_token[t]], items[first_by_token[t]].retention_ms or pol.idempotency_retention_ms)
        for t in tokens
    ]
    named, added = storage.for_connection(conn).take_tokens(conn, now=now, queue_id=queue_id, rows=rows)
    if added:
        check_queue_room(conn, queue_id, tokens=added)
        add_counters(conn, queue_id, token_rows=added)
    # A token names our job exactly when we wrote it (uids are unique); the others are live.
    return {token: named[token] for token, uid, _ in rows if named[token] != uid}


def _active_keys(conn, queue_id: int, keys: set, *, refused: bool = False) -> dict[str, str]:
    """``{unique_key: uid}`` of the queue's scheduled/ready/running jobs holding one of ``keys``.

    ``refused=True`` after an insert of ``keys`` was refused (a job holds them: see the store).
    """
    wanted = sorted(k for k in keys if k is not None)
    return storage.for_connection(conn).active_jobs_by_key(conn, queue_id, wanted, refused=refused)


def _lock_keys(conn, queue_id: int, keys: set) -> None:
    """Take the unique keys' transaction locks in sorted order before inserting (where the store has them).

    Jobs are inserted in input order (their enqueue order), so two batches
    holding the same keys in opposite orders would wait on each other's
    index entries; locking the keys first, sorted, makes them queue up instead.
    """
    storage.for_connection(conn).lock_unique_keys(conn, queue_id, sorted(k for k in keys if k is not None))


def _due(conn, now: str, items: list[_Item], indexes: list[int]) -> list[tuple[int, str, int, bool]]:
    """``(index, concurrency_key, priority, due)`` of keyed items: due when eligible at once (no delay, no later ``at``)."""
    clock = storage.for_connection(conn).clock_plus(conn, now, 0) if any(items[i].at is not None for i in indexes) else 0
    out = []
    for i in indexes:
        it = items[i]
        due = it.at <= clock if it.at is not None else not it.delay_ms
        out.append((i, cast(str, it.concurrency_key), it.priority, due))
    return out


def _insert_jobs(conn, now, queue_id, pol, items, uids, indexes, states=None) -> dict[str, int]:
    """Insert the jobs of ``indexes``; return ``{uid: enqueued_at}`` of those inserted (unique-key conflicts skip).

    ``states``: index → ``queued`` or ``held`` for keyed items (:func:`~django_fq.services.keys.plan_enqueue`).
    """
    store = storage.for_connection(conn)
    created: dict[str, int] = {}
    for start in range(0, len(indexes), _CHUNK):
        chunk = indexes[start : start + _CHUNK]
        # Payloads above FQ_PAYLOAD_OFFLOAD_BYTES: the job row keeps the marker, the body its own row.
        stored, bodies = payloads.split([(uids[i], items[i].payload, items[i].size) for i in chunk])
        rows = []
        for i, text in zip(chunk, stored, strict=True):
            it = items[i]
            rows.append(
                (
                    uids[i],
                    it.priority,
                    it.at,
                    it.delay_ms or 0,
                    it.max_attempts or pol.max_attempts,
                    pol.timeout_ms if it.timeout_ms is None else it.timeout_ms,
                    text,
                    it.size,
                    it.unique_key,
                    it.token,
                    it.metadata,
                    it.tags,
                    it.concurrency_key,
                    (states or {}).get(i, "queued"),
                )
            )
        inserted = store.insert_jobs(conn, now=now, queue_id=queue_id, rows=rows)
        # Same transaction as the jobs: a job is never committed without its body. Only the
        # inserted ones (a row skipped for its unique key has no job to belong to).
        store.insert_bodies(conn, [b for b in bodies if b[0] in inserted])
        created.update(inserted)
    return created
