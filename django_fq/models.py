"""ORM models: queues, jobs, leases, idempotency tokens and counter deltas.

The ORM is the source of truth for the schema and migrations; the hot paths in
:mod:`django_fq.services` also issue hand-written SQL against these tables.

Design notes (see ``docs/explanation/design.md``):

* Every instant is a ``BigIntegerField`` of **epoch milliseconds** computed by
  the database clock, so comparisons are exact integer comparisons on every
  backend and the deadline a claim returns is exactly the one enforced.
* A job's *stored* state is one of ``waiting``/``queued``/``running``/``succeeded``/
  ``dead``/``cancelled``; ``scheduled`` vs ``ready`` is derived from ``run_at``.
  ``waiting``: dependencies not yet satisfied (:class:`Dependency`); no claim reads it.
* ``Job.seq`` (auto-increment) is the internal key and the FIFO order; the
  public id is ``Job.uid``, 32 hex characters of a random 128-bit value.
* Counters are never a hot row: they are spread over :class:`QueueCounter`
  shards that writers pick without waiting for each other.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from . import validation
from .types import QueuePolicy

_DEFAULT = QueuePolicy()


class Stored(models.TextChoices):
    """Stored job states (``queued`` covers the reported ``scheduled`` and ``ready``)."""

    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Waiting for a slot of its concurrency key (docs/reference/semantics.md §9 "Per-key limits"):
    #: reported as ``scheduled``/``ready`` like ``queued``, but outside the claim index, so claims
    #: never read it. Only in a queue with ``key_concurrency`` > 0.
    HELD = "held"


ACTIVE = (Stored.WAITING, Stored.QUEUED, Stored.RUNNING, Stored.HELD)
#: Stored states that report as ``scheduled`` or ``ready`` (by ``run_at``): not ``waiting``, which
#: reports as itself (unfinished dependencies).
QUEUED_STATES = (Stored.QUEUED, Stored.HELD)


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
    # The policy's defaults are QueuePolicy's (types.py): one copy.
    concurrency = models.IntegerField(default=_DEFAULT.concurrency)
    max_attempts = models.IntegerField(default=_DEFAULT.max_attempts)
    backoff_ms = models.BigIntegerField(default=_DEFAULT.backoff_ms)
    max_backoff_ms = models.BigIntegerField(default=_DEFAULT.max_backoff_ms)
    visibility_ms = models.BigIntegerField(default=_DEFAULT.visibility_ms)
    idempotency_retention_ms = models.BigIntegerField(default=_DEFAULT.idempotency_retention_ms)
    timeout_ms = models.BigIntegerField(default=_DEFAULT.timeout_ms, db_default=_DEFAULT.timeout_ms)
    # Per-key limit (docs/reference/semantics.md §9 "Per-key limits"): running jobs per concurrency key.
    key_concurrency = models.IntegerField(default=_DEFAULT.key_concurrency, db_default=_DEFAULT.key_concurrency)
    created_at = models.BigIntegerField(help_text="epoch ms, database clock")
    # Flow control (docs/reference/semantics.md §9 "Pause"): every claim reads this flag in
    # its own SQL, so a paused queue hands out no job, on any host, once pause() returned.
    paused = models.BooleanField(default=False, db_default=False)
    paused_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms, database clock, of the pause")
    # Queue time to live (docs/reference/semantics.md §9 "Queue time to live"): an empty,
    # unpaused queue with no activity for ttl_ms is deleted by prune(); 0 = kept forever.
    ttl_ms = models.BigIntegerField(default=_DEFAULT.ttl_ms, db_default=_DEFAULT.ttl_ms)
    # The latest activity prune() or configure() has seen (epoch ms, database clock), so that
    # pruning the queue's finished jobs does not make it look idle since it was created.
    active_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms, database clock")
    # Rate limit (docs/reference/semantics.md §9 "Rate limits"): at most rate_limit claims in any
    # window of rate_window_ms, counted by the claim from the queue's RateLog; 0 = none.
    rate_limit = models.IntegerField(default=_DEFAULT.rate_limit, db_default=_DEFAULT.rate_limit)
    rate_window_ms = models.BigIntegerField(default=_DEFAULT.rate_window_ms, db_default=_DEFAULT.rate_window_ms)
    # Per-key rate limit (docs/reference/semantics.md §9 "Per-key limits"): at most key_rate_limit
    # claims of one concurrency key in any window of rate_window_ms, counted from KeyClaim; 0 = none.
    key_rate_limit = models.IntegerField(default=_DEFAULT.key_rate_limit, db_default=_DEFAULT.key_rate_limit)

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
    # At most the queue's key_concurrency jobs of one key run at once (docs/reference/semantics.md §9).
    concurrency_key = models.CharField(max_length=200, null=True, blank=True)
    idempotency = models.CharField(max_length=255, null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    # Metadata: a small JSON object set at enqueue (compact JSON text, like the
    # payload), read by handlers and middleware, shown in get/admin/REST
    # (docs/how-to/middleware.md). ``tags`` repeats its "tags" list as
    # "|a|b|" so a listing can filter by tag with a plain LIKE on every database.
    metadata = models.TextField(null=True, blank=True)
    tags = models.CharField(max_length=1100, null=True, blank=True)
    # Progress a running handler reports (a number and a short message), written
    # at most once a second per job (docs/how-to/progress.md); ``progress_at`` is
    # the database clock's epoch ms of the last write.
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=200, blank=True, default="", db_default="")
    progress_at = models.BigIntegerField(null=True, blank=True)
    # The last settle (ack/nack/release/cancel/expire) of a lease, so that a
    # repeat of the same call is answered as a replay (docs/reference/semantics.md §9).
    settled_hash = models.CharField(max_length=64, null=True, blank=True)
    settled_op = models.CharField(max_length=10, null=True, blank=True)
    settled_args = models.CharField(max_length=32, null=True, blank=True)
    settled_outcome = models.JSONField(null=True, blank=True)
    # Snoozes of this job since it was enqueued or last retried: at most MAX_SNOOZES
    # (docs/reference/semantics.md §9 "Verbs and arguments").
    snoozes = models.IntegerField(default=0, db_default=0)
    # Dependencies (docs/how-to/workflows.md): ``waiting_on`` counts the job's edges not yet
    # satisfied while it is ``waiting``; ``has_dependents`` is set once another job depends on
    # this one, so an ack of a job without dependents never looks at the edge table (and
    # PostgreSQL's one-statement ack leaves a job with dependents to the ack that releases them).
    # A member of a batch (:class:`BatchMember`) is flagged ``has_dependents`` too: its batch's
    # callback waits on it, so every path that finishes a flagged job counts it in its batch.
    waiting_on = models.IntegerField(default=0, db_default=0)
    has_dependents = models.BooleanField(default=False, db_default=False)

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
            # The jobs waiting for a slot of their key, in claim order: the next one to admit.
            models.Index(
                fields=["queue", "concurrency_key", "-priority", "seq"],
                name="fq_job_key_held",
                condition=Q(state="held"),
            ),
            # The admitted, not yet claimed jobs of a key: each holds one of its per-key rate tokens.
            models.Index(
                fields=["queue", "concurrency_key"],
                name="fq_job_key_queued",
                condition=Q(state="queued") & Q(concurrency_key__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["uid"], name="fq_job_uid"),
            models.UniqueConstraint(
                fields=["queue", "unique_key"],
                name="fq_job_active_unique_key",
                condition=Q(state__in=["waiting", "queued", "running", "held"]) & Q(unique_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.uid

    #: Django's warnings that a database drops an index's or a unique constraint's condition.
    #: Where it does (MariaDB/MySQL), migration 0003 builds what the conditions stand for: a
    #: generated active-key column under a unique index, and plain claim and prune indexes
    #: (docs/explanation/storage.md), so these warnings would only teach users to silence them
    #: for every model, their own included.
    DROPPED_CONDITION_WARNINGS = frozenset({"models.W036", "models.W037"})

    @classmethod
    def check(cls, **kwargs):
        """Django's model checks, less :data:`DROPPED_CONDITION_WARNINGS` (handled by migration 0003)."""
        return [e for e in super().check(**kwargs) if e.id not in cls.DROPPED_CONDITION_WARNINGS]

    @property
    def payload_value(self):
        """The payload decoded from its stored JSON text (a stand-in when it nests too deep to show).

        An offloaded payload (docs/explanation/storage.md#large-payloads) is read from
        :class:`JobPayload` first: one more query, only for such a job.
        """
        from . import payloads

        return validation.stored_json(payloads.text_of(self.uid, self.payload), "payload")

    @property
    def result_value(self):
        """The result decoded from its stored JSON text (``None`` if unset; a stand-in when too deep)."""
        return validation.stored_json(self.result, "result")


class Dependency(models.Model):
    """An edge of a workflow: job ``job`` runs only after job ``upstream`` succeeded.

    ``pending`` while the edge still counts in the dependent's ``waiting_on``.
    ``on_failure`` says what the dependent does when the upstream job goes dead
    or is cancelled: ``cancel`` it (and its own dependents), ``run`` (the edge
    counts as satisfied), or ``wait`` for a retry of the dead job
    (docs/reference/semantics.md §9 "Dependencies"). No database foreign keys, as
    for ``Job.queue``: the stores delete edges with their jobs (prune, delete_queue).
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, related_name="dependency_edges", db_index=False, db_constraint=False
    )
    upstream = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, related_name="dependent_edges", db_index=False, db_constraint=False
    )
    on_failure = models.CharField(max_length=6, default="cancel")
    pending = models.BooleanField(default=True)
    #: The key of the upstream job's result in the dependent's ``job.upstream`` (the workflow
    #: builder writes the step's name), or ``None``: the result is then keyed by the job id.
    name = models.CharField(max_length=200, null=True, blank=True)

    class Meta:
        db_table = "django_fq_dependency"
        constraints = [models.UniqueConstraint(fields=["job", "upstream"], name="fq_dep_edge")]
        # The release on ack: the direct dependents of the jobs just finished, by index.
        indexes = [models.Index(fields=["upstream", "job"], name="fq_dep_upstream")]

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.upstream_id}"


class Batch(models.Model):
    """A set of jobs of one queue with a callback enqueued once every member has finished.

    ``state``: ``open`` (members may be added), ``sealed`` (no more members;
    the callback fires when ``succeeded + dead + cancelled == total``),
    ``finished`` (the callback was enqueued: ``callback_job``), ``cancelled``.
    The counts are changed only under this row's lock, in the transaction that
    adds or finishes a member (docs/reference/semantics.md §9 "Batches").
    ``callback_options`` is compact JSON text of the callback's enqueue options.
    No database foreign key, as for ``Job.queue``: ``delete_queue`` deletes the rows.
    """

    id = models.BigAutoField(primary_key=True)
    uid = models.CharField("id", max_length=32)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    state = models.CharField(max_length=9, default="open")
    total = models.BigIntegerField(default=0)
    succeeded = models.BigIntegerField(default=0)
    dead = models.BigIntegerField(default=0)
    cancelled = models.BigIntegerField(default=0)
    callback_queue = models.CharField(max_length=200, null=True, blank=True)
    callback_payload = models.TextField(null=True, blank=True)
    callback_options = models.TextField(null=True, blank=True)
    callback_job = models.CharField(max_length=32, null=True, blank=True)
    created_at = models.BigIntegerField(help_text="epoch ms, database clock")
    sealed_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms, database clock")
    finished_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms, database clock")

    class Meta:
        db_table = "django_fq_batch"
        verbose_name_plural = "batches"
        constraints = [models.UniqueConstraint(fields=["uid"], name="fq_batch_uid")]
        # Listings of a queue's batches, newest first; prune's finished ones by age.
        indexes = [
            models.Index(fields=["queue", "id"], name="fq_batch_queue"),
            models.Index(fields=["state", "finished_at"], name="fq_batch_finished"),
        ]

    def __str__(self) -> str:
        return self.uid


class BatchMember(models.Model):
    """Job ``job`` is a member of batch ``batch`` (a job is in at most one batch: the key is the job).

    Written in the enqueue's transaction; deleted with the job (prune,
    ``delete_queue``) or with its batch. No database foreign keys, as for
    :class:`Dependency`.
    """

    job = models.OneToOneField(
        Job, on_delete=models.DO_NOTHING, primary_key=True, related_name="+", db_constraint=False
    )
    batch = models.ForeignKey(Batch, on_delete=models.DO_NOTHING, related_name="+", db_index=False, db_constraint=False)

    class Meta:
        db_table = "django_fq_batch_member"
        # A batch's members in enqueue order (members(), cancel).
        indexes = [models.Index(fields=["batch", "job"], name="fq_batch_member")]

    def __str__(self) -> str:
        return f"job {self.job_id} in batch {self.batch_id}"


class JobPayload(models.Model):
    """The body of a job payload larger than ``FQ_PAYLOAD_OFFLOAD_BYTES``, kept out of the hot job row.

    The job's ``payload`` column then holds ``""`` (no JSON text is empty) and
    ``payload_size`` the body's size, so claims still count it against their
    32 MiB. Written in the job's insert transaction and deleted with the job;
    keyed by the job's public id, known before the job row is written
    (docs/explanation/storage.md#large-payloads). No database foreign key, as
    for ``Job.queue``: the stores delete bodies with their jobs.
    """

    job_uid = models.CharField(max_length=32, primary_key=True)
    body = models.TextField()

    class Meta:
        db_table = "django_fq_payload"

    def __str__(self) -> str:
        return f"payload of job {self.job_uid}"


class Lease(models.Model):
    """A live claim on a job. Exists exactly while the job is ``running``.

    ``receipt_hash`` is the SHA-256 of the receipt's secret; the receipt itself
    is never stored. ``deadline`` is exclusive: the lease is valid strictly
    before it. ``timeout_at`` caps every extension when the job has a timeout.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="lease")
    # No database constraint: its check on every lease insert took a key-share lock on the queue
    # row, which waited for a configure holding that row (docs/explanation/storage.md "Locks").
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="leases", db_index=False, db_constraint=False)
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


class ClaimFloor(models.Model):
    """Where a queue's claims may start reading, kept only where the store has
    :attr:`~django_fq.storage.base.Store.supports_claim_floor` (PostgreSQL).

    ``seq``: no queued job of the queue with priority ``priority`` has a
    sequence number below it (due or not), so a claim reads that priority from
    ``seq`` on and every other priority whole. ``lease_from`` (epoch ms): no
    lease of the queue has a deadline below it, so the expired-lease checks read
    from there. Both only skip index entries of row versions a long-running
    snapshot keeps; ``pend_*`` is the next value, taken from a snapshot whose
    ``pend_xmax`` (transaction id) every transaction then in progress must have
    finished before it is used (docs/explanation/storage.md#the-claim-floor).
    """

    queue = models.OneToOneField(Queue, on_delete=models.CASCADE, primary_key=True, related_name="+")
    priority = models.IntegerField(default=0)
    seq = models.BigIntegerField(default=0)
    lease_from = models.BigIntegerField(default=0)
    pend_seq = models.BigIntegerField(null=True, blank=True)
    pend_lease_from = models.BigIntegerField(null=True, blank=True)
    pend_xmax = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "django_fq_claim_floor"

    def __str__(self) -> str:
        return f"claim floor of queue {self.queue_id}"


class ConcurrencyKey(models.Model):
    """The slots of one concurrency key in a queue with ``key_concurrency`` > 0.

    ``admitted`` counts the key's jobs that are ``queued`` (claimable) or
    ``running``; the key's other waiting jobs are ``held``, so a claim only
    ever sees jobs whose key has room and never reads past a busy key.
    Whoever admits or gives back a slot locks this row first
    (docs/explanation/storage.md#per-key-limits). ``wake_at`` (epoch ms): the
    key has room and a held job becomes due then (a delay or a retry
    backoff); the reaper and the claim admit it once the clock passes it.
    No database foreign key, as for ``Job.queue``: the stores delete the rows
    with their queue.
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    key = models.CharField(max_length=200, db_column="concurrency_key")
    admitted = models.IntegerField(default=0)
    wake_at = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "django_fq_key"
        constraints = [models.UniqueConstraint(fields=["queue", "key"], name="fq_key_unique")]
        # Plain, not partial (MariaDB/MySQL would drop the condition, and warn): one row per key.
        indexes = [models.Index(fields=["queue", "wake_at"], name="fq_key_wake")]

    def __str__(self) -> str:
        return f"key {self.key} of queue {self.queue_id}"

    @classmethod
    def check(cls, **kwargs):
        """Django's model checks, less the dropped-condition warnings (see :attr:`Job.DROPPED_CONDITION_WARNINGS`).

        On MariaDB/MySQL ``fq_key_wake`` is a plain index: it still serves the wake-up scan.
        """
        return [e for e in super().check(**kwargs) if e.id not in Job.DROPPED_CONDITION_WARNINGS]


class QueueRate(models.Model):
    """The claim counter of a rate-limited queue: ``next_n`` is the number the next claimed job gets.

    Written by every claim of the queue that takes jobs while it has a rate
    limit, under the claim's queue-row lock, so that claims in a caller's
    snapshot older than the last one fail to write it rather than count from
    a stale log (docs/reference/semantics.md §9 "Rate limits"). No database
    foreign key, as for ``Job.queue``: ``delete_queue`` deletes it.
    """

    queue = models.OneToOneField(
        Queue, on_delete=models.CASCADE, primary_key=True, related_name="+", db_constraint=False
    )
    next_n = models.BigIntegerField(default=0)

    class Meta:
        db_table = "django_fq_rate"

    def __str__(self) -> str:
        return f"rate counter of queue {self.queue_id}"


class RateLog(models.Model):
    """The instant (epoch ms, database clock) at which job number ``n`` of a rate-limited queue was claimed.

    A queue keeps the rows of its last ``rate_limit`` claimed jobs: job ``n``
    may be claimed only when job ``n - rate_limit``'s instant is at least
    ``rate_window_ms`` old (or has no row), which holds every window of
    ``rate_window_ms`` to ``rate_limit`` claims
    (docs/reference/semantics.md §9 "Rate limits").
    """

    pk = models.CompositePrimaryKey("queue", "n")
    # The primary key (queue_id, n) leads with the queue: no index of its own.
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False)
    n = models.BigIntegerField()
    at = models.BigIntegerField()

    class Meta:
        db_table = "django_fq_rate_log"

    def __str__(self) -> str:
        return f"claim {self.n} of queue {self.queue_id}"


class KeyClaim(models.Model):
    """One claim (epoch ms, database clock) of a job of concurrency key ``key`` in a queue with ``key_rate_limit``.

    Written by the claim, in its transaction, for each keyed job it takes
    while its queue has a per-key rate limit. A key's jobs are admitted to
    the claim index only while its claims of the last ``rate_window_ms`` and
    its admitted unclaimed (``queued``) jobs together stay under the limit,
    so no window ever holds more claims of the key
    (docs/reference/semantics.md §9 "Per-key limits"). Rows older than the
    window are deleted by the key's next admission and by the reaper. No
    database foreign key, as for ``Job.queue``: the stores delete the rows
    with their queue.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    key = models.CharField(max_length=200, db_column="concurrency_key")
    at = models.BigIntegerField(help_text="epoch ms, database clock, of the claim")

    class Meta:
        db_table = "django_fq_key_claim"
        indexes = [
            models.Index(fields=["queue", "key", "at"], name="fq_key_claim_key"),
            # The reaper's prune of claims older than the window, queue by queue.
            models.Index(fields=["queue", "at"], name="fq_key_claim_at"),
        ]

    def __str__(self) -> str:
        return f"claim of key {self.key} of queue {self.queue_id} at {self.at}"


class WorkerProcess(models.Model):
    """One live (or lately gone) worker process, as it registered itself (docs/admin.md "Workers").

    A worker upserts its row when it starts, moves ``heartbeat_at`` (and
    ``running``) with one ``UPDATE`` every ``heartbeat_ms``
    (``FQ_WORKER_HEARTBEAT_MS``) and deletes the row on a clean shutdown. A
    row whose heartbeat is older than :data:`django_fq.workers.STALE_BEATS`
    of its own intervals is reported *gone* (the process died or lost the
    database); the reaper's prune deletes it an hour after that
    (:data:`django_fq.workers.GONE_KEEP_MS`). With ``FQ_QUEUE_DATABASES`` a
    worker has a row on each database alias it serves, listing that alias's
    queues. Instants are epoch ms of the database clock. Nothing here is a
    secret: a worker holds receipts, its row never does.
    """

    id = models.BigAutoField(primary_key=True)
    worker_id = models.CharField(
        "worker id", max_length=200, help_text="as on the leases: hostname:pid:random by default"
    )
    host = models.CharField(max_length=255)
    pid = models.BigIntegerField()
    queues = models.TextField(help_text="the queue names served on this database, comma-separated")
    concurrency = models.IntegerField()
    running = models.IntegerField(default=0, help_text="jobs running at the last heartbeat")
    pool = models.CharField(max_length=40, help_text="threads, asyncio, threads+asyncio or processes")
    version = models.CharField(max_length=40, help_text="django_fq.__version__ of the worker")
    started_at = models.BigIntegerField(help_text="epoch ms, database clock")
    heartbeat_at = models.BigIntegerField(help_text="epoch ms, database clock")
    heartbeat_ms = models.BigIntegerField(help_text="the worker's heartbeat interval, ms")

    class Meta:
        db_table = "django_fq_worker"
        verbose_name = "worker"
        verbose_name_plural = "workers"
        constraints = [models.UniqueConstraint(fields=["worker_id"], name="fq_worker_id")]
        indexes = [models.Index(fields=["heartbeat_at"], name="fq_worker_heartbeat")]

    def __str__(self) -> str:
        return self.worker_id


class QueueMinute(models.Model):
    """One row of a queue's per-minute history (docs/reference/history.md).

    ``minute`` is the start of the minute (epoch ms, database clock). The row
    with ``kind`` 0 (``bin`` 0) holds the minute's throughput: jobs enqueued,
    attempts succeeded, attempts failed and retried, attempts that left their
    job dead. Rows with ``kind`` 1 (wait time) or 2 (run time) hold one bin
    of that minute's log-scale histogram: ``n`` attempts fell in bin ``bin``
    (:mod:`django_fq.services.history` has the bin edges). Written by the
    processes that claim, settle and enqueue (one upsert per process and
    minute), pruned by :func:`~django_fq.services.prune` after
    ``FQ_HISTORY_RETENTION_MS``.
    """

    # Deleted with its queue by the store (Store.delete_queue_rows), as the queue's other rows.
    queue = models.ForeignKey(Queue, on_delete=models.DO_NOTHING, related_name="+", db_index=False, db_constraint=False)
    minute = models.BigIntegerField(help_text="start of the minute, epoch ms (database clock)")
    kind = models.SmallIntegerField(default=0, help_text="0 throughput, 1 wait-time bin, 2 run-time bin")
    bin = models.SmallIntegerField(default=0)
    enqueued = models.IntegerField(default=0, db_default=0)
    succeeded = models.IntegerField(default=0, db_default=0)
    failed = models.IntegerField(default=0, db_default=0)
    dead = models.IntegerField(default=0, db_default=0)
    n = models.IntegerField(default=0, db_default=0, help_text="attempts in this histogram bin")

    class Meta:
        db_table = "django_fq_minute"
        constraints = [
            models.UniqueConstraint(fields=["queue", "minute", "kind", "bin"], name="fq_minute_unique"),
        ]
        indexes = [models.Index(fields=["minute"], name="fq_minute_minute")]

    def __str__(self) -> str:
        return f"history of queue {self.queue_id} at {self.minute} ({self.kind}/{self.bin})"
