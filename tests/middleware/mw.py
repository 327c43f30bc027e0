"""Middleware the middleware tests configure by dotted path (in-process and in worker children).

Each records what it saw in ``TRAIL`` (in-process) or, for worker children,
in the file named by the job's payload ``"trail"`` (one JSON line per call).
"""

from __future__ import annotations

import json
import os

from django_fq.exceptions import EnqueueRefused, RetryAfter, Snooze

TRAIL: list = []


def _note(job, what: str) -> None:
    TRAIL.append((what, job.id))
    path = job.payload.get("trail") if isinstance(job.payload, dict) else None
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps(
                    {"mw": what, "id": job.id, "attempt": job.attempts, "pid": os.getpid(), "metadata": job.metadata}
                )
                + "\n"
            )


def outer(job, call_next):
    _note(job, "outer:before")
    try:
        return call_next(job)
    finally:
        _note(job, "outer:after")


def inner(job, call_next):
    _note(job, "inner:before")
    result = call_next(job)
    _note(job, "inner:after")
    return {"inner": result}


def snooze_first(job, call_next):
    """Snooze a job whose metadata says so, as long as it is its first snooze (metadata ``snooze_ms``)."""
    ms = job.metadata.get("snooze_ms")
    marker = job.payload.get("trail") if isinstance(job.payload, dict) else None
    if ms is not None and marker and not os.path.exists(marker + ".snoozed"):
        open(marker + ".snoozed", "w").close()
        _note(job, "snooze")
        raise Snooze(ms)
    return call_next(job)


def retry_on_value_error(job, call_next):
    """Turn a ValueError of the handler into a retry 0 ms later (no backoff)."""
    try:
        return call_next(job)
    except ValueError as exc:
        _note(job, "retry")
        raise RetryAfter(0, error=f"retrying: {exc}") from exc


def per_handler(job, call_next):
    _note(job, "per_handler")
    return call_next(job)


async def async_only(job, call_next):
    return await call_next(job)


class Both:
    """A middleware with a sync and an async form."""

    def __call__(self, job, call_next):
        _note(job, "both:sync")
        return call_next(job)

    async def acall(self, job, call_next):
        _note(job, "both:async")
        return await call_next(job)


both = Both()
not_callable = 42


# --- enqueue middleware ---


def add_tenant(request, call_next):
    """Stamp the tenant (from options/payload) and a tag on every job."""
    request.metadata.setdefault("tenant", "acme")
    tags = list(request.metadata.get("tags", []))
    if "stamped" not in tags:
        tags.append("stamped")
    request.metadata["tags"] = tags
    return call_next(request)


def refuse_forbidden(request, call_next):
    if request.metadata.get("tenant") == "forbidden" or request.queue.endswith(".closed"):
        raise EnqueueRefused(f"queue {request.queue} does not take this job")
    return call_next(request)


def forgets_to_return(request, call_next):
    call_next(request)


def tag_task(request, call_next):
    """Tag a Django Tasks job with its task's function name (the Tasks API itself carries no metadata)."""
    task = request.payload.get("task") if hasattr(request.payload, "get") else None
    if isinstance(task, str):
        request.metadata["tags"] = [*request.metadata.get("tags", []), "task:" + task.rpartition(".")[2]]
    return call_next(request)


def refuse_all_tasks(request, call_next):
    if hasattr(request.payload, "get") and "task" in request.payload:
        raise EnqueueRefused("tasks are paused")
    return call_next(request)
