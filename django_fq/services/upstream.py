"""Results flow forward: what a job's dependencies returned (docs/how-to/workflows.md "Results flow forward").

A job enqueued with ``depends_on`` reads the results of the jobs it depends
on: :func:`results` (``django_fq.results``), ``job.upstream`` in a handler
(:attr:`django_fq.worker.context.JobContext.upstream`), ``fq workflow upstream``
and ``GET queues/{q}/jobs/{id}/upstream/``. Each dependency is one
:class:`UpstreamResult`, keyed by the name of its edge (a workflow step's
name) or, for an edge without a name, by the dependency's job id.

The results are read in one query, bounded as a claim's payloads are: when
the succeeded dependencies' results add up to more than
:data:`~django_fq.conf.CLAIM_PAYLOAD_CAP_BYTES` (32 MiB, docs/reference/semantics.md §5),
the query sums their sizes in the database and sends none of the texts, and
:class:`~django_fq.exceptions.ResultsTooLarge` names the size: never a
gigabyte of JSON in a worker's memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from .. import conf, db, routing, validation
from ..exceptions import ResultsTooLarge
from ._base import get_queue, manager, reported_state
from .jobs import job_not_found

#: Most bytes of results one read returns: the cap on the payloads one claim returns
#: (docs/reference/semantics.md §5, 32 MiB).
MAX_RESULTS_BYTES = conf.CLAIM_PAYLOAD_CAP_BYTES


@dataclasses.dataclass(frozen=True)
class UpstreamResult:
    """One dependency of a job, as its dependent sees it.

    ``name``: the edge's name (a workflow step's name), or ``None``; ``id``,
    ``queue``: the dependency; ``state``: its reported state (``succeeded``,
    ``dead``, ``cancelled``, or not finished: ``waiting``, ``scheduled``,
    ``ready``, ``running``); ``on_failure``: the edge's policy (a ``run`` edge
    lets the dependent run after a dead or cancelled dependency: its state
    says so); ``result``: what it returned (decoded JSON) when it succeeded,
    else ``None``; ``size``: the result's size in bytes of compact UTF-8
    JSON (0 without one).
    """

    name: str | None
    id: str
    queue: str
    state: str
    on_failure: str
    result: Any
    size: int

    @property
    def key(self) -> str:
        """The key of this dependency in :class:`Upstream`: its edge's name, else its job id."""
        return self.name if self.name is not None else self.id

    @property
    def succeeded(self) -> bool:
        """True when the dependency succeeded (only then is there a result)."""
        return self.state == "succeeded"

    def as_dict(self) -> dict:
        """``{"name", "id", "queue", "state", "on_failure", "result", "size"}`` (the CLI's ``--json``, REST)."""
        return dataclasses.asdict(self)


class Upstream(Mapping[str, Any]):
    """A job's dependencies and their results: a read-only mapping ``key → result``.

    Keys are the edges' names (a workflow step's name) or, for an edge
    without one, the dependency's job id; ``upstream[job_id]`` also finds a
    named edge by its job id. A value is the dependency's result, or ``None``
    when it has none (not succeeded: see :meth:`entry` for its state).
    Iteration follows the order the edges were written (``depends_on``'s order).
    """

    __slots__ = ("entries", "_by_key")

    def __init__(self, entries: tuple[UpstreamResult, ...]):
        #: Every dependency as an :class:`UpstreamResult`, in edge order.
        self.entries = entries
        self._by_key: dict[str, UpstreamResult] = {}
        for e in entries:
            self._by_key[e.id] = e
        for e in entries:
            if e.name is not None:
                self._by_key[e.name] = e  # a name wins over an equal job id of another edge

    def entry(self, key: str) -> UpstreamResult:
        """The :class:`UpstreamResult` under ``key`` (edge name or job id); ``KeyError`` if none."""
        return self._by_key[key]

    def __getitem__(self, key: str) -> Any:
        return self._by_key[key].result

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        return (e.key for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def size(self) -> int:
        """The results' sizes together, in bytes."""
        return sum(e.size for e in self.entries)

    def as_list(self) -> list[dict]:
        """Every entry as :meth:`UpstreamResult.as_dict`, in edge order."""
        return [e.as_dict() for e in self.entries]

    def __repr__(self) -> str:
        return f"Upstream({', '.join(f'{e.key!r}: {e.state}' for e in self.entries)})"


@routing.by_queue
def results(queue: str, job_id: str, *, queues: Collection[str] | None = None) -> Upstream:
    """The results of the dependencies of job ``job_id`` of ``queue``, as an :class:`Upstream`.

    ``queues``: read only the dependencies of these queues (the REST API
    passes the queues its user may see); ``None``: all of them. A job without
    dependencies has an empty :class:`Upstream`.

    Raises :class:`QueueNotFound`, :class:`JobNotFound`, and
    :class:`ResultsTooLarge` (``size`` and ``limit`` in bytes) when the
    results together pass :data:`MAX_RESULTS_BYTES` (32 MiB): read them one
    by one with ``get`` then.
    """
    q = get_queue(queue)
    if not validation.job_id(job_id):
        raise job_not_found(queue, job_id)
    from ..models import Job

    seq = manager(Job).filter(queue_id=q.id, uid=job_id).values_list("seq", flat=True).first()
    if seq is None:
        raise job_not_found(queue, job_id)
    return load(job_id, seq=seq, queues=queues)


def load(job_id: str, *, seq: int | None = None, queues: Collection[str] | None = None) -> Upstream:
    """:func:`results` without the queue check: the dependencies of job ``job_id`` (or of job row ``seq``).

    One query: each edge with its dependency's reported state and result
    size, and the result text only while the results together stay within
    :data:`MAX_RESULTS_BYTES` (the sum is a subquery, so a too-large set
    never leaves the database). Raises :class:`ResultsTooLarge`.
    """
    from django.db.models import Case, F, Subquery, Sum, Value, When

    from ..models import Dependency

    mine = {"job_id": seq} if seq is not None else {"job__uid": job_id}
    scope = {} if queues is None else {"upstream__queue__name__in": sorted(queues)}
    edges = manager(Dependency).filter(**mine, **scope)
    # Not correlated (the job is a constant): the database computes the sum once, not per edge.
    total = Subquery(
        manager(Dependency)
        .filter(**mine, upstream__state="succeeded", **scope)
        .order_by()
        .values("job_id")
        .annotate(t=Sum(db.ByteLength("upstream__result")))
        .values("t")[:1]
    )
    rows = list(
        edges.annotate(
            reported=reported_state("upstream__"),
            size=db.ByteLength("upstream__result"),
            total=total,
        )
        .annotate(
            body=Case(
                When(total__gt=MAX_RESULTS_BYTES, then=Value(None)),
                When(upstream__state="succeeded", then=F("upstream__result")),
                default=Value(None),
            )
        )
        .order_by("id")
        .values("name", "upstream__uid", "upstream__queue__name", "reported", "on_failure", "size", "total", "body")
    )
    if not rows:
        return Upstream(())
    total_bytes = int(rows[0]["total"] or 0)
    if total_bytes > MAX_RESULTS_BYTES:
        raise ResultsTooLarge(
            f"the results of job {job_id}'s dependencies are {total_bytes} bytes together; at most "
            f"{MAX_RESULTS_BYTES} (32 MiB, the claim limit) are read at once: read them one by one with get",
            size=total_bytes,
            limit=MAX_RESULTS_BYTES,
        )
    entries = []
    for r in rows:
        ok = r["reported"] == "succeeded"
        entries.append(
            UpstreamResult(
                name=r["name"],
                id=r["upstream__uid"],
                queue=r["upstream__queue__name"],
                state=r["reported"],
                on_failure=r["on_failure"],
                result=validation.stored_json(r["body"], "result") if ok else None,
                size=int(r["size"] or 0) if ok else 0,
            )
        )
    return Upstream(tuple(entries))


def upstream_queues(queue: str, job_id: str) -> set[str]:
    """The queues of the dependencies of job ``job_id`` of ``queue`` (one query after the job's own check).

    Raises :class:`QueueNotFound`, :class:`JobNotFound`.
    """
    from ..models import Dependency, Job

    q = get_queue(queue)
    if not validation.job_id(job_id):
        raise job_not_found(queue, job_id)
    seq = manager(Job).filter(queue_id=q.id, uid=job_id).values_list("seq", flat=True).first()
    if seq is None:
        raise job_not_found(queue, job_id)
    return set(manager(Dependency).filter(job_id=seq).values_list("upstream__queue__name", flat=True).distinct())


__all__ = ["MAX_RESULTS_BYTES", "ResultsTooLarge", "Upstream", "UpstreamResult", "load", "results", "upstream_queues"]
