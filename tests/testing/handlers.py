"""Handlers of the testing-helper tests (registered at import; queue names start with ``tt.``)."""

from __future__ import annotations

from django.db import transaction

from django_fq import services
from django_fq.exceptions import PermanentFailure
from django_fq.handlers import handler
from django_fq.worker import current_job
from tests.testapp.models import Done

OK, FAIL, PERM, CHAIN, NEXT, LOOP, DUP, NOHANDLER = (
    "tt.ok", "tt.fail", "tt.perm", "tt.chain", "tt.next", "tt.loop", "tt.dup", "tt.nohandler",
)  # fmt: skip


@handler(OK)
def record(job):
    """One ``Done`` row per job (unique: a second run fails loudly); returns what it saw."""
    Done.objects.create(job_id=job.id)
    return {"n": (job.payload or {}).get("n"), "attempt": job.attempt, "current": current_job() is job}


@handler(FAIL)
def fail(job):
    raise RuntimeError(f"boom on attempt {job.attempt}")


@handler(PERM)
def permanent(job):
    raise PermanentFailure("never")


@handler(CHAIN)
def chain(job):
    """Enqueue a follow-up on ``tt.next``, then record this job; the outer context survives the nested run."""
    services.enqueue(NEXT, {"from": job.id})
    Done.objects.create(job_id=job.id)
    return {"current": current_job() is job}


@handler(NEXT)
def follow_up(job):
    Done.objects.create(job_id=job.id)
    return {"from": job.payload["from"]}


@handler(LOOP)
def loop(job):
    """Enqueue another job of its own queue every time: a chain with no end."""
    services.enqueue(LOOP, {"n": job.payload["n"] + 1})
    return job.payload["n"]


@handler(DUP)
def duplicate_row(job):
    """Insert a ``Done`` row whose key already exists: a database error inside the handler."""
    Done.objects.create(job_id=job.payload["key"])
    raise AssertionError("unreachable: the key exists")  # pragma: no cover


@handler("tt.leaveopen")
def leave_transaction_open(job):
    """Enter a transaction and never leave it: a worker rolls it back and fails the run."""
    transaction.atomic().__enter__()
    Done.objects.create(job_id=job.id)
    return {"left": "open"}


AIO, AIOFAIL, PROGRESS = "tt.aio", "tt.aiofail", "tt.progress"

# The async handlers are not registered (tests give them to drain(handlers=...)): a registered
# async def handler would give every worker that serves all handlers an event loop.


async def record_async(job):
    """An ``async def`` handler writing through Django's async ORM; returns what it counted."""
    await Done.objects.acreate(job_id=job.id)
    return {"done": await Done.objects.filter(job_id=job.id).acount(), "current": current_job() is job}


async def fail_async(job):
    """Writes a row, then fails: inside a test's transaction the row is rolled back with the run."""
    await Done.objects.acreate(job_id=job.id)
    raise RuntimeError("async boom")


@handler(PROGRESS)
def report_progress(job):
    """Two reports within a second: the first is written at once, the last must be written before the ack."""
    job.progress(10, "started")
    job.progress(100, "all done")
    return "ok"
