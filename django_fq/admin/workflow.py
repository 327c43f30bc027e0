"""The admin's workflow page: the jobs connected to one job by dependencies, drawn as an SVG graph.

The page (``admin:django_fq_job_workflow``, linked from a job's page and the
job list) reads the workflow with
:func:`django_fq.services.dependencies.component` (one recursive query,
whatever the depth, at most :data:`DRAW_LIMIT` jobs), then one query per 500
jobs for their details and one per 500 jobs for the edges' policies. The graph is laid out
here, on the server (:func:`layout`), and drawn by a template as inline SVG:
no JavaScript.

* Layout: a job's column is its longest path from a root (a job with no
  dependency in the workflow); the order within a column is chosen by
  barycentre sweeps (each job moved towards the mean place of its neighbours
  in the column before, then after), which removes most crossings of the
  usual shapes (chains, diamonds, fan-out / fan-in) at a cost linear in the edges.
* Nodes: the step name (the ``step`` key of the job's metadata, which the
  workflow builder sets for a named step), the queue, the short id and the
  state, as text: the colours have a text and border cue too. Each node links
  to its job's page and has a ``<title>`` tooltip.
* Edges: line style by failure policy (``cancel`` solid, ``run`` dashed,
  ``wait`` dotted); an edge already settled is drawn fainter.
* Bounds: above :data:`DRAW_LIMIT` jobs or :data:`EDGE_LIMIT` edges no graph
  is drawn; the table under it (always there, the accessible alternative)
  lists the jobs read, with a note. See docs/admin.md "Workflow graph".
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict, deque

from django.db.models.functions import Left

from .. import conf
from ..models import QUEUED_STATES, Dependency, Job
from ..services import dependencies
from ..services._base import reported_state

#: Most jobs of a workflow drawn as a graph (and read at all: above it the table lists these).
DRAW_LIMIT = 500
#: Most edges drawn; a workflow with more is shown as the table only.
EDGE_LIMIT = 5000
#: Characters of a step name or queue name inside a node (the tooltip and the table have more).
NODE_CHARS = 24
#: Characters of a step name in the tooltip and the table.
NAME_CHARS = 200
#: Characters of the metadata read per job to find its step name (the builder writes ``step`` first).
META_HEAD = 600
#: Barycentre sweeps (each one down and one up).
SWEEPS = 4
#: Rows of a query's ``IN (…)`` list.
CHUNK = 500

# Geometry, in SVG user units (pixels at 100 %).
NODE_W, NODE_H = 200, 58
GAP_X, GAP_Y = 70, 16
PAD = 12

#: The states a node shows, in legend order: ``(state, what it means)``.
#: ``held`` and ``retrying`` refine the reported ``scheduled``/``ready``
#: (docs/reference/semantics.md §9): a job waiting for its concurrency key's
#: slot, and one that failed an attempt and waits for the next.
STATES = (
    ("waiting", "dependencies not all done"),
    ("held", "waiting for its concurrency key's slot"),
    ("scheduled", "queued, runs later"),
    ("ready", "queued, can run now"),
    ("retrying", "an attempt failed; queued for the next"),
    ("running", "claimed by a worker"),
    ("succeeded", "done"),
    ("dead", "failed, no attempts left"),
    ("cancelled", "cancelled"),
)
#: The edges' line styles: ``(on_failure, legend text)``.
POLICIES = (
    ("cancel", "cancel: a failed dependency cancels the step (solid)"),
    ("run", "run anyway (dashed)"),
    ("wait", "wait for a retry (dotted)"),
)


@dataclasses.dataclass
class Node:
    """One job of the workflow as the page shows it."""

    seq: int
    uid: str
    queue: str
    state: str  # one of STATES
    reported: str  # the reported state (the API's)
    attempts: int
    max_attempts: int
    name: str | None
    level: int = 0
    x: float = 0
    y: float = 0


@dataclasses.dataclass
class Edge:
    """``job`` depends on ``upstream`` (seqs), with the edge's policy; ``pending`` while it keeps the job waiting."""

    job: int
    upstream: int
    on_failure: str
    pending: bool


@dataclasses.dataclass
class Graph:
    """What :func:`read` found: nodes by seq, edges, and why the graph may not be drawn."""

    nodes: dict[int, Node]
    edges: list[Edge]
    truncated: bool  # more jobs are connected than DRAW_LIMIT
    too_many_edges: bool  # more than EDGE_LIMIT edges among the jobs read

    @property
    def drawable(self) -> bool:
        return bool(self.nodes) and not self.truncated and not self.too_many_edges


def shown_state(stored: str, reported: str, attempts: int) -> str:
    """The node state of a job: its reported state, with ``held`` and ``retrying`` told apart."""
    if stored == "held":
        return "held"
    if stored in QUEUED_STATES and attempts > 0:
        return "retrying"
    return reported


def step_name(head: str | None) -> str | None:
    """The ``step`` string of a job's metadata, from its first :data:`META_HEAD` characters; ``None`` if absent."""
    if not head:
        return None
    name = None
    try:
        value = json.loads(head)
    except ValueError:  # longer than the head: the builder writes "step" first
        name = _leading_step(head)
    else:
        name = value.get("step") if isinstance(value, dict) else None
    return cut(name, NAME_CHARS) if isinstance(name, str) and name else None


def _leading_step(head: str) -> str | None:
    """The ``step`` string that opens a metadata text cut short, itself whole or cut (an escape cut in two is dropped)."""
    prefix = '{"step":"'
    if not head.startswith(prefix):
        return None
    try:
        name, _ = json.JSONDecoder().raw_decode(head, len(prefix) - 1)
    except ValueError:
        pass
    else:
        return name if isinstance(name, str) else None
    rest = head[len(prefix) :]
    for drop in range(7):  # the longest escape, \uXXXX, is six characters
        try:
            value = json.loads('"' + rest[: len(rest) - drop] + '"')
        except ValueError:
            continue
        return value + "…"
    return None


def read(job_id: str, *, limit: int = DRAW_LIMIT) -> Graph:
    """The workflow of job ``job_id`` (its uid): at most ``limit`` jobs and :data:`EDGE_LIMIT` edges.

    Queries: those of ``component`` (two, and one per 500 jobs), then one per 500 jobs for the details and at most one per 500
    jobs for the edges. Jobs whose queue row is gone are left out.
    """
    found, _, truncated = dependencies.component(job_id, limit=limit)
    seqs = sorted(found)
    nodes: dict[int, Node] = {}
    db_alias = conf.database()
    for start in range(0, len(seqs), CHUNK):
        rows = (
            Job.objects.using(db_alias)
            .filter(seq__in=seqs[start : start + CHUNK])
            .annotate(reported=reported_state(), meta_head=Left("metadata", META_HEAD))
            .values_list("seq", "uid", "queue__name", "state", "reported", "attempts", "max_attempts", "meta_head")
        )
        for seq, uid, queue, stored, reported, attempts, max_attempts, head in rows:
            nodes[seq] = Node(
                seq=seq,
                uid=uid,
                queue=queue,
                state=shown_state(stored, reported, attempts),
                reported=reported,
                attempts=attempts,
                max_attempts=max_attempts,
                name=step_name(head),
            )
    edges: list[Edge] = []
    too_many = False
    ordered = sorted(nodes)
    for start in range(0, len(ordered), CHUNK):
        room = EDGE_LIMIT + 1 - len(edges)
        found_edges = list(
            Dependency.objects.using(db_alias)
            .filter(job_id__in=ordered[start : start + CHUNK])
            .order_by("job_id", "upstream_id")
            .values_list("job_id", "upstream_id", "on_failure", "pending")[:room]
        )
        edges += [Edge(j, u, p, bool(pending)) for j, u, p, pending in found_edges if u in nodes]
        if len(found_edges) >= room:
            too_many = True
            break
    if len(edges) > EDGE_LIMIT:
        too_many = True
    return Graph(nodes=nodes, edges=edges[:EDGE_LIMIT], truncated=truncated, too_many_edges=too_many)


def layout(seqs: list[int], edges: list[tuple[int, int]], *, sweeps: int = SWEEPS) -> list[list[int]]:
    """Columns of a layered drawing: ``seqs`` (jobs) by longest path from a root, ordered to reduce crossings.

    ``edges``: ``(job, upstream)`` pairs among ``seqs``. Returns the columns
    left to right, each a list of seqs top to bottom. A job on a cycle (never
    made by the services) goes to the column after the last.
    """
    ups: dict[int, list[int]] = defaultdict(list)
    downs: dict[int, list[int]] = defaultdict(list)
    for job, up in edges:
        ups[job].append(up)
        downs[up].append(job)
    need = {s: len(ups[s]) for s in seqs}
    level = dict.fromkeys(seqs, 0)
    ready = deque(s for s in seqs if need[s] == 0)
    done = 0
    while ready:
        s = ready.popleft()
        done += 1
        for d in downs[s]:
            level[d] = max(level[d], level[s] + 1)
            need[d] -= 1
            if need[d] == 0:
                ready.append(d)
    if done < len(seqs):
        last = max(level.values(), default=0) + 1
        for s in seqs:
            if need[s] > 0:
                level[s] = last
    columns: list[list[int]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for s in sorted(seqs):  # enqueue order first: a workflow's steps are mostly inserted in order
        columns[level[s]].append(s)
    place: dict[int, float] = {}

    def settle(column: list[int]) -> None:
        n = len(column)
        for i, s in enumerate(column):
            place[s] = (i + 0.5) / n  # a fraction of the column's height, so columns of any size compare

    for column in columns:
        settle(column)

    def sweep(order: range, neighbours: dict[int, list[int]]) -> None:
        for c in order:
            column = columns[c]
            keys = {}
            for s in column:
                near = neighbours[s]
                keys[s] = sum(place[t] for t in near) / len(near) if near else place[s]
            column.sort(key=lambda s: keys[s])  # stable: ties keep their order
            settle(column)

    for _ in range(sweeps):
        sweep(range(1, len(columns)), ups)
        sweep(range(len(columns) - 2, -1, -1), downs)
    return columns


def crossings(columns: list[list[int]], edges: list[tuple[int, int]]) -> int:
    """Pairs of edges between adjacent columns that cross (for tests and the page's note)."""
    where = {s: (c, i) for c, column in enumerate(columns) for i, s in enumerate(column)}
    by_gap: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for job, up in edges:
        (cu, iu), (cj, ij) = where[up], where[job]
        if cj == cu + 1:
            by_gap[cu].append((iu, ij))
    total = 0
    for pairs in by_gap.values():
        for a in range(len(pairs)):
            for b in range(a + 1, len(pairs)):
                (u1, j1), (u2, j2) = pairs[a], pairs[b]
                total += (u1 - u2) * (j1 - j2) < 0
    return total


def cut(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= n else text[: n - 1] + "…"


def drawing(graph: Graph, *, url_of) -> dict:
    """The SVG geometry of ``graph``: nodes with their box and labels, edges as paths, the canvas size.

    ``url_of(seq)``: the admin URL of a job's page.
    """
    seqs = sorted(graph.nodes)
    pairs = [(e.job, e.upstream) for e in graph.edges]
    columns = layout(seqs, pairs)
    tallest = max((len(c) for c in columns), default=0)
    row = NODE_H + GAP_Y
    height = PAD * 2 + tallest * row - GAP_Y
    width = PAD * 2 + len(columns) * (NODE_W + GAP_X) - GAP_X
    nodes = []
    for c, column in enumerate(columns):
        top = PAD + (tallest - len(column)) * row / 2
        for i, s in enumerate(column):
            n = graph.nodes[s]
            n.level, n.x, n.y = c, PAD + c * (NODE_W + GAP_X), top + i * row
            head = n.name if n.name is not None else n.queue
            tooltip = " · ".join(
                part
                for part in (
                    f"step {n.name}" if n.name is not None else "",
                    f"queue {n.queue}",
                    f"job {n.uid}",
                    n.state,
                    f"attempts {n.attempts} / {n.max_attempts}",
                )
                if part
            )
            nodes.append(
                {
                    "uid": n.uid,
                    "state": n.state,
                    "level": c + 1,
                    "url": url_of(s),
                    "x": n.x,
                    "y": round(n.y, 1),
                    "text_x": n.x + 9,
                    "line1": round(n.y + 18, 1),
                    "line2": round(n.y + 33, 1),
                    "line3": round(n.y + 49, 1),
                    "head": cut(head, NODE_CHARS),
                    "queue": cut(n.queue, NODE_CHARS) if n.name is not None else "",
                    "short": n.uid[:8],
                    "title": tooltip,
                }
            )
    edges = []
    for e in graph.edges:
        up, job = graph.nodes[e.upstream], graph.nodes[e.job]
        x1, y1 = up.x + NODE_W, up.y + NODE_H / 2
        x2, y2 = job.x - 4, job.y + NODE_H / 2  # the arrow head ends at the box
        mid = (x1 + x2) / 2
        edges.append(
            {
                "from": up.uid,
                "to": job.uid,
                "policy": e.on_failure,
                "pending": e.pending,
                "d": f"M{x1:.1f} {y1:.1f} C{mid:.1f} {y1:.1f} {mid:.1f} {y2:.1f} {x2:.1f} {y2:.1f}",
            }
        )
    return {
        "width": max(width, NODE_W + 2 * PAD),
        "height": max(height, NODE_H + 2 * PAD),
        "node_w": NODE_W,
        "node_h": NODE_H,
        "nodes": nodes,
        "edges": edges,
        "levels": len(columns),
        "crossings": crossings(columns, pairs),
    }


def rows(graph: Graph, *, url_of) -> list[dict]:
    """The table under the graph: one row per job read, by level (when drawn) then enqueue order."""
    ups: dict[int, list[Edge]] = defaultdict(list)
    for e in graph.edges:
        ups[e.job].append(e)
    out = []
    for n in sorted(graph.nodes.values(), key=lambda n: (n.level, n.seq)):
        after = [graph.nodes[e.upstream] for e in ups[n.seq]]
        out.append(
            {
                "uid": n.uid,
                "url": url_of(n.seq),
                "name": cut(n.name, 100) if n.name is not None else "",
                "queue": n.queue,
                "state": n.state,
                "attempts": f"{n.attempts} / {n.max_attempts}",
                "level": n.level + 1 if graph.drawable else "",
                "after": [
                    {"short": u.uid[:8], "uid": u.uid, "url": url_of(u.seq), "policy": e.on_failure}
                    for u, e in zip(after[:5], ups[n.seq][:5], strict=True)
                ],
                "more_after": max(0, len(after) - 5),
            }
        )
    return out


def counts(graph: Graph) -> list[tuple[str, int]]:
    """Jobs read in each node state, in legend order (states with none left out)."""
    per: dict[str, int] = defaultdict(int)
    for n in graph.nodes.values():
        per[n.state] += 1
    return [(s, per[s]) for s, _ in STATES if per[s]]
