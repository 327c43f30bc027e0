"""Settings of django-fq, read live from ``django.conf.settings``.

Every setting is optional. Values are read on each access (so tests can use
``override_settings``) and validated by the system checks in
:mod:`django_fq.checks`, never at import time.

=============================  ==================  ==========================================
setting                        default             meaning
=============================  ==================  ==========================================
``FQ_DATABASE``                ``"default"``       database alias that holds the queue tables
``FQ_QUEUE_DATABASES``         ``{}``              ``{pattern: alias}`` (or ``[(pattern, alias)]``):
                                                   queues on other databases, first match wins
                                                   (django_fq.routing)
``FQ_MAX_PAYLOAD_BYTES``       1 MiB (1048576)     largest payload / result, in bytes of
                                                   compact UTF-8 JSON; at most 32 MiB
``FQ_PAYLOAD_OFFLOAD_BYTES``   8 KiB (8192)        payloads larger than this are kept in a side
                                                   table, out of the job row; 0: never
``FQ_MAX_JOBS_PER_QUEUE``      1,000,000           scheduled + ready + running jobs per queue
``FQ_MAX_TOKENS_PER_QUEUE``    1,000,000           idempotency token rows per queue (expired
                                                   rows count until pruned)
``FQ_MAX_QUEUES``              10,000              queues the database may hold; creating one
                                                   more fails with ``too_many_queues``
``FQ_FINISHED_RETENTION_MS``   7 days              succeeded/cancelled jobs are pruned after this
``FQ_HISTORY_RETENTION_MS``    8 days              per-minute history rows are pruned after this
                                                   (docs/reference/history.md)
``FQ_QUEUE_TTL_MS``            0                   the ``ttl_ms`` a queue gets when it is created
                                                   (0: none; docs/reference/semantics.md §9)
``FQ_HANDLERS``                ``{}``              ``{queue: "dotted.path"}`` handlers, besides
                                                   ``@handler`` in ``fq_handlers`` modules
                                                   (or ``{"handler": path, "middleware": [...]}``)
``FQ_HANDLER_MIDDLEWARE``      ``[]``              dotted paths of handler middleware, outermost
                                                   first (docs/how-to/middleware.md)
``FQ_ENQUEUE_MIDDLEWARE``      ``[]``              dotted paths of enqueue middleware, outermost
                                                   first
``FQ_MAX_METADATA_BYTES``      4096                largest job metadata, in bytes of compact
                                                   UTF-8 JSON; at most 64 KiB
``FQ_SCHEDULE``                ``{}``              cron entries, see ``docs/periodic.md``
``FQ_TASK_MODULES``            ``[]``              modules outside the installed apps that may
                                                   hold Django Tasks (``django_fq.tasks.paths``)
``FQ_SYNCHRONOUS_SETTLE``      ``False``           PostgreSQL: when False, claim/ack/nack/
                                                   extend/release that django-fq commits
                                                   itself do not wait for the WAL flush
                                                   (``synchronous_commit = off``); see
                                                   docs/concepts.md "Durability"
``FQ_TRACING``                 ``False``           ``True``: OpenTelemetry spans of enqueues
                                                   and worker runs (django_fq.tracing)
``FQ_TRACING_PARENT``          ``"child"``         a run's span: child of the enqueuing span,
                                                   or ``"link"``: a new trace linked to it
``FQ_WORKER_HEARTBEAT_MS``     10,000 (10 s)       how often a worker moves the heartbeat of its
                                                   row in the worker registry (one ``UPDATE``);
                                                   gone after 3 missed beats; 0: no registry row
                                                   (docs/admin.md "Workers")
``FQ_TEST_CLOCK_OFFSET_MS``    0                   tests only: shifts the database clock
                                                   *inside the SQL expression*
``FQ_INLINE``                  ``False``           tests only: ``True`` (or a list of queue
                                                   names) runs each enqueued job at once,
                                                   after its transaction commits
                                                   (docs/how-to/testing.md)
=============================  ==================  ==========================================
"""

from __future__ import annotations

from contextvars import ContextVar

from django.conf import settings

MIB = 1024 * 1024
#: Hard cap on any payload or result, docs/reference/semantics.md §3 (32 MiB).
HARD_PAYLOAD_CAP_BYTES = 32 * MIB
#: Hard cap on a job's metadata (``FQ_MAX_METADATA_BYTES`` cannot pass it), 64 KiB.
HARD_METADATA_CAP_BYTES = 65536
#: Cap on the summed payload sizes returned by one claim, docs/reference/semantics.md §5 (32 MiB).
CLAIM_PAYLOAD_CAP_BYTES = 32 * MIB

DEFAULTS = {
    "FQ_DATABASE": "default",
    "FQ_MAX_PAYLOAD_BYTES": 1 * MIB,
    "FQ_PAYLOAD_OFFLOAD_BYTES": 8192,
    "FQ_MAX_JOBS_PER_QUEUE": 1_000_000,
    "FQ_MAX_TOKENS_PER_QUEUE": 1_000_000,
    "FQ_MAX_QUEUES": 10_000,
    "FQ_FINISHED_RETENTION_MS": 7 * 24 * 3600 * 1000,
    "FQ_HISTORY_RETENTION_MS": 8 * 24 * 3600 * 1000,
    "FQ_QUEUE_TTL_MS": 0,
    "FQ_TEST_CLOCK_OFFSET_MS": 0,
    "FQ_SYNCHRONOUS_SETTLE": False,
    "FQ_MAX_METADATA_BYTES": 4096,
    "FQ_HANDLER_MIDDLEWARE": [],
    "FQ_ENQUEUE_MIDDLEWARE": [],
    "FQ_INLINE": False,
    "FQ_WORKER_HEARTBEAT_MS": 10_000,
}


def get(name: str):
    """Return the current value of setting ``name`` (an ``FQ_*`` key of :data:`DEFAULTS`)."""
    return getattr(settings, name, DEFAULTS[name])


#: The alias of the operation running in this thread or task, set by :func:`django_fq.routing.using`
#: (each verb of a queue sets its queue's alias when ``FQ_QUEUE_DATABASES`` routes queues); ``None``: none.
current_alias: ContextVar[str | None] = ContextVar("django_fq_alias", default=None)


def database() -> str:
    """The database alias django-fq works on now: the current operation's (see :mod:`django_fq.routing`), else ``FQ_DATABASE``."""
    alias = current_alias.get()
    return alias if alias is not None else get("FQ_DATABASE")


def max_payload_bytes() -> int:
    """Largest accepted payload/result in bytes, never above the 32 MiB hard cap."""
    return min(int(get("FQ_MAX_PAYLOAD_BYTES")), HARD_PAYLOAD_CAP_BYTES)


def payload_offload_bytes() -> int:
    """Payloads larger than this many bytes (compact UTF-8 JSON) are offloaded; 0 or less: none are.

    ``FQ_PAYLOAD_OFFLOAD_BYTES``, default 8,192: why that number is in
    docs/explanation/storage.md#large-payloads.
    """
    value = int(get("FQ_PAYLOAD_OFFLOAD_BYTES"))
    return value if value > 0 else HARD_PAYLOAD_CAP_BYTES


def max_metadata_bytes() -> int:
    """Largest accepted job metadata in bytes (``FQ_MAX_METADATA_BYTES``), never above the 64 KiB hard cap."""
    return min(int(get("FQ_MAX_METADATA_BYTES")), HARD_METADATA_CAP_BYTES)


def clock_offset_ms() -> int:
    """Test-only shift of the database clock in milliseconds (``FQ_TEST_CLOCK_OFFSET_MS``)."""
    return int(get("FQ_TEST_CLOCK_OFFSET_MS"))


def queue_ttl_ms() -> int:
    """The time to live (ms) given to each queue when it is created (``FQ_QUEUE_TTL_MS``, default 0: none)."""
    return int(get("FQ_QUEUE_TTL_MS"))


def max_queues() -> int:
    """Most queues the database may hold (``FQ_MAX_QUEUES``); creating one more raises ``TooManyQueues``."""
    return int(get("FQ_MAX_QUEUES"))


#: Bounds of ``FQ_WORKER_HEARTBEAT_MS`` when not 0 (ms): a beat more often than every 50 ms is load
#: for nothing, one rarer than an hour would leave a dead worker shown live for three hours.
WORKER_HEARTBEAT_MIN_MS, WORKER_HEARTBEAT_MAX_MS = 50, 3_600_000


def worker_heartbeat_ms() -> int:
    """How often (ms) a worker beats its registry row (``FQ_WORKER_HEARTBEAT_MS``, default 10,000; 0: no row).

    A value the system check refuses (not an integer, outside 50 ms - 1 h) is
    taken as the default here, so a worker never fails on it.
    """
    default = int(DEFAULTS["FQ_WORKER_HEARTBEAT_MS"])  # type: ignore[call-overload]
    value = get("FQ_WORKER_HEARTBEAT_MS")
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    if value == 0:
        return 0
    return value if WORKER_HEARTBEAT_MIN_MS <= value <= WORKER_HEARTBEAT_MAX_MS else default
