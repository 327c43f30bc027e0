"""Workflows: a graph of jobs enqueued in one transaction, all of it or none (docs/how-to/workflows.md).

A :class:`Workflow` collects steps (a queue, a payload and the options of
``enqueue``) and the edges between them (``after=[…]``, :meth:`Workflow.chain`,
:meth:`Workflow.group`, :meth:`Workflow.callback`); :meth:`Workflow.enqueue`
checks the whole graph (names, unknown steps, cycles, limits) before it writes
anything, then enqueues it with one ``enqueue_many``-like call per queue
(whatever the depth: the steps' ids are chosen first, so a step and its
dependents go in the same calls), inside the caller's transaction when
there is one. Each step is a job with
``depends_on``: from then on the rules are those of dependencies
(docs/reference/semantics.md §9 "Dependencies"), and the jobs are seen,
retried and cancelled as any others.

Once enqueued, a workflow is the set of jobs connected by dependencies:
:func:`show` reads it from any of its jobs, :func:`cancel` cancels every
step that has not finished.

Usage::

    from django_fq.workflows import Workflow

    wf = Workflow()
    split = wf.step("imports", {"file": "orders.csv"}, name="split")
    chunks = wf.group(*(wf.step("imports", {"chunk": i}, name=f"chunk-{i}", after=[split]) for i in range(8)))
    wf.callback(chunks, "reports", {"file": "orders.csv"}, name="report")
    ids = wf.enqueue()  # {"split": "…", "chunk-0": "…", …, "report": "…"}
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from django.db import transaction

from . import conf, db, routing, validation
from .exceptions import FqError, InvalidDependency, InvalidWorkflow, WrongDatabase
from .services import dependencies
from .services.enqueue import ENVELOPE_KEYS

#: Most steps one workflow may have (docs/reference/semantics.md §9 "Dependencies").
MAX_STEPS = 10_000
#: Most edges one workflow may have, all steps together.
MAX_EDGES = 100_000
#: Longest step name.
MAX_NAME = 200

_OPTIONS = ENVELOPE_KEYS - {"payload", "depends_on"}


#: The builder's error (:class:`django_fq.exceptions.InvalidWorkflow`), under the name this module gives it.
WorkflowError = InvalidWorkflow


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """A step of a :class:`Workflow`: what :meth:`Workflow.step` returns, to name it in ``after``."""

    name: str
    queue: str
    workflow: Workflow = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    """Steps that run in parallel: an ``after`` of a group waits for every one of them."""

    steps: tuple[Step, ...]


class Workflow:
    """A graph of steps to enqueue together. Build it, then call :meth:`enqueue` once."""

    def __init__(self) -> None:
        self._steps: dict[str, tuple[str, Any, dict]] = {}
        self._after: dict[str, list[tuple[Step | str, str]]] = {}
        self._order: list[str] = []
        self._named: set[str] = set()  # steps given a name (not the default "<queue>#<n>")
        #: Built from a document (:func:`from_spec`): an option's error is named under ``options``.
        self._from_spec = False

    def step(
        self,
        queue: str,
        payload: Any,
        *,
        name: str | None = None,
        after: Iterable[Step | Group | str] = (),
        on_failure: str = dependencies.DEFAULT_ON_FAILURE,
        **options: Any,
    ) -> Step:
        """Add a job to ``queue``; return its :class:`Step`.

        ``name`` (1–200 characters, unique in the workflow; default
        ``"<queue>#<n>"``) names the step in errors and in the ids
        :meth:`enqueue` returns; a name given here is also recorded in the
        job's metadata as ``"step"`` (unless ``metadata`` has that key), where
        the admin's workflow graph reads it. ``after``: steps, groups, or ids of jobs
        already enqueued, that must succeed first; ``on_failure`` is the
        policy of those edges (``cancel``, ``run``, ``wait``). ``options``:
        those of ``enqueue`` (``priority``, ``delay_ms``, ``at``,
        ``idempotency``, ``unique_key``, ``max_attempts``, ``timeout_ms``,
        ``metadata``, …). Raises :class:`WorkflowError` for a duplicate name
        or an unknown option.
        """
        validation.queue_name(queue)
        named = name is not None
        name = f"{queue}#{len(self._order)}" if name is None else name
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
            raise WorkflowError(f"a step name is 1-{MAX_NAME} characters", field="name")
        if name in self._steps:
            raise WorkflowError(f"step {name!r}: the name is used twice", field=f"steps[{name}]")
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise WorkflowError(f"step {name!r}: unknown option {unknown[0]}", field=f"steps[{name}].{unknown[0]}")
        self._steps[name] = (queue, payload, options)
        self._after[name] = []
        self._order.append(name)
        if named:
            self._named.add(name)
        step = Step(name, queue, self)
        self.add_edges(step, after, on_failure=on_failure)
        return step

    def add_edges(self, step: Step, after: Iterable[Step | Group | str], *, on_failure: str = "cancel") -> None:
        """``step`` runs only after every one of ``after`` (steps, groups, job ids) succeeded (or as ``on_failure`` says)."""
        if on_failure not in dependencies.ON_FAILURE:
            raise WorkflowError(
                f"step {step.name!r}: on_failure must be one of {', '.join(dependencies.ON_FAILURE)}",
                field=f"steps[{step.name}].on_failure",
            )
        mine = self._own(step)
        for item in after:
            for up in item.steps if isinstance(item, Group) else (item,):
                if isinstance(up, Step):
                    self._own(up)
                elif not isinstance(up, str):
                    raise WorkflowError(
                        f"step {step.name!r}: after takes steps, groups and job ids, not {type(up).__name__}",
                        field=f"steps[{step.name}].after",
                    )
                self._after[mine].append((up, on_failure))

    def chain(self, *steps: Step | Group, on_failure: str = "cancel") -> Step | Group:
        """Each of ``steps`` runs after the one before it (a group: after all of it); returns the last."""
        for before, nxt in itertools.pairwise(steps):
            for s in nxt.steps if isinstance(nxt, Group) else (nxt,):
                self.add_edges(s, [before], on_failure=on_failure)
        return steps[-1]

    def group(self, *steps: Step) -> Group:
        """``steps`` as one :class:`Group` (they run in parallel), to name in ``after`` or :meth:`chain`."""
        for s in steps:
            self._own(s)
        return Group(tuple(steps))

    def callback(self, group: Group | Step, queue: str, payload: Any, *, name: str | None = None, **options) -> Step:
        """A step that runs once, when every step of ``group`` has finished, whatever each outcome.

        Its edges are ``on_failure="run"``: a member that goes dead or is
        cancelled counts as finished (the callback may read their states with
        ``get``). A member waiting out retries keeps it waiting until it is done.
        """
        return self.step(queue, payload, name=name, after=[group], on_failure="run", **options)

    def steps(self) -> list[Step]:
        """Every step, in the order they were added."""
        return [Step(name, self._steps[name][0], self) for name in self._order]

    def external_dependencies(self) -> list[tuple[str, str]]:
        """``(step name, job id)`` for each ``after`` naming a job enqueued before (not a step of this workflow)."""
        return [(name, up) for name in self._order for up, _ in self._after[name] if isinstance(up, str)]

    def _own(self, step: Step) -> str:
        if not isinstance(step, Step) or step.workflow is not self or step.name not in self._steps:
            name = getattr(step, "name", step)
            raise WorkflowError(f"step {name!r} is not a step of this workflow", field=f"steps[{name}]")
        return step.name

    # --- enqueue -------------------------------------------------------------------------------

    def levels(self) -> list[list[str]]:
        """The step names in dependency order, level by level; raises :class:`WorkflowError` (cycle, unknown step, limits)."""
        if len(self._order) > MAX_STEPS:
            # Named: the first step past the limit (docs/reference/python-api.md: errors name the step).
            over = self._order[MAX_STEPS]
            raise WorkflowError(
                f"step {over!r}: a workflow has at most {MAX_STEPS} steps, not {len(self._order)}",
                field=f"steps[{over}]",
            )
        edges = 0
        for name in self._order:
            edges += len(self._after[name])
            if edges > MAX_EDGES:
                total = sum(len(v) for v in self._after.values())
                raise WorkflowError(
                    f"step {name!r}: a workflow has at most {MAX_EDGES} edges, not {total}", field=f"steps[{name}].after"
                )
        need: dict[str, int] = {}
        downstream: dict[str, list[str]] = defaultdict(list)
        for name in self._order:
            ups = {self._own(u) for u, _ in self._after[name] if isinstance(u, Step)}
            if len(self._after[name]) > dependencies.MAX_DEPENDENCIES:
                raise WorkflowError(
                    f"step {name!r} depends on {len(self._after[name])} jobs; at most {dependencies.MAX_DEPENDENCIES}",
                    field=f"steps[{name}].after",
                )
            need[name] = len(ups)
            for u in ups:
                downstream[u].append(name)
        level = [n for n in self._order if need[n] == 0]
        out: list[list[str]] = []
        seen = 0
        while level:
            out.append(level)
            seen += len(level)
            nxt = []
            for n in level:
                for d in downstream[n]:
                    need[d] -= 1
                    if need[d] == 0:
                        nxt.append(d)
            level = nxt
        if seen < len(self._order):
            stuck = next(n for n in self._order if need[n] > 0)
            raise WorkflowError(f"step {stuck!r} is on a cycle of dependencies", field=f"steps[{stuck}].after")
        return out

    def enqueue(self, *, create_queues: bool | Collection[str] = True) -> dict[str, str]:
        """Enqueue every step in one transaction (the caller's, when one is open); return ``{step name: job id}``.

        All or nothing: an error names the step (``steps[NAME].field``) and
        leaves nothing written. A step that an idempotency token or unique key
        coalesces onto an existing job is that job (its dependents wait for it).
        ``create_queues``: whether a step's queue that does not exist is
        created (``True``, as ``enqueue`` does), never (``False``: the error
        ``queue_not_found`` naming the step), or only for the queue names given.
        Raises :class:`WorkflowError` and the errors of ``enqueue_many``.
        """
        levels = self.levels()
        if not levels:
            return {}
        if not routing.enabled():
            return db.retrying(self._write, levels, create_queues)
        with routing.using(self._alias(levels)):
            routing.check_transaction(self._steps[levels[0][0]][0], field=f"steps[{levels[0][0]}].queue")
            return db.retrying(self._write, levels, create_queues)

    def _alias(self, levels: list[list[str]]) -> str:
        """The one database alias of every step's queue; :class:`WrongDatabase` naming the first step elsewhere."""
        first: tuple[str, str] | None = None
        for level in levels:
            for name in level:
                alias = routing.alias_for(self._steps[name][0])
                if first is None:
                    first = (name, alias)
                elif alias != first[1]:
                    raise WrongDatabase(
                        f"step {name!r}: queue {self._steps[name][0]} is on database {alias!r}, but step "
                        f"{first[0]!r} is on {first[1]!r}; the jobs of one workflow share one database "
                        "(their dependencies are rows of it)",
                        field=f"steps[{name}].queue",
                    )
        assert first is not None
        return first[1]

    def _write(self, levels: list[list[str]], create_queues: bool | Collection[str] = True) -> dict[str, str]:
        """Write every step: one ``enqueue_many``-like call per (round, queue), then the round's edges at once.

        A step that cannot coalesce (no idempotency token, no unique key) gets
        its job id now, so that its dependents may be written in the same
        call as it, or in the call of another queue. A step that can coalesce
        is a barrier: its job (new or existing) is known only once it is
        written, so its dependents go in a later round. A chain of such
        steps costs a few statements per queue (and per 500 rows), not per
        level (docs/performance.md "Workflows").
        """
        order = [name for level in levels for name in level]
        rank = {name: i for i, name in enumerate(order)}
        barrier = {n for n in order if self._coalesces(n)}
        rounds: dict[str, int] = {}
        for name in order:
            rounds[name] = max(
                (rounds[up.name] + (up.name in barrier) for up, _ in self._after[name] if isinstance(up, Step)),
                default=0,
            )
        planned: dict[str, str] = {n: secrets.token_hex(16) for n in order}
        ids: dict[str, str] = {n: uid for n, uid in planned.items() if n not in barrier}
        by_round: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for name in order:
            by_round[rounds[name]][self._steps[name][0]].append(name)
        # Every step's planned id: a step that may coalesce is, when it creates its job, a dependent of this write too.
        by_uid = {uid: rank[n] for n, uid in planned.items()}
        with transaction.atomic(using=conf.database()):
            for r in sorted(by_round):
                fresh = dependencies.Fresh(ids[n] for names in by_round[r].values() for n in names if n in ids)
                written: list[tuple[str, list]] = []
                for queue, names in by_round[r].items():
                    items = [self._envelope(n, ids) for n in names]
                    create = create_queues if isinstance(create_queues, bool) else queue in create_queues
                    try:
                        results = _enqueue_steps(queue, items, [planned[n] for n in names], fresh, create)
                    except FqError as exc:
                        _name_the_step(exc, names)
                        step = _step_of(exc.field)
                        if self._from_spec and step in self._steps:
                            _under_options(exc, step, self._steps[step][2])
                        raise
                    ids.update((n, res.id) for n, res in zip(names, results, strict=True))
                    written.append((queue, results))
                dependencies.attach_fresh(db.connection(), fresh, by_uid.__getitem__)
                _after_enqueue(written)
        return {n: ids[n] for n in order}

    def _coalesces(self, name: str) -> bool:
        """Whether step ``name`` may turn out to be an existing job (an idempotency token or a unique key)."""
        options = self._steps[name][2]
        return options.get("idempotency") is not None or options.get("unique_key") is not None

    def _envelope(self, name: str, ids: Mapping[str, str]) -> dict:
        _, payload, options = self._steps[name]
        deps: dict[str, dict] = {}
        for up, policy in self._after[name]:
            if isinstance(up, Step):
                # The edge carries the step's name: the dependent reads its result as job.upstream[name].
                deps.setdefault(ids[up.name], {"id": ids[up.name], "on_failure": policy, "name": up.name})
            else:
                deps.setdefault(up, {"id": up, "on_failure": policy})
        env = {"payload": payload, **options}
        meta = options.get("metadata")
        if name in self._named and (meta is None or (isinstance(meta, dict) and "step" not in meta)):
            # First, so that a reader of the metadata's first characters finds it (the admin's graph).
            env["metadata"] = {"step": name, **(meta or {})}
        if deps:
            env["depends_on"] = list(deps.values())
        return env


# --- a workflow as data: the REST body and the CLI's file -----------------------------------------

#: Keys of one step of a workflow document.
STEP_KEYS = frozenset({"name", "queue", "payload", "options", "after", "on_failure"})
#: Keys of a workflow document.
SPEC_KEYS = frozenset({"steps", "groups", "chains"})


def _bad(message: str, field: str) -> InvalidWorkflow:
    return InvalidWorkflow(message, field=field)


def from_spec(spec: object) -> Workflow:
    """A :class:`Workflow` built from a JSON document (``POST workflows/``, ``fq workflow create``).

    ``spec``: ``{"steps": [step, …], "groups": {name: [step names]}, "chains":
    [[names], …]}`` (``groups`` and ``chains`` optional). A step is ``{"name",
    "queue", "payload", "options", "after", "on_failure"}``: ``name`` (1–200
    characters, unique) and ``queue`` required, ``payload`` required (any
    JSON), ``options`` an object of ``enqueue`` options (``priority``,
    ``delay_ms``, ``at``, ``idempotency``, ``unique_key``, ``max_attempts``,
    ``timeout_ms``, ``metadata``, ``concurrency_key``, …), ``after`` a list of
    step names, group names (every member) or ids of jobs enqueued before,
    ``on_failure`` the policy of its ``after`` edges (``cancel``, ``run``,
    ``wait``). A group names steps to wait for together; a chain makes each
    of its names (steps or groups) run after the one before, with the
    ``cancel`` policy. At most :data:`MAX_STEPS` steps.

    Raises :class:`InvalidWorkflow` naming the step and field
    (``steps[NAME].after[0]``, ``steps[3].name`` before a step has a name,
    ``groups[G][1]``, ``chains[0][2]``); nothing is enqueued by this call.
    """
    if not isinstance(spec, Mapping):
        raise _bad("a workflow is a JSON object with steps", "steps")
    unknown = sorted(str(k) for k in spec if k not in SPEC_KEYS)
    if unknown:
        raise _bad(f"unknown field {unknown[0]}", unknown[0])
    raw_steps = spec.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise _bad("steps must be a non-empty list of steps", "steps")
    if len(raw_steps) > MAX_STEPS:
        raise _bad(f"a workflow has at most {MAX_STEPS} steps, not {len(raw_steps)}", "steps")
    wf = Workflow()
    wf._from_spec = True
    made: dict[str, Step] = {}
    pending_after: list[tuple[Step, list, str]] = []
    for i, raw in enumerate(raw_steps):
        if not isinstance(raw, Mapping):
            raise _bad(f"steps[{i}] must be a JSON object", f"steps[{i}]")
        name = raw.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
            raise _bad(f"steps[{i}].name must be a string of 1-{MAX_NAME} characters", f"steps[{i}].name")
        where = f"steps[{name}]"
        extra = sorted(str(k) for k in raw if k not in STEP_KEYS)
        if extra:
            raise _bad(f"step {name!r}: unknown field {extra[0]}", f"{where}.{extra[0]}")
        for key in ("queue", "payload"):
            if key not in raw:
                raise _bad(f"step {name!r}: {key} is required", f"{where}.{key}")
        queue = raw["queue"]
        try:
            validation.queue_name(queue)
        except FqError as exc:
            raise type(exc)(f"step {name!r}: {exc.message}", field=f"{where}.queue") from None
        options = {} if raw.get("options") is None else raw["options"]
        if not isinstance(options, Mapping):
            raise _bad(f"step {name!r}: options must be a JSON object", f"{where}.options")
        after = [] if raw.get("after") is None else raw["after"]
        if not isinstance(after, list):
            raise _bad(f"step {name!r}: after must be a list of step names or job ids", f"{where}.after")
        on_failure = raw.get("on_failure", dependencies.DEFAULT_ON_FAILURE)
        if on_failure not in dependencies.ON_FAILURE:
            raise _bad(
                f"step {name!r}: on_failure must be one of {', '.join(dependencies.ON_FAILURE)}", f"{where}.on_failure"
            )
        bad = sorted(str(k) for k in options if k not in _OPTIONS)
        if bad:
            raise _bad(f"step {name!r}: unknown option {bad[0]}", f"{where}.options.{bad[0]}")
        step = wf.step(queue, raw["payload"], name=name, **options)
        made[name] = step
        pending_after.append((step, after, on_failure))
    groups = _spec_groups(wf, spec.get("groups"), made)
    for step, after, on_failure in pending_after:
        items: list[Step | Group | str] = []
        for j, ref in enumerate(after):
            items.append(_resolve(ref, made, groups, f"steps[{step.name}].after[{j}]", step.name, ids=True))
        wf.add_edges(step, items, on_failure=on_failure)
    chains = [] if spec.get("chains") is None else spec["chains"]
    if not isinstance(chains, list):
        raise _bad("chains must be a list of lists of step or group names", "chains")
    for i, chain in enumerate(chains):
        if not isinstance(chain, list) or len(chain) < 2:
            raise _bad(f"chains[{i}] must list at least two step or group names", f"chains[{i}]")
        links = [_resolve(ref, made, groups, f"chains[{i}][{j}]", None, ids=False) for j, ref in enumerate(chain)]
        wf.chain(*links)  # ids=False: only steps and groups
    return wf


def create(spec: object, *, create_queues: bool | Collection[str] = True) -> dict[str, str]:
    """Build the workflow of ``spec`` (:func:`from_spec`) and enqueue it (:meth:`Workflow.enqueue`).

    Returns ``{step name: job id}``. All or nothing; the errors of both, each
    naming the step; an error about an option names it under ``options``
    (``steps[NAME].options.priority``).
    """
    return from_spec(spec).enqueue(create_queues=create_queues)


def _step_of(field: str | None) -> str | None:
    if not field or not field.startswith("steps["):
        return None
    name, sep, _ = field[len("steps[") :].partition("]")
    return name if sep else None


def _under_options(exc: FqError, name: str, options: Mapping) -> None:
    """``steps[NAME].priority`` → ``steps[NAME].options.priority`` for a key of the step's ``options``."""
    head = f"steps[{name}]."
    field = exc.field or ""
    if field.startswith(head):
        rest = field[len(head) :]
        if rest.split(".", 1)[0].split("[", 1)[0] in options:
            exc.field = f"{head}options.{rest}"


def _spec_groups(wf: Workflow, raw: object, made: Mapping[str, Step]) -> dict[str, Group]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _bad("groups must be an object of group name: [step names]", "groups")
    out: dict[str, Group] = {}
    for gname, members in raw.items():
        where = f"groups[{gname}]"
        if gname in made:
            raise _bad(f"group {gname!r}: the name is a step's name", where)
        if not isinstance(members, list) or not members:
            raise _bad(f"group {gname!r} must list step names", where)
        steps = []
        for j, m in enumerate(members):
            if not isinstance(m, str) or m not in made:
                raise _bad(f"group {gname!r}: no step {m!r} in the workflow", f"{where}[{j}]")
            steps.append(made[m])
        out[str(gname)] = wf.group(*steps)
    return out


def _resolve(ref: object, made: Mapping[str, Step], groups: Mapping[str, Group], field: str, step: str | None, *, ids: bool):
    """A name in ``after`` or a chain: a step, a group, or (``ids``) the id of a job enqueued before."""
    if isinstance(ref, str):
        if ref in made:
            return made[ref]
        if ref in groups:
            return groups[ref]
        if ids and validation.job_id(ref):
            return ref
    who = f"step {step!r}: " if step is not None else ""
    what = "step names, group names or job ids" if ids else "step or group names"
    raise _bad(f"{who}{field} is not a step of the workflow ({what})", field)


def _enqueue_steps(queue: str, items: list[dict], uids: list[str], fresh, create_queue: bool = True):
    from .services.enqueue import enqueue_steps

    return enqueue_steps(queue, items, uids=uids, fresh=fresh, create_queue=create_queue)


def _after_enqueue(written: list[tuple[str, list]]) -> None:
    """The enqueue hook (the test helpers' inline mode) for each call of a round, once its edges are written."""
    import importlib

    # By name: ``django_fq.services.enqueue`` as an attribute is the function, not the module.
    hook = importlib.import_module("django_fq.services.enqueue").after_enqueue
    if hook is not None:
        for queue, results in written:
            hook(queue, results)


def _name_the_step(exc: FqError, names: list[str]) -> None:
    """``items[i].field`` of ``enqueue_many`` → ``steps[NAME].field``, in the field and the message."""
    field = exc.field or ""
    if field in ("", "queue") and names and exc.code == "queue_not_found":
        exc.field = f"steps[{names[0]}].queue"
        exc.message = f"step {names[0]!r}: {exc.message}"
        exc.args = (exc.message,)
        return
    if field.startswith("items["):
        index, _, rest = field[len("items[") :].partition("]")
        if index.isdigit() and int(index) < len(names):
            name = names[int(index)]
            rest = rest.lstrip(".")
            exc.field = f"steps[{name}].{rest}" if rest else f"steps[{name}]"
            head = f"items[{index}]."
            text = exc.message[len(head) :] if exc.message.startswith(head) else exc.message
            exc.message = f"step {name!r}: {text}"
            exc.args = (exc.message,)


# --- a workflow once enqueued: the jobs connected by dependencies -------------------------------


@dataclasses.dataclass(frozen=True)
class WorkflowInfo:
    """The jobs connected to one job by dependencies, each way (:func:`show`).

    ``steps``: one dict per job, ``{"id", "queue", "state", "depends_on":
    [ids]}``, in dependency order (a job after every job it depends on);
    ``truncated``: the graph has more than :data:`MAX_STEPS` jobs and only
    that many were read.
    """

    id: str
    steps: list[dict]
    truncated: bool = False


@routing.by_queue
def show(queue: str, job_id: str) -> WorkflowInfo:
    """The workflow of job ``job_id`` of ``queue``: every job connected to it by dependencies, each way.

    Read by index, level by level, at most :data:`MAX_STEPS` jobs. Raises
    :class:`QueueNotFound`, :class:`JobNotFound`.
    """
    from .services import get

    get(queue, job_id)  # the job exists in this queue (else the verbs' own errors)
    nodes, edges, truncated = dependencies.component(job_id, limit=MAX_STEPS)
    ordered, ups = _in_order(nodes, edges)
    steps = [
        {
            "id": nodes[seq]["uid"],
            "queue": nodes[seq]["queue"],
            "state": nodes[seq]["state"],
            "depends_on": [nodes[u]["uid"] for u in sorted(ups[seq]) if u in nodes],
        }
        for seq in ordered
    ]
    return WorkflowInfo(id=job_id, steps=steps, truncated=truncated)


def _in_order(nodes: Mapping[int, dict], edges: list[tuple[int, int]]) -> tuple[list[int], dict[int, list[int]]]:
    """The seqs of ``nodes`` in dependency order (a job after those it depends on), and each one's upstream seqs."""
    ups: dict[int, list[int]] = defaultdict(list)
    downs: dict[int, list[int]] = defaultdict(list)
    for job, up in edges:
        ups[job].append(up)
        downs[up].append(job)
    need = {seq: sum(1 for u in ups[seq] if u in nodes) for seq in nodes}
    ready = deque(sorted(seq for seq, n in need.items() if n == 0))
    ordered: list[int] = []
    while ready:
        seq = ready.popleft()
        ordered.append(seq)
        for d in sorted(downs[seq]):
            if d in need:
                need[d] -= 1
                if need[d] == 0:
                    ready.append(d)
    ordered += sorted(set(nodes) - set(ordered))  # only when truncated: edges to jobs not read
    return ordered, ups


#: Reported states of a finished job: :func:`cancel` leaves them as they are.
_FINISHED = ("succeeded", "cancelled")


@dataclasses.dataclass(frozen=True)
class CancelledWorkflow:
    """What :func:`cancel` did: the jobs it cancelled (directly or by cascade), and those already finished (left as they were)."""

    id: str
    cancelled: int
    finished: int


@routing.by_queue
def cancel(
    queue: str, job_id: str, *, manageable: Callable[[set[str]], set[str]] | None = None
) -> CancelledWorkflow:
    """Cancel every unfinished job (waiting, scheduled, ready, running, dead) of job ``job_id``'s workflow.

    One transaction; a running job's lease ends as with ``cancel``, and no
    job of the workflow is released meanwhile (a ``run`` edge satisfied by a
    cancel releases a job this call cancels next, before it commits). Each
    job ends as a cancel of the jobs one by one, in dependency order, would
    leave it (a waiting job reached by a ``cancel`` or ``wait`` edge first is
    cancelled by that dependency, the others are cancelled directly), written
    as a set: a bounded number of statements per 500 jobs, whatever the
    depth (more than :data:`MAX_STEPS` jobs connected: one by one).
    ``manageable``: given the names of the queues holding unfinished jobs,
    those the caller may cancel in; when one is missing, nothing is cancelled
    and :class:`django.core.exceptions.PermissionDenied` is raised (the REST
    view's check, made on the steps this transaction reads, so a job that
    joined the workflow after an earlier look is judged too).
    Raises :class:`QueueNotFound`, :class:`JobNotFound`.
    """
    from .services import cancel as cancel_job
    from .services import get

    def check(touched: set[str]) -> None:
        if manageable is not None and touched - manageable(touched):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied("the workflow has unfinished jobs in a queue the caller may not manage")

    def one_by_one(info: WorkflowInfo) -> CancelledWorkflow:
        # More than MAX_STEPS jobs connected: the cascade may reach jobs this call did not read.
        unfinished = [s for s in info.steps if s["state"] not in _FINISHED]
        check({s["queue"] for s in unfinished})
        for step in unfinished:  # in dependency order: a cascade of one may have cancelled the next
            try:
                cancel_job(step["queue"], step["id"])
            except FqError as exc:
                if exc.code != "invalid_state":
                    raise
        return CancelledWorkflow(id=job_id, cancelled=len(unfinished), finished=len(info.steps) - len(unfinished))

    def apply():
        get(queue, job_id)  # the job exists in this queue (else the verbs' own errors)
        nodes, edges, truncated = dependencies.component(job_id, limit=MAX_STEPS)
        if truncated:
            return one_by_one(show(queue, job_id))
        ordered, _ = _in_order(nodes, edges)
        unfinished = [seq for seq in ordered if nodes[seq]["state"] not in _FINISHED]
        check({nodes[seq]["queue"] for seq in unfinished})
        # Counted from the rows it changed: a step a worker acked after the plan's plain read finished.
        gone = dependencies.cancel_component(db.connection(), nodes, unfinished)
        return CancelledWorkflow(id=job_id, cancelled=len(gone), finished=len(nodes) - len(gone))

    return db.retrying(apply)


__all__ = ["MAX_EDGES", "MAX_STEPS", "Group", "InvalidDependency", "InvalidWorkflow", "Step", "Workflow", "WorkflowError", "WorkflowInfo", "cancel", "create", "from_spec", "show"]
