"""Batch handlers the worker tests run (imported by ``tests.testapp.fq_handlers``; docs/how-to/batch-handlers.md).

Each call appends one ``batch`` record (ids, attempts, pid) to the JSON-lines
file named by the jobs' ``events`` payload field, and writes a ``Done`` row for
every job it acks, so a test in another process sees what ran.
"""

import json
import os
import time

from django_fq import BatchResult
from django_fq.handlers import handler

from .models import Done


def _record(jobs, ev: str, **extra) -> None:
    path = next((job.payload.get("events") for job in jobs if isinstance(job.payload, dict)), None)
    if not path:
        return
    record = {"ev": ev, "ids": jobs.ids, "attempts": [job.attempts for job in jobs], "pid": os.getpid(), **extra}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _wait_for_gate(jobs) -> None:
    gate = next((job.payload.get("gate") for job in jobs if job.payload.get("gate")), None)
    if gate:
        give_up = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < give_up:
            time.sleep(0.01)


@handler("t.batch", batch=50)
def batch_record(jobs):
    """Ack each job with ``{"n": ...}``; fail those whose ``fail_until`` is above their attempt; kill ``dead`` ones."""
    _record(jobs, "start")
    _wait_for_gate(jobs)
    result = BatchResult()
    acked = []
    for job in jobs:
        if job.payload.get("dead"):
            result.dead(job, "this item can never be processed")
        elif job.attempts < job.payload.get("fail_until", 0):
            result.fail(job, f"item {job.payload.get('n')} failed on attempt {job.attempts}")
        else:
            result.ack(job, {"n": job.payload.get("n"), "attempt": job.attempts})
            if not job.lease_lost:
                acked.append(Done(job_id=job.id, pid=os.getpid()))
    Done.objects.bulk_create(acked)
    _record(jobs, "batch", lost=[job.id for job in jobs.lost()])
    return result


@handler("t.batch.raise", batch=10)
def batch_raise(jobs):
    """Raise: every job of the batch fails its attempt."""
    _record(jobs, "batch")
    raise RuntimeError(f"the whole batch of {len(jobs)} failed")
