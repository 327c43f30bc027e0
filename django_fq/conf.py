"""Settings of django-fq, read live from ``django.conf.settings``.

Every setting is optional. Values are read on each access (so tests can use
``override_settings``) and validated by the system checks in
:mod:`django_fq.checks`, never at import time.

=============================  ==================  ==========================================
setting                        default             meaning
=============================  ==================  ==========================================
``FQ_DATABASE``                ``"default"``       database alias that holds the queue tables
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
``FQ_TEST_CLOCK_OFFSET_MS``    0                   tests only: shifts the database clock
                                                   *inside the SQL expression*
``FQ_INLINE``                  ``False``           tests only: ``True`` (or a list of queue
                                                   names) runs each enqueued job at once,
                                                   after its transaction commits
                                                   (docs/how-to/testing.md)
=============================  ==================  ==========================================
"""

from __future__ import annotations

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
    "FQ_QUEUE_TTL_MS": 0,
    "FQ_TEST_CLOCK_OFFSET_MS": 0,
    "FQ_SYNCHRONOUS_SETTLE": False,
    "FQ_MAX_METADATA_BYTES": 4096,
    "FQ_HANDLER_MIDDLEWARE": [],
    "FQ_ENQUEUE_MIDDLEWARE": [],
    "FQ_INLINE": False,
}


def get(name: str):
    """Return the current value of setting ``name`` (an ``FQ_*`` key of :data:`DEFAULTS`)."""
    return getattr(settings, name, DEFAULTS[name])


def database() -> str:
    """The database alias holding django-fq's tables (``FQ_DATABASE``)."""
    return get("FQ_DATABASE")


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
