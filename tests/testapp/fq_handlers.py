"""Handlers the worker tests run (found by ``handlers.autodiscover()``).

Queue names start with ``t.`` so they never collide with an application's.
Every handler records what it did in the database, because the worker runs
them in a child process.
"""

import json
import os
import time

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
