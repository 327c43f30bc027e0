"""Queue verbs: configure, policy, queues, delete_queue, pause, resume."""

from __future__ import annotations

from .. import db, storage, validation
from ..exceptions import InvalidPolicy, QueueNotFound
from ..types import STATE_NAMES, PauseResult, QueueInfo, QueuePolicy
from . import keys as slots
from ._base import (
    JOB,
    POLICY_FIELDS,
    QUEUE,
    REPORTED_STATE_SQL,
    get_or_create_queue,
    get_queue,
    policy_of,
)

#: Bounds of every policy field; defined in ``validation`` so that modules without models can use them.
POLICY_BOUNDS = validation.POLICY_BOUNDS


def configure(queue: str, **changes: int) -> QueuePolicy:
    """Set policy fields of ``queue``, creating it with defaults if missing.

    ``changes`` are any of ``concurrency`` (0–100000, 0 = unlimited),
    ``max_attempts`` (1–1000), ``backoff_ms`` (0–86400000),
    ``max_backoff_ms`` (≥ backoff_ms, ≤ 30 days), ``visibility_ms``
    (1 ms–24 h), ``idempotency_retention_ms`` (1 ms–30 days), ``timeout_ms``
    (0–7 days, 0 = none), ``key_concurrency`` (0–100000, 0 = unlimited: most
    running jobs per concurrency key, docs/reference/semantics.md §9 "Per-key limits"); ``None``
    values are ignored. All values are checked before anything is written.
    Returns the resulting policy. A change of ``key_concurrency`` waits for
    the queue's enqueues in progress and recounts its waiting keyed jobs in
    the same transaction (:func:`~django_fq.services.keys.rebalance`).

    Raises :class:`InvalidQueueName`, :class:`InvalidPolicy` (naming the field).
    """
    validation.queue_name(queue)
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidPolicy(f"unknown policy field: {name}", field=name)
    changes = {k: v for k, v in changes.items() if v is not None}
    for name, value in changes.items():
        lo, hi = POLICY_BOUNDS[name]
        validation.integer(value, name, lo, hi, InvalidPolicy)

    def apply():
        q = get_or_create_queue(queue)
        merged = {**{f: getattr(q, f) for f in POLICY_FIELDS}, **changes}
        if merged["max_backoff_ms"] < merged["backoff_ms"]:
            raise InvalidPolicy("max_backoff_ms must be at least backoff_ms", field="max_backoff_ms")
        old_limit = q.key_concurrency
        if changes:
            for name, value in changes.items():
                setattr(q, name, value)
            q.save(using=db.connection().alias, update_fields=list(changes))
        if "key_concurrency" in changes and changes["key_concurrency"] != old_limit:
            # The jobs waiting for their keys' slots, counted again for the new limit (services.keys).
            slots.rebalance(db.connection(), queue_id=q.id, queue=queue, limit=changes["key_concurrency"])
        return policy_of(q)

    return db.retrying(apply)


def policy(queue: str) -> QueuePolicy:
    """The policy of ``queue``. Raises :class:`QueueNotFound` (and creates nothing) if missing."""
    return policy_of(get_queue(queue))


def queues() -> list[QueueInfo]:
    """Every queue, by name, with its policy and its job counts per reported state."""
    from ..models import Queue
    from ._base import manager

    rows = list(manager(Queue).order_by("name"))
    counts = _counts_by_queue()
    return [
        QueueInfo(
            name=q.name,
            policy=policy_of(q),
            counts=counts.get(q.id, _zero_counts()),
            created_at=q.created_at,
            paused=bool(q.paused),
            paused_at=q.paused_at,
        )
        for q in rows
    ]


def counts(queue_id: int) -> dict[str, int]:
    """Job counts per reported state for one queue (every state name present)."""
    return _counts_by_queue(queue_id).get(queue_id, _zero_counts())


def delete_queue(queue: str) -> None:
    """Delete ``queue`` with its jobs, leases, idempotency tokens and counters.

    Raises :class:`QueueNotFound` if it does not exist.
    """

    def apply():
        conn = db.connection()
        q = get_queue(queue)
        # Enqueues hold the queue row FOR KEY SHARE until they commit: wait for
        # them, and stop new ones, so the DELETE below sees every job.
        store = storage.for_connection(conn)
        store.lock_queue_row(conn, QUEUE, q.id, exclusive=True)
        store.delete_queue_rows(conn, q.id)

    db.retrying(apply)


def pause(queue: str) -> PauseResult:
    """Stop every claim of ``queue``, on every host, from the moment this returns.

    The flag is written in one transaction and read by each claim's own SQL
    (docs/reference/semantics.md §9 "Pause"): a claim that starts after this returned
    hands out no job (an empty list; a long poll waits its ``wait_ms`` out, then
    returns none). Jobs already running go on, and their ack, nack, release,
    extend and progress work as usual; enqueues still add jobs; the reaper
    still ends expired leases, and those jobs wait, ready or scheduled, for
    :func:`resume`. ``paused_at`` is the database clock (epoch ms) of the pause.

    Pausing a paused queue changes nothing and returns ``changed=False`` with
    the first ``paused_at``. Raises :class:`InvalidQueueName`,
    :class:`QueueNotFound` (and creates nothing).
    """
    return _set_paused(queue, True)


def resume(queue: str) -> PauseResult:
    """Let claims of ``queue`` take jobs again (undoes :func:`pause`).

    Idle workers and long polls are woken as by an enqueue (PostgreSQL's
    NOTIFY at commit; this process's waiters elsewhere, other processes at
    their next poll). Resuming a queue that is not paused changes nothing and
    returns ``changed=False``. Raises :class:`InvalidQueueName`,
    :class:`QueueNotFound`.
    """
    return _set_paused(queue, False)


def _set_paused(queue: str, paused: bool) -> PauseResult:
    def apply():
        conn = db.connection()
        store = storage.for_connection(conn)
        q = get_queue(queue)
        # The row locked first: the flag read here is the newest commit's and holds until this
        # commits, so a pause that lost a race to another pause still answers paused.
        state = store.lock_pause_state(conn, q.id)
        if state is None:
            raise QueueNotFound(f"no such queue: {queue}", field="queue")
        if state[0] == paused:
            return PauseResult(queue=queue, paused=paused, paused_at=state[1], changed=False)
        store.set_paused(conn, now=db.now_sql(conn), queue_id=q.id, paused=paused)
        if not paused:
            db.notify(conn, queue)  # at commit, as an enqueue's: idle claimers look again at once
            return PauseResult(queue=queue, paused=False, paused_at=None, changed=True)
        after = store.lock_pause_state(conn, q.id)  # paused_at as the database stamped it
        return PauseResult(queue=queue, paused=True, paused_at=after[1] if after else None, changed=True)

    return db.retrying(apply)


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(STATE_NAMES, 0)


def _counts_by_queue(queue_id: int | None = None) -> dict[int, dict[str, int]]:
    conn = db.connection()
    state = REPORTED_STATE_SQL.format(now=db.now_sql(conn))
    where, params = ("WHERE j.queue_id = %s", [queue_id]) if queue_id is not None else ("", [])
    out: dict[int, dict[str, int]] = {}
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT j.queue_id, {state} AS s, COUNT(*) FROM {JOB} j {where} GROUP BY j.queue_id, s",
            params,
        )
        for qid, s, n in cur.fetchall():
            out.setdefault(qid, _zero_counts())[s] = n
    return out
