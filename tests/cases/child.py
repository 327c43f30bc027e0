"""A stand-in worker process for the case tests, driven through the Python API.

Run as ``python -m tests.cases.child <command> <args…>`` with
``DJANGO_SETTINGS_MODULE=tests.cases.child_settings`` and ``FQ_CHILD_DB_NAME``
naming the parent's test database (see :mod:`tests.cases.procs`). Every
report goes to stdout as one JSON object per line, flushed at once, so the
parent can follow along. Receipts are never printed.

Commands:

``hold QUEUE VISIBILITY_MS WORKER``
    Claim one job, report it, then sleep until killed (a worker that dies
    mid-job).
``heartbeat QUEUE VISIBILITY_MS WORKER INTERVAL_MS``
    Claim whatever is eligible and keep extending every lease held, forever,
    reporting each claim and extension (a live worker that heart-beats).
``drain QUEUE COUNT VISIBILITY_MS``
    Report ``ready``, wait for ``go`` on stdin, then claim batches of up to
    COUNT jobs until none is left; the "handler" inserts the job id into
    ``testapp.Done`` (UNIQUE) and acks. Reports how many it handled.
``skewed DELAYED_QUEUE READY_QUEUE VISIBILITY_MS``
    Meant to run with ``FQ_CHILD_SKEW_MS`` set: reports its own (shifted)
    clock, enqueues a job delayed 5 minutes into DELAYED_QUEUE, tries to
    claim it, then claims one ready job of READY_QUEUE, bracketing that claim
    with database clock readings.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _skew_clock(skew_ms: int) -> None:
    """Shift this process's wall clock by ``skew_ms``: ``time.time``/``time_ns`` and ``datetime.now``.

    Must run before Django is imported, so modules that bind ``datetime`` at
    import time (``django.utils.timezone`` among them) pick up the shifted class.
    """
    import datetime as dt_module

    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + skew_ms / 1000
    time.time_ns = lambda: real_time_ns() + skew_ms * 1_000_000

    real_datetime = dt_module.datetime
    shift = dt_module.timedelta(milliseconds=skew_ms)

    class _Meta(type):
        # Values built elsewhere (e.g. by a database driver) are plain
        # datetimes; they must still pass isinstance checks against the patch.
        def __instancecheck__(cls, obj):
            return isinstance(obj, real_datetime)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real_datetime)

    class ShiftedDatetime(real_datetime, metaclass=_Meta):
        @classmethod
        def now(cls, tz=None):
            return real_datetime.now(tz) + shift

        @classmethod
        def utcnow(cls):
            return real_datetime.now(dt_module.UTC).replace(tzinfo=None) + shift

        @classmethod
        def today(cls):
            return cls.now()

    ShiftedDatetime.__name__ = ShiftedDatetime.__qualname__ = "datetime"
    ShiftedDatetime.__module__ = "datetime"
    dt_module.datetime = ShiftedDatetime
    # Modules imported before this point (e.g. by a sitecustomize) bound the
    # real class already; point them at the shifted one too.
    for name, module in list(sys.modules.items()):
        if name not in ("datetime", "_datetime") and getattr(module, "datetime", None) is real_datetime:
            module.datetime = ShiftedDatetime


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _job(j) -> dict:
    return {
        "id": j.id,
        "deadline": j.deadline,
        "claimed_at": j.claimed_at,
        "attempts": j.attempts,
        "max_attempts": j.max_attempts,
    }


def cmd_hold(queue: str, visibility_ms: str, worker: str) -> None:
    from django_fq import services as fq

    jobs = fq.claim(queue, count=1, visibility_ms=int(visibility_ms), worker=worker)
    emit(event="claimed", pid=os.getpid(), jobs=[_job(j) for j in jobs])
    while True:  # the parent kills us
        time.sleep(3600)


def cmd_heartbeat(queue: str, visibility_ms: str, worker: str, interval_ms: str) -> None:
    from django_fq import services as fq

    vis, pause = int(visibility_ms), int(interval_ms) / 1000
    held: dict[str, str] = {}
    while True:  # the parent kills us
        for job_id, receipt in list(held.items()):
            emit(event="extended", id=job_id, deadline=fq.extend(queue, receipt, visibility_ms=vis))
        jobs = fq.claim(queue, count=10, visibility_ms=vis, worker=worker)
        for j in jobs:
            held[j.id] = j.receipt
        if jobs:
            emit(event="claimed", pid=os.getpid(), jobs=[_job(j) for j in jobs])
        time.sleep(pause)


def cmd_drain(queue: str, count: str, visibility_ms: str) -> None:
    from django_fq import db
    from django_fq import services as fq
    from tests.testapp.models import Done

    db.db_now_ms()  # connect before reporting ready
    emit(event="ready", pid=os.getpid())
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected 'go' on stdin")
    pid, handled = os.getpid(), 0
    while True:
        jobs = fq.claim(queue, count=int(count), visibility_ms=int(visibility_ms), worker=f"drain-{pid}")
        if not jobs:
            break
        for j in jobs:
            Done.objects.create(job_id=j.id, pid=pid)  # the handler's side effect
            fq.ack(queue, j.receipt)
            handled += 1
    emit(event="done", pid=pid, handled=handled)


def cmd_skewed(delayed_queue: str, ready_queue: str, visibility_ms: str) -> None:
    import datetime as dt

    from django.utils import timezone

    from django_fq import db
    from django_fq import services as fq

    vis = int(visibility_ms)
    report = {
        "py_time_ms": int(time.time() * 1000),
        "py_datetime_ms": int(dt.datetime.now(dt.UTC).timestamp() * 1000),
        "django_now_ms": int(timezone.now().timestamp() * 1000),
    }
    report["enqueue_before"] = db.db_now_ms()
    report["delayed_id"] = fq.enqueue(delayed_queue, {"delayed": True}, delay_ms=300_000).id
    report["enqueue_after"] = db.db_now_ms()
    report["delayed_claimed"] = [j.id for j in fq.claim(delayed_queue, count=10, visibility_ms=vis)]
    report["claim_before"] = db.db_now_ms()
    jobs = fq.claim(ready_queue, count=1, visibility_ms=vis, worker="skewed")
    report["claim_after"] = db.db_now_ms()
    report["jobs"] = [_job(j) for j in jobs]
    emit(event="report", **report)


COMMANDS = {"hold": cmd_hold, "heartbeat": cmd_heartbeat, "drain": cmd_drain, "skewed": cmd_skewed}


def main(argv: list[str]) -> None:
    skew = os.environ.get("FQ_CHILD_SKEW_MS")
    if skew:
        _skew_clock(int(skew))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.cases.child_settings")
    import django

    django.setup()
    COMMANDS[argv[1]](*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
