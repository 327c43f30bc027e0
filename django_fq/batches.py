"""Batches: a set of jobs of one queue and a callback enqueued exactly once when all of them have finished.

(docs/how-to/workflows.md "Batches", docs/reference/semantics.md §9 "Batches".)

A batch is created ``open``; jobs join it with the enqueue option ``batch=ID``
(``enqueue``, ``enqueue_many`` items, :func:`add`), in as many calls as
needed, until it is :func:`seal`-ed. A member has finished when it
``succeeded``, went ``dead`` or was ``cancelled``. The batch row holds the
counts; they change only under that row's lock, in the transaction that adds
or finishes a member (the ack, the nack or lease expiry that makes a job dead,
a cancel), so the callback is enqueued in the transaction that finishes the
last member of a sealed batch (or in the seal, when every member has already
finished), and in no other: concurrent finishers, reapers and retries
serialise on the row, and only the one that sees ``sealed`` with
``succeeded + dead + cancelled == total`` fires it and marks the batch
``finished``.

The callback job carries the counts in its metadata, under the key
``"batch"``: ``{"id", "total", "succeeded", "dead", "cancelled"}``.

Usage::

    from django_fq import batches

    b = batches.create("imports", callback={"queue": "reports", "payload": {"file": "orders.csv"}})
    batches.add(b.id, [{"payload": {"chunk": i}} for i in range(100)])
    batches.add(b.id, [{"payload": {"chunk": i}} for i in range(100, 120)])
    batches.seal(b.id)
    batches.get(b.id).progress  # done / total
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db.models import F

from . import conf, db, routing, storage, validation
from .exceptions import BatchNotFound, InvalidArgument, InvalidState, WrongDatabase
from .models import ACTIVE, Batch, BatchMember, Queue
from .types import EnqueueResult

#: Batch states: members may be added while ``open``; the callback fires once a ``sealed`` batch's
#: members have all finished, and the batch is then ``finished``; ``cancelled`` never fires.
STATES = ("open", "sealed", "finished", "cancelled")
#: Options a callback may carry besides ``queue`` and ``payload`` (those of ``enqueue`` that keep
#: their meaning for a job enqueued later by the database: no token, unique key, ``at`` or dependency).
CALLBACK_OPTIONS = frozenset({"priority", "delay_ms", "max_attempts", "timeout_ms", "metadata", "concurrency_key"})
#: Most rows :func:`members` and :func:`list_batches` return per call.
MAX_PAGE = 1000
#: Members :func:`cancel` reads per query (each is then cancelled in a transaction of its own).
CANCEL_CHUNK = 500
#: The largest count a callback's metadata may have to carry: its size is checked with it at create.
_WORST_COUNTS = {"id": "f" * 32, "total": 10**15, "succeeded": 10**15, "dead": 10**15, "cancelled": 10**15}


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """A batch as :func:`get` reads it. Times are epoch ms on the database clock (``None`` until they happen).

    ``total`` counts the members added; ``succeeded``, ``dead`` and
    ``cancelled`` those finished so far (read under no lock: a snapshot).
    ``callback_job``: the id of the callback job, once enqueued.
    """

    id: str
    queue: str
    state: str
    total: int
    succeeded: int
    dead: int
    cancelled: int
    callback_queue: str | None
    callback_job: str | None
    created_at: int
    sealed_at: int | None
    finished_at: int | None

    @property
    def done(self) -> int:
        """Members finished: ``succeeded + dead + cancelled``."""
        return self.succeeded + self.dead + self.cancelled

    @property
    def progress(self) -> float:
        """``done / total`` (0.0 – 1.0); 1.0 for a batch without members."""
        return self.done / self.total if self.total else 1.0

    def as_dict(self) -> dict:
        """The fields and ``done``/``progress`` as a JSON-ready dict (the CLI's ``--json``, REST)."""
        return {**dataclasses.asdict(self), "done": self.done, "progress": self.progress}


def _info(b: Batch, queue: str | None = None) -> BatchInfo:
    return BatchInfo(
        id=b.uid,
        queue=queue if queue is not None else b.queue.name,
        state=b.state,
        total=b.total,
        succeeded=b.succeeded,
        dead=b.dead,
        cancelled=b.cancelled,
        callback_queue=b.callback_queue,
        callback_job=b.callback_job,
        created_at=b.created_at,
        sealed_at=b.sealed_at,
        finished_at=b.finished_at,
    )


def _manager(model):
    return model.objects.using(conf.database())


def _not_found(batch_id: object, queue: str | None, field: str = "batch_id") -> BatchNotFound:
    if not validation.job_id(batch_id):
        return BatchNotFound("not a batch id: batch ids are 32 lowercase hex characters", field=field)
    where = f" in queue {queue}" if queue is not None else ""
    return BatchNotFound(f"no batch {batch_id}{where}", field=field)


def _find(batch_id: object, queue: str | None, *, lock: bool = False) -> Batch:
    """The batch row (with its queue), :class:`BatchNotFound` when there is none (in ``queue``, when given)."""
    if queue is not None:
        validation.queue_name(queue)
    if not validation.job_id(batch_id):
        raise _not_found(batch_id, queue)
    qs = _manager(Batch).filter(uid=batch_id)
    if queue is not None:
        qid = _manager(Queue).filter(name=queue).values_list("id", flat=True).first()
        if qid is None:
            raise _not_found(batch_id, queue)
        qs = qs.filter(queue_id=qid)
    if lock and storage.for_connection(db.connection()).supports_row_locks:
        qs = qs.select_for_update()  # the batch row only (no join: MySQL would lock the queue row too)
    else:
        qs = qs.select_related("queue")
    b = qs.first()
    if b is None:
        raise _not_found(batch_id, queue)
    return b


# --- the callback ----------------------------------------------------------------------------


def _parse_callback(callback: object, default_queue: str) -> tuple[str, str, str]:
    """``(queue, payload JSON text, options JSON text)`` of a callback given as a mapping or a tuple.

    A mapping: ``{"queue"?, "payload", <option>...}``; a tuple: ``(queue, payload)``
    or ``(queue, payload, {option: value})``. Options: :data:`CALLBACK_OPTIONS`.
    Raises :class:`InvalidArgument` naming ``callback.<field>``.
    """
    if isinstance(callback, (tuple, list)):
        if len(callback) not in (2, 3) or (len(callback) == 3 and not isinstance(callback[2], Mapping)):
            raise InvalidArgument("callback must be (queue, payload) or (queue, payload, options)", field="callback")
        callback = {"queue": callback[0], "payload": callback[1], **(callback[2] if len(callback) == 3 else {})}
    if not isinstance(callback, Mapping):
        raise InvalidArgument("callback must be an object with a payload", field="callback")
    if "payload" not in callback:
        raise InvalidArgument("callback.payload is required", field="callback.payload")
    extra = sorted(str(k) for k in callback if k not in CALLBACK_OPTIONS | {"queue", "payload"})
    if extra:
        raise InvalidArgument(f"unknown callback option: {extra[0]}", field=f"callback.{extra[0]}")
    queue = callback.get("queue") or default_queue
    try:
        validation.queue_name(queue)
    except InvalidArgument as exc:
        raise type(exc)(f"callback.queue: {exc.message}", field="callback.queue") from None
    if routing.alias_for(queue) != routing.alias_for(default_queue):
        # The last member's ack enqueues the callback in its own transaction: one database.
        raise WrongDatabase(
            f"callback.queue: queue {queue} is on database {routing.alias_for(queue)!r}, the batch's queue "
            f"{default_queue} on {routing.alias_for(default_queue)!r}; a batch and its callback share one database",
            field="callback.queue",
        )
    from .services.enqueue import parse_options

    options = {k: v for k, v in callback.items() if k in CALLBACK_OPTIONS and v is not None}
    meta = options.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise InvalidArgument("callback.metadata must be a JSON object", field="callback.metadata")
    if meta is not None and "batch" in meta:
        raise InvalidArgument(
            "callback.metadata.batch is set by the batch (its counts)", field="callback.metadata.batch"
        )
    try:
        # Checked with the largest counts it may carry, so the enqueue at the last finish never fails on size.
        worst = {**(meta or {}), "batch": _WORST_COUNTS}
        item = parse_options({**options, "payload": callback["payload"], "metadata": worst})
    except InvalidArgument as exc:
        exc.field = f"callback.{exc.field}" if exc.field else "callback"
        exc.message = f"callback.{exc.message}"
        exc.args = (exc.message,)
        raise
    return queue, item.payload, json.dumps(options, separators=(",", ":"))


def _fire(conn, b: Batch) -> None:
    """In the transaction holding batch ``b``'s row lock: enqueue its callback (if any), mark it finished.

    The callback skips the queue-full limit (``FQ_MAX_JOBS_PER_QUEUE``): its
    members already counted, and refusing it would fail the ack of the last one.
    """
    callback_job = None
    if b.callback_queue is not None:
        import importlib

        enq = importlib.import_module(
            "django_fq.services.enqueue"
        )  # the module (services re-exports a function of its name)

        options = json.loads(b.callback_options or "{}")
        meta = dict(options.pop("metadata", None) or {})
        meta["batch"] = {
            "id": b.uid,
            "total": b.total,
            "succeeded": b.succeeded,
            "dead": b.dead,
            "cancelled": b.cancelled,
        }
        meta_text, tags = validation.metadata(meta, "callback.metadata", 65536)
        text = b.callback_payload or "null"
        item = enq._Item(
            payload=text,
            size=len(text.encode()),
            priority=options.get("priority", 0),
            delay_ms=options.get("delay_ms"),
            at=None,
            token=None,
            retention_ms=None,
            unique_key=None,
            max_attempts=options.get("max_attempts"),
            timeout_ms=options.get("timeout_ms"),
            metadata=meta_text,
            tags=tags,
            concurrency_key=options.get("concurrency_key"),
        )
        callback_job = enq._write_batch(b.callback_queue, [item], batch=False, create=True, room=False)[0].id
    _manager(Batch).filter(id=b.id).update(state="finished", finished_at=db.DbNow(), callback_job=callback_job)


def _locked(batch_pk: int) -> Batch:
    qs = _manager(Batch).filter(id=batch_pk)
    if storage.for_connection(db.connection()).supports_row_locks:
        qs = qs.select_for_update()  # a locking read: MySQL's plain read would show its snapshot
    return qs.get()


def _fire_if_done(conn, batch_pk: int) -> None:
    b = _locked(batch_pk)
    if b.state == "sealed" and b.succeeded + b.dead + b.cancelled >= b.total:
        _fire(conn, b)


# --- hooks of the paths that add and finish jobs (services) ------------------------------------


def resolve(conn, queue_id: int, wanted: Mapping[str, str]) -> dict[str, int]:
    """At an enqueue: ``{batch uid: batch pk}`` of the batches ``wanted`` names (``{uid: field}``).

    Each must exist in the enqueue's queue (:class:`BatchNotFound`, field the
    item's ``batch``: a batch of another queue is reported as missing) and be
    ``open`` (:class:`InvalidState`). A plain read: :func:`join` re-checks
    ``open`` under the row lock.
    """
    rows = {
        uid: (pk, qid, state)
        for uid, pk, qid, state in _manager(Batch)
        .filter(uid__in=sorted(wanted))
        .values_list("uid", "id", "queue_id", "state")
    }
    out = {}
    for uid, field in wanted.items():
        row = rows.get(uid)
        if row is None or row[1] != queue_id:
            raise BatchNotFound(f"{field}: no batch {uid} in this queue", field=field)
        if row[2] != "open":
            raise InvalidState(
                f"{field}: batch {uid} is {row[2]}; members join only an open batch", field=field, state=row[2]
            )
        out[uid] = row[0]
    return out


def join(conn, joined: Mapping[int, tuple[str, Sequence[str]]]) -> None:
    """In the enqueue's transaction: jobs just inserted join their batches (``{pk: (field, [uid, …])}``).

    Adds them to ``total`` under the batch row's lock, in pk order; a batch
    sealed or cancelled since :func:`resolve` raises :class:`InvalidState`
    (the enqueue rolls back: nothing is written).
    """
    store = storage.for_connection(conn)
    for pk in sorted(joined):
        field, uids = joined[pk]
        if not uids:
            continue
        if not _manager(Batch).filter(id=pk, state="open").update(total=F("total") + len(uids)):
            state = _manager(Batch).filter(id=pk).values_list("state", flat=True).first() or "gone"
            raise InvalidState(
                f"{field}: the batch is {state}; members join only an open batch", field=field, state=state
            )
        store.join_batch(conn, pk, uids)


def settle(conn, seqs: Sequence[int], outcome: str, *, found: dict[int, int] | None = None) -> None:
    """Jobs ``seqs`` just finished with ``outcome`` (``succeeded``, ``dead``, ``cancelled``) in this transaction.

    Counts the members among them in their batches, under each batch row's
    lock (pk order), and fires the callback of a sealed batch whose last
    member this was. One lookup by the membership's primary key, then two
    statements per batch touched. ``found``: that lookup's answer
    (``{batch id: members}``) when the caller's statement already made it
    (PostgreSQL's releasing ack); ``seqs`` is then not read.
    """
    if found is None:
        found = storage.for_connection(conn).batches_of(conn, seqs)
    for pk in sorted(found):
        _manager(Batch).filter(id=pk).update(**{outcome: F(outcome) + found[pk]})
        _fire_if_done(conn, pk)


def unsettle(conn, seqs: Sequence[int], outcome: str = "dead") -> None:
    """Jobs ``seqs`` leave ``outcome`` in this transaction (a dead job retried, or cancelled): uncount them.

    A retried member is unfinished again, so the batch waits for it; after the
    callback fired the counts still follow the members, but no second callback
    is ever enqueued (docs/reference/semantics.md §9 "Batches").
    """
    found = storage.for_connection(conn).batches_of(conn, seqs)
    for pk in sorted(found):
        _manager(Batch).filter(id=pk).update(**{outcome: F(outcome) - found[pk]})


def forget_queue(conn, queue_id: int) -> None:
    """``delete_queue``: the queue's batches and their memberships go first, so no callback fires for them."""
    pks = list(_manager(Batch).filter(queue_id=queue_id).values_list("id", flat=True))
    for start in range(0, len(pks), 500):
        part = pks[start : start + 500]
        _manager(BatchMember).filter(batch_id__in=part).delete()
        _manager(Batch).filter(id__in=part).delete()


def prune(conn, *, retention_ms: int, limit: int) -> int:
    """Delete at most ``limit`` finished or cancelled batches that ended ``retention_ms`` or more ago.

    Their memberships go too (the members stay, as any finished job, until
    their own prune). Returns the number of batches deleted.
    """
    now = db.db_now_ms()
    pks = list(
        _manager(Batch)
        .filter(state__in=("finished", "cancelled"), finished_at__lte=now - retention_ms)
        .values_list("id", flat=True)[:limit]
    )
    for start in range(0, len(pks), 500):
        part = pks[start : start + 500]
        _manager(BatchMember).filter(batch_id__in=part).delete()
        _manager(Batch).filter(id__in=part).delete()
    return len(pks)


# --- the public API -------------------------------------------------------------------------


def _alias_holding(batch_id: object) -> str | None:
    """The alias whose database holds batch ``batch_id`` (asked alias by alias), ``None`` if none does."""
    if not validation.job_id(batch_id):
        return None
    for alias in routing.aliases():
        if Batch.objects.using(alias).filter(uid=batch_id).exists():
            return alias
    return None


def _by_batch(fn):
    """Run a verb of one batch on its database: the ``queue`` keyword's alias, else the alias that holds the batch.

    Batch ids are random 128-bit values, so at most one database holds a batch.
    Without ``FQ_QUEUE_DATABASES`` (or inside :func:`django_fq.routing.using`) the verb runs as it is.
    """

    @functools.wraps(fn)
    def routed(batch_id, *args, queue=None, **kwargs):
        if not routing.enabled() or routing.current() is not None:
            return fn(batch_id, *args, queue=queue, **kwargs)
        alias = routing.alias_for(queue) if queue is not None else _alias_holding(batch_id)
        with routing.using(alias or conf.get("FQ_DATABASE")):
            return fn(batch_id, *args, queue=queue, **kwargs)

    return routed


@routing.by_queue
def create(queue: str, *, callback: Mapping | Sequence | None = None, create_queue: bool = True) -> BatchInfo:
    """Create an open batch in ``queue`` (created with the default policy if missing, unless ``create_queue=False``).

    ``callback``: the job to enqueue once the sealed batch's members have all
    finished: ``{"queue": Q, "payload": P, <option>: ...}`` (``queue``
    defaults to the batch's) or ``(queue, payload[, options])``; options
    ``priority``, ``delay_ms``, ``max_attempts``, ``timeout_ms``, ``metadata``
    (a JSON object; the batch adds its counts under ``"batch"``, so the size
    limit is checked with the largest counts), ``concurrency_key``. ``None``:
    no callback (the batch still reports its progress and becomes finished).

    Raises :class:`InvalidQueueName`, :class:`QueueNotFound` (``create_queue=False``),
    :class:`TooManyQueues`, :class:`InvalidArgument` (field ``callback.<name>``),
    :class:`InvalidJson`, :class:`PayloadTooLarge`.
    """
    from .services._base import get_or_create_queue, get_queue

    validation.queue_name(queue)
    cb_queue = cb_payload = cb_options = None
    if callback is not None:
        cb_queue, cb_payload, cb_options = _parse_callback(callback, queue)

    def apply():
        q = get_or_create_queue(queue) if create_queue else get_queue(queue)
        return (
            _manager(Batch)
            .create(
                uid=secrets.token_hex(16),
                queue_id=q.id,
                callback_queue=cb_queue,
                callback_payload=cb_payload,
                callback_options=cb_options,
                created_at=db.db_now_ms(),
            )
            .pk
        )

    pk = db.retrying(apply)
    return _info(_manager(Batch).select_related("queue").get(id=pk))


@_by_batch
def add(batch_id: str, items: Iterable[Mapping], *, queue: str | None = None) -> list[EnqueueResult]:
    """Enqueue ``items`` (envelopes, as for ``enqueue_many``) as members of open batch ``batch_id``, all or none.

    Same as ``enqueue_many(batch's queue, items)`` with ``batch=batch_id`` on
    every item. An item that is deduplicated (idempotency token, unique key)
    returns the existing job and adds nothing. Raises :class:`BatchNotFound`
    (none, or not in ``queue`` when given), :class:`InvalidState` (sealed or
    cancelled, field ``batch``), :class:`InvalidArgument` (``items[i].batch``
    names another batch), and whatever ``enqueue_many`` raises.
    """
    from .services.enqueue import enqueue_many

    b = _find(batch_id, queue)
    envelopes = []
    for i, raw in enumerate(items):
        if isinstance(raw, Mapping) and raw.get("batch") not in (None, batch_id):
            raise InvalidArgument(f"items[{i}].batch names another batch", field=f"items[{i}].batch")
        envelopes.append({**raw, "batch": batch_id} if isinstance(raw, Mapping) else raw)
    return enqueue_many(b.queue.name, envelopes, create_queue=False)


@_by_batch
def seal(batch_id: str, *, queue: str | None = None) -> BatchInfo:
    """No more members: the callback fires when the last member finishes, or now if all have.

    Sealing a sealed or finished batch changes nothing. Raises
    :class:`BatchNotFound`, :class:`InvalidState` (cancelled).
    """

    def apply():
        conn = db.connection()
        b = _find(batch_id, queue, lock=True)
        if b.state == "cancelled":
            raise InvalidState("a cancelled batch cannot be sealed", field="batch_id", state=b.state)
        if b.state == "open":
            _manager(Batch).filter(id=b.id).update(state="sealed", sealed_at=db.DbNow())
            _fire_if_done(conn, b.id)

    db.retrying(apply)
    return get(batch_id, queue=queue)


@_by_batch
def cancel(batch_id: str, *, queue: str | None = None) -> BatchInfo:
    """Cancel the batch (no callback will be enqueued) and every member that has not finished.

    The batch becomes ``cancelled`` first, in its own transaction; then its
    waiting, scheduled, ready and running members (stored ``waiting``,
    ``held``, ``queued``, ``running``) are cancelled :data:`CANCEL_CHUNK`
    (500) at a time, one transaction per chunk and a bounded number of
    statements in each, whatever the chunk holds
    (:meth:`Store.cancel_unfinished <django_fq.storage.dependencies.DependencySql.cancel_unfinished>`):
    as ``cancel`` does it for one job, a running member's lease ends (its
    receipt then raises :class:`ReceiptCancelled`), each is counted as
    cancelled in its queue and in the batch, a key's slot goes to its next
    held job, and the members' dependents are cancelled or released as
    their edges' ``on_failure`` says. Dead members stay dead; members that
    finished meanwhile are counted by whoever finished them. Calling it
    again finishes an interrupted run. Raises :class:`BatchNotFound`,
    :class:`InvalidState` (the batch already finished).
    """
    from .services import dependencies
    from .services import keys as slots
    from .services._base import HISTORY_KEEP, add_counters

    def mark():
        b = _find(batch_id, queue, lock=True)
        if b.state == "finished":
            raise InvalidState("a finished batch cannot be cancelled", field="batch_id", state=b.state)
        if b.state != "cancelled":
            _manager(Batch).filter(id=b.id).update(state="cancelled", finished_at=db.DbNow())
        return b

    b = db.retrying(mark)
    queue_name = b.queue.name

    def cancel_chunk(seqs: list[int]) -> None:
        conn = db.connection()
        gone = storage.for_connection(conn).cancel_unfinished(conn, now=db.now_sql(conn), seqs=seqs, keep=HISTORY_KEEP)
        if not gone:
            return
        per_queue: dict[int, int] = {}
        for r in gone:
            per_queue[r["queue_id"]] = per_queue.get(r["queue_id"], 0) + 1
        for queue_id, n in sorted(per_queue.items()):
            add_counters(conn, queue_id, cancelled=n, active=-n)
        # A queued or running job of a key held one of its slots (a waiting or held one none).
        freed = [r["concurrency_key"] for r in gone if r["state"] in ("queued", "running")]
        slots.give_back(conn, queue_id=b.queue_id, queue=queue_name, freed=freed)
        # Counts them in the batch and applies their dependents' policies, all of the chunk at once.
        dependencies.finished(conn, [r["seq"] for r in gone], "cancelled")

    after = 0
    while True:
        rows = list(
            _manager(BatchMember)
            .filter(batch_id=b.id, job_id__gt=after)
            .order_by("job_id")
            .values_list("job_id", "job__state")[:CANCEL_CHUNK]
        )
        if not rows:
            break
        active = [seq for seq, state in rows if state in ACTIVE]
        if active:
            db.retrying(cancel_chunk, active)
        after = rows[-1][0]
    return get(batch_id, queue=queue)


@_by_batch
def get(batch_id: str, *, queue: str | None = None) -> BatchInfo:
    """The batch: state, counts, ``done``/``progress``, callback. Raises :class:`BatchNotFound`."""
    return _info(_find(batch_id, queue))


@_by_batch
def members(
    batch_id: str, *, queue: str | None = None, state: str | None = None, limit: int = 100, after: str | None = None
) -> list[dict]:
    """The batch's members in enqueue order: ``[{"id", "state"}, …]`` (reported states).

    ``state``: only members in that reported state (``waiting``, ``scheduled``,
    ``ready``, ``running``, ``succeeded``, ``dead``, ``cancelled``); ``limit``
    1 – 1,000; ``after``: a member's id, to read the page after it. Members
    pruned after the batch finished are no longer listed. Raises
    :class:`BatchNotFound`, :class:`InvalidArgument` (``state``, ``limit``, ``after``).
    """
    from .services._base import reported_state
    from .types import JobState

    b = _find(batch_id, queue)
    validation.integer(limit, "limit", 1, MAX_PAGE)
    if state is not None and state not in {s.value for s in JobState}:
        raise InvalidArgument(f"state must be one of {', '.join(s.value for s in JobState)}", field="state")
    qs = _manager(BatchMember).filter(batch_id=b.id)
    if after is not None:
        if not validation.job_id(after):
            raise InvalidArgument("after must be a job id", field="after")
        seq = _manager(BatchMember).filter(batch_id=b.id, job__uid=after).values_list("job_id", flat=True).first()
        if seq is None:
            raise InvalidArgument(f"after: job {after} is not a member of this batch", field="after")
        qs = qs.filter(job_id__gt=seq)
    qs = qs.annotate(reported=reported_state("job__"))
    if state is not None:
        qs = qs.filter(reported=state)
    rows = qs.order_by("job_id").values_list("job__uid", "reported")[:limit]
    return [{"id": uid, "state": st} for uid, st in rows]


def list_batches(
    queue: str | None = None, *, state: str | None = None, limit: int = 100, after: str | None = None
) -> list[BatchInfo]:
    """Batches, newest first: of ``queue`` (every queue when ``None``), in ``state`` (one of :data:`STATES`).

    ``limit`` 1 – 1,000; ``after``: a batch id, to read the page after it.
    With ``FQ_QUEUE_DATABASES`` and no ``queue``, the databases are read one
    after the other (newest first within each, in ``routing.aliases()`` order);
    ``after`` continues on the database that holds that batch.
    Raises :class:`QueueNotFound`, :class:`InvalidArgument` (``state``, ``limit``, ``after``).
    """
    if routing.enabled() and routing.current() is None:
        if queue is not None:
            with routing.using(routing.alias_for(queue)):
                return _list_batches(queue, state=state, limit=limit, after=after)
        names = routing.aliases()
        start = 0
        if after is not None:
            holder = _alias_holding(after)
            if holder is None:
                raise InvalidArgument("after must be the id of a batch", field="after")
            start = names.index(holder)
        out: list[BatchInfo] = []
        for i, alias in enumerate(names[start:]):
            with routing.using(alias):
                out += _list_batches(None, state=state, limit=limit - len(out), after=after if i == 0 else None)
            if len(out) >= limit:
                break
        return out
    return _list_batches(queue, state=state, limit=limit, after=after)


def _list_batches(queue: str | None, *, state: str | None, limit: int, after: str | None) -> list[BatchInfo]:
    from .services._base import get_queue

    validation.integer(limit, "limit", 1, MAX_PAGE)
    qs: Any = _manager(Batch).select_related("queue")
    if queue is not None:
        qs = qs.filter(queue_id=get_queue(queue).id)
    if state is not None:
        if state not in STATES:
            raise InvalidArgument(f"state must be one of {', '.join(STATES)}", field="state")
        qs = qs.filter(state=state)
    if after is not None:
        pk = (
            _manager(Batch).filter(uid=after).values_list("id", flat=True).first() if validation.job_id(after) else None
        )
        if pk is None:
            raise InvalidArgument("after must be the id of a batch", field="after")
        qs = qs.filter(id__lt=pk)
    return [_info(b) for b in qs.order_by("-id")[:limit]]


__all__ = ["BatchInfo", "add", "cancel", "create", "get", "list_batches", "members", "seal"]
