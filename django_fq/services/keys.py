"""Per-key limits: admission of jobs to the slots and the rate tokens of their concurrency key.

docs/reference/semantics.md §9 "Per-key limits"; the design and why:
docs/explanation/storage.md#per-key-limits. In a queue with ``key_concurrency``
K > 0, at most K jobs of one key are *admitted* at a time: ``queued``
(claimable) or ``running``. In a queue with ``key_rate_limit`` R > 0 (over
the queue's ``rate_window_ms`` W), a key holds R tokens: each of its admitted
jobs not claimed yet holds one, and each claim of the last W (logged by the
claim in ``django_fq_key_claim``) holds one until it is W old; a job is admitted
only with a free token, so no window of W ever holds more than R claims of the
key. The key's other waiting jobs are ``held``, outside the claim index, so a
claim never reads past a busy or rate-limited key and never needs to know
about keys at all beyond logging its keyed claims. The limits are kept by the
writers that admit jobs or give slots back, each under the lock of the key's
row (``django_fq_key``), in the transaction that changes the job:

* an enqueue admits its new keyed jobs while their key has room (due ones,
  in claim order) and inserts the rest ``held`` (:func:`plan_enqueue`), so a
  held job never has an entry in the claim index;
* whatever ends a lease or takes an admitted job out (ack, nack, expiry,
  timeout, snooze, cancel) gives the slot back and admits the key's next due
  held jobs, in claim order (priority, then seq); with a per-key rate limit a
  job going back to the queue is held and admitted again (it needs a token);
* a held job that becomes due while its key has room (a delay, a retry
  backoff), or whose key's next rate token frees, is admitted at the key's
  ``wake_at`` by the reaper or by the queue's next claim (:func:`wake`);
* ``configure()`` of ``key_concurrency``, ``key_rate_limit`` (or of
  ``rate_window_ms`` while it is set) recounts the queue (:func:`rebalance`).

A job admitted and not due cannot exist: a job going back to the queue with a
delay is held and gives its slot back, so a key's delayed jobs never keep its
ready jobs waiting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from django.db.models import Q

from .. import db, storage
from ..models import Queue
from ..storage.base import KeyPolicy
from ._base import QUEUE, manager

#: Key rows per statement of one call (their parameters stay under every database's limit).
KEY_CHUNK = 1000
#: Keys :func:`wake` handles per call (one transaction per queue).
WAKE_BATCH = 1000
#: A key's room when only its rate (or nothing) limits it: more than any claim takes.
UNLIMITED = 1 << 30


def plan_enqueue(conn, *, queue_id: int, limited: bool, jobs: Sequence[tuple[int, str, int, bool]]):
    """Before an enqueue inserts keyed jobs: lock their keys and decide which are admitted.

    ``jobs``: ``(index, concurrency_key, priority, due)`` per new keyed job, in
    enqueue order. ``limited``: the queue had a per-key limit when the enqueue
    read it under its share lock of the queue row (a ``configure()`` of it
    waits for that lock: :func:`rebalance`). Returns ``(states, policy, rows)``:
    ``states`` maps each index to ``queued`` (admitted: due, and its key has
    room and a rate token, taken in claim order) or ``held``; ``policy`` and
    ``rows`` go to :func:`finish_enqueue`. Without a limit: every job
    ``queued``, no key row.
    """
    if not limited or not jobs:
        return {i: "queued" for i, _, _, _ in jobs}, KeyPolicy(), {}
    store = storage.for_connection(conn)
    policy, rows = store.lock_keys(conn, queue_id, sorted({key for _, key, _, _ in jobs}), create=True)
    room, _ = _rooms(conn, queue_id, policy, {k: r["admitted"] for k, r in rows.items()})
    states = {}
    # Claim order among the batch's due jobs of one key: priority first, then enqueue order.
    for i, key, _, due in sorted(jobs, key=lambda j: (-j[2], j[0])):
        admitted = policy.on and due and room.get(key, 0) > 0
        if admitted:
            room[key] -= 1
        states[i] = "queued" if admitted or not policy.on else "held"
    return states, policy, rows


def finish_enqueue(conn, *, queue_id: int, queue: str, policy: KeyPolicy, rows: dict, admitted: Counter) -> None:
    """After the insert planned by :func:`plan_enqueue`: count the jobs admitted (``admitted``: per key, the
    ``queued`` ones actually inserted), admit held jobs if room is left, note when a delayed one is due."""
    if not policy.on or not rows:
        return
    _admit(conn, queue_id, queue, policy, rows, {k: r["admitted"] + admitted.get(k, 0) for k, r in rows.items()})


def admit_released(conn, *, queue_id: int, queue: str, jobs: Sequence[tuple[int, str, int]]) -> None:
    """Jobs this transaction just released from ``waiting`` (``(seq, concurrency_key, priority)`` each,
    queued now): admit them.

    Under the key rows' locks, with the queue's limits read there, the jobs
    are held, then the key's due held jobs are admitted in claim order while
    it has room (and rate tokens). A queue without a per-key limit by then
    keeps them queued (its claim floor comes down to them). A waiting job took
    no slot, so none changes hands here.
    """
    store = storage.for_connection(conn)
    for chunk in _chunks(sorted({key for _, key, _ in jobs})):
        mine = set(chunk)
        part = [(seq, priority) for seq, key, priority in jobs if key in mine]
        policy, rows = store.lock_keys(conn, queue_id, chunk, create=True)
        if not policy.on:
            store.lower_claim_floors(conn, [(queue_id, priority, seq) for seq, priority in part])
            db.notify(conn, queue)
            continue
        store.hold_jobs(conn, [seq for seq, _ in part], now=db.now_sql(conn))
        _admit(conn, queue_id, queue, policy, rows, {k: r["admitted"] for k, r in rows.items()})


def give_back(conn, *, queue_id: int, queue: str | None, freed: Iterable[str | None]) -> None:
    """One slot of each key in ``freed`` (a key once per slot) is free again: admit the next held jobs.

    Call it in the transaction that ended the lease or took the admitted job
    out, after that (the lease lock is held, so a ``configure()`` of the limit
    is either done, and read here, or waits for this transaction). Nothing
    when the queue has no per-key limit now.
    """
    counts = Counter(k for k in freed if k is not None)
    if not counts:
        return
    store = storage.for_connection(conn)
    for chunk in _chunks(sorted(counts)):
        policy, rows = store.lock_keys(conn, queue_id, chunk, create=False)
        if not policy.on:
            return  # the limit was lifted: nothing is counted any more
        _admit(conn, queue_id, queue, policy, rows, {k: max(0, r["admitted"] - counts[k]) for k, r in rows.items()})


def admit(
    conn,
    *,
    queue_id: int,
    queue: str | None,
    keys: Iterable[str | None],
    create: bool = True,
    skip_locked: bool = False,
) -> None:
    """Admit due held jobs of ``keys`` while they have room (a retry, a requeue, a wake); no slot changes hands.

    ``create=False``: the key rows exist already (a wake), so none is inserted.
    ``skip_locked`` (a claim's wake): keys another transaction holds are left
    to it, so concurrent claims do not queue up behind each other's admissions.
    """
    wanted = sorted({k for k in keys if k is not None})
    store = storage.for_connection(conn)
    for chunk in _chunks(wanted):
        policy, rows = store.lock_keys(conn, queue_id, chunk, create=create, skip_locked=skip_locked)
        if not policy.on:
            return
        _admit(conn, queue_id, queue, policy, rows, {k: r["admitted"] for k, r in rows.items()})


def requeue_held(queue: Queue) -> bool:
    """Whether a keyed job of ``queue`` going back to it at once (a nack, an expiry, a release) must wait held.

    Only with a per-key rate limit: the job needs a rate token again, so it
    is admitted like a new one (:func:`give_back` right after). Read after the
    lease lock, as the caller reads the queue row.
    """
    return queue.key_rate_limit > 0


def wake(*, queue_id: int | None = None, limit: int = WAKE_BATCH) -> int:
    """Admit held jobs that became due, or whose key's next rate token freed (their key's ``wake_at`` has come).

    Returns the keys looked at. Only queue ``queue_id``'s unless ``None`` (the
    reaper's pass over every queue, which also deletes per-key claims older
    than their window). One transaction per queue, owned by django-fq.
    """
    conn = db.connection()
    store = storage.for_connection(conn)
    if queue_id is None:
        # Queue by queue, through the (queue, wake_at) index: only queues with a key limit keep keys.
        limited = (
            manager(Queue)
            .filter(Q(key_concurrency__gt=0) | Q(key_rate_limit__gt=0))
            .values_list("id", "key_rate_limit", "rate_window_ms")
        )
        looked = 0
        for qid, rate, window_ms in limited:
            looked += wake(queue_id=qid, limit=limit)
            if rate > 0:
                db.retrying(
                    lambda qid=qid, w=window_ms: store.delete_key_claims(
                        db.connection(), queue_id=qid, older_than_ms=w, now=db.now_sql(db.connection())
                    )
                )
        return looked
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
        policy, rows = store.lock_keys(conn, queue_id, chunk, create=False)
        if not policy.on:
            store.write_keys(conn, [(r["id"], 0, None) for r in rows.values()])
            continue
        _admit(conn, queue_id, _queue_name(conn, queue_id), policy, rows, {k: r["admitted"] for k, r in rows.items()})


def rebalance(conn, *, queue_id: int, queue: str, seed: bool = False) -> None:
    """Recount queue ``queue_id``'s keys for its per-key limits as they are now, in the configure's transaction.

    Waits for the queue's enqueues (the queue row, exclusively) and its
    settles, claims, cancels and admissions in flight (their leases and jobs:
    :meth:`~django_fq.storage.base.Store.key_census`), then reads the limits.
    Without any, every held job is queued again and the key rows (and the
    per-key claim log) go. Otherwise every queued keyed job is held, each key
    counts its running jobs, and the due held jobs are admitted again in claim
    order while each key has room and rate tokens: raising a limit admits more
    at once; lowering it leaves running jobs alone and admits no more until the
    key is under the new limit. ``seed`` (the per-key rate limit was 0): the
    claims of the running keyed jobs in the last window are logged first
    (:meth:`~django_fq.storage.base.Store.seed_key_claims`), so the claims that
    committed before this configure count against the new limit.
    """
    store = storage.for_connection(conn)
    store.lock_queue_row(conn, QUEUE, queue_id, exclusive=True)
    census = store.key_census(conn, queue_id)
    now = db.now_sql(conn)
    policy, _ = store.lock_keys(conn, queue_id, [], create=False)
    store.delete_keys(conn, queue_id)  # rebuilt below for the keys that have jobs: unused ones go
    if policy.rate == 0:
        store.delete_key_claims(conn, queue_id=queue_id)
    elif seed:
        store.delete_key_claims(conn, queue_id=queue_id)  # left by claims since the limit was last on
        store.seed_key_claims(conn, now=now, queue_id=queue_id, window_ms=policy.window_ms)
    if not policy.on:
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
        policy, rows = store.lock_keys(conn, queue_id, chunk, create=True)
        _admit(conn, queue_id, queue, policy, rows, {k: running.get(k, 0) for k in rows})


def _rooms(conn, queue_id: int, policy: KeyPolicy, admitted: dict[str, int]) -> tuple[dict[str, int], dict]:
    """How many more jobs each key of ``admitted`` (its true count of queued + running jobs) may have admitted now.

    The least of its free slots (``key_concurrency`` − admitted, with that
    limit) and its free rate tokens (``key_rate_limit`` − queued − claims of
    the last window, with that limit); never below 0. Also returns the rate
    use per key (:meth:`~django_fq.storage.base.Store.key_rate_use`; ``{}``
    without a rate limit), for :func:`_rate_wake`.
    """
    rooms = {k: (policy.concurrency - a if policy.concurrency > 0 else UNLIMITED) for k, a in admitted.items()}
    use: dict = {}
    if policy.rate > 0 and admitted:
        store = storage.for_connection(conn)
        use = store.key_rate_use(
            conn, now=db.now_sql(conn), queue_id=queue_id, keys=sorted(admitted), window_ms=policy.window_ms
        )
        for key, (queued, instants, _) in use.items():
            rooms[key] = min(rooms[key], policy.rate - queued - len(instants))
    return {k: max(0, r) for k, r in rooms.items()}, use


def _rate_wake(policy: KeyPolicy, use: tuple[int, list[int], int], queued: int) -> int | None:
    """When key's next rate token frees (epoch ms, database clock), given its rate ``use`` and ``queued`` now.

    ``None`` while it has a free token. The claims of the window free theirs
    as each becomes one window old: with ``u`` tokens held and ``R`` the
    limit, the one freeing the first token is the ``u − R + 1``-th oldest,
    at its instant + the window (exact). When the key's unclaimed jobs alone
    hold every token, none frees before one of them is claimed and that claim
    is a window old: no earlier than now + the window, when it is looked at again.
    """
    _, instants, now = use
    held = queued + len(instants)
    if held < policy.rate:
        return None
    first = held - policy.rate  # index of the claim whose expiry frees the first token
    if first < len(instants):
        return instants[first] + policy.window_ms
    return now + policy.window_ms


def _admit(conn, queue_id: int, queue: str | None, policy: KeyPolicy, rows: dict, admitted: dict[str, int]) -> None:
    """With the key rows ``rows`` locked and ``admitted`` their true counts: fill each key's room, write the rows.

    A key left with room keeps, as ``wake_at``, the earliest ``run_at`` of its
    held jobs (all delayed now, or passed over while another transaction held
    them), for :func:`wake`; a key out of rate tokens the instant its next one
    frees (or that ``run_at`` if later); a full key none (the next slot given
    back looks). Jobs admitted keep their sequence numbers: the claim floor
    comes down to them.
    """
    store = storage.for_connection(conn)
    rooms, use = _rooms(conn, queue_id, policy, admitted)
    wanted = {k: r for k, r in rooms.items() if r > 0}
    promoted = store.admit_held(conn, now=db.now_sql(conn), queue_id=queue_id, rooms=wanted) if wanted else []
    taken = Counter(key for key, _, _ in promoted)
    for key, n in taken.items():
        admitted[key] += n
    left = [k for k in rooms if policy.concurrency == 0 or admitted[k] < policy.concurrency]
    wakes = store.held_wake(conn, queue_id, left)
    changes = []
    for key, row in rows.items():
        wake_at = wakes.get(key)
        if wake_at is not None and key in use:
            freed = _rate_wake(policy, use[key], use[key][0] + taken.get(key, 0))
            if freed is not None:
                wake_at = max(wake_at, freed)
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
