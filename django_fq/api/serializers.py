"""Request and response shapes of the API, as DRF serializers.

They document the API: drf-spectacular turns them into the OpenAPI schema
served at ``schema/``, and the tests check every response against it. They
do **not** validate requests: the views hand the decoded JSON to
:mod:`django_fq.services`, whose checks (and error codes, and field names)
are the same on every interface — the Python API, ``manage.py fq`` and this
API. Bounds below are copied from those checks for the documentation only.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import validation
from ..services.queues import POLICY_BOUNDS
from ..types import STATE_NAMES, TOTAL_NAMES


def _int(lo=None, hi=None, **kw):
    return serializers.IntegerField(min_value=lo, max_value=hi, **kw)


def _epoch_ms(**kw):
    kw.setdefault("help_text", "epoch milliseconds (database clock)")
    return serializers.IntegerField(**kw)


@extend_schema_field({"description": "any JSON value", "nullable": True})
class AnyJSON(serializers.JSONField):
    """Any JSON document (object, array, string, number, boolean or null)."""


AT_SCHEMA = {
    "oneOf": [
        {"type": "integer", "minimum": 0, "description": "epoch milliseconds"},
        {"type": "string", "format": "date-time", "description": "ISO 8601 with a UTC offset"},
    ],
    "nullable": True,
}


@extend_schema_field(AT_SCHEMA)
class AtField(serializers.Field):
    """``at``: epoch milliseconds, or an ISO 8601 date-time with an offset."""


# --- errors ---------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="stable machine-readable error code")
    message = serializers.CharField()
    field = serializers.CharField(allow_null=True, help_text="the offending field, when one is to blame")


# --- queues ---------------------------------------------------------------------------------


class PolicySerializer(serializers.Serializer):
    """A queue's policy (durations in ms)."""

    concurrency = _int(*POLICY_BOUNDS["concurrency"], help_text="jobs running at once; 0 = unlimited")
    max_attempts = _int(*POLICY_BOUNDS["max_attempts"])
    backoff_ms = _int(*POLICY_BOUNDS["backoff_ms"])
    max_backoff_ms = _int(*POLICY_BOUNDS["max_backoff_ms"], help_text="at least backoff_ms")
    visibility_ms = _int(*POLICY_BOUNDS["visibility_ms"])
    idempotency_retention_ms = _int(*POLICY_BOUNDS["idempotency_retention_ms"])
    timeout_ms = _int(*POLICY_BOUNDS["timeout_ms"], help_text="0 = none")
    ttl_ms = _int(*POLICY_BOUNDS["ttl_ms"], help_text="delete the queue once empty and idle this long; 0 = never")
    key_concurrency = _int(
        *POLICY_BOUNDS["key_concurrency"], help_text="jobs of one concurrency_key running at once; 0 = unlimited"
    )
    rate_limit = _int(*POLICY_BOUNDS["rate_limit"], help_text="claims allowed in any window of rate_window_ms; 0 = none")
    rate_window_ms = _int(*POLICY_BOUNDS["rate_window_ms"], help_text="the rate limits' sliding window")
    key_rate_limit = _int(
        *POLICY_BOUNDS["key_rate_limit"],
        help_text="claims of one concurrency_key allowed in any window of rate_window_ms; 0 = none",
    )


class PolicyInputSerializer(serializers.Serializer):
    """Policy fields to set; omitted (or null) fields: defaults on PUT, unchanged on PATCH."""

    queue = serializers.CharField(required=False, help_text="optional; must equal the queue of the URL")
    concurrency = _int(*POLICY_BOUNDS["concurrency"], required=False, allow_null=True)
    max_attempts = _int(*POLICY_BOUNDS["max_attempts"], required=False, allow_null=True)
    backoff_ms = _int(*POLICY_BOUNDS["backoff_ms"], required=False, allow_null=True)
    max_backoff_ms = _int(*POLICY_BOUNDS["max_backoff_ms"], required=False, allow_null=True)
    visibility_ms = _int(*POLICY_BOUNDS["visibility_ms"], required=False, allow_null=True)
    idempotency_retention_ms = _int(*POLICY_BOUNDS["idempotency_retention_ms"], required=False, allow_null=True)
    timeout_ms = _int(*POLICY_BOUNDS["timeout_ms"], required=False, allow_null=True)
    ttl_ms = _int(*POLICY_BOUNDS["ttl_ms"], required=False, allow_null=True)
    key_concurrency = _int(*POLICY_BOUNDS["key_concurrency"], required=False, allow_null=True)
    rate_limit = _int(*POLICY_BOUNDS["rate_limit"], required=False, allow_null=True)
    rate_window_ms = _int(*POLICY_BOUNDS["rate_window_ms"], required=False, allow_null=True)
    key_rate_limit = _int(*POLICY_BOUNDS["key_rate_limit"], required=False, allow_null=True)


class QueueConfigSerializer(PolicySerializer):
    """A queue's name and policy (as ``manage.py fq config --json``)."""

    queue = serializers.CharField()


#: Jobs per reported state, one integer per name of ``types.STATE_NAMES``.
CountsSerializer = type(
    "CountsSerializer", (serializers.Serializer,), {name: serializers.IntegerField() for name in STATE_NAMES}
)


def _paused():
    return serializers.BooleanField(help_text="true: claims of the queue hand out no job until it is resumed")


def _paused_at():
    return _epoch_ms(allow_null=True, help_text="epoch milliseconds (database clock) of the pause; null while running")


class QueueInfoSerializer(serializers.Serializer):
    name = serializers.CharField()
    policy = PolicySerializer()
    counts = CountsSerializer()
    created_at = _epoch_ms()
    paused = _paused()
    paused_at = _paused_at()


class PausedSerializer(serializers.Serializer):
    """The outcome of a pause or a resume."""

    queue = serializers.CharField()
    paused = _paused()
    paused_at = _paused_at()
    changed = serializers.BooleanField(help_text="false: the queue already was so; nothing was written")


class DeletedSerializer(serializers.Serializer):
    queue = serializers.CharField()
    deleted = serializers.BooleanField()


# --- enqueue -----------------------------------------------------------------------------------


class EnqueueSerializer(serializers.Serializer):
    """An enqueue envelope: the payload and the options of ``enqueue``."""

    payload = AnyJSON(help_text="any JSON; at most FQ_MAX_PAYLOAD_BYTES as compact UTF-8")
    priority = _int(validation.MIN_PRIORITY, validation.MAX_PRIORITY, required=False, allow_null=True)
    delay_ms = _int(0, validation.MAX_DELAY_MS, required=False, allow_null=True, help_text="not with at")
    at = AtField(required=False, help_text="when the job becomes eligible (within 10 years); not with delay_ms")
    idempotency = serializers.CharField(min_length=1, max_length=255, required=False, allow_null=True)
    idempotency_retention_ms = _int(*POLICY_BOUNDS["idempotency_retention_ms"], required=False, allow_null=True)
    unique_key = serializers.CharField(min_length=1, max_length=255, required=False, allow_null=True)
    max_attempts = _int(*POLICY_BOUNDS["max_attempts"], required=False, allow_null=True)
    timeout_ms = _int(*POLICY_BOUNDS["timeout_ms"], required=False, allow_null=True)
    metadata = serializers.DictField(
        required=False,
        allow_null=True,
        help_text='a JSON object of at most FQ_MAX_METADATA_BYTES (default 4096) as compact UTF-8; its "tags": '
        "up to 16 distinct strings of 1-64 characters from [A-Za-z0-9:._-]",
    )
    concurrency_key = serializers.CharField(
        min_length=1,
        max_length=validation.MAX_CONCURRENCY_KEY_LENGTH,
        required=False,
        allow_null=True,
        help_text="at most the queue's key_concurrency jobs of one key run at once",
    )
    depends_on = serializers.ListField(
        child=AnyJSON(),
        required=False,
        allow_null=True,
        max_length=1000,
        help_text='jobs that must succeed first (any queue): job ids, or {"id": ..., "on_failure": '
        '"cancel"|"run"|"wait"}; at most 1000',
    )
    batch = serializers.CharField(
        min_length=32, max_length=32, required=False, allow_null=True,
        help_text="the id of an open batch of this queue the job joins",
    )  # fmt: skip


class BulkEnqueueSerializer(serializers.Serializer):
    jobs = EnqueueSerializer(many=True, help_text="envelopes; all are enqueued or none")


class EnqueuedSerializer(serializers.Serializer):
    id = serializers.CharField()
    created = serializers.BooleanField(help_text="false: an idempotency token or unique key matched an existing job")


# --- leases ----------------------------------------------------------------------------------


class ClaimSerializer(serializers.Serializer):
    count = _int(1, validation.MAX_CLAIM_COUNT, required=False, allow_null=True, help_text="default 1")
    visibility_ms = _int(
        validation.MIN_VISIBILITY_MS, validation.MAX_VISIBILITY_MS, required=False, allow_null=True,
        help_text="lease length; default: the queue's policy",
    )  # fmt: skip
    wait_ms = _int(0, validation.MAX_WAIT_MS, required=False, allow_null=True, help_text="long poll; default 0")
    worker = serializers.CharField(max_length=200, required=False, allow_null=True, allow_blank=True)


class ClaimedJobSerializer(serializers.Serializer):
    id = serializers.CharField()
    payload = AnyJSON()
    receipt = serializers.CharField(help_text="settles this lease; keep it secret")
    deadline = _epoch_ms(help_text="the lease is valid strictly before this instant (epoch ms)")
    attempts = serializers.IntegerField()
    enqueued_at = _epoch_ms()
    metadata = serializers.DictField(help_text="the job's metadata ({} when none)")


class AckSerializer(serializers.Serializer):
    receipt = serializers.CharField()
    result = AnyJSON(required=False)


class NackSerializer(serializers.Serializer):
    receipt = serializers.CharField()
    delay_ms = _int(0, validation.MAX_NACK_DELAY_MS, required=False, allow_null=True, help_text="default: backoff")
    error = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    permanent = serializers.BooleanField(required=False, allow_null=True, help_text="dead now, whatever the attempts")


class ReleaseSerializer(serializers.Serializer):
    receipt = serializers.CharField()
    error = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    delay_ms = _int(
        0, validation.MAX_NACK_DELAY_MS, required=False, allow_null=True,
        help_text="eligible again this long from now (a snooze); default: ready now",
    )  # fmt: skip


class ExtendSerializer(serializers.Serializer):
    receipt = serializers.CharField()
    visibility_ms = _int(validation.MIN_VISIBILITY_MS, validation.MAX_VISIBILITY_MS)


class ProgressSerializer(serializers.Serializer):
    """A progress report of a running job (request and response), as ``services.report_progress`` takes it."""

    receipt = serializers.CharField(write_only=True)
    progress = serializers.FloatField(min_value=0, max_value=100, help_text="a percentage, 0-100")
    message = serializers.CharField(
        required=False, allow_blank=True, allow_null=True, max_length=validation.MAX_PROGRESS_MESSAGE,
        help_text='at most 200 characters (default "")',
    )


class DeadlineSerializer(serializers.Serializer):
    deadline = _epoch_ms()


class SettleSerializer(serializers.Serializer):
    id = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)
    run_at = _epoch_ms(allow_null=True)
    replay = serializers.BooleanField(help_text="true: a repeat of the recorded settle; nothing changed")


# --- jobs ------------------------------------------------------------------------------------


class ErrorEntrySerializer(serializers.Serializer):
    at = _epoch_ms()
    attempt = serializers.IntegerField()
    kind = serializers.CharField()
    error = serializers.CharField(allow_blank=True)
    worker = serializers.CharField(allow_blank=True)


class JobListedSerializer(serializers.Serializer):
    """A job's metadata (no payload, result or errors). Never a receipt."""

    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)
    priority = serializers.IntegerField()
    run_at = _epoch_ms()
    enqueued_at = _epoch_ms()
    changed_at = _epoch_ms()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    timeout_ms = serializers.IntegerField()
    unique_key = serializers.CharField(allow_null=True)
    idempotency = serializers.CharField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)
    claimed_at = _epoch_ms(allow_null=True)
    finished_at = _epoch_ms(allow_null=True)
    lease_deadline = _epoch_ms(allow_null=True)
    worker = serializers.CharField(allow_blank=True)
    metadata = serializers.DictField(help_text="set at enqueue ({} when none)")
    tags = serializers.ListField(child=serializers.CharField(), help_text='metadata "tags"')
    progress = serializers.FloatField(allow_null=True, help_text="the last progress report: a percentage, 0-100")
    progress_message = serializers.CharField(allow_blank=True)
    progress_at = _epoch_ms(allow_null=True)
    concurrency_key = serializers.CharField(allow_null=True)
    snoozes = serializers.IntegerField(help_text="snoozes since the enqueue or the last retry (at most 1000)")


class DependencyEdgeSerializer(serializers.Serializer):
    """One edge of a job's dependencies, seen from the job (``depends_on``) or from its dependency (``dependents``)."""

    id = serializers.CharField(help_text="the job at the other end of the edge")
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)
    on_failure = serializers.ChoiceField(choices=["cancel", "run", "wait"])
    pending = serializers.BooleanField(help_text="true while the edge keeps the dependent waiting")
    name = serializers.CharField(
        required=False, help_text="the edge's name (a workflow step's name), only when it has one"
    )


class JobSerializer(JobListedSerializer):
    """A job with its payload, result, error history and dependencies. Never a receipt."""

    payload = AnyJSON()
    result = AnyJSON()
    depends_on = DependencyEdgeSerializer(many=True, help_text="the jobs this one depends on")
    dependents = DependencyEdgeSerializer(many=True, help_text="the jobs that depend on this one (first 1000)")
    # DRF's metaclass moves declared fields off the class, so Serializer.errors is not shadowed.
    errors = ErrorEntrySerializer(many=True)  # type: ignore[assignment]


class WorkflowStepSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)
    depends_on = serializers.ListField(child=serializers.CharField(), help_text="ids of the steps it depends on")


class WorkflowSerializer(serializers.Serializer):
    """A job's workflow: the jobs connected to it by dependencies (those of queues the user may manage)."""

    id = serializers.CharField(help_text="the job asked about")
    steps = WorkflowStepSerializer(many=True, help_text="in dependency order")
    truncated = serializers.BooleanField(help_text="more than 10,000 jobs are connected; the first ones are listed")


class WorkflowCancelledSerializer(serializers.Serializer):
    id = serializers.CharField()
    cancelled = serializers.IntegerField(help_text="jobs cancelled, directly or by cascade")
    finished = serializers.IntegerField(help_text="jobs that had finished already")


class BatchCallbackSerializer(serializers.Serializer):
    """The job a batch enqueues once it is sealed and every member has finished."""

    queue = serializers.CharField(required=False, allow_null=True, help_text="default: the batch's queue")
    payload = AnyJSON(help_text="any JSON; at most FQ_MAX_PAYLOAD_BYTES as compact UTF-8")
    priority = _int(validation.MIN_PRIORITY, validation.MAX_PRIORITY, required=False, allow_null=True)
    delay_ms = _int(0, validation.MAX_DELAY_MS, required=False, allow_null=True)
    max_attempts = _int(*POLICY_BOUNDS["max_attempts"], required=False, allow_null=True)
    timeout_ms = _int(*POLICY_BOUNDS["timeout_ms"], required=False, allow_null=True)
    metadata = serializers.DictField(
        required=False, allow_null=True, help_text='a JSON object; the batch adds its counts under "batch"'
    )
    concurrency_key = serializers.CharField(max_length=validation.MAX_CONCURRENCY_KEY_LENGTH, required=False, allow_null=True)


class BatchCreateSerializer(serializers.Serializer):
    callback = BatchCallbackSerializer(required=False, allow_null=True, help_text="none: no callback")


class BatchSerializer(serializers.Serializer):
    """A batch: its state, counts and progress, and its callback job once enqueued."""

    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=["open", "sealed", "finished", "cancelled"])
    total = serializers.IntegerField(help_text="members added")
    succeeded = serializers.IntegerField()
    dead = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    done = serializers.IntegerField(help_text="succeeded + dead + cancelled")
    progress = serializers.FloatField(help_text="done / total, 0-1 (1 for an empty batch)")
    callback_queue = serializers.CharField(allow_null=True)
    callback_job = serializers.CharField(allow_null=True, help_text="the callback job's id, once enqueued")
    created_at = _epoch_ms()
    sealed_at = _epoch_ms(allow_null=True)
    finished_at = _epoch_ms(allow_null=True)


class BatchMemberSerializer(serializers.Serializer):
    id = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)


class UpstreamResultSerializer(serializers.Serializer):
    """One dependency of a job and what it returned."""

    name = serializers.CharField(allow_null=True, help_text="the edge's name (a workflow step's name), or null")
    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)
    on_failure = serializers.ChoiceField(choices=["cancel", "run", "wait"])
    result = AnyJSON(help_text="the result when it succeeded, else null")
    size = serializers.IntegerField(help_text="the result's size in bytes of compact UTF-8 JSON (0 without one)")


class UpstreamSerializer(serializers.Serializer):
    """The results of a job's dependencies (those of queues the user may consume or manage)."""

    id = serializers.CharField(help_text="the job asked about")
    upstream = UpstreamResultSerializer(many=True, help_text="in the order the edges were written")


class WorkflowStepInputSerializer(serializers.Serializer):
    """One step of a workflow to create."""

    name = serializers.CharField(min_length=1, max_length=200, help_text="unique in the workflow")
    queue = serializers.CharField(min_length=1, max_length=200)
    payload = AnyJSON(help_text="any JSON; at most FQ_MAX_PAYLOAD_BYTES as compact UTF-8")
    options = serializers.DictField(
        required=False,
        help_text="options of enqueue: priority, delay_ms, at, idempotency, idempotency_retention_ms, "
        "unique_key, max_attempts, timeout_ms, metadata, concurrency_key",
    )
    after = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="step names, group names or ids of jobs enqueued before, that must succeed first",
    )
    on_failure = serializers.ChoiceField(
        choices=["cancel", "run", "wait"], required=False, help_text="policy of the after edges (default cancel)"
    )


class WorkflowCreateSerializer(serializers.Serializer):
    """A whole workflow: every step is enqueued, or none."""

    steps = WorkflowStepInputSerializer(many=True, help_text="at most 10,000")
    groups = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="group name: step names; after or a chain naming the group waits for all of them",
    )
    chains = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="lists of step or group names: each runs after the one before",
    )


class WorkflowCreatedSerializer(serializers.Serializer):
    ids = serializers.DictField(child=serializers.CharField(), help_text="step name: job id")


class JobOutcomeSerializer(serializers.Serializer):
    """What ``wait`` tells a user who may produce but not manage: the outcome, nothing of the job's inputs."""

    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_NAMES)
    result = AnyJSON()


class JobPageSerializer(serializers.Serializer):
    jobs = JobListedSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="pass as cursor for the next page")


class WaitSerializer(serializers.Serializer):
    timeout_ms = _int(0, validation.MAX_WAIT_MS, required=False, allow_null=True, help_text="default 20000")


#: Totals since the queue was created, one integer per name of ``types.TOTAL_NAMES``.
TotalsSerializer = type(
    "TotalsSerializer", (serializers.Serializer,), {name: serializers.IntegerField() for name in TOTAL_NAMES}
)


class HistoryTimingSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="attempts measured")
    median = serializers.FloatField(allow_null=True, help_text="ms, within 9.05 % (histogram bins); null: none")
    p95 = serializers.FloatField(allow_null=True, help_text="ms, within 9.05 %; null: none")


class HistoryTotalsSerializer(serializers.Serializer):
    enqueued = serializers.IntegerField(help_text="jobs created")
    succeeded = serializers.IntegerField(help_text="attempts acked")
    failed = serializers.IntegerField(help_text="failed attempts (nack, lease expiry, timeout) whose job is retried")
    dead = serializers.IntegerField(help_text="failed attempts whose job became dead")
    wait_ms = HistoryTimingSerializer(help_text="claim − the later of enqueue and run_at, of the attempts claimed")
    run_ms = HistoryTimingSerializer(help_text="ack − claim, of the attempts acked")


class HistoryBucketSerializer(HistoryTotalsSerializer):
    start = serializers.IntegerField(help_text="epoch ms (database clock)")


class HistorySerializer(serializers.Serializer):
    queue = serializers.CharField(allow_null=True)
    span = serializers.ChoiceField(choices=["hour", "day", "week"])
    step_ms = serializers.IntegerField(help_text="bucket length: 60000 (hour), 900000 (day), 3600000 (week)")
    start = serializers.IntegerField()
    end = serializers.IntegerField()
    now = serializers.IntegerField()
    buckets = HistoryBucketSerializer(many=True)
    totals = HistoryTotalsSerializer()


class StatsSerializer(serializers.Serializer):
    queue = serializers.CharField()
    counts = CountsSerializer()
    totals = TotalsSerializer()
    wait_ms_sum = serializers.IntegerField()
    wait_count = serializers.IntegerField()
    run_ms_sum = serializers.IntegerField()
    run_count = serializers.IntegerField()
    paused = _paused()
    paused_at = _paused_at()



class WorkerSerializer(serializers.Serializer):
    """A worker process of the registry (``GET workers/``; docs/admin.md "Workers")."""

    worker_id = serializers.CharField(help_text="the id on its leases (hostname:pid:random unless --worker-id)")
    host = serializers.CharField()
    pid = serializers.IntegerField()
    queues = serializers.ListField(child=serializers.CharField(), help_text="the queues it serves on this database")
    concurrency = serializers.IntegerField()
    running = serializers.IntegerField(help_text="jobs running at its last heartbeat")
    pool = serializers.CharField(help_text="threads, asyncio, threads+asyncio or processes")
    version = serializers.CharField(help_text="its django-fq version")
    started_at = _epoch_ms()
    heartbeat_at = _epoch_ms()
    heartbeat_ms = serializers.IntegerField(help_text="its heartbeat interval, ms")
    age_ms = serializers.IntegerField(help_text="how old its last heartbeat is, ms (database clock)")
    state = serializers.ChoiceField(
        choices=["live", "gone"], help_text="gone: no heartbeat for 3 intervals (the process died or lost the database)"
    )
    database = serializers.CharField(help_text="the database alias of the row (FQ_QUEUE_DATABASES)")
