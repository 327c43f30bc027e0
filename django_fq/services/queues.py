"""Queue verbs: configure, policy, queues, delete_queue, pause, resume; queues past their time to live."""

from __future__ import annotations

from .. import db, routing, storage, validation
from ..exceptions import InvalidPolicy, QueueNotFound
from ..models import Queue
from ..types import STATE_NAMES, PauseResult, QueueInfo, QueuePolicy
from . import keys as slots
from ._base import (
    JOB,
    POLICY_FIELDS,
    QUEUE,
    REPORTED_STATE_SQL,
    get_or_create_queue,
    get_queue,
    manager,
    policy_of,
)

#: Bounds of every policy field; defined in ``validation`` so that modules without models can use them.
POLICY_BOUNDS = validation.POLICY_BOUNDS


@routing.by_queue
def configure(queue: str, **changes: int) -> QueuePolicy:
    """Set policy fields of ``queue``, creating it with defaults if missing.

    ``changes`` are any of ``concurrency`` (0–100000, 0 = unlimited),
    ``max_attempts`` (1–1000), ``backoff_ms`` (0–86400000),
    ``max_backoff_ms`` (≥ backoff_ms, ≤ 30 days), ``visibility_ms``
    (1 ms–24 h), ``idempotency_retention_ms`` (1 ms–30 days), ``timeout_ms``
    (0–7 days, 0 = none), ``key_concurrency`` (0–100000, 0 = unlimited: most
    running jobs per concurrency key, docs/reference/semantics.md §9 "Per-key limits"),
    ``key_rate_limit`` (0–1000000, 0 = none: most claims of one concurrency
    key in any window of ``rate_window_ms``, same section), ``rate_limit``
    (0–1000000) and ``rate_window_ms`` (1 ms–24 h),
    ``ttl_ms`` (0–365 days, 0 = none: see :func:`expire_idle_queues`); ``None``
    values are ignored. All values are checked before anything is written; a
    change counts as activity of the queue for its time to live. Returns the
    resulting policy. The queue row is read under an update lock, so
    concurrent configures (and enqueues in progress) go one after the other.
    A change of ``key_concurrency`` or ``key_rate_limit`` (or of
    ``rate_window_ms`` while ``key_rate_limit`` is set) waits for the
    queue's enqueues in progress and recounts its waiting keyed jobs in the
    same transaction (:func:`~django_fq.services.keys.rebalance`).

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
        created = get_or_create_queue(queue)
        # Read again under the row's update lock: two configures, or a configure and an enqueue
        # (which holds the row shared), then go one after the other, and the old limits compared
        # below are the newest commit's (a plain read could be an older snapshot's).
        q = manager(Queue).select_for_update().get(id=created.id)
        merged = {**{f: getattr(q, f) for f in POLICY_FIELDS}, **changes}
        if merged["max_backoff_ms"] < merged["backoff_ms"]:
            raise InvalidPolicy("max_backoff_ms must be at least backoff_ms", field="max_backoff_ms")
        old = (q.key_concurrency, q.key_rate_limit, q.rate_window_ms)
        if changes:
            for name, value in changes.items():
                setattr(q, name, value)
            q.active_at = db.DbNow()
            q.save(using=db.connection().alias, update_fields=[*changes, "active_at"])
        new = (q.key_concurrency, q.key_rate_limit, q.rate_window_ms)
        window_matters = q.key_rate_limit > 0 and new[2] != old[2]
        if new[:2] != old[:2] or window_matters:
            # The jobs waiting for their keys' slots and tokens, counted again for the new limits (services.keys).
            slots.rebalance(db.connection(), queue_id=q.id, queue=queue, seed=old[1] == 0 and new[1] > 0)
        return policy_of(q)

    return db.retrying(apply)


@routing.by_queue
def policy(queue: str) -> QueuePolicy:
    """The policy of ``queue``. Raises :class:`QueueNotFound` (and creates nothing) if missing."""
    return policy_of(get_queue(queue))


def _queues_of_every_alias(answers) -> list[QueueInfo]:
    # A queue row left on an alias the mapping no longer sends it to is not listed: every
    # verb on that name reaches the other alias (docs/how-to/queues-over-databases.md).
    found = [q for alias, rows in answers for q in rows if routing.alias_for(q.name) == alias]
    return sorted(found, key=lambda q: q.name)


@routing.every_alias(_queues_of_every_alias)
def queues() -> list[QueueInfo]:
    """Every queue, by name, with its policy and its job counts per reported state.

    With ``FQ_QUEUE_DATABASES``, the queues of every database alias, merged by
    name (inside :func:`django_fq.routing.using`: only that alias's).
    """
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


@routing.by_queue
def delete_queue(queue: str) -> None:
    """Delete ``queue`` with its jobs, leases, idempotency tokens and counters.

    A job of another queue that depends on one of its unfinished jobs is
    treated as if that dependency were cancelled (its edge's ``on_failure``:
    ``run`` releases it, ``cancel`` and ``wait`` cancel it).

    Its batches are deleted with it, and no callback of theirs is enqueued.

    Raises :class:`QueueNotFound` if it does not exist.
    """

    def apply():
        conn = db.connection()
        q = get_queue(queue)
        # Enqueues hold the queue row FOR KEY SHARE until they commit: wait for
        # them, and stop new ones, so the DELETE below sees every job.
        store = storage.for_connection(conn)
        store.lock_queue_row(conn, QUEUE, q.id, exclusive=True)
        # Its batches go first, so that its members' cancel below enqueues no callback.
        from .. import batches

        batches.forget_queue(conn, q.id)
        # Jobs of other queues that depend on this queue's unfinished jobs: their dependencies
        # go away as if cancelled (docs/reference/semantics.md §9 "Dependencies").
        unfinished = [seq for seq, state in store.queue_dependency_rows(conn, q.id) if state != "succeeded"]
        if unfinished:
            from . import dependencies

            dependencies.finished(conn, unfinished, "cancelled")
        store.delete_queue_rows(conn, q.id)

    db.retrying(apply)


@routing.by_queue
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


@routing.by_queue
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


#: Stored states of finished jobs: a queue holding only these (or nothing) is empty for its time to live.
FINISHED_STORED = ("succeeded", "cancelled")


def expire_idle_queues(*, limit: int = 1000) -> list[str]:
    """Delete queues that have been empty and idle for their ``ttl_ms``; return their names.

    A queue with ``ttl_ms`` above 0 expires when, by the database clock,
    it holds no job that has not finished (scheduled, ready, running, dead
    or waiting jobs keep it), no live idempotency token, is not paused, and
    its latest activity is at least ``ttl_ms`` old. Its latest activity is
    the latest of: its creation, its last ``configure``, the last state
    change of its finished jobs, and what an earlier pass recorded in
    ``active_at`` (a pass records it for every queue with a time to live,
    so pruning finished jobs never makes a queue look idle since its
    creation). Each expiry takes the queue row exclusively (waiting for
    enqueues in flight, as :func:`delete_queue` does), checks the rule again
    under that lock and deletes the queue with its jobs, tokens, counters and
    policy (docs/reference/semantics.md §9 "Queue time to live"). At most
    ``limit`` queues (1 – 10⁹) are looked at per call. :func:`prune` calls
    this before it prunes jobs.
    """
    from ..models import Queue
    from ._base import manager

    validation.integer(limit, "limit", 1, 10**9)
    ids = list(manager(Queue).filter(ttl_ms__gt=0).order_by("id").values_list("id", flat=True)[:limit])
    if not ids:
        return []
    rows = _activity(ids)
    # Record what was seen first: the prune that follows may delete the finished jobs it came from.
    busy = [qid for qid, is_busy, _, _ in rows if is_busy]
    if busy:
        db.retrying(lambda: manager(Queue).filter(id__in=busy).update(active_at=db.DbNow()))
    for qid, is_busy, seen, _ in rows:
        if not is_busy:
            db.retrying(
                lambda qid=qid, seen=seen: (
                    manager(Queue).filter(id=qid).exclude(active_at__gte=seen).update(active_at=seen)
                )
            )
    gone = []
    for qid, _, _, expired in rows:
        if expired:
            name = db.retrying(_delete_if_expired, qid)
            if name is not None:
                gone.append(name)
    return gone


def _activity(ids: list[int]) -> list[tuple[int, bool, int, bool]]:
    """``(id, busy, seen, expired)`` of queues ``ids`` (see :func:`_with_activity`), read without a lock."""
    from ..models import Queue
    from ._base import manager

    return list(_with_activity(manager(Queue).filter(id__in=ids)).values_list("id", "busy", "seen", "expired"))


def _with_activity(qs):
    """``qs`` (of queues) annotated with ``busy``, ``seen`` (latest activity, epoch ms) and ``expired``."""
    from django.db.models import BigIntegerField, BooleanField, Case, Exists, F, OuterRef, Q, Subquery, Value, When
    from django.db.models.functions import Coalesce, Greatest

    from ..models import IdempotencyToken, Job
    from ..storage.dependencies import UNFINISHED_STATES
    from ._base import manager

    jobs = manager(Job).filter(queue_id=OuterRef("id"))

    def last_change(state: str):
        # One entry of the (queue, state, changed_at) index per state: never a scan of the queue's jobs.
        newest = jobs.filter(state=state).order_by("-changed_at").values("changed_at")[:1]
        return Coalesce(Subquery(newest), Value(0), output_field=BigIntegerField())

    seen = Greatest(
        F("created_at"),
        Coalesce(F("active_at"), Value(0), output_field=BigIntegerField()),
        *(last_change(state) for state in FINISHED_STORED),
        output_field=BigIntegerField(),
    )
    live_tokens = manager(IdempotencyToken).filter(queue_id=OuterRef("id"), expires_at__gt=db.DbNow())
    # A finished job that an unfinished job (of any queue) still depends on keeps the queue, as
    # it keeps prune from deleting the job (docs/reference/semantics.md §9 "Dependencies"). Only
    # jobs flagged has_dependents are probed, by the (upstream, job) index.
    needed = jobs.filter(has_dependents=True, dependent_edges__job__state__in=UNFINISHED_STATES)
    qs = qs.annotate(
        busy=Exists(jobs.exclude(state__in=FINISHED_STORED)) | Exists(needed),
        promised=Exists(live_tokens),
        seen=seen,
    )
    ripe = Q(busy=False, promised=False, paused=False, ttl_ms__gt=0, seen__lte=db.DbNow() - F("ttl_ms"))
    return qs.annotate(expired=Case(When(ripe, then=Value(True)), default=Value(False), output_field=BooleanField()))


def _delete_if_expired(queue_id: int) -> str | None:
    """In one transaction: lock queue ``queue_id`` exclusively, check it expired, delete it; its name or ``None``."""
    from ..models import Queue
    from ._base import manager

    conn = db.connection()
    store = storage.for_connection(conn)
    if not store.lock_queue_row(conn, QUEUE, queue_id, exclusive=True):
        return None  # deleted meanwhile
    if store.may_read_stale(conn):
        # A snapshot older than the lock (InnoDB REPEATABLE READ) could miss a job or token that
        # committed while this waited: look for one with locking reads, which read the newest commit.
        from ..models import IdempotencyToken, Job

        unfinished = manager(Job).filter(queue_id=queue_id).exclude(state__in=FINISHED_STORED)
        live = manager(IdempotencyToken).filter(queue_id=queue_id, expires_at__gt=db.DbNow())
        if any(qs.select_for_update().values_list("pk", flat=True)[:1] for qs in (unfinished, live)):
            return None
    # Read after the lock was granted: an enqueue that committed while this waited is seen here.
    row = _with_activity(manager(Queue).filter(id=queue_id)).filter(expired=True).values_list("name", flat=True)
    name = next(iter(row), None)
    if name is not None:
        store.delete_queue_rows(conn, queue_id)
    return name
