"""django-fq: leased background jobs on the database a Django project already has.

The verbs of :mod:`django_fq.services` are importable from here too
(``django_fq.enqueue(...)``), loaded lazily so importing the package never
touches the app registry.
"""

from .exceptions import (  # noqa: F401  (re-exported)
    BatchFailure,
    EnqueueRefused,
    FqError,
    InvalidArgument,
    InvalidReceipt,
    InvalidState,
    JobNotFound,
    PayloadTooLarge,
    PermanentFailure,
    QueueFull,
    QueueNotFound,
    ReceiptCancelled,
    ResultsTooLarge,
    RetryAfter,
    Snooze,
    TooManyQueues,
    WaitTimeout,
)

__version__ = "0.1.0"

_LAZY = {
    "Queue": ("django_fq.client", "Queue"),
    "handler": ("django_fq.handlers", "handler"),
    "EnqueueRequest": ("django_fq.middleware", "EnqueueRequest"),
    "BatchResult": ("django_fq.worker.batch", "BatchResult"),
    "JobBatch": ("django_fq.worker.batch", "JobBatch"),
}
_SERVICES = frozenset(
    {
        "ack", "ack_many", "cancel", "claim", "configure", "delete_queue", "enqueue", "enqueue_many",
        "extend", "fold_counters", "get", "jobs", "nack", "pause", "policy", "prune", "queues", "reap", "release",
        "report_progress", "requeue", "results", "resume", "retry", "stats", "wait", "workers",
    }
)


def __getattr__(name: str):
    import importlib

    if name in _SERVICES:
        return getattr(importlib.import_module("django_fq.services"), name)
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'django_fq' has no attribute {name!r}")
