"""Workflows: a graph of jobs enqueued in one transaction, all of it or none (docs/how-to/workflows.md).

A :class:`Workflow` collects steps (a queue, a payload and the options of
``enqueue``) and the edges between them (``after=[…]``, :meth:`Workflow.chain`,
:meth:`Workflow.group`, :meth:`Workflow.callback`); :meth:`Workflow.enqueue`
checks the whole graph (names, unknown steps, cycles, limits) before it writes
anything, then enqueues it level by level with ``enqueue_many``, inside the
caller's transaction when there is one. Each step is a job with
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
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction

from . import conf, db, validation
from .exceptions import FqError, InvalidDependency, InvalidWorkflow
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
        :meth:`enqueue` returns. ``after``: steps, groups, or ids of jobs
        already enqueued, that must succeed first; ``on_failure`` is the
        policy of those edges (``cancel``, ``run``, ``wait``). ``options``:
        those of ``enqueue`` (``priority``, ``delay_ms``, ``at``,
        ``idempotency``, ``unique_key``, ``max_attempts``, ``timeout_ms``,
        ``metadata``, …). Raises :class:`WorkflowError` for a duplicate name
        or an unknown option.
        """
        validation.queue_name(queue)
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

    def _own(self, step: Step) -> str:
        if not isinstance(step, Step) or step.workflow is not self or step.name not in self._steps:
            name = getattr(step, "name", step)
            raise WorkflowError(f"step {name!r} is not a step of this workflow", field=f"steps[{name}]")
        return step.name

    # --- enqueue -------------------------------------------------------------------------------

    def levels(self) -> list[list[str]]:
        """The step names in dependency order, level by level; raises :class:`WorkflowError` (cycle, unknown step, limits)."""
        if len(self._order) > MAX_STEPS:
            raise WorkflowError(f"a workflow has at most {MAX_STEPS} steps, not {len(self._order)}", field="steps")
        edges = sum(len(v) for v in self._after.values())
        if edges > MAX_EDGES:
            raise WorkflowError(f"a workflow has at most {MAX_EDGES} edges, not {edges}", field="steps")
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

    def enqueue(self) -> dict[str, str]:
        """Enqueue every step in one transaction (the caller's, when one is open); return ``{step name: job id}``.

        All or nothing: an error names the step (``steps[NAME].field``) and
        leaves nothing written. A step that an idempotency token or unique key
        coalesces onto an existing job is that job (its dependents wait for it).
        Raises :class:`WorkflowError` and the errors of ``enqueue_many``.
        """
        levels = self.levels()
        if not levels:
            return {}
        return db.retrying(self._write, levels)

    def _write(self, levels: list[list[str]]) -> dict[str, str]:
        ids: dict[str, str] = {}
        with transaction.atomic(using=conf.database()):
            for level in levels:
                by_queue: dict[str, list[str]] = defaultdict(list)
                for name in level:
                    by_queue[self._steps[name][0]].append(name)
                for queue, names in by_queue.items():
                    items = [self._envelope(n, ids) for n in names]
                    try:
                        results = _enqueue_many(queue, items)
                    except FqError as exc:
                        _name_the_step(exc, names)
                        raise
                    ids.update((n, r.id) for n, r in zip(names, results, strict=True))
        return ids

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
        if deps:
            env["depends_on"] = list(deps.values())
        return env


def _enqueue_many(queue: str, items: list[dict]):
    from .services import enqueue_many

    return enqueue_many(queue, items)


def _name_the_step(exc: FqError, names: list[str]) -> None:
    """``items[i].field`` of ``enqueue_many`` → ``steps[NAME].field``, in the field and the message."""
    field = exc.field or ""
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


def show(queue: str, job_id: str) -> WorkflowInfo:
    """The workflow of job ``job_id`` of ``queue``: every job connected to it by dependencies, each way.

    Read by index, level by level, at most :data:`MAX_STEPS` jobs. Raises
    :class:`QueueNotFound`, :class:`JobNotFound`.
    """
    from .services import get

    get(queue, job_id)  # the job exists in this queue (else the verbs' own errors)
    nodes, edges, truncated = dependencies.component(job_id, limit=MAX_STEPS)
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


@dataclasses.dataclass(frozen=True)
class CancelledWorkflow:
    """What :func:`cancel` did: the jobs it cancelled (directly or by cascade), and those already finished (left as they were)."""

    id: str
    cancelled: int
    finished: int


def cancel(queue: str, job_id: str) -> CancelledWorkflow:
    """Cancel every unfinished job (waiting, scheduled, ready, running, dead) of job ``job_id``'s workflow.

    One transaction; a running job's lease ends as with ``cancel``, and no
    job of the workflow is released meanwhile (a ``run`` edge satisfied by a
    cancel releases a job this call cancels next, before it commits).
    Raises :class:`QueueNotFound`, :class:`JobNotFound`.
    """
    from .services import cancel as cancel_job

    def apply():
        info = show(queue, job_id)
        unfinished = [s for s in info.steps if s["state"] not in ("succeeded", "cancelled")]
        for step in unfinished:  # in dependency order: a cascade of one may have cancelled the next
            try:
                cancel_job(step["queue"], step["id"])
            except FqError as exc:
                if exc.code != "invalid_state":
                    raise
        return CancelledWorkflow(id=job_id, cancelled=len(unfinished), finished=len(info.steps) - len(unfinished))

    return db.retrying(apply)


__all__ = ["MAX_EDGES", "MAX_STEPS", "Group", "InvalidDependency", "InvalidWorkflow", "Step", "Workflow", "WorkflowError", "WorkflowInfo", "cancel", "show"]
