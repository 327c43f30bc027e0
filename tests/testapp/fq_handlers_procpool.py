"""Handlers of the ``fq_worker --pool processes`` tests (imported by ``fq_handlers``).

They run in a child process of the worker, so everything they do is written
down: JSON lines in ``payload["events"]`` (with the child's pid) and rows.
"""

import json
import os
import select
import signal
import time

from django_fq.exceptions import PermanentFailure, RetryAfter, Snooze, SoftTimeout
from django_fq.handlers import handler
from django_fq.worker import current_job

from .models import Done


def _event(job, path, ev, **extra):
    if not path:
        return
    record = {
        "ev": ev,
        "id": job.id,
        "attempt": job.attempts,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "t": time.monotonic(),
        **extra,
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _block(how):
    """Block for an hour in a way a thread could never be stopped from."""
    if how == "select":
        select.select([], [], [], 3600)
    elif how == "pause":
        signal.pause()
    else:
        time.sleep(3600)


@handler("t.proc")
def proc_controlled(job):
    """Steered by the payload: ``events`` (path), ``block`` (sleep/select/pause: stuck for an hour),
    ``on_soft`` (what to do on SoftTimeout: ``block`` again, ``raise`` it, ``return``), ``crash``
    (``exit``: os._exit(9), ``segv``: SIGSEGV to itself), ``gate`` (wait for that file), ``sleep_ms``,
    ``fail``, ``perm``, ``done`` (a ``Done`` row), ``result``, ``inspect`` (return what the job shows)."""
    p = job.payload or {}
    events = p.get("events")
    _event(job, events, "start", current=current_job() is job, ids=[job.id, job.queue, job.attempts, job.max_attempts])
    if p.get("crash") == "exit":
        os._exit(9)
    if p.get("crash") == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if p.get("gate"):
        give_up = time.monotonic() + 60
        while not os.path.exists(p["gate"]) and time.monotonic() < give_up:
            time.sleep(0.01)
    if p.get("sleep_ms"):
        time.sleep(p["sleep_ms"] / 1000)
    if p.get("block"):
        try:
            _block(p["block"])
        except SoftTimeout as exc:
            _event(job, events, "soft", remaining_ms=exc.remaining_ms, message=str(exc))
            if p.get("on_soft") == "raise":
                raise
            if p.get("on_soft") == "return":
                return {"stopped": "soft"}
            _block(p["block"])  # ignore it: the kill comes at the timeout
    if p.get("done"):
        Done.objects.create(job_id=job.id, pid=os.getpid())
    if p.get("fail"):
        raise RuntimeError(f"asked to fail on attempt {job.attempts}")
    if p.get("perm"):
        raise PermanentFailure("this job can never succeed")
    if p.get("inspect"):
        return {
            "attrs": sorted(a for a in dir(job) if not a.startswith("__")),
            "values": [str(getattr(job, a, "")) for a in dir(job) if not a.startswith("__")],
            "deadline": job.deadline,
            "enqueued_at": job.enqueued_at,
            "claimed_at": job.claimed_at,
            "lease_lost": job.lease_lost,
        }
    _event(job, events, "end")
    return p.get("result", {"ok": True, "attempt": job.attempts, "pid": os.getpid()})


# --- a Snooze or RetryAfter whose delay_ms escaped its check (tests/worker/test_bad_delay.py) ------


class _UncheckedSnooze(Snooze):
    def __init__(self):  # no super().__init__: no delay_ms at all
        Exception.__init__(self, "snoozed without a delay")


class _UncheckedRetryAfter(RetryAfter):
    def __init__(self):
        Exception.__init__(self, "retry without a delay")


#: ``payload["bad"]``: ``"<snooze|retry>:<missing|negative|text|huge|float>"``.
_BAD_DELAYS = {"negative": -1, "text": "soon", "huge": 10**30, "float": 1.5}


@handler("t.baddelay")
def bad_delay(job):
    """Raise a Snooze or RetryAfter whose ``delay_ms`` is missing or was changed after its check."""
    kind, how = job.payload["bad"].split(":")
    if how == "missing":
        raise _UncheckedSnooze() if kind == "snooze" else _UncheckedRetryAfter()
    exc = Snooze(10) if kind == "snooze" else RetryAfter(10)
    exc.delay_ms = _BAD_DELAYS[how]
    raise exc


# --- a handler that forks without exec (tests/worker/test_procpool_fork.py) ----------------------


@handler("t.fork")
def forks(job):
    """Fork; the copy returns at once, the original waits for it to end, then returns its own result.

    ``payload["events"]``: a ``start`` line per run (with the pid).
    """
    p = job.payload or {}
    _event(job, p.get("events"), "start")
    if not p.get("fork"):
        return {"from": "plain", "n": p.get("n")}
    pid = os.fork()
    if pid == 0:
        return {"from": "fork"}
    os.waitpid(pid, 0)
    return {"from": "child"}
