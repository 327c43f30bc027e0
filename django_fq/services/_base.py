"""Plumbing shared by the service modules: queue lookup, counters, SQL helpers.

Nothing here is public API.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from django.db import IntegrityError, transaction

from .. import conf, db, storage, validation
from ..exceptions import QueueFull, QueueNotFound, TooManyQueues
from ..models import QUEUED_STATES, IdempotencyToken, Job, Lease, Queue, QueueCounter
from ..types import TIMING_NAMES, TOTAL_NAMES, QueuePolicy

JOB = Job._meta.db_table
LEASE = Lease._meta.db_table
QUEUE = Queue._meta.db_table
TOKEN = IdempotencyToken._meta.db_table
COUNTER = QueueCounter._meta.db_table

POLICY_FIELDS = tuple(QueuePolicy.__dataclass_fields__)
#: Every counter column of QueueCounter: the reported totals and timings,
#: plus ``active`` (scheduled+ready+running jobs) and ``token_rows``.
COUNTER_NAMES = TOTAL_NAMES + TIMING_NAMES + ("active", "token_rows")

#: Stored state → reported state, as SQL over a job row aliased ``j`` (docs/reference/semantics.md §9 "Time").
REPORTED_STATE_SQL = (
    "CASE WHEN j.state IN ('queued', 'held') AND j.run_at > {now} THEN 'scheduled' "
    "WHEN j.state IN ('queued', 'held') THEN 'ready' ELSE j.state END"
)


def manager(model):
    """``model``'s default manager on django-fq's database alias."""
    return model.objects.using(conf.database())


# In model field order: Model.from_db() maps values to fields by that order.
_QUEUE_COLUMNS = tuple(
    f.attname for f in Queue._meta.concrete_fields if f.attname in {"id", "name", "created_at", "paused", "paused_at", *POLICY_FIELDS}
)


def reported_state(prefix: str = ""):
    """The reported state of a job as an ORM expression (``prefix``: the path to the job, e.g. ``"job__"``).

    ``queued`` and ``held`` (a job waiting for its key's slot) report as
    ``scheduled`` while ``run_at`` is ahead of the database clock, else
    ``ready``; every other stored state (``waiting`` included) as itself.
    """
    from django.db.models import Case, F, Value, When

    now = db.DbNow()
    return Case(
        When(**{f"{prefix}state__in": QUEUED_STATES, f"{prefix}run_at__gt": now}, then=Value("scheduled")),
        When(**{f"{prefix}state__in": QUEUED_STATES}, then=Value("ready")),
        default=F(f"{prefix}state"),
    )


def get_queue(name: str, *, lock: bool = False) -> Queue:
    """The queue row named ``name``; :class:`QueueNotFound` if there is none. Never creates.

    One hand-written SELECT: every verb starts here, so it stays off the ORM's
    query compiler. ``lock=True`` (paths that insert jobs) holds the row
    ``FOR KEY SHARE`` on PostgreSQL until the transaction ends, so
    :func:`~django_fq.services.delete_queue` waits for the jobs to commit and
    deletes them too (jobs have no database-level foreign key to their queue).
    """
    validation.queue_name(name)
    conn = db.connection()
    store = storage.for_connection(conn)
    suffix = store.key_share_sql if lock else ""
    sql = f"SELECT {', '.join(_QUEUE_COLUMNS)} FROM {QUEUE} WHERE name = %s"
    with conn.cursor() as cur:
        cur.execute(f"{sql}{suffix}", [name])
        row = cur.fetchone()
        if row is None and not lock and store.may_read_stale(conn):
            # A caller's snapshot may predate the queue's creation: ask the newest commit
            # (a locking read), only on a miss, so a found queue's row is never held.
            cur.execute(f"{sql}{store.fresh_read_sql(conn)}", [name])
            row = cur.fetchone()
    if row is None:
        raise QueueNotFound(f"no such queue: {name}", field="queue")
    return Queue.from_db(conf.database(), list(_QUEUE_COLUMNS), list(row))


#: Key of the lock that serialises queue creations (the ``FQ_MAX_QUEUES`` count; see Store.lock_queue_creation).
_CREATE_LOCK_KEY = 0x66710001


def lock_queue_creation(conn) -> None:
    """Wait for other transactions creating queues (a lock the store holds until this transaction ends)."""
    storage.for_connection(conn).lock_queue_creation(conn, _CREATE_LOCK_KEY)


def check_room_for_a_queue(conn, name: str) -> None:
    """Raise :class:`TooManyQueues` if one more queue would pass ``FQ_MAX_QUEUES``.

    Call it inside the transaction that creates the queue. It first takes
    the store's queue-creation lock, held until that transaction ends, so
    concurrent creations count one after the other and the limit holds
    exactly. It runs only on the way to creating a queue, never on an enqueue
    into an existing one.
    """
    limit = conf.max_queues()
    lock_queue_creation(conn)
    count = storage.for_connection(conn).count_queues(conn)
    if count >= limit:
        raise TooManyQueues(
            f"too many queues: the database holds {count} and FQ_MAX_QUEUES is {limit}; "
            f"queue {name} was not created",
            field="queue",
            limit=limit,
        )


def get_or_create_queue(name: str, *, lock: bool = False) -> Queue:
    """The queue row named ``name``, created with the default policy if missing (race-safe).

    ``lock``: as for :func:`get_queue`. Raises :class:`TooManyQueues` when
    creating it would pass ``FQ_MAX_QUEUES`` (nothing is created).
    """
    for _ in range(5):
        try:
            return get_queue(name, lock=lock)
        except QueueNotFound:
            pass
        try:
            with transaction.atomic(using=conf.database()):
                conn = db.connection()
                lock_queue_creation(conn)
                if not _exists(conn, name):  # else created while this waited for the lock: use it
                    check_room_for_a_queue(conn, name)
                    manager(Queue).create(name=name, created_at=db.DbNow(), ttl_ms=conf.queue_ttl_ms())
        except IntegrityError:
            continue  # created concurrently (and maybe deleted again since): look again
        try:
            return get_queue(name, lock=lock)
        except QueueNotFound:
            continue  # deleted again between its creation and this read: create it again
    raise QueueNotFound(f"queue {name} is being created and deleted concurrently; try again", field="queue")


def _exists(conn, name: str) -> bool:
    with conn.cursor() as cur:
        cur.execute(f"SELECT 1 FROM {QUEUE} WHERE name = %s", [name])
        return cur.fetchone() is not None


def policy_of(q: Queue) -> QueuePolicy:
    """The :class:`QueuePolicy` stored on queue row ``q``."""
    return QueuePolicy(**{f: getattr(q, f) for f in POLICY_FIELDS})


def add_counters(conn, queue_id: int, **deltas: int) -> None:
    """Add ``deltas`` (counter name → increment) to the queue's counters.

    Adds to one :class:`QueueCounter` shard that no other transaction holds
    (``SKIP LOCKED`` where rows lock), or inserts a new shard when every
    shard is busy, so this never waits for another transaction.
    """
    deltas = {k: v for k, v in deltas.items() if v}
    if deltas:
        storage.for_connection(conn).add_counters(conn, queue_id, deltas)


def counter_sums(conn, queue_id: int, names=COUNTER_NAMES) -> dict[str, int]:
    """The queue's counters ``names``: sums over its shards (one statement, one snapshot)."""
    return storage.for_connection(conn).counter_sums(conn, queue_id, names)


class Overflow(NamedTuple):
    """A per-queue limit an addition would pass (see :func:`queue_overflow`)."""

    #: The setting: ``"FQ_MAX_JOBS_PER_QUEUE"`` or ``"FQ_MAX_TOKENS_PER_QUEUE"``.
    setting: str
    #: Its value.
    limit: int
    #: What the queue holds now: active (scheduled + ready + running) jobs, or token rows.
    held: int
    #: What the caller would add.
    adding: int


def max_jobs_per_queue() -> int:
    """``FQ_MAX_JOBS_PER_QUEUE``: the most scheduled + ready + running jobs a queue may hold."""
    return int(conf.get("FQ_MAX_JOBS_PER_QUEUE"))


def fits(held: int, adding: int, limit: int) -> bool:
    """The queue-full rule (docs/reference/semantics.md §9): ``held + adding`` must not pass ``limit``.

    The one-statement PostgreSQL enqueue states the same rule in SQL
    (``active + n <= limit``) with :func:`max_jobs_per_queue`.
    """
    return held + adding <= limit


def queue_overflow(conn, queue_id: int, *, jobs: int = 0, tokens: int = 0) -> Overflow | None:
    """The first per-queue limit that adding ``jobs`` active jobs and ``tokens`` token rows would pass, or ``None``.

    Jobs count against ``FQ_MAX_JOBS_PER_QUEUE``, token rows against
    ``FQ_MAX_TOKENS_PER_QUEUE``; what the queue holds is read from its
    counters (one statement). For every writer that adds jobs or tokens
    (enqueue, import), each raising its own error.
    """
    sums = counter_sums(conn, queue_id, ("active", "token_rows"))
    checks = (
        ("FQ_MAX_JOBS_PER_QUEUE", max_jobs_per_queue(), sums["active"], jobs),
        ("FQ_MAX_TOKENS_PER_QUEUE", int(conf.get("FQ_MAX_TOKENS_PER_QUEUE")), sums["token_rows"], tokens),
    )
    for setting, limit, held, adding in checks:
        if adding and not fits(held, adding, limit):
            return Overflow(setting, limit, held, adding)
    return None


def check_queue_room(conn, queue_id: int, *, jobs: int = 0, tokens: int = 0) -> None:
    """Raise :class:`QueueFull` if adding ``jobs`` active jobs or ``tokens`` token rows would pass a limit.

    The enqueue's error: field ``queue`` for jobs, ``idempotency`` for tokens.
    """
    over = queue_overflow(conn, queue_id, jobs=jobs, tokens=tokens)
    if over is None:
        return
    if over.setting == "FQ_MAX_JOBS_PER_QUEUE":
        raise QueueFull(f"queue full: {over.held} of {over.limit} jobs active (FQ_MAX_JOBS_PER_QUEUE)", field="queue")
    raise QueueFull(f"queue full: {over.limit} idempotency tokens (FQ_MAX_TOKENS_PER_QUEUE)", field="idempotency")


def history_entry(at: int, attempt: int, kind: str, error: str, worker: str = "") -> dict:
    """One entry of a job's error history."""
    return {"at": at, "attempt": attempt, "kind": kind, "error": error, "worker": worker}


def append_history(errors: list | None, entry: dict, keep: int = 100) -> list:
    """``errors`` with ``entry`` appended, keeping the newest ``keep`` (100, docs/reference/semantics.md §9)."""
    out = list(errors or [])
    out.append(entry)
    return out[-keep:]


#: Entries a job's error history keeps, the newest (docs/reference/semantics.md §9).
HISTORY_KEEP = 100


def history_on_server(conn) -> bool:
    """True when the store appends a history entry in the database (:func:`history_value` needs no ``errors``)."""
    return storage.for_connection(conn).history_append_sql("errors", HISTORY_KEEP) is not None


def history_value(conn, errors: list | None, entry: dict):
    """What an ORM ``update(errors=...)`` writes to append ``entry`` to a job's history, keeping :data:`HISTORY_KEEP`.

    Where the store appends in the database, an expression that sends only
    ``entry`` (a full history of 64 KiB errors would not fit one statement,
    docs/reference/semantics.md §9); else the list, ``errors`` (the job's
    current history) with ``entry`` appended.
    """
    from django.db.models import JSONField
    from django.db.models.expressions import RawSQL

    sql = storage.for_connection(conn).history_append_sql("errors", HISTORY_KEEP)
    if sql is None:
        return append_history(errors, entry, HISTORY_KEEP)
    return RawSQL(sql, [json.dumps(entry)], output_field=JSONField())


def backoff_ms(policy: QueuePolicy, attempts: int) -> int:
    """Retry delay after failed attempt number ``attempts`` (≥ 1), in ms.

    ``min(max_backoff_ms, backoff_ms * 2**(attempts-1))`` with the exponent
    clamped at 62 so it never overflows (docs/reference/semantics.md §5, §9).
    """
    exponent = min(max(attempts - 1, 0), 62)
    return min(policy.max_backoff_ms, policy.backoff_ms * (2**exponent))


def dumps(value) -> str:
    """Compact JSON text of an already-validated value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def fetch_dicts(cur) -> list[dict]:
    """All rows of ``cur`` as dicts keyed by column name."""
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def load_json(value):
    """Decode a JSON column that a raw query may return as text or as a value."""
    if isinstance(value, (str, bytes)):
        return json.loads(value)
    return value
