"""The public Python API: one function per operation (docs/reference/semantics.md §2–6, §9).

Every verb takes the queue name first; options are keyword-only; times are
epoch milliseconds (database clock) and durations milliseconds. Errors are
subclasses of :class:`django_fq.exceptions.FqError`.

Usage::

    from django_fq import services as fq

    fq.configure("emails", max_attempts=5)
    job = fq.enqueue("emails", {"to": "a@example.com"}, idempotency="welcome-42")
    for claimed in fq.claim("emails", count=10, visibility_ms=60_000):
        ...
        fq.ack("emails", claimed.receipt, result={"sent": True})
"""

from .enqueue import enqueue, enqueue_many
from .jobs import cancel, get, jobs, requeue, retry, stats, wait
from .leases import ack, ack_many, claim, extend, nack, release, report_progress
from .maintenance import fold_counters, prune, reap
from .queues import configure, delete_queue, pause, policy, queues, resume
from .upstream import results
from .workers import prune_workers, workers

__all__ = [
    "ack",
    "ack_many",
    "cancel",
    "claim",
    "configure",
    "delete_queue",
    "enqueue",
    "enqueue_many",
    "extend",
    "fold_counters",
    "get",
    "jobs",
    "nack",
    "pause",
    "policy",
    "prune",
    "prune_workers",
    "queues",
    "reap",
    "release",
    "report_progress",
    "requeue",
    "results",
    "resume",
    "retry",
    "stats",
    "wait",
    "workers",
]
