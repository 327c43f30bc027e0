"""ORM models: queues, jobs, leases, idempotency tokens and counter deltas.

The ORM is the source of truth for the schema and migrations; the hot paths in
:mod:`django_fq.services` also issue hand-written SQL against these tables.

Design notes (see ``docs/explanation/design.md``):

* Every instant is a ``BigIntegerField`` of **epoch milliseconds** computed by
  the database clock, so comparisons are exact integer comparisons on every
  backend and the deadline a claim returns is exactly the one enforced.
* A job's *stored* state is one of ``queued``/``running``/``succeeded``/
  ``dead``/``cancelled``; ``scheduled`` vs ``ready`` is derived from ``run_at``.
* ``Job.seq`` (auto-increment) is the internal key and the FIFO order; the
  public id is ``Job.uid``, 32 hex characters of a random 128-bit value.
* Counters are never a hot row: they are spread over :class:`QueueCounter`
  shards that writers pick without waiting for each other.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from . import validation


class Stored(models.TextChoices):
    """Stored job states (``queued`` covers the reported ``scheduled`` and ``ready``)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


ACTIVE = (Stored.QUEUED, Stored.RUNNING)


class CounterFields(models.Model):
    """Abstract base: one column per total (``types.TOTAL_NAMES``) and timing sum (``types.TIMING_NAMES``)."""

    enqueued = models.BigIntegerField(default=0, db_default=0)
    deduplicated = models.BigIntegerField(default=0, db_default=0)
    claimed = models.BigIntegerField(default=0, db_default=0)
    acked = models.BigIntegerField(default=0, db_default=0)
    nacked = models.BigIntegerField(default=0, db_default=0)
    released = models.BigIntegerField(default=0, db_default=0)
    expired = models.BigIntegerField(default=0, db_default=0)
    timed_out = models.BigIntegerField(default=0, db_default=0)
    retried = models.BigIntegerField(default=0, db_default=0)
    cancelled = models.BigIntegerField(default=0, db_default=0)
    dead = models.BigIntegerField(default=0, db_default=0)
    wait_ms_sum = models.BigIntegerField(default=0, db_default=0)
    wait_count = models.BigIntegerField(default=0, db_default=0)
    run_ms_sum = models.BigIntegerField(default=0, db_default=0)
    run_count = models.BigIntegerField(default=0, db_default=0)
    # Not reported as totals: running sums that make the queue-full checks
    # O(1) instead of a count over up to a million rows.
    active = models.BigIntegerField(default=0, db_default=0, help_text="scheduled + ready + running jobs")
    token_rows = models.BigIntegerField(default=0, db_default=0, help_text="idempotency token rows")

    class Meta:
        abstract = True


class Queue(models.Model):
    """A named queue and its policy (docs/reference/semantics.md §2). Its counters live in :class:`QueueCounter` rows."""

    name = models.CharField(max_length=200, unique=True)
    concurrency = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=25)
    backoff_ms = models.BigIntegerField(default=1000)
    max_backoff_ms = models.BigIntegerField(default=3_600_000)
    visibility_ms = models.BigIntegerField(default=30_000)
    idempotency_retention_ms = models.BigIntegerField(default=300_000)
    timeout_ms = models.BigIntegerField(default=0, db_default=0)
    created_at = models.BigIntegerField(help_text="epoch ms, database clock")

    class Meta:
        db_table = "django_fq_queue"
        ordering = ["name"]
        # Capabilities of the REST API and the admin, besides the model permissions.
        permissions = [
            ("produce", "Can enqueue jobs"),
            ("consume", "Can claim and settle jobs"),
            ("manage", "Can inspect and repair queues and jobs"),
        ]

    def __str__(self) -> str:
        return self.name


class Job(models.Model):
    """One unit of work. ``payload`` and ``result`` hold compact JSON text."""

    seq = models.BigAutoField(primary_key=True)
    # Unique through Meta.constraints, not ``unique=True``: on PostgreSQL that
    # would add a second, pattern-ops index that every insert pays for.
    uid = models.CharField("id", max_length=32)
    # No database-level foreign key: its check runs once per inserted row, which
    # costs bulk enqueues a third of their time. The queue row is held with
    # FOR KEY SHARE by every enqueue instead, and delete_queue takes it FOR
    # UPDATE before deleting the jobs, so no job outlives its queue.
    queue = models.ForeignKey(
        Queue, on_delete=models.CASCADE, related_name="jobs", db_index=False, db_constraint=False
    )
    state = models.CharField(max_length=10, choices=Stored.choices, default=Stored.QUEUED)
    priority = models.IntegerField(default=0)
    run_at = models.BigIntegerField()
    enqueued_at = models.BigIntegerField()
    changed_at = models.BigIntegerField(help_text="epoch ms of the last state transition")
    claimed_at = models.BigIntegerField(null=True, blank=True)
    finished_at = models.BigIntegerField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField()
    generation = models.BigIntegerField(default=0, help_text="number of leases ever granted")
    timeout_ms = models.BigIntegerField(default=0, db_default=0)
    payload = models.TextField()
    payload_size = models.IntegerField()
    result = models.TextField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    errors = models.JSONField(default=list, blank=True)
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    idempotency = models.CharField(max_length=255, null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    # The last settle (ack/nack/release/cancel/expire) of a lease, so that a
    # repeat of the same call is answered as a replay (docs/reference/semantics.md §9).
    settled_hash = models.CharField(max_length=64, null=True, blank=True)
    settled_op = models.CharField(max_length=10, null=True, blank=True)
    settled_args = models.CharField(max_length=32, null=True, blank=True)
    settled_outcome = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "django_fq_job"
        indexes = [
            # The claim path: eligible jobs of a queue in claim order.
            models.Index(
                fields=["queue", "-priority", "seq"],
                name="fq_job_claim",
                condition=Q(state="queued"),
            ),
            # Listings of finished jobs (newest first) and prune.
            models.Index(fields=["queue", "state", "changed_at"], name="fq_job_state_changed"),
            models.Index(
                fields=["finished_at"],
                name="fq_job_finished",
                condition=Q(state__in=["succeeded", "cancelled"]),
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["uid"], name="fq_job_uid"),
            models.UniqueConstraint(
                fields=["queue", "unique_key"],
                name="fq_job_active_unique_key",
                condition=Q(state__in=["queued", "running"]) & Q(unique_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.uid

    @property
    def payload_value(self):
        """The payload decoded from its stored JSON text (a stand-in when it nests too deep to show)."""
        return validation.stored_json(self.payload, "payload")

    @property
    def result_value(self):
        """The result decoded from its stored JSON text (``None`` if unset; a stand-in when too deep)."""
        return validation.stored_json(self.result, "result")


class Lease(models.Model):
    """A live claim on a job. Exists exactly while the job is ``running``.

    ``receipt_hash`` is the SHA-256 of the receipt's secret; the receipt itself
    is never stored. ``deadline`` is exclusive: the lease is valid strictly
    before it. ``timeout_at`` caps every extension when the job has a timeout.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="lease")
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="leases", db_index=False)
    generation = models.BigIntegerField()
    receipt_hash = models.CharField(max_length=64)
    claimed_at = models.BigIntegerField()
    deadline = models.BigIntegerField()
    timeout_at = models.BigIntegerField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        db_table = "django_fq_lease"
        indexes = [
            models.Index(fields=["queue", "deadline"], name="fq_lease_queue_deadline"),
            models.Index(fields=["deadline"], name="fq_lease_deadline"),
        ]

    def __str__(self) -> str:
        return f"lease {self.generation} of job {self.job_id}"


class IdempotencyToken(models.Model):
    """An idempotency token: deduplicates enqueues into a queue until ``expires_at``.

    ``job_uid`` is not a foreign key: the token outlives its job (docs/reference/semantics.md §9).
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="tokens", db_index=False)
    token = models.CharField(max_length=255)
    job_uid = models.CharField(max_length=32)
    created_at = models.BigIntegerField()
    expires_at = models.BigIntegerField()

    class Meta:
        db_table = "django_fq_token"
        constraints = [models.UniqueConstraint(fields=["queue", "token"], name="fq_token_unique")]
        indexes = [models.Index(fields=["expires_at"], name="fq_token_expires")]

    def __str__(self) -> str:
        return self.token


class QueueCounter(CounterFields):
    """One shard of a queue's counters; a queue's value is the sum over its shards.

    Every operation adds to one shard it can lock without waiting (PostgreSQL
    ``SKIP LOCKED``) and inserts a new shard when all are busy, so counters never
    serialize the queue, not even behind a caller's long transaction. The
    reaper merges shards back (:func:`services.maintenance.compact_counters`).
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+")

    class Meta:
        db_table = "django_fq_counter"

    def __str__(self) -> str:
        return f"counter shard {self.pk} of queue {self.queue_id}"
