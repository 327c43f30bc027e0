"""Per-key concurrency: admission of jobs to the slots of their concurrency key.

docs/reference/semantics.md §9 "Per-key limits"; the design and why:
docs/explanation/storage.md#per-key-limits. In a queue with ``key_concurrency``
K > 0, at most K jobs of one key are *admitted* at a time: ``queued``
(claimable) or ``running``. The key's other waiting jobs are ``held``, outside
the claim index, so a claim never reads past a busy key and never needs to know
about keys at all: its statements are those of a queue without keys. The limit
is kept by the writers that admit jobs or give slots back, each under the lock
of the key's row (``django_fq_key``), in the transaction that changes the job:

* an enqueue admits its new keyed jobs while their key has room (due ones,
  in claim order) and inserts the rest ``held`` (:func:`plan_enqueue`), so a
  held job never has an entry in the claim index;
* whatever ends a lease or takes an admitted job out (ack, nack, expiry,
  timeout, snooze, cancel) gives the slot back and admits the key's next due
  held jobs, in claim order (priority, then seq);
* a held job that becomes due while its key has room (a delay, a retry
  backoff) is admitted at the key's ``wake_at`` by the reaper or by the
  queue's next claim (:func:`wake`);
* ``configure()`` of ``key_concurrency`` recounts the queue (:func:`rebalance`).

A job admitted and not due cannot exist: a job going back to the queue with a
delay is held and gives its slot back, so a key's delayed jobs never keep its
ready jobs waiting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from .. import db, storage
from ..models import Queue
from ._base import QUEUE, manager

#: Key rows per statement of one call (their parameters stay under every database's limit).
KEY_CHUNK = 1000
#: Keys :func:`wake` handles per call (one transaction per queue).
WAKE_BATCH = 1000


def plan_enqueue(conn, *, queue_id: int, limit: int, jobs: Sequence[tuple[int, str, int, bool]]):
    """Before an enqueue inserts keyed jobs: lock their keys and decide which are admitted.

    ``jobs``: ``(index, concurrency_key, priority, due)`` per new keyed job, in
    enqueue order. ``limit`` is the queue's ``key_concurrency`` as the enqueue
    read it under its share lock of the queue row (a ``configure()`` of it
    waits for that lock: :func:`rebalance`). Returns ``(states, limit, rows)``:
    ``states`` maps each index to ``queued`` (admitted: due, and its key has
    room, taken in claim order) or ``held``; ``limit`` and ``rows`` go to
    :func:`finish_enqueue`. With ``limit`` 0: every job ``queued``, no key row.
    """
    if limit == 0 or not jobs:
        return {i: "queued" for i, _, _, _ in jobs}, 0, {}
    store = storage.for_connection(conn)
    limit, rows = store.lock_keys(conn, queue_id, sorted({key for _, key, _, _ in jobs}), create=True)
    room = {k: max(0, limit - r["admitted"]) for k, r in rows.items()}
    states = {}
    # Claim order among the batch's due jobs of one key: priority first, then enqueue order.
    for i, key, _, due in sorted(jobs, key=lambda j: (-j[2], j[0])):
        admitted = limit > 0 and due and room.get(key, 0) > 0
        if admitted:
            room[key] -= 1
        states[i] = "queued" if admitted or limit == 0 else "held"
    return states, limit, rows


def finish_enqueue(conn, *, queue_id: int, queue: str, limit: int, rows: dict, admitted: Counter) -> None:
    """After the insert planned by :func:`plan_enqueue`: count the jobs admitted (``admitted``: per key, the
    ``queued`` ones actually inserted), admit held jobs if room is left, note when a delayed one is due."""
    if limit == 0 or not rows:
        return
    _admit(conn, queue_id, queue, limit, rows, {k: r["admitted"] + admitted.get(k, 0) for k, r in rows.items()})


def admit_released(conn, *, queue_id: int, queue: str, jobs: Sequence[tuple[int, str, int]]) -> None:
    """Jobs this transaction just released from ``waiting`` (``(seq, concurrency_key, priority)`` each,
    queued now): admit them.

    Under the key rows' locks, with the queue's ``key_concurrency`` read there,
    the jobs are held, then the key's due held jobs are admitted in claim order
    while it has room.
    A queue whose limit is 0 by then keeps them queued (its claim floor comes
    down to them). A waiting job took no slot, so none changes hands here.
    """
    store = storage.for_connection(conn)
    for chunk in _chunks(sorted({key for _, key, _ in jobs})):
        mine = set(chunk)
        part = [(seq, priority) for seq, key, priority in jobs if key in mine]
        limit, rows = store.lock_keys(conn, queue_id, chunk, create=True)
        if limit == 0:
            store.lower_claim_floors(conn, [(queue_id, priority, seq) for seq, priority in part])
            db.notify(conn, queue)
            continue
        store.hold_jobs(conn, [seq for seq, _ in part], now=db.now_sql(conn))
        _admit(conn, queue_id, queue, limit, rows, {k: r["admitted"] for k, r in rows.items()})


def give_back(conn, *, queue_id: int, queue: str | None, freed: Iterable[str | None]) -> None:
    """One slot of each key in ``freed`` (a key once per slot) is free again: admit the next held jobs.

    Call it in the transaction that ended the lease or took the admitted job
    out, after that (the lease lock is held, so a ``configure()`` of the limit
    is either done, and read here, or waits for this transaction). Nothing
    when the queue has no key limit now.
    """
    counts = Counter(k for k in freed if k is not None)
    if not counts:
        return
    store = storage.for_connection(conn)
    for chunk in _chunks(sorted(counts)):
        limit, rows = store.lock_keys(conn, queue_id, chunk, create=False)
        if limit == 0:
            return  # the limit was lifted: nothing is counted any more
        _admit(conn, queue_id, queue, limit, rows, {k: max(0, r["admitted"] - counts[k]) for k, r in rows.items()})


def admit(conn, *, queue_id: int, queue: str | None, keys: Iterable[str | None], create: bool = True) -> None:
    """Admit due held jobs of ``keys`` while they have room (a retry, a requeue, a wake); no slot changes hands.

    ``create=False``: the key rows exist already (a wake), so none is inserted.
    """
    wanted = sorted({k for k in keys if k is not None})
    store = storage.for_connection(conn)
    for chunk in _chunks(wanted):
        limit, rows = store.lock_keys(conn, queue_id, chunk, create=create)
        if limit == 0:
            return
        _admit(conn, queue_id, queue, limit, rows, {k: r["admitted"] for k, r in rows.items()})


def wake(*, queue_id: int | None = None, limit: int = WAKE_BATCH) -> int:
    """Admit held jobs that became due in keys with room (their ``wake_at`` has come); the keys looked at.

    Only queue ``queue_id``'s unless ``None`` (the reaper's pass over every
    queue). One transaction per queue, owned by django-fq.
    """
    conn = db.connection()
    store = storage.for_connection(conn)
    if queue_id is None:
        # Queue by queue, through the (queue, wake_at) index: only queues with a key limit keep keys.
        limited = manager(Queue).filter(key_concurrency__gt=0).values_list("id", flat=True)
        return sum(wake(queue_id=qid, limit=limit) for qid in limited)
    due = store.due_keys(conn, now=db.now_sql(conn), queue_id=queue_id, limit=limit)
    by_queue: dict[int, list[str]] = {}
    for qid, key in due:
        by_queue.setdefault(qid, []).append(key)
    for qid, keys in by_queue.items():
        db.retrying(_wake_queue, qid, keys)
    return len(due)


def _wake_queue(queue_id: int, keys: list[str]) -> None:
    conn = db.connection()
    store = storage.for_connection(conn)
    for chunk in _chunks(sorted(keys)):
        limit, rows = store.lock_keys(conn, queue_id, chunk, create=False)
        if limit == 0:
            store.write_keys(conn, [(r["id"], 0, None) for r in rows.values()])
            continue
        _admit(conn, queue_id, _queue_name(conn, queue_id), limit, rows, {k: r["admitted"] for k, r in rows.items()})


def rebalance(conn, *, queue_id: int, queue: str, limit: int) -> None:
    """Recount queue ``queue_id``'s keys for a new ``key_concurrency`` ``limit``, in the configure's transaction.

    Waits for the queue's enqueues (the queue row, exclusively) and its
    settles, claims and cancels in flight (their leases and jobs:
    :meth:`~django_fq.storage.base.Store.key_census`). With 0 every held job
    is queued again and the key rows go. Otherwise every queued keyed job is
    held, each key counts its running jobs, and the due held jobs are admitted
    again in claim order up to the limit: raising the limit admits more at once;
    lowering it leaves running jobs alone and admits no more until the key is
    under the new limit.
    """
    store = storage.for_connection(conn)
    store.lock_queue_row(conn, QUEUE, queue_id, exclusive=True)
    census = store.key_census(conn, queue_id)
    now = db.now_sql(conn)
    store.delete_keys(conn, queue_id)  # rebuilt below for the keys that have jobs: unused ones go
    if limit == 0:
        lowest = store.release_held(conn, now=now, queue_id=queue_id)
        if lowest:
            store.lower_claim_floors(conn, lowest)
            db.notify(conn, queue)
        return
    queued = [seq for seq, _, state, _, _ in census if state == "queued"]
    for start in range(0, len(queued), KEY_CHUNK):
        store.hold_jobs(conn, queued[start : start + KEY_CHUNK], now=now)
    running = Counter(key for _, key, state, _, _ in census if state == "running")
    for chunk in _chunks(sorted({key for _, key, _, _, _ in census})):
        limit, rows = store.lock_keys(conn, queue_id, chunk, create=True)
        _admit(conn, queue_id, queue, limit, rows, {k: running.get(k, 0) for k in rows})


def _admit(conn, queue_id: int, queue: str | None, limit: int, rows: dict, admitted: dict[str, int]) -> None:
    """With the key rows ``rows`` locked and ``admitted`` their true counts: fill each key's room, write the rows.

    A key left with room keeps, as ``wake_at``, the earliest ``run_at`` of its
    held jobs (all delayed now, or passed over while another transaction held
    them), for :func:`wake`; a full key none (the next slot given back looks).
    Jobs admitted keep their sequence numbers: the claim floor comes down to them.
    """
    store = storage.for_connection(conn)
    rooms = {k: limit - a for k, a in admitted.items() if a < limit}
    promoted = store.admit_held(conn, now=db.now_sql(conn), queue_id=queue_id, rooms=rooms) if rooms else []
    for key, _, _ in promoted:
        admitted[key] += 1
    left = [k for k in rooms if admitted[k] < limit]
    wakes = store.held_wake(conn, queue_id, left)
    changes = []
    for key, row in rows.items():
        wake_at = wakes.get(key) if key in wakes else None
        if (admitted[key], wake_at) != (row["admitted"], row["wake_at"]):
            changes.append((row["id"], admitted[key], wake_at))
    store.write_keys(conn, changes)
    if promoted:
        store.lower_claim_floors(conn, [(queue_id, priority, seq) for _, priority, seq in promoted])
        if queue is not None:
            db.notify(conn, queue)


def _chunks(keys: list[str]) -> list[list[str]]:
    return [keys[i : i + KEY_CHUNK] for i in range(0, len(keys), KEY_CHUNK)] if keys else []


def _queue_name(conn, queue_id: int) -> str | None:
    with conn.cursor() as cur:
        cur.execute(f"SELECT name FROM {QUEUE} WHERE id = %s", [queue_id])
        row = cur.fetchone()
    return row[0] if row else None
