"""The one exception hierarchy of django-fq.

Every error the library raises on purpose derives from :class:`FqError`. Each
class carries:

* ``code`` — a stable machine-readable slug (used by ``fq --json`` and the REST API),
* ``status`` — the HTTP status the REST API answers with,
* ``field`` — the name of the offending argument, when one is to blame.

A class's docstring is its default message. Errors never include a receipt or
a payload in their text.
"""

from __future__ import annotations


class FqError(Exception):
    """django-fq error."""

    code = "error"
    status = 400

    def __init__(self, message: str | None = None, *, field: str | None = None, **extra):
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        self.field = field
        self.extra = extra
        super().__init__(self.message)

    def as_dict(self) -> dict:
        """The error as ``{"code", "message", "field", ...extra}`` for JSON output (``field`` ``None`` when none is to blame).

        The same keys as the REST API's error bodies (docs/rest-api.md).
        """
        out = {"code": self.code, "message": self.message, "field": self.field or None}
        out.update(self.extra)
        return out


# --- bad input (400) -------------------------------------------------------------


class InvalidArgument(FqError):
    """Invalid argument."""

    code = "invalid"


class InvalidDependency(InvalidArgument):
    """A dependency is not a job of this database, or depends_on is malformed or too long."""

    code = "invalid_dependency"


class WrongDatabase(InvalidArgument):
    """The queue is on another database than the transaction or the other queues of this operation (FQ_QUEUE_DATABASES)."""

    code = "wrong_database"


class InvalidWorkflow(InvalidArgument):
    """The workflow is not valid (a step name used twice, an unknown step, a cycle, a limit); nothing was written."""

    code = "invalid_workflow"


class InvalidQueueName(InvalidArgument):
    """Queue names are 1-200 characters from [A-Za-z0-9:._-]."""

    code = "invalid_queue_name"


class InvalidJson(InvalidArgument):
    """The value is not a JSON document django-fq can store."""

    code = "invalid_json"


class PayloadTooLarge(InvalidArgument):
    """Payload too large."""

    code = "payload_too_large"
    status = 413


class ResultsTooLarge(FqError):
    """The results of a job's dependencies are too large to read at once."""

    code = "results_too_large"
    status = 413


class CountOutOfRange(InvalidArgument):
    """Count out of range."""

    code = "count_out_of_range"


class VisibilityOutOfRange(InvalidArgument):
    """Visibility must be between 1 ms and 24 h."""

    code = "visibility_out_of_range"


class InvalidDelay(InvalidArgument):
    """Delay out of range."""

    code = "invalid_delay"


class InvalidTime(InvalidArgument):
    """Invalid point in time."""

    code = "invalid_time"


class DelayAndAt(InvalidArgument):
    """Give delay_ms or at, not both."""

    code = "delay_and_at"


class InvalidPolicy(InvalidArgument):
    """Queue policy value out of range."""

    code = "invalid_policy"


class InvalidCursor(InvalidArgument):
    """Malformed or foreign cursor."""

    code = "invalid_cursor"


class InvalidBackup(InvalidArgument):
    """The backup file cannot be imported.

    ``line`` (1-based, also in ``as_dict()``) is the offending line; ``field``
    the key of that line to blame (``"priority"``, ``"policy.max_attempts"``),
    when one is.
    """

    code = "invalid_backup"

    def __init__(self, problem: str, *, line: int, field: str | None = None):
        where = f'line {line}: field "{field}": ' if field else f"line {line}: "
        super().__init__(where + problem, field=field, line=line)
        self.line = line


# --- not found (404) ---------------------------------------------------------------


class QueueNotFound(FqError):
    """No such queue."""

    code = "queue_not_found"
    status = 404


class JobNotFound(FqError):
    """No such job in this queue."""

    code = "job_not_found"
    status = 404


class BatchNotFound(FqError):
    """No such batch (in this queue, when a queue is named)."""

    code = "batch_not_found"
    status = 404


# --- conflicts (409) ---------------------------------------------------------------


class InvalidReceipt(FqError):
    """Invalid or expired receipt."""

    code = "invalid_receipt"
    status = 409


class ReceiptCancelled(InvalidReceipt):
    """The job was cancelled while it ran; its receipt no longer works."""

    code = "cancelled"
    status = 409


class InvalidState(FqError):
    """The job is not in a state that allows this operation."""

    code = "invalid_state"
    status = 409


class SnoozeLimit(InvalidState):
    """The job was snoozed as often as a job may be (``MAX_SNOOZES``, 1,000) since it was enqueued or retried.

    Raised by ``release(…, delay_ms=…)``, which then changes nothing: the lease
    is still held. The worker fails the attempt instead (a nack with this
    message), so a handler that snoozes for ever ends in the queue's backoff
    and dead rule (docs/reference/semantics.md §9 "Verbs and arguments").
    """

    code = "snooze_limit"
    status = 409


class QueueFull(FqError):
    """Queue full."""

    code = "queue_full"
    status = 429


class TooManyQueues(FqError):
    """Creating one more queue would pass ``FQ_MAX_QUEUES`` (field ``queue``; ``extra``: ``limit``).

    Nothing is created or enqueued. Delete unused queues, or raise the setting.
    """

    code = "too_many_queues"
    status = 409


class ImportConflict(FqError):
    """The import kept meeting concurrent writes (rows it meant to insert, a lock); nothing was imported."""

    code = "import_conflict"
    status = 409


class EnqueueRefused(FqError):
    """An enqueue middleware refused the job; nothing was enqueued.

    Raised by a function of ``FQ_ENQUEUE_MIDDLEWARE``. The REST API answers
    403 with code ``enqueue_refused``; ``fq enqueue`` exits 1 with it; the
    message is the middleware's own (keep it free of secrets).
    """

    code = "enqueue_refused"
    status = 403


class WaitTimeout(FqError):
    """The job did not finish within the wait."""

    code = "wait_timeout"
    status = 408


# --- configuration and the worker (not errors of the API, so not FqError) ------------


class WorkerConfigError(ValueError):
    """The worker cannot start as configured (no handler for a queue, nothing to serve)."""


class HandlerImportError(Exception):
    """A handler module (or an ``FQ_HANDLERS`` path) raised while it was imported.

    The message is one line: where (``module …, file …, line …`` — the last
    line of that module the traceback passes through, or where a
    ``SyntaxError`` is) and the exception (``NameError: …``). The original
    exception is ``__cause__``; ``module`` is the module's dotted name.
    """

    def __init__(self, where: str, exc: BaseException, module: str):
        text = " ".join(str(exc).split())
        super().__init__(f"{where}: {type(exc).__name__}: {text}" if text else f"{where}: {type(exc).__name__}")
        self.module = module


class HandlerLoadError(Exception):
    """The job handlers cannot be loaded; the message is one line that says why."""


class ScheduleError(Exception):
    """An entry of ``FQ_SCHEDULE`` is invalid; ``check_id`` is its system-check id."""

    def __init__(self, check_id: str, message: str):
        super().__init__(message)
        self.check_id = check_id
        self.message = message


# --- outcomes a handler raises or meets (not errors of the API) -------------------


class LeaseLost(Exception):
    """The running job's lease is gone: it must not be settled by this run.

    ``reason`` is one of ``expired`` (the deadline passed before an extend
    succeeded), ``invalid_receipt`` (another claim holds the job now, or the
    lease was ended by expiry handling), ``cancelled``, ``timeout`` (the
    job's ``timeout_ms`` passed), ``shutdown`` (the worker released it) or
    ``queue_deleted``.
    """

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"the job's lease was lost ({reason})")



class SoftTimeout(Exception):
    """The job is about to reach its ``timeout_ms``: tidy up and leave the handler now.

    Raised inside a handler run by ``fq_worker --pool processes``, in the
    child process's main thread (wherever it is: a sleep, a blocking call
    that Python can interrupt), ``--soft-timeout-ms`` before the worker
    kills the child at the job's timeout. Not a :class:`LeaseLost`: the lease
    is still held, so a handler that lets it out fails the attempt at once
    (nacked with this error, retried per the queue's policy); a handler that
    catches it and goes on is killed at the timeout, recorded as a timeout.
    ``remaining_ms`` is the time left before the kill when it was raised.
    """

    def __init__(self, remaining_ms: int = 0):
        self.remaining_ms = remaining_ms
        super().__init__(f"soft timeout: the job reaches its timeout_ms in {remaining_ms} ms and will be killed then")


class PermanentFailure(Exception):
    """Raise from a handler to make the job dead at once, without further attempts.

    The exception's text is stored as the job's last error.
    """


class BatchFailure(Exception):
    """Raise from a batch handler to fail some jobs of its batch and ack the others.

    ``errors`` maps a job (its context, or its id) to what went wrong with it:
    an exception, settled as if a one-job handler had raised it
    (:class:`PermanentFailure` makes the job dead, :class:`RetryAfter` and
    :class:`Snooze` keep their meaning, anything else is a failed attempt), or
    a text stored as the attempt's error. ``results`` optionally maps the
    other jobs (or ids) to the result their ack stores. Every job the mapping
    does not name is acked (docs/how-to/batch-handlers.md).
    """

    def __init__(self, errors, results=None):
        self.errors = dict(errors)
        self.results = dict(results or {})
        super().__init__(f"{len(self.errors)} job(s) of the batch failed")


def _delay(value: object) -> int:
    """``value`` as a delay in ms, 0 – 30 days (the nack bound); ``InvalidDelay`` (field ``delay_ms``) otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 30 * 24 * 3600 * 1000:
        raise InvalidDelay("delay_ms must be an integer between 0 and 2592000000 (30 days)", field="delay_ms")
    return value


class Snooze(Exception):
    """Raise from a handler or a handler middleware to put the job off for ``delay_ms`` (0 – 30 days).

    The worker releases the lease with that delay: the attempt is given back,
    a history entry of kind ``snoozed`` is written and the job becomes
    eligible ``delay_ms`` after now (database clock). A bad ``delay_ms``
    raises :class:`InvalidDelay` here, inside the handler, so it counts as a
    failed attempt with that message.
    """

    def __init__(self, delay_ms: int):
        self.delay_ms = _delay(delay_ms)
        super().__init__(f"snoozed for {self.delay_ms} ms")


class RetryAfter(Exception):
    """Raise from a handler or a handler middleware to fail this attempt and retry it ``delay_ms`` later.

    A nack with ``delay_ms`` (0 – 30 days) instead of the queue's backoff;
    ``error`` (text, optional) is stored as the attempt's error. The attempt
    counts: at ``max_attempts`` the job is dead. A bad ``delay_ms`` raises
    :class:`InvalidDelay` here (a failed attempt with that message).
    """

    def __init__(self, delay_ms: int, error: str | None = None):
        self.delay_ms = _delay(delay_ms)
        self.error = error
        super().__init__(error or f"retry after {self.delay_ms} ms")
