"""Handlers the worker tests run (found by ``handlers.autodiscover()``).

Queue names start with ``t.`` so they never collide with an application's.
Every handler records what it did in the database, because the worker runs
them in a child process.
"""

import asyncio
import json
import os
import threading
import time

from asgiref.sync import sync_to_async
from django.db import transaction

from django_fq import services
from django_fq.exceptions import PermanentFailure
from django_fq.handlers import handler
from django_fq.worker import LeaseLost, current_job

from .models import Done


@handler("t.ok")
def record(job):
    """Write one ``Done`` row (unique per job: a second run fails loudly); return a result."""
    Done.objects.create(job_id=job.id, pid=os.getpid())
    return {"job": job.id, "n": job.payload.get("n"), "attempt": job.attempts}


@handler("t.other")
def record_other(job):
    """Like ``t.ok``, for the tests that check which queues a worker serves."""
    Done.objects.create(job_id=job.id, pid=os.getpid())
    return {"queue": job.queue}


@handler("t.fail")
def fail(job):
    """Always raise an ordinary exception."""
    raise RuntimeError(f"boom on attempt {job.attempts}")


@handler("t.perm")
def fail_permanently(job):
    """Raise the permanent-failure exception: the job must die at once."""
    raise PermanentFailure("this job can never succeed")


@handler("t.badresult")
def unstorable_result(job):
    """Return something that is not JSON: the worker must nack, not crash."""
    return {"when": object()}


@handler("t.cancelself")
def cancel_self(job):
    """Cancel the very job being run, then return: the ack is refused (cancelled)."""
    services.cancel(job.queue, job.id)
    return {"ignored": True}


@handler("t.slow")
def outlive_lease(job):
    """Sleep ``payload["sleep_ms"]`` (past the lease), then return: the ack is refused (expired)."""
    time.sleep(job.payload.get("sleep_ms", 0) / 1000)
    Done.objects.create(job_id=job.id, pid=os.getpid())
    return {"slept": True}


@handler("t.inspect")
def inspect(job):
    """Return what the handler can see of its job context (to check no receipt leaks into it)."""
    seen = {name: getattr(job, name) for name in ("id", "queue", "payload", "attempts", "max_attempts", "deadline", "enqueued_at")}
    seen["repr"] = repr(job)
    seen["attrs"] = sorted(a for a in dir(job) if not a.startswith("__"))
    seen["values"] = [str(getattr(job, a, "")) for a in dir(job) if not a.startswith("__")]
    return seen


@handler("t.cancelfail")
def cancel_self_then_fail(job):
    """Cancel the very job being run, then raise: the nack is refused (cancelled), never requeued."""
    services.cancel(job.queue, job.id)
    raise RuntimeError("failing after my own cancel")


def _event(job, path, ev, **extra):
    """Append one JSON line about ``job`` to ``path`` (one write per line, so lines never interleave)."""
    if not path:
        return
    record = {"ev": ev, "id": job.id, "queue": job.queue, "attempt": job.attempts, "pid": os.getpid(),
              "t": time.monotonic(), "wall": time.time(), **extra}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def controlled(job):
    """A handler the worker tests steer through the payload (run in a child process).

    Payload keys (all optional): ``events`` (path: JSON lines ``start``/``end``/``lost``
    are appended), ``gate`` (path: wait until that file exists, up to
    ``gate_timeout_s``), ``sleep_ms`` (plain sleep, lease or not), ``until_lost``
    (wait until the worker says the lease is gone, record why, then return),
    ``done`` (insert a ``Done`` row: a second run of the job fails loudly),
    ``touch_db`` (query the database first, so the thread holds a connection),
    ``fail`` (raise), ``result`` (return value).
    """
    p = job.payload or {}
    events = p.get("events")
    _event(job, events, "start", current=current_job() is job, deadline=job.deadline)
    if p.get("touch_db"):
        Done.objects.exists()  # open this thread's database connection before waiting
        _event(job, events, "touched")
    if p.get("gate"):
        give_up = time.monotonic() + p.get("gate_timeout_s", 60)
        while not os.path.exists(p["gate"]) and time.monotonic() < give_up:
            if p.get("gate_checks") and job.lease_lost:
                _event(job, events, "lost", reason=job.lost_reason, timed_out=job.timed_out)
                return {"gave_up": True}
            time.sleep(0.01)
    if p.get("sleep_ms"):
        time.sleep(p["sleep_ms"] / 1000)
    if p.get("until_lost"):
        give_up = time.monotonic() + p.get("lost_timeout_s", 60)
        while not job.lease_lost and time.monotonic() < give_up:
            time.sleep(0.005)
        try:
            job.check()
            raised = None
        except LeaseLost as exc:
            raised = exc.reason
        _event(job, events, "lost", reason=job.lost_reason, timed_out=job.timed_out, raised=raised)
        return {"lost": job.lease_lost}
    if p.get("done"):
        Done.objects.create(job_id=job.id, pid=os.getpid())
    if p.get("fail"):
        _event(job, events, "end", failed=True)
        raise RuntimeError(f"asked to fail on attempt {job.attempts}")
    _event(job, events, "end", deadline=job.deadline, lost=job.lease_lost)
    return p.get("result", {"ok": True, "attempt": job.attempts})


for _queue in ("t.ctl", "t.ctl.a", "t.ctl.b"):
    handler(_queue)(controlled)


@handler("t.rate")
def rate_limited(job):
    """Nothing to do: the rate-limit tests read the claim instants the database recorded."""
    return None


@handler("t.noop")
def noop(job):
    """Nothing to do: the drain tests read the leases and the worker's claim lines."""
    return None


@handler("t.keyrate")
def key_rate_limited(job):
    """Nothing to do: the per-key rate-limit tests read the claim instants the database recorded."""
    return None


# --- progress reports (tests/worker/test_progress.py) ----------------------------------------

#: With this set, every progress write the worker child makes is appended to that file as a
#: JSON line ``{"t", "progress", "message", "written"}`` (``t``: monotonic seconds at its start).
PROGRESS_LOG_ENV = "FQ_TEST_PROGRESS_LOG"

if os.environ.get(PROGRESS_LOG_ENV):
    from django_fq.storage.base import Store
    from django_fq.storage.mysql import MysqlStore

    def _counting(write_progress):
        def counted_write_progress(self, conn, **kwargs):
            started = time.monotonic()
            written = write_progress(self, conn, **kwargs)
            line = {"t": started, "progress": kwargs["progress"], "message": kwargs["message"], "written": written}
            with open(os.environ[PROGRESS_LOG_ENV], "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
            return written

        return counted_write_progress

    # Every class that writes progress its own way (MariaDB/MySQL locks the lease first).
    for _cls in (Store, MysqlStore):
        _cls.write_progress = _counting(_cls.__dict__["write_progress"])  # type: ignore[method-assign]


@handler("t.progress")
def report_progress(job):
    """Report progress ``per_s`` times a second for ``report_s`` seconds, then keep quiet for ``quiet_s``.

    Records ``reported`` (the count and the last report, with its monotonic
    time) in the ``events`` file before the quiet part, and ``end`` after.
    ``until_lost``: after the reports, wait (reporting on) until the worker
    says the lease is gone, for the tests of a run that lost its lease.
    """
    p = job.payload or {}
    events = p.get("events")
    _event(job, events, "start")
    n = 0
    give_up = time.monotonic() + p.get("report_s", 0)
    value = 0.0
    while time.monotonic() < give_up or n == 0:
        n += 1
        value = min(100.0, n / 10)
        job.progress(value, f"step {n}")
        time.sleep(1 / p.get("per_s", 50))
    _event(job, events, "reported", n=n, last=value, message=f"step {n}")
    if p.get("until_lost"):
        lost_by = time.monotonic() + p.get("lost_timeout_s", 60)
        while not job.lease_lost and time.monotonic() < lost_by:
            n += 1
            job.progress(min(100.0, n / 10), f"step {n}")
            time.sleep(0.01)
        # Still reporting after the loss: none of these may reach the database.
        for _ in range(p.get("after_lost", 0)):
            n += 1
            job.progress(min(100.0, n / 10), f"after loss {n}")
            time.sleep(0.01)
        _event(job, events, "lost", reason=job.lost_reason, n=n)
        return {"lost": True}
    time.sleep(p.get("quiet_s", 0))
    _event(job, events, "end", n=n)
    return {"reports": n}


# --- async def handlers (django_fq.worker.aio) ---------------------------------------------------

#: Per barrier name: the jobs that reached it, and the event set once ``n`` did (one event loop per process).
_barriers: dict[str, tuple[list, asyncio.Event]] = {}


def _open_transaction_and_write(job_id: str) -> None:
    """Enter ``atomic()`` and write, never leaving the block (a bug the worker must catch)."""
    transaction.atomic().__enter__()
    Done.objects.create(job_id=job_id, pid=os.getpid())


async def acontrolled(job):
    """The ``async def`` twin of :func:`controlled`, run on the worker's event loop.

    Payload keys (all optional): ``events`` (path, as for ``controlled``), ``barrier`` and
    ``n`` (wait, up to ``barrier_timeout_s``, until ``n`` jobs of that barrier are all
    running in this process; fail otherwise), ``gate`` (await until that file exists),
    ``block_gate`` (block the loop with ``time.sleep`` until that file exists), ``swallow_cancel``
    (catch every ``CancelledError`` and await on for ever),
    ``sleep_s`` (``await job.asleep``), ``until_cancelled`` (``asyncio.sleep`` until the
    worker cancels the task; record it), ``until_lost`` (the same with ``job.asleep``,
    which may also end with ``LeaseLost``: record which), ``orm`` (write a ``Done`` row and read it back
    with the async ORM), ``leave_transaction``, ``value_error_first`` (raise ``ValueError``
    on attempt 1), ``fail``, ``permanent``, ``result``.
    """
    p = job.payload or {}
    events = p.get("events")
    _event(job, events, "start", current=current_job() is job, thread=threading.current_thread().name)
    if p.get("barrier"):
        arrived, everyone = _barriers.setdefault(p["barrier"], ([], asyncio.Event()))
        arrived.append(job.id)
        if len(arrived) >= p["n"]:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), p.get("barrier_timeout_s", 30))
        _event(job, events, "all_running", threads=threading.active_count(), arrived=len(arrived))
    if p.get("gate"):
        while not os.path.exists(p["gate"]):
            await asyncio.sleep(0.01)
    if p.get("block_gate"):
        # A handler that blocks the loop (time.sleep, not await) until that file exists.
        while not os.path.exists(p["block_gate"]):
            time.sleep(0.01)
        _event(job, events, "unblocked", lost=job.lease_lost, reason=job.lost_reason)
    if p.get("swallow_cancel"):
        # A handler that swallows the worker's cancel and awaits on for ever.
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                _event(job, events, "swallowed", reason=job.lost_reason)
    if p.get("sleep_s"):
        await job.asleep(p["sleep_s"])
    if p.get("until_cancelled"):
        try:
            await asyncio.sleep(3600)  # not job.asleep: only the worker's cancel ends it
        except asyncio.CancelledError:
            _event(job, events, "cancelled", reason=job.lost_reason, timed_out=job.timed_out)
            raise
    if p.get("until_lost"):
        try:
            while True:
                await job.asleep(60)
        except asyncio.CancelledError:
            _event(job, events, "cancelled", reason=job.lost_reason, timed_out=job.timed_out)
            raise
        except LeaseLost as exc:
            _event(job, events, "lost", reason=exc.reason, timed_out=job.timed_out)
            raise
    if p.get("orm"):
        await Done.objects.acreate(job_id=job.id, pid=os.getpid())
        row = await Done.objects.aget(job_id=job.id)
        seen = await sync_to_async(lambda: current_job() is job)()
        _event(job, events, "orm", pid=row.pid, current_in_orm_thread=seen)
    if p.get("leave_transaction"):
        await sync_to_async(_open_transaction_and_write)(job.id)
    if p.get("value_error_first") and job.attempts == 1:
        raise ValueError("first attempt fails")
    if p.get("permanent"):
        raise PermanentFailure("asked to fail for good")
    if p.get("fail"):
        _event(job, events, "end", failed=True)
        raise RuntimeError(f"async handler asked to fail on attempt {job.attempts}")
    _event(job, events, "end", lost=job.lease_lost)
    return p.get("result", {"ok": True, "attempt": job.attempts, "async": True})


for _queue in ("t.actl", "t.actl.b"):
    handler(_queue)(acontrolled)
from . import fq_handlers_batch  # noqa: E402, F401, I001 - the batch handlers (docs/how-to/batch-handlers.md)
from . import fq_handlers_procpool  # noqa: E402, F401 - the --pool processes tests


# --- per-key concurrency (tests/worker/test_keys.py) ------------------------------------------


@handler("t.keys")
def keyed(job):
    """Sleep ``payload["sleep_ms"]``, then append a ``run`` line with the run's start and end by the database clock.

    ``payload["key"]`` is the job's concurrency key, repeated so the line names it.
    """
    from django_fq import db

    p = job.payload or {}
    start = db.db_now_ms()
    time.sleep(p.get("sleep_ms", 0) / 1000)
    end = db.db_now_ms()
    _event(job, p.get("events"), "run", key=p.get("key"), start=start, end=end)
    return {"ok": True}
