"""django_fq.tracing in-process: the subscriber on a real Worker thread, the parent modes, untrusted carriers, the missing package."""

from __future__ import annotations

import sys
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_fq import services as fq
from django_fq import tracing
from django_fq.worker import JobFinished, JobSettled, JobStarted, Worker
from tests.worker.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.otel.inproc"


@pytest.fixture
def recorded():
    """A TracerProvider of this test only (not the global one) and its in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def traced_worker(provider, handler, **kwargs) -> Worker:
    subscriber = tracing.TracingSubscriber(tracer_provider=provider, parent=kwargs.pop("parent", None))
    return Worker(
        [Q],
        handlers={Q: handler},
        poll_interval_ms=10,
        reaper=False,
        subscribers=[(subscriber, *subscriber.event_types)],
        **kwargs,
    )


def spans_named(exporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_a_lost_lease_is_an_event_of_the_run_span_and_its_settle_says_not_settled(recorded):
    provider, exporter = recorded
    running = threading.Event()

    def handler(job):
        running.set()
        while True:
            job.sleep(0.02)  # LeaseLost once the heartbeat sees the cancellation

    job = fq.enqueue(Q, {}).id
    worker = traced_worker(provider, handler, visibility_ms=300, burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert running.wait(30)
    fq.cancel(Q, job)
    thread.join(60)
    assert not thread.is_alive()

    [run] = spans_named(exporter, f"process {Q}")
    assert run.attributes["django_fq.job.outcome"] == "lost" and run.attributes["error.type"] == "LeaseLost"
    assert run.status.status_code is trace.StatusCode.ERROR
    assert run.status.description == "not settled: lease_lost:cancelled"
    # The heartbeat may see the loss before the handler ends (an event on the span) or after it.
    events = [e.name for e in run.events]
    assert events in (["lease_lost", "settle"], ["settle"]), events
    settle = run.events[-1].attributes
    assert settle["django_fq.settle.result"] == run.attributes["django_fq.settle.result"] == "not_settled"
    assert settle["django_fq.settle.reason"] == "lease_lost:cancelled"
    assert spans_named(exporter, "settle") == []  # the settle is the run span's event, not a span


def test_jobs_given_back_at_shutdown_end_their_run_span_or_get_a_release_span(recorded):
    provider, exporter = recorded
    started = threading.Event()

    def handler(job):
        started.set()
        job.sleep(30)  # until the worker's stop releases it (LeaseLost "shutdown")

    first = fq.enqueue(Q, {}).id
    ahead = fq.enqueue(Q, {}).id  # claimed ahead (prefetch) and never started
    worker = traced_worker(provider, handler, grace_s=0, concurrency=1, prefetch=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(30)
    wait_until(lambda: worker.running_count == 2, what="the second job claimed ahead")
    worker.request_stop("test over")
    thread.join(60)
    assert not thread.is_alive()

    [run] = spans_named(exporter, f"process {Q}")
    assert run.attributes["messaging.message.id"] == first
    assert (run.attributes["django_fq.settle.result"], run.attributes["django_fq.job.state"]) == ("released", "ready")
    assert run.attributes["django_fq.settle.reason"] == "shutdown" and "release" in [e.name for e in run.events]
    [release] = spans_named(exporter, f"release {Q}")
    assert release.attributes["messaging.message.id"] == ahead and release.parent is None
    assert release.attributes["django_fq.settle.result"] == "released"
    assert fq.get(Q, first).state == fq.get(Q, ahead).state == "ready"


def test_the_run_span_is_current_in_the_handler(recorded):
    provider, exporter = recorded
    seen = {}

    def handler(job):
        seen["span"] = trace.get_current_span().get_span_context()

    fq.enqueue(Q, {})
    traced_worker(provider, handler, burst=True).run()
    [run] = spans_named(exporter, f"process {Q}")
    assert seen["span"].span_id == run.context.span_id
    assert not trace.get_current_span().get_span_context().is_valid  # nothing left attached on this thread


@pytest.mark.parametrize(
    "otel",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # a string, not a carrier
        {"traceparent": "00-zzzz651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},  # the invalid all-zero trace id
        {"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},  # the forbidden version ff
        {"traceparent": 42, "tracestate": ["a"]},
        {"traceparent": "00-" + "a" * 100_000},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x00"},
        None,
    ],
)
def test_a_malformed_carrier_gives_no_producer_context_and_never_raises(otel):
    assert tracing.producer_context({"otel": otel}) is None


def test_a_carrier_keeps_only_bounded_strings():
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    carrier = tracing.carrier_of({"otel": {"traceparent": good, 1: "x", "tracestate": "x" * 9000, "big" * 30: "y"}})
    assert carrier == {"traceparent": good}
    assert tracing.carrier_of(["otel"]) == {} and tracing.carrier_of(None) == {}
    ctx = tracing.producer_context({"otel": {"TraceParent": good}})
    assert format(trace.get_current_span(ctx).get_span_context().trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"


def test_off_by_default_no_subscriber_and_the_worker_builds_no_event(settings):
    assert tracing.worker_subscribers() == []
    settings.FQ_TRACING = "yes"  # only True switches it on
    assert tracing.worker_subscribers() == []
    worker = Worker([Q], handlers={Q: lambda job: None})
    assert not any(worker.events.wants(t) for t in (JobStarted, JobFinished, JobSettled))
    settings.FQ_TRACING = True
    [(subscriber, *types)] = tracing.worker_subscribers()
    assert isinstance(subscriber, tracing.TracingSubscriber) and JobSettled in types


def test_a_bad_parent_mode_is_refused(settings):
    settings.FQ_TRACING = True
    settings.FQ_TRACING_PARENT = "sibling"
    with pytest.raises(ImproperlyConfigured, match="FQ_TRACING_PARENT must be one of 'child', 'link', not 'sibling'"):
        tracing.worker_subscribers()


def test_tracing_on_without_the_package_is_a_clear_error(settings, monkeypatch):
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import opentelemetry… raises ImportError
    settings.FQ_TRACING = True
    with pytest.raises(ImproperlyConfigured, match=r"pip install 'django-fq\[otel\]'"):
        tracing.TracingSubscriber()
    with pytest.raises(
        CommandError, match=r"FQ_TRACING = True needs the OpenTelemetry API \(pip install 'django-fq\[otel\]'\)"
    ):
        call_command("fq_worker", "--queue=t.ok", "--burst")
    settings.FQ_TRACING = False
    assert tracing.worker_subscribers() == []  # off: the package is never imported


def test_the_system_check_reports_what_fq_worker_would_refuse(settings, monkeypatch):
    from django_fq.checks import check_tracing

    assert check_tracing() == []
    settings.FQ_TRACING = True
    assert check_tracing() == []
    settings.FQ_TRACING_PARENT = "both"
    [error] = check_tracing()
    assert error.id == "django_fq.E040" and "FQ_TRACING_PARENT must be one of" in error.msg
    settings.FQ_TRACING_PARENT = "link"
    monkeypatch.setitem(sys.modules, "opentelemetry.propagate", None)
    [error] = check_tracing()
    assert error.id == "django_fq.E040" and "pip install 'django-fq[otel]'" in error.msg


def test_the_enqueue_middleware_runs_only_with_tracing_on_and_only_once(settings, producer_spans):
    job = fq.enqueue(Q, {}, metadata={"k": "v"}).id
    assert fq.get(Q, job).metadata == {"k": "v"} and producer_spans.get_finished_spans() == ()  # off: nothing added

    settings.FQ_TRACING = True
    job = fq.enqueue(Q, {}, metadata={"k": "v", "otel": {"traceparent": "forged"}}).id
    stored = fq.get(Q, job).metadata
    [create] = producer_spans.get_finished_spans()
    assert stored["k"] == "v" and stored["otel"]["traceparent"].startswith(f"00-{create.context.trace_id:032x}-")
    assert create.name == f"create {Q}" and create.parent is None  # no span was current: a root

    # Listed by the project itself: it runs where listed, not a second time first.
    settings.FQ_ENQUEUE_MIDDLEWARE = ["django_fq.tracing.enqueue_middleware"]
    producer_spans.clear()
    fq.enqueue(Q, {})
    assert len(producer_spans.get_finished_spans()) == 1


def test_what_the_middleware_injects_is_bounded_traceparent_first():
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    # baggage: over 512 characters; x-more: would pass 1,024 in all.
    injected = {"baggage": "b" * 600, "tracestate": "t" * 500, "traceparent": parent, "x-more": "m" * 480, "y": "1"}
    assert tracing._bounded(injected) == {"traceparent": parent, "tracestate": "t" * 500, "y": "1"}
    assert list(tracing._bounded({"tracestate": "a=1", "traceparent": parent})) == ["traceparent", "tracestate"]
