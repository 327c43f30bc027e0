"""Assertions on what was enqueued, read from the database (so they see the test's transaction).

``assert_enqueued`` and ``assert_not_enqueued`` look at the jobs of one queue
in some states (by default the waiting ones: scheduled and ready) and fail
with a message that lists what the queue holds, so a wrong payload is seen
at a glance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import db, payloads, validation
from ..exceptions import QueueNotFound
from ..models import Job
from ..services._base import get_queue, manager
from ..services.jobs import _reported
from ..types import STATE_NAMES

#: The states ``assert_enqueued`` looks at unless told otherwise: enqueued and not run yet.
WAITING = ("scheduled", "ready")
#: At most this many jobs are listed in an assertion's message.
_SHOWN = 20


@dataclass(frozen=True)
class EnqueuedJob:
    """One job as the assertions see it: id, reported state, payload, metadata and the enqueue options.

    ``metadata`` is ``None`` when the job has none; ``run_at`` and
    ``enqueued_at`` are epoch ms (database clock).
    """

    id: str
    queue: str
    state: str
    payload: Any
    metadata: Any
    priority: int
    run_at: int
    enqueued_at: int
    attempts: int
    max_attempts: int
    unique_key: str | None
    idempotency: str | None

    def describe(self) -> str:
        """One line: id, state and payload (and metadata when there is some)."""
        text = f"{self.id} [{self.state}] payload={_compact(self.payload)}"
        if self.metadata is not None:
            text += f" metadata={_compact(self.metadata)}"
        return text


def _compact(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def _states(state: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if state is None:
        return None
    names = (state,) if isinstance(state, str) else tuple(state)
    for name in names:
        if name not in STATE_NAMES:
            raise ValueError(f"state must be one of {', '.join(STATE_NAMES)}, not {name!r}")
    return names


def enqueued_jobs(queue: str, *, state: str | Iterable[str] | None = WAITING) -> list[EnqueuedJob]:
    """The jobs of ``queue`` in ``state`` (a reported state name, several, or ``None`` for all), oldest enqueue first.

    Default: the waiting jobs (``scheduled`` and ``ready``). A queue that does
    not exist has no jobs (``[]``). One query; payloads and metadata are
    decoded from their stored JSON.
    """
    validation.queue_name(queue)
    states = _states(state)
    try:
        q = get_queue(queue)
    except QueueNotFound:
        return []
    rows = manager(Job).filter(queue_id=q.id).annotate(reported=_reported())
    if states is not None:
        rows = rows.filter(reported__in=states)
    fields = (
        "uid", "reported", "payload", "metadata", "priority", "run_at", "enqueued_at",
        "attempts", "max_attempts", "unique_key", "idempotency",
    )  # fmt: skip
    found = list(rows.order_by("seq").values(*fields))
    payloads.fill(db.connection(), found)  # offloaded bodies (docs/explanation/storage.md#large-payloads)
    return [
        EnqueuedJob(
            id=r["uid"],
            queue=queue,
            state=r["reported"],
            payload=validation.stored_json(r["payload"], "payload"),
            metadata=None if r["metadata"] is None else validation.stored_json(r["metadata"], "metadata"),
            priority=r["priority"],
            run_at=r["run_at"],
            enqueued_at=r["enqueued_at"],
            attempts=r["attempts"],
            max_attempts=r["max_attempts"],
            unique_key=r["unique_key"],
            idempotency=r["idempotency"],
        )
        for r in found
    ]


_ANY = object()


def _matches(job: EnqueuedJob, payload: Any, metadata: Any, options: Mapping[str, Any]) -> bool:
    if payload is not _ANY and job.payload != payload:
        return False
    if metadata is not _ANY:
        have = job.metadata if isinstance(job.metadata, Mapping) else {}
        if metadata is None:
            if job.metadata is not None:
                return False
        elif not isinstance(metadata, Mapping) or any(k not in have or have[k] != v for k, v in metadata.items()):
            return False
    return all(getattr(job, name) == value for name, value in options.items())


_OPTIONS = ("priority", "unique_key", "idempotency", "max_attempts")


def _wanted(payload: Any, metadata: Any, options: Mapping[str, Any]) -> str:
    parts = []
    if payload is not _ANY:
        parts.append(f"payload={_compact(payload)}")
    if metadata is not _ANY:
        parts.append(f"metadata ⊇ {_compact(metadata)}")
    parts += [f"{k}={v!r}" for k, v in options.items()]
    return f" with {', '.join(parts)}" if parts else ""


def _listing(queue: str, jobs: list[EnqueuedJob], states: tuple[str, ...] | None) -> str:
    where = f"{queue} ({'/'.join(states)})" if states else queue
    if not jobs:
        return f"{where} holds no job"
    lines = [f"{where} holds {len(jobs)} job(s):"]
    lines += [f"  {job.describe()}" for job in jobs[:_SHOWN]]
    if len(jobs) > _SHOWN:
        lines.append(f"  … and {len(jobs) - _SHOWN} more")
    return "\n".join(lines)


def _check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"unknown option {unknown[0]!r}; assertions match payload, metadata, {', '.join(_OPTIONS)}")


def assert_enqueued(
    queue: str,
    payload: Any = _ANY,
    *,
    metadata: Any = _ANY,
    count: int | None = None,
    state: str | Iterable[str] | None = WAITING,
    **options: Any,
) -> list[EnqueuedJob]:
    """Assert that ``queue`` holds a job (or exactly ``count`` jobs) matching; return the matching jobs.

    Args:
        queue: the queue name.
        payload: the job's payload, compared with ``==`` (``unittest.mock.ANY``
            works inside it); left out: any payload.
        metadata: a mapping whose items the job's metadata must all contain
            (other keys may be there: middleware adds its own); ``None``: the
            job has no metadata; left out: any metadata.
        count: the exact number of matching jobs; ``None``: at least one.
        state: the reported states to look at (default: ``scheduled`` and
            ``ready``; ``None``: every state).
        options: ``priority``, ``unique_key``, ``idempotency`` or
            ``max_attempts``, compared with ``==``.

    Raises :class:`AssertionError` naming what was wanted and listing the
    queue's jobs in those states (up to 20), ``TypeError`` for an unknown option.
    """
    _check_options(options)
    states = _states(state)
    jobs = enqueued_jobs(queue, state=states)
    found = [j for j in jobs if _matches(j, payload, metadata, options)]
    wanted = _wanted(payload, metadata, options)
    if count is None and not found:
        raise AssertionError(f"no job{wanted} in {_listing(queue, jobs, states)}")
    if count is not None and len(found) != count:
        raise AssertionError(f"expected {count} job(s){wanted}, found {len(found)} in {_listing(queue, jobs, states)}")
    return found


def assert_not_enqueued(
    queue: str,
    payload: Any = _ANY,
    *,
    metadata: Any = _ANY,
    state: str | Iterable[str] | None = WAITING,
    **options: Any,
) -> None:
    """Assert that ``queue`` holds no job matching (arguments as :func:`assert_enqueued`; nothing given: no job at all).

    Raises :class:`AssertionError` listing the jobs that match.
    """
    _check_options(options)
    states = _states(state)
    jobs = enqueued_jobs(queue, state=states)
    found = [j for j in jobs if _matches(j, payload, metadata, options)]
    if found:
        raise AssertionError(
            f"expected no job{_wanted(payload, metadata, options)}, but {_listing(queue, found, states)}"
        )
