"""OpenTelemetry tracing of django-fq (optional: ``pip install 'django-fq[otel]'``; docs/how-to/tracing.md).

Switched on by the setting ``FQ_TRACING = True``. Then:

* the enqueue middleware :func:`enqueue_middleware` records a ``create <queue>``
  producer span for each job enqueued (each item of ``enqueue_many`` too) and
  writes its trace context (W3C ``traceparent``/``tracestate``, through the
  API's global propagator) into the job's metadata under :data:`METADATA_KEY`
  (``"otel"``): the job's creation context;
* ``fq_worker`` subscribes a :class:`TracingSubscriber` to its worker
  (:mod:`django_fq.worker.events`), which records

  - ``receive <queue>``: a claim call that got jobs (kind CLIENT);
  - ``process <queue>``: one run of a handler and its settle (kind CONSUMER),
    a child of the job's creation context read back from the metadata
    (``FQ_TRACING_PARENT = "child"``, the default) or a new trace linked to
    it (``"link"``), and always carrying a link to it; the handler's own
    spans are its children; the settle (ack, nack, release) is its event,
    with the state the database answered.

The names and ``messaging.*`` attributes follow the OpenTelemetry semantic
conventions for messaging spans (development status) as of conventions 1.37
(``messaging.operation.type`` = create/receive/process/settle); what they have
no name for is under ``django_fq.*``. Receipts are never put in a span.

The OpenTelemetry API is imported only when tracing is on: without the
package django-fq works as before, and ``FQ_TRACING = True`` without it is an
:class:`~django.core.exceptions.ImproperlyConfigured` naming the extra (a
``CommandError`` at ``fq_worker`` start). Which TracerProvider and exporter
the spans go to is the project's own OpenTelemetry setup.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from . import __version__

#: The metadata key holding the enqueuing code's trace context: ``{"traceparent": ..., "tracestate": ...}``.
METADATA_KEY = "otel"
#: The dotted path of :func:`enqueue_middleware`, put first in the enqueue chain by ``FQ_TRACING = True``.
ENQUEUE_MIDDLEWARE = "django_fq.tracing.enqueue_middleware"
#: ``messaging.system`` of every span.
SYSTEM = "django_fq"
#: The instrumentation scope name of the tracer.
SCOPE = "django_fq"
#: Values ``FQ_TRACING_PARENT`` takes: the ``process`` span is a child of the enqueuing context, or a new trace linked to it.
PARENT_MODES = ("child", "link")

# A carrier read back from metadata is untrusted (any client may write metadata): only this many
# string entries of at most this size reach the propagator. A W3C traceparent is 55 characters,
# a tracestate at most 32 entries of ~256, so honest values pass.
_CARRIER_MAX_ENTRIES = 8
_CARRIER_MAX_KEY = 64
_CARRIER_MAX_VALUE = 8192
# What the enqueue middleware writes is bounded tighter: it shares the metadata's size cap with the caller.
_INJECT_MAX_VALUE = 512
_INJECT_MAX_TOTAL = 1024
# Runs whose settle has not been seen yet, kept so the settle span can be their child. A run
# always settles (or is reported not settled); the cap only bounds what a bug could leak.
_MAX_OPEN_RUNS = 10_000

# Handler outcomes that mark the process span as an error (``ok``, and a snooze, do not).
_ERROR_OUTCOMES = frozenset({"failed", "permanent", "lost", "retry"})
_SETTLE_NAMES = {"acked": "ack", "nacked": "nack", "released": "release"}


def enabled() -> bool:
    """True when the setting ``FQ_TRACING`` is ``True`` (anything else, or unset, is off)."""
    return getattr(settings, "FQ_TRACING", False) is True


def parent_mode() -> str:
    """``FQ_TRACING_PARENT``: ``"child"`` (default) or ``"link"``.

    Raises:
        ImproperlyConfigured: any other value.
    """
    mode = getattr(settings, "FQ_TRACING_PARENT", "child")
    if mode not in PARENT_MODES:
        raise ImproperlyConfigured(
            f"FQ_TRACING_PARENT must be one of {', '.join(map(repr, PARENT_MODES))}, not {mode!r}"
        )
    return mode


def require() -> None:
    """Make sure the OpenTelemetry API can be imported.

    Raises:
        ImproperlyConfigured: ``opentelemetry-api`` is not installed (the message names the extra).
    """
    try:
        import opentelemetry.propagate
        import opentelemetry.trace  # noqa: F401
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"FQ_TRACING = True needs the OpenTelemetry API (pip install 'django-fq[otel]'): {exc}"
        ) from exc


def _tracer(tracer_provider=None):
    from opentelemetry import trace

    # Without a provider given: the global one's, a proxy until the project sets its TracerProvider.
    return trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)


def carrier_of(metadata: Any) -> dict[str, str]:
    """The propagation carrier stored in a job's ``metadata`` (a dict), cleaned; ``{}`` when there is none.

    ``metadata`` is untrusted: only ``str`` keys and values of bounded size
    (keys 64, values 8192 characters, 8 entries) under :data:`METADATA_KEY`
    are kept; anything else is ignored, never an error.
    """
    if not isinstance(metadata, dict):
        return {}
    raw = metadata.get(METADATA_KEY)
    if not isinstance(raw, dict):
        return {}
    carrier: dict[str, str] = {}
    for key, value in raw.items():
        if len(carrier) >= _CARRIER_MAX_ENTRIES:
            break
        if (
            isinstance(key, str)
            and isinstance(value, str)
            and len(key) <= _CARRIER_MAX_KEY
            and len(value) <= _CARRIER_MAX_VALUE
        ):
            carrier[key.lower()] = value
    return carrier


def producer_context(metadata: Any):
    """The enqueuing code's OpenTelemetry context read back from ``metadata``, or ``None``.

    ``None`` when there is no carrier, or when the propagator finds no valid
    span context in it (a malformed ``traceparent`` is ignored this way).
    Never raises.
    """
    carrier = carrier_of(metadata)
    if not carrier:
        return None
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context

    try:
        ctx = propagate.extract(carrier, context=Context())
    except Exception:  # noqa: BLE001 - a propagator must not crash a run over untrusted input
        return None
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def enqueue_middleware(request, call_next):
    """Enqueue middleware: a ``create <queue>`` producer span, whose context is put in the job's metadata.

    ``request.metadata`` gets ``{"otel": {"traceparent": ..., "tracestate": ...}}``
    (whatever the global propagator injects; a value already under ``"otel"``
    is replaced). When no SDK is set up the span is not recording and the
    caller's own context, if any, is injected instead, so a context that
    came in (an HTTP ``traceparent``) still travels. ``FQ_TRACING = True``
    puts it first in the enqueue chain; it passes the call through when
    tracing is off or the API is not installed.
    """
    if not enabled():
        return call_next(request)
    try:
        from opentelemetry import context, propagate, trace
    except ImportError:
        return call_next(request)
    queue = getattr(request, "queue", "")
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.destination.name": queue,
    }
    outer = context.get_current()
    with _tracer().start_as_current_span(
        f"create {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        injected: dict[str, str] = {}
        propagate.inject(injected, context=None if span.get_span_context().is_valid else outer)
        carrier = _bounded(injected)
        if carrier and isinstance(getattr(request, "metadata", None), dict):
            request.metadata[METADATA_KEY] = carrier
        result = call_next(request)
        job_id = getattr(result, "id", None)  # known when the chain's end is the insert itself
        if isinstance(job_id, str):
            span.set_attribute("messaging.message.id", job_id)
        return result


def _bounded(injected: dict[str, str]) -> dict[str, str]:
    """What of an injected carrier goes into the metadata: ``traceparent`` first, then the rest, within 1 KiB.

    The metadata has a size cap (``FQ_MAX_METADATA_BYTES``, 4 KiB by default)
    that the caller's own keys share: a large ``tracestate`` or baggage
    (values over 512 characters, or past 1,024 characters in all) is left
    out rather than making the enqueue fail.
    """
    carrier: dict[str, str] = {}
    used = 0
    for key in sorted(injected, key=lambda k: (k != "traceparent", k != "tracestate", k)):
        value = injected[key]
        if (
            not isinstance(value, str)
            or len(value) > _INJECT_MAX_VALUE
            or used + len(key) + len(value) > _INJECT_MAX_TOTAL
        ):
            continue
        carrier[key] = value
        used += len(key) + len(value)
    return carrier


class _Run:
    """One run being traced: its job context, its ``process`` span, the context token to detach, how far it got."""

    __slots__ = ("worker", "job", "span", "token", "finished", "settled")

    def __init__(self, worker, job, span, token):
        self.worker = worker
        self.job = job
        self.span = span
        self.token = token
        self.finished = False  # JobFinished seen: the handler returned or raised
        self.settled = False  # JobSettled seen (a release at shutdown may come while the handler still runs)


class TracingSubscriber:
    """A worker event subscriber (:mod:`django_fq.worker.events`) recording the worker's spans.

    ``fq_worker`` subscribes one when ``FQ_TRACING = True``; an embedded
    worker takes one with ``Worker(..., subscribers=[(s, *s.event_types)])``.
    Each event is handled on the thread that emits it. The ``process`` span
    of a run starts at its :class:`~django_fq.worker.events.JobStarted` (and
    is made current on the runner thread, so the handler's spans are its
    children) and ends at its settle (:class:`~django_fq.worker.events.JobSettled`,
    recorded as the span's ``settle`` event), so one span per run carries
    both how the handler ended and what the database made of the job. A run
    still open when the worker stops is ended then.

    Args:
        parent: ``"child"`` or ``"link"`` (see :func:`parent_mode`); default the ``FQ_TRACING_PARENT`` setting.
        tracer_provider: the OpenTelemetry ``TracerProvider`` to record with; default the global one.

    Raises:
        ImproperlyConfigured: the OpenTelemetry API is not installed, or ``parent`` is not a known mode.
    """

    def __init__(self, parent: str | None = None, tracer_provider: Any = None):
        require()
        from opentelemetry import context, trace
        from opentelemetry.context import Context

        self.parent = parent_mode() if parent is None else parent
        if self.parent not in PARENT_MODES:
            raise ImproperlyConfigured(
                f"parent must be one of {', '.join(map(repr, PARENT_MODES))}, not {self.parent!r}"
            )
        self._trace = trace
        self._context = context
        self._empty = Context
        self._tracer = _tracer(tracer_provider)
        self._lock = threading.Lock()
        self._runs: dict[int, _Run] = {}
        from .worker.events import JobFinished, JobsClaimed, JobSettled, JobStarted, LeaseLostEvent, WorkerStopped

        self._handlers = {
            JobsClaimed: self._claimed,
            JobStarted: self._started,
            JobFinished: self._finished,
            JobSettled: self._settled,
            LeaseLostEvent: self._lost,
            WorkerStopped: self._stopped,
        }

    @property
    def event_types(self) -> tuple[type, ...]:
        """The event types this subscriber takes (subscribe it to these only: the others are not even built)."""
        return tuple(self._handlers)

    def __call__(self, event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _claimed(self, event) -> None:
        if not event.got:
            return  # an empty poll is not worth a trace of its own
        end = time.time_ns()
        span = self._tracer.start_span(
            f"receive {event.queue}",
            context=self._empty(),
            kind=self._trace.SpanKind.CLIENT,
            start_time=end - int(event.ms * 1_000_000),
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "receive",
                "messaging.operation.name": "claim",
                "messaging.destination.name": event.queue,
                "messaging.client.id": event.worker.worker_id,
                "messaging.batch.message_count": event.got,
                "django_fq.claim.asked": event.asked,
            },
        )
        span.end(end_time=end)

    def _started(self, event) -> None:
        job = event.job
        trace = self._trace
        producer = producer_context(getattr(job, "metadata", None))
        links = []
        parent = self._empty()
        if producer is not None:
            links.append(trace.Link(trace.get_current_span(producer).get_span_context()))
            if self.parent == "child":
                parent = producer
        span = self._tracer.start_span(
            f"process {job.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id,
                "messaging.client.id": event.worker.worker_id,
                "django_fq.job.attempt": job.attempts,
                "django_fq.job.max_attempts": job.max_attempts,
                "django_fq.job.wait_ms": event.wait_ms,
            },
            links=links,
        )
        token = self._context.attach(trace.set_span_in_context(span, parent))
        evicted = None
        with self._lock:
            if len(self._runs) >= _MAX_OPEN_RUNS:
                evicted = self._runs.pop(next(iter(self._runs)))
            self._runs[id(job)] = _Run(event.worker, job, span, token)
        if evicted is not None:
            evicted.span.end()

    def _run_of(self, job, pop: bool = False) -> _Run | None:
        with self._lock:
            run = self._runs.get(id(job))
            if run is None or run.job is not job:
                return None
            if pop:
                del self._runs[id(job)]
            return run

    def _mark(self, run: _Run, *, finished: bool = False, settled: bool = False) -> bool:
        """Record that ``run`` finished or settled; True (and forget it) once both happened: end its span then.

        Under the lock: a release at shutdown (main thread) may race the handler's end (runner thread).
        """
        with self._lock:
            run.finished = run.finished or finished
            run.settled = run.settled or settled
            done = run.finished and run.settled
            if done and self._runs.get(id(run.job)) is run:
                del self._runs[id(run.job)]
            return done

    def _finished(self, event) -> None:
        run = self._run_of(event.job)
        if run is None:
            return
        if run.token is not None:
            self._context.detach(run.token)
            run.token = None
        span = run.span
        span.set_attribute("django_fq.job.outcome", event.outcome)
        span.set_attribute("django_fq.job.run_ms", event.run_ms)
        if event.outcome in _ERROR_OUTCOMES:
            kind = event.error.partition(":")[0] if event.outcome != "lost" else "LeaseLost"
            span.set_attribute("error.type", kind or event.outcome)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, event.error or event.outcome))
        if self._mark(run, finished=True):  # settled already: released at shutdown while the handler still ran
            span.end()

    def _lost(self, event) -> None:
        run = self._run_of(event.job)
        if run is not None and not run.settled:
            run.span.add_event("lease_lost", {"django_fq.lease.lost_reason": event.reason})

    def _settled(self, event) -> None:
        job = event.job
        run = self._run_of(job)
        attributes: dict[str, Any] = {
            "django_fq.settle.result": event.result,
            "django_fq.settle.ms": round(event.ms, 3),
        }
        if event.state:
            attributes["django_fq.job.state"] = event.state
        if event.reason:
            attributes["django_fq.settle.reason"] = event.reason
        if run is None:
            self._settled_alone(event, attributes)
            return
        span = run.span
        span.add_event(_SETTLE_NAMES.get(event.result, "settle"), attributes)
        span.set_attributes(attributes)
        if event.result == "not_settled":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, f"not settled: {event.reason}"))
        if self._mark(run, settled=True):
            span.end()

    def _settled_alone(self, event, attributes: dict[str, Any]) -> None:
        """A settle with no run traced here: a job claimed ahead and released at shutdown before it started."""
        job = event.job
        trace = self._trace
        producer = producer_context(getattr(job, "metadata", None))
        name = _SETTLE_NAMES.get(event.result, "settle")
        end = time.time_ns()
        span = self._tracer.start_span(
            f"{name} {job.queue}",
            context=producer if producer is not None and self.parent == "child" else self._empty(),
            kind=trace.SpanKind.CLIENT,
            start_time=end - int(event.ms * 1_000_000),
            links=[trace.Link(trace.get_current_span(producer).get_span_context())] if producer is not None else [],
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "settle",
                "messaging.operation.name": name,
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id,
                "messaging.client.id": event.worker.worker_id,
                "django_fq.job.attempt": job.attempts,
                **attributes,
            },
        )
        span.end(end_time=end)

    def _stopped(self, event) -> None:
        """End the spans of runs the worker never reported settled (an internal error), so none is lost."""
        with self._lock:
            left = [r for r in self._runs.values() if r.worker is event.worker]
            for run in left:
                del self._runs[id(run.job)]
        for run in left:
            run.span.set_status(
                self._trace.Status(self._trace.StatusCode.ERROR, "the worker stopped before it settled the job")
            )
            run.span.end()


def worker_subscribers() -> list:
    """The subscribers ``fq_worker`` adds for tracing: ``[(TracingSubscriber, *types)]``, or ``[]`` when ``FQ_TRACING`` is off.

    Raises:
        ImproperlyConfigured: tracing is on and the OpenTelemetry API is missing, or ``FQ_TRACING_PARENT`` is bad.
    """
    if not enabled():
        return []
    subscriber = TracingSubscriber()
    return [(subscriber, *subscriber.event_types)]
