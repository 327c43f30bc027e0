"""Dependencies between jobs: the rules (docs/reference/semantics.md §9 "Dependencies").

A job enqueued with ``depends_on`` is ``waiting`` until every dependency has
succeeded; no claim reads a waiting job. Whoever finishes a job (an ack, a
nack or expiry that makes it dead, a cancel) calls :func:`finished` in the
same transaction: the job's pending edges are settled by index, a dependent
whose last edge was satisfied becomes queued (and wakes workers), and one
whose policy says so is cancelled, which cascades to its own dependents.

Per edge, ``on_failure`` decides what a dependency that goes dead or is
cancelled does to its dependent: ``cancel`` (the default) cancels it,
``run`` counts the edge as satisfied, ``wait`` keeps it waiting for a
``retry`` of the dead job (a cancelled dependency can never be retried, so
there ``wait`` cancels too). The SQL is the store's
(:mod:`django_fq.storage.dependencies`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from .. import db, storage, validation
from ..exceptions import InvalidDependency
from . import keys
from ._base import add_counters, history_entry, reported_state

#: Most direct dependencies one job may have (docs/reference/semantics.md §9 "Dependencies").
MAX_DEPENDENCIES = 1000
#: Most dependencies the jobs of one ``enqueue_many`` may name together (the workflow builder's
#: edge limit, ``workflows.MAX_EDGES``): the enqueue locks and reads every one of them in its
#: transaction, so an unbounded batch (1,000 jobs of 1,000 made-up ids) held it for half a minute.
MAX_BATCH_DEPENDENCIES = 100_000
#: What a dependency that goes dead or is cancelled does to its dependent.
ON_FAILURE = ("cancel", "run", "wait")
DEFAULT_ON_FAILURE = "cancel"


#: Longest name of a dependency edge (a workflow step's name: ``django_fq.workflows.MAX_NAME``).
MAX_EDGE_NAME = 200


class Edge(NamedTuple):
    """One parsed dependency: the job it names, the policy of the edge, and its name (``None``: none).

    The name is the key under which the dependent reads that job's result
    (``job.upstream[name]``, docs/how-to/workflows.md "Results flow forward");
    the workflow builder gives each edge the name of the step it comes from.
    """

    id: str
    on_failure: str
    name: str | None = None


_ITEM_KEYS = frozenset({"id", "on_failure", "name"})


def parse(value: object, field: str = "depends_on") -> tuple[Edge, ...] | None:
    """Validate a ``depends_on`` value: a list of job ids, or of ``{"id": …, "on_failure": …, "name": …}`` objects.

    ``None`` or an empty list: no dependencies. At most :data:`MAX_DEPENDENCIES`
    items; each id 32 lowercase hex characters, each listed once;
    ``on_failure`` one of ``cancel`` (default), ``run``, ``wait``; ``name``
    (optional) a string of 1–200 characters, each name once, the key of that
    dependency's result in ``job.upstream``. Raises
    :class:`InvalidDependency` naming ``field`` (``depends_on[i]`` for one item).
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidDependency(f"{field} must be a list of job ids", field=field)
    if len(value) > MAX_DEPENDENCIES:
        raise InvalidDependency(
            f"{field} lists {len(value)} jobs; a job may depend on at most {MAX_DEPENDENCIES}", field=field
        )
    edges: list[Edge] = []
    seen: set[str] = set()
    names: set[str] = set()
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        policy = DEFAULT_ON_FAILURE
        name = None
        if isinstance(item, Mapping):
            if len(item) > 3 or not item.keys() <= _ITEM_KEYS:
                extra = sorted(str(k) for k in item if k not in _ITEM_KEYS)[0]
                raise InvalidDependency(f"{where}: unknown key {extra}", field=f"{where}.{extra}")
            policy = item.get("on_failure", DEFAULT_ON_FAILURE)
            if policy not in ON_FAILURE:
                raise InvalidDependency(
                    f"{where}.on_failure must be one of {', '.join(ON_FAILURE)}", field=f"{where}.on_failure"
                )
            name = item.get("name")
            if name is not None:
                if not isinstance(name, str) or not 1 <= len(name) <= MAX_EDGE_NAME or "\x00" in name:
                    raise InvalidDependency(
                        f"{where}.name must be a string of 1-{MAX_EDGE_NAME} characters", field=f"{where}.name"
                    )
                if name in names:
                    raise InvalidDependency(f"{where}.name: {name!r} names two dependencies", field=f"{where}.name")
                names.add(name)
            item = item.get("id")
        if not validation.job_id(item):
            raise InvalidDependency(f"{where} is not a job id (32 lowercase hex characters)", field=where)
        assert isinstance(item, str)
        if item in seen:
            raise InvalidDependency(f"{where}: job {item} is listed twice", field=where)
        seen.add(item)
        edges.append(Edge(item, policy, name))
    return tuple(edges) or None


def check_total(items: Iterable[tuple[str, Sequence[Edge] | None]]) -> None:
    """Refuse a batch whose items name more than :data:`MAX_BATCH_DEPENDENCIES` dependencies in all.

    ``items``: ``(field prefix, edges)`` per item, in order (prefix ``"items[i]."``). Raises
    :class:`InvalidDependency` naming the ``depends_on`` of the item that passes the limit,
    before anything is read or written.
    """
    total = 0
    for prefix, edges in items:
        total += len(edges or ())
        if total > MAX_BATCH_DEPENDENCIES:
            field = f"{prefix}depends_on"
            raise InvalidDependency(
                f"{field}: the jobs of one batch may depend on at most {MAX_BATCH_DEPENDENCIES} jobs in all",
                field=field,
            )


def parse_cli(values: Sequence[str] | None) -> list[dict] | None:
    """``--depends-on`` arguments (``ID`` or ``ID:POLICY``) as ``depends_on`` items for :func:`parse`."""
    if not values:
        return None
    out = []
    for v in values:
        uid, _, policy = v.partition(":")
        out.append({"id": uid, "on_failure": policy} if policy else {"id": uid})
    return out


class _Plan(NamedTuple):
    """What one new job's edges are, once its dependencies' states are known."""

    edges: list[tuple[int, str, bool, str | None]]  # (upstream seq, on_failure, pending, name)
    pending: int
    cancelled_by: str | None  # the uid of a finished-failed dependency whose policy cancels the job


def _plan(deps: Sequence[Edge], found: Mapping[str, tuple[int, str, int]]) -> _Plan:
    edges, pending, cancelled_by = [], 0, None
    for dep in deps:
        seq, state, _ = found[dep.id]
        satisfied = state == "succeeded" or (state in ("dead", "cancelled") and dep.on_failure == "run")
        cancels = not satisfied and (state == "cancelled" or (state == "dead" and dep.on_failure == "cancel"))
        if cancels and cancelled_by is None:
            cancelled_by = dep.id
        is_pending = not satisfied and not cancels
        pending += is_pending
        edges.append((seq, dep.on_failure, is_pending, dep.name))
    return _Plan(edges, pending, cancelled_by)


def check(
    conn, wanted: Sequence[tuple[str, tuple[Edge, ...]]], *, skip: frozenset[str] = frozenset()
) -> dict[str, tuple[int, str, int]]:
    """In the enqueue's transaction: lock the dependencies of the jobs about to be inserted.

    ``wanted``: ``(field prefix, edges)`` per item that has dependencies (the
    prefix is ``""`` for ``enqueue``, ``"items[i]."`` for ``enqueue_many``).
    ``skip``: ids of jobs this transaction inserts (a workflow's steps,
    :class:`Fresh`): neither locked nor looked for. Returns ``{uid: (seq,
    state, queue_id)}``. Raises :class:`InvalidDependency` naming the first
    item and index whose job does not exist in this database (nothing is
    written: the caller's transaction rolls back).
    """
    uids = sorted({e.id for _, edges in wanted for e in edges if e.id not in skip})
    found = storage.for_connection(conn).lock_dependencies(conn, uids) if uids else {}
    for prefix, edges in wanted:
        for i, e in enumerate(edges):
            if e.id not in found and e.id not in skip:
                field = f"{prefix}depends_on[{i}]"
                raise InvalidDependency(f"{field}: no job {e.id} in this database", field=field)
    return found


def parked(jobs: Mapping[int, tuple[Edge, ...]], found: Mapping[str, tuple[int, str, int]]) -> set[int]:
    """Of ``jobs`` (item index → its edges), the ones :func:`attach` will make ``waiting`` or ``cancelled``.

    ``found``: what :func:`check` returned. The enqueue inserts them held, so
    they never enter the claim index and take no slot of their key.
    """
    out = set()
    for i, edges in jobs.items():
        plan = _plan(edges, found)
        if plan.pending or plan.cancelled_by is not None:
            out.add(i)
    return out


def attach(conn, *, now: str, jobs: Sequence[tuple[str, int, tuple[Edge, ...]]], found) -> None:
    """Write the edges of jobs just inserted in this transaction; make the unsatisfied ones ``waiting``.

    ``jobs``: ``(uid, queue_id, edges)`` per new job with dependencies;
    ``found``: what :func:`check` returned. A dependency already succeeded is
    satisfied at once (as is a failed one under ``run``); a dependency already
    dead under ``cancel``, or cancelled under ``cancel`` or ``wait``, cancels
    the new job at once (it is then created ``cancelled``, its history saying why).
    The others are queued as without dependencies (the enqueue inserted the
    ones this makes ``waiting`` or ``cancelled`` held: :func:`parked`).
    """
    store = storage.for_connection(conn)
    seqs = store.job_seqs(conn, [uid for uid, _, _ in jobs])
    rows: list[tuple[int, int, str, bool, str | None]] = []
    waiting: list[tuple[int, int]] = []
    cancel: dict[str, list[tuple[int, int]]] = {}
    for uid, queue_id, edges in jobs:
        plan = _plan(edges, found)
        seq = seqs[uid]
        rows += [(seq, up, policy, pending, name) for up, policy, pending, name in plan.edges]
        if plan.cancelled_by is not None:
            cancel.setdefault(plan.cancelled_by, []).append((seq, queue_id))
        elif plan.pending:
            waiting.append((seq, plan.pending))
    store.insert_dependencies(conn, rows)
    # Cancelled ones are made waiting first, so that the one cancel path writes them.
    store.mark_waiting(conn, waiting + [(seq, 1) for group in cancel.values() for seq, _ in group])
    for upstream, group in cancel.items():
        state = found[upstream][1]
        _cancel(conn, now, [seq for seq, _ in group], upstream, state)


class Fresh:
    """Jobs one workflow write inserts whose dependencies include other jobs it inserts (docs/how-to/workflows.md).

    ``uids``: the ids given beforehand to the steps that cannot coalesce (no
    token, no unique key), so that a step may name one still to be inserted,
    in any queue of the write. The enqueue inserts such a dependent held and
    leaves its edges here, in ``jobs`` (``(uid, queue_id, edges)``), with
    its other dependencies locked and read in ``found`` (as :func:`check`
    returns them); :func:`attach_fresh` writes them once every queue's rows are in.
    """

    def __init__(self, uids: Iterable[str]) -> None:
        self.uids = frozenset(uids)
        self.jobs: list[tuple[str, int, tuple[Edge, ...]]] = []
        self.found: dict[str, tuple[int, str, int]] = {}


def attach_fresh(conn, fresh: Fresh, order: Callable[[str], int]) -> None:
    """Write the edges of ``fresh.jobs``, all at once: :func:`attach` for dependents of jobs just inserted.

    ``order``: a job's rank in dependency order (a job after the jobs it
    depends on). A dependency on a job of this write is pending, unless that
    job is cancelled here, by a dependency already dead or cancelled: then the
    edge's ``on_failure`` decides, as :func:`attach` decides it for a job
    enqueued after a cancelled one (``cancel`` and ``wait`` cancel it too,
    ``run`` counts it satisfied). So the cascade of a whole chain is decided
    in memory and written in a bounded number of statements per 500 jobs,
    whatever its depth. A job left with no pending edge is released (queued,
    its key's admission as for any released job).
    """
    if not fresh.jobs:
        return
    store = storage.for_connection(conn)
    now = db.now_sql(conn)
    jobs = sorted(fresh.jobs, key=lambda job: order(job[0]))
    ups = sorted({e.id for _, _, edges in jobs for e in edges if e.id in fresh.uids})
    rows_read = store.job_states(conn, sorted({uid for uid, _, _ in jobs} | set(ups)))
    seqs = {uid: seq for uid, (seq, _) in rows_read.items()}
    known: dict[str, tuple[int, str, int]] = dict(fresh.found)
    for uid in ups:
        # Inserted by this write: held (a dependent of this write, decided below), or queued, waiting or
        # already cancelled by its own dependencies (attach).
        known[uid] = (seqs[uid], rows_read[uid][1], 0)
    rows: list[tuple[int, int, str, bool, str | None]] = []
    waiting: list[tuple[int, int]] = []
    released: list[int] = []
    cancelled: list[tuple[int, str, str]] = []
    at = None
    for uid, queue_id, edges in jobs:
        plan = _plan(edges, known)
        seq = seqs[uid]
        rows += [(seq, up, policy, pending, name) for up, policy, pending, name in plan.edges]
        if plan.cancelled_by is not None:
            at = db.db_now_ms() if at is None else at
            message = f"cancelled: dependency {plan.cancelled_by} is {known[plan.cancelled_by][1]}"
            entry = json.dumps(history_entry(at, 0, "cancel", message), separators=(",", ":"))
            cancelled.append((seq, message, entry))
            known[uid] = (seq, "cancelled", queue_id)
        elif plan.pending:
            waiting.append((seq, plan.pending))
        else:
            released.append(seq)
    store.flag_dependents(conn, [seqs[u] for u in ups])
    store.insert_dependencies(conn, rows)
    # Cancelled and released ones are made waiting first, so that the one cancel path and the one
    # release path write them.
    store.mark_waiting(conn, waiting + [(seq, 1) for seq, _, _ in cancelled] + [(seq, 1) for seq in released])
    if cancelled:
        gone = store.cancel_waiting_each(conn, now=now, rows=cancelled)
        _counted_cancel(conn, gone)
    if released:
        _release(conn, store.count_down(conn, now=now, counts=dict.fromkeys(released, 1)))


def finished(conn, seqs: Sequence[int], outcome: str) -> None:
    """Jobs ``seqs`` just finished with ``outcome`` (``succeeded``, ``dead`` or ``cancelled``) in this transaction.

    Settles their pending edges (by the ``(upstream, job)`` index: cost
    proportional to the direct dependents): a satisfied edge counts its
    dependent down, and a dependent left with none becomes queued, keeping its
    priority and place, ready at the later of its ``run_at`` and now, and
    wakes the workers of its queue at commit. A dependent cancelled by its
    policy passes the cancel on to its own dependents, level by level. Call it
    after the jobs' own update, in the same transaction. The members of a
    batch among the jobs (and among the dependents cancelled) are counted in
    their batches (:func:`django_fq.batches.settle`).
    """
    from .. import batches

    batches.settle(conn, seqs, outcome)
    _cascade(conn, seqs, outcome)


def _cascade(conn, seqs: Sequence[int], outcome: str) -> None:
    """:func:`finished` after the batch counts: settle the pending edges out of ``seqs``, level by level."""
    store = storage.for_connection(conn)
    now = db.now_sql(conn)
    frontier: list[tuple[list[int], str]] = [(list(seqs), outcome)]
    while frontier:
        upstreams, what = frontier.pop()
        edges = store.pending_edges(conn, upstreams) if upstreams else []
        if not edges:
            continue
        satisfy: dict[int, int] = {}
        cancel: dict[int, list[int]] = {}  # upstream seq -> dependents to cancel
        closed: list[int] = []
        for edge_id, job, upstream, policy in edges:
            if what == "succeeded" or policy == "run":
                satisfy[job] = satisfy.get(job, 0) + 1
                closed.append(edge_id)
            elif policy == "cancel" or what == "cancelled":
                cancel.setdefault(upstream, []).append(job)
                closed.append(edge_id)
            # else: "wait" on a dead job stays pending until a retry of it succeeds
        store.close_edges(conn, closed)
        if satisfy:
            _release(conn, store.count_down(conn, now=now, counts=satisfy))
        for upstream, jobs in sorted(cancel.items()):
            gone = _cancel(conn, now, jobs, _uid_of(conn, upstream), what)
            onward = [r["seq"] for r in gone if r["has_dependents"]]
            if onward:
                frontier.append((onward, "cancelled"))


def cancel_component(conn, nodes: Mapping[int, dict], unfinished: Sequence[int]) -> set[int]:
    """Cancel jobs ``unfinished`` (seqs in dependency order, every dependent of each among ``nodes``) as a set.

    ``nodes``: what :func:`component` returns (``{seq: {"uid", "queue",
    "state"}}``, reported states), for a workflow read whole. The outcome is
    that of ``cancel`` of each job in turn (``django_fq.workflows.cancel``
    before): a job not yet cancelled is cancelled directly (its lease ends,
    its history says ``cancel``); a waiting dependent reached from it by a
    ``cancel`` or ``wait`` edge is cancelled by that dependency (its history
    says so), and so on down; a ``run`` edge counts the dependent down, and
    one left with none is cancelled directly in its turn. Decided in memory
    from the pending edges (read locked), then written in a bounded number
    of statements per 500 jobs: counters per queue, key slots given back,
    batch counts (a dead member's moved to cancelled), edges closed.
    Returns the seqs of the jobs of ``unfinished`` it cancelled: fewer when
    some finished (an ack) between the plan's read and the locks.
    """
    from .. import batches
    from ._base import HISTORY_KEEP

    if not unfinished:
        return set()
    store = storage.for_connection(conn)
    now = db.now_sql(conn)
    # Read plainly to plan: locked only after the jobs (below), in the order an ack locks them.
    edges = store.pending_edges(conn, unfinished, lock=False)
    out: dict[int, list[tuple[int, str]]] = {}
    pending: dict[int, int] = {}
    for _, job, upstream, policy in edges:
        out.setdefault(upstream, []).append((job, policy))
        pending[job] = pending.get(job, 0) + 1

    def plan(finished: set[int]) -> tuple[list[int], dict[int, int]]:
        # ``finished``: jobs the plan took for unfinished that the locks found finished (an ack
        # committed meanwhile): they cancel nothing, as their cancel would have failed.
        left = dict(pending)
        waiting = {seq for seq in unfinished if nodes[seq]["state"] == "waiting"}
        direct: list[int] = []
        by: dict[int, int] = {}  # seq -> the upstream whose cancel cancels it
        done: set[int] = set(finished)
        for seq in unfinished:
            if seq in done:
                continue
            done.add(seq)
            direct.append(seq)
            stack = [seq]
            while stack:  # the cascade of finished(): each pending edge out of a job just cancelled
                up = stack.pop()
                for job, policy in out.get(up, ()):
                    if job in done or job not in waiting:
                        continue
                    if policy == "run":
                        left[job] -= 1
                        if left[job] <= 0:
                            waiting.discard(job)  # released: cancelled directly in its turn
                        continue
                    done.add(job)
                    by[job] = up
                    stack.append(job)
        return direct, by

    gone: list[dict] = []
    tried: set[int] = set()
    finished: set[int] = set()
    while True:  # again while the locks find planned jobs finished: fewer cascades, other reasons
        direct, by = plan(finished)
        todo = [seq for seq in direct if seq not in tried]
        if not todo:
            break
        got = store.cancel_unfinished(conn, now=now, seqs=todo, keep=HISTORY_KEEP, dead=True)
        gone += got
        tried.update(todo)
        finished |= set(todo) - {r["seq"] for r in got}
    by = {seq: up for seq, up in by.items() if seq not in tried}
    if by:
        at = db.db_now_ms()
        rows = []
        for seq, up in by.items():
            message = f"cancelled: dependency {nodes[up]['uid']} is cancelled"
            rows.append((seq, message, json.dumps(history_entry(at, 0, "cancel", message), separators=(",", ":"))))
        cascaded = store.cancel_waiting_each(conn, now=now, rows=rows)
        gone += [{**r, "state": "waiting", "concurrency_key": None} for r in cascaded]
        # Released (or otherwise changed) since the plan was read: cancelled directly instead.
        missed = sorted(set(by) - {r["seq"] for r in cascaded} - tried)
        if missed:
            gone += store.cancel_unfinished(conn, now=now, seqs=missed, keep=HISTORY_KEEP, dead=True)
    if not gone:
        return set()
    per_queue: dict[int, list[dict]] = {}
    for r in gone:
        per_queue.setdefault(r["queue_id"], []).append(r)
    for queue_id, rows_of in sorted(per_queue.items()):
        active = sum(1 for r in rows_of if r["state"] != "dead")
        add_counters(conn, queue_id, cancelled=len(rows_of), active=-active)
        # A queued or running job of a key held one of its slots (a waiting or held one none).
        freed = [r["concurrency_key"] for r in rows_of if r["state"] in ("queued", "running")]
        if any(k is not None for k in freed):
            keys.give_back(conn, queue_id=queue_id, queue=nodes[rows_of[0]["seq"]]["queue"], freed=freed)
    dead = [r["seq"] for r in gone if r["state"] == "dead" and r["has_dependents"]]
    if dead:  # a dead batch member now counts as cancelled
        batches.unsettle(conn, dead, "dead")
    flagged = [r["seq"] for r in gone if r["has_dependents"]]  # a batch member is flagged
    if flagged:
        batches.settle(conn, flagged, "cancelled")
    cancelled = {r["seq"] for r in gone}
    locked = store.pending_edges(conn, sorted(cancelled))
    store.close_edges(conn, [edge_id for edge_id, job, _, _ in locked if job in cancelled])
    # A dependent that joined after the plan was read (its enqueue committed before these locks):
    # its edges follow the rule of a cancelled dependency, as after any cancel.
    joined = sorted({upstream for _, job, upstream, _ in locked if job not in cancelled})
    if joined:
        _cascade(conn, joined, "cancelled")
    return cancelled & set(unfinished)


def _release(conn, released: list[dict]) -> None:
    """Jobs ``released`` (as ``count_down`` returns them) are queued now: wake their queues' workers.

    A keyed job of a queue with ``key_concurrency`` or ``key_rate_limit`` enters its key's admission
    as a new keyed job does (docs/reference/semantics.md §9 "Dependencies"):
    held, or admitted while its key has room, in this transaction
    (:func:`~django_fq.services.keys.admit_released`).
    """
    if not released:
        return
    plain = [r for r in released if r["concurrency_key"] is None or not r["key_concurrency"]]
    keyed: dict[tuple[int, str], list[tuple[int, str, int]]] = {}
    for r in released:
        if r["concurrency_key"] is not None and r["key_concurrency"]:
            keyed.setdefault((r["queue_id"], r["queue"]), []).append((r["seq"], r["concurrency_key"], r["priority"]))
    if plain:
        storage.for_connection(conn).lower_claim_floors(conn, [(r["queue_id"], r["priority"], r["seq"]) for r in plain])
        for name in sorted({r["queue"] for r in plain}):
            db.notify(conn, name)
    for (queue_id, queue), jobs in sorted(keyed.items()):
        keys.admit_released(conn, queue_id=queue_id, queue=queue, jobs=jobs)


def admit_keyed(conn, released: list[dict]) -> None:
    """Keyed jobs a store's releasing ack just queued (dicts of ``seq``, ``queue_id``, ``queue``,
    ``priority``, ``concurrency_key``): admitted per queue as :func:`_release` admits them."""
    keyed: dict[tuple[int, str], list[tuple[int, str, int]]] = {}
    for r in released:
        keyed.setdefault((r["queue_id"], r["queue"]), []).append((r["seq"], r["concurrency_key"], r["priority"]))
    for (queue_id, queue), jobs in sorted(keyed.items()):
        keys.admit_released(conn, queue_id=queue_id, queue=queue, jobs=jobs)


def _uid_of(conn, seq: int) -> str:
    from ..models import Job
    from ._base import manager

    return manager(Job).filter(seq=seq).values_list("uid", flat=True).first() or str(seq)


def _cancel(conn, now: str, seqs: Sequence[int], upstream: str, state: str) -> list[dict]:
    """Cancel waiting jobs ``seqs`` because dependency ``upstream`` (a uid) is ``state``; count it per queue."""
    message = f"cancelled: dependency {upstream} is {state}"
    at = db.db_now_ms()
    entry = json.dumps(history_entry(at, 0, "cancel", message), separators=(",", ":"))
    gone = storage.for_connection(conn).cancel_waiting(conn, now=now, seqs=seqs, error=message, entry_json=entry)
    _counted_cancel(conn, gone)
    return gone


def _counted_cancel(conn, gone: list[dict]) -> None:
    """Waiting jobs ``gone`` were just cancelled: count them in their batches and per queue."""
    from .. import batches

    flagged = [r["seq"] for r in gone if r["has_dependents"]]  # a batch member is flagged
    if flagged:
        batches.settle(conn, flagged, "cancelled")
    per_queue: dict[int, int] = {}
    for r in gone:
        per_queue[r["queue_id"]] = per_queue.get(r["queue_id"], 0) + 1
    for queue_id, n in per_queue.items():
        add_counters(conn, queue_id, cancelled=n, active=-n)


#: Dependents ``get`` lists at most (a job's dependencies are bounded by :data:`MAX_DEPENDENCIES`).
MAX_LISTED_DEPENDENTS = 1000


def edges_of(seq: int, *, dependents: bool = True) -> dict:
    """``{"depends_on": [...], "dependents": [...]}`` of job ``seq``, each entry
    ``{"id", "queue", "state", "on_failure", "pending"}`` (reported states), and ``"name"`` when the
    edge has one (a workflow step's name); ``{}`` when it has neither.

    Dependents: the first :data:`MAX_LISTED_DEPENDENTS`, oldest first; read only
    when ``dependents`` (the job's ``has_dependents`` flag). One or two queries.
    """
    from ..models import Dependency
    from ._base import manager

    out: dict[str, list] = {}
    for key, mine, other, wanted in (
        ("depends_on", "job", "upstream", True),
        ("dependents", "upstream", "job", dependents),
    ):
        if not wanted:
            continue
        reported = reported_state(f"{other}__")
        rows = (
            manager(Dependency)
            .filter(**{f"{mine}_id": seq})
            .annotate(reported=reported)
            .order_by(f"{other}_id")
            .values(f"{other}__uid", f"{other}__queue__name", "reported", "on_failure", "pending", "name")[
                :MAX_LISTED_DEPENDENTS
            ]
        )
        found = [
            {
                "id": r[f"{other}__uid"],
                "queue": r[f"{other}__queue__name"],
                "state": r["reported"],
                "on_failure": r["on_failure"],
                "pending": bool(r["pending"]),
                **({"name": r["name"]} if r["name"] is not None else {}),
            }
            for r in rows
        ]
        if found:
            out[key] = found
    return out


def component(job_id: str, *, limit: int) -> tuple[dict[int, dict], list[tuple[int, int]], bool]:
    """The jobs connected to job ``job_id`` by dependencies, each way, at most ``limit`` of them.

    Returns ``(nodes, edges, truncated)``: ``nodes`` maps seq to ``{"uid",
    "queue", "state"}`` (reported state) for at most ``limit`` jobs, the
    nearest first; ``edges`` are ``(job seq, upstream seq)`` between two of
    them; ``truncated`` when more jobs are connected. Queries, whatever the
    depth: one for the job, one recursive statement for the walk and its
    edges (:meth:`Store.component <django_fq.storage.dependencies.DependencySql.component>`),
    one per 500 jobs for their details.
    """
    from ..models import Job
    from ._base import manager

    reported = reported_state()
    start = manager(Job).filter(uid=job_id).values_list("seq", flat=True).first()
    if start is None:
        return {}, [], False
    conn = db.connection()
    seqs, edges = storage.for_connection(conn).component(conn, int(start), limit=limit + 1)
    truncated = len(seqs) > limit
    seen = set(seqs[:limit])
    nodes: dict[int, dict] = {}
    ordered = sorted(seen)
    for part in range(0, len(ordered), 500):
        rows = (
            manager(Job)
            .filter(seq__in=ordered[part : part + 500])
            .annotate(reported=reported)
            .values_list("seq", "uid", "queue__name", "reported")
        )
        for seq, uid, queue, state in rows:
            nodes[seq] = {"uid": uid, "queue": queue, "state": state}
    return nodes, [(j, u) for j, u in sorted(edges) if j in nodes and u in nodes], truncated


def queues_of(uids: Sequence[str]) -> dict[str, str]:
    """``{uid: queue name}`` of the jobs ``uids`` that exist (one query per 1,000 ids)."""
    from ..models import Job
    from ._base import manager

    out: dict[str, str] = {}
    ordered = sorted(set(uids))
    for start in range(0, len(ordered), 1000):
        rows = manager(Job).filter(uid__in=ordered[start : start + 1000]).values_list("uid", "queue__name")
        out.update(rows)
    return out
