"""Handlers the worker tests run (found by ``handlers.autodiscover()``).

Queue names start with ``t.`` so they never collide with an application's.
Every handler records what it did in the database, because the worker runs
them in a child process.
"""

import os
import time

from django_fq import services
from django_fq.exceptions import PermanentFailure
from django_fq.handlers import handler

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
