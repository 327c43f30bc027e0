"""Handlers of the tracing tests (queue ``t.otel``): what ``payload["kind"]`` says, inside a span of their own."""

from opentelemetry import trace

from django_fq.exceptions import PermanentFailure
from django_fq.handlers import handler


@handler("t.otel")
def traced(job):
    """Open an ``inner`` span (a child of the run's span), then return, fail or fail for good."""
    with trace.get_tracer("tests.otel").start_as_current_span("inner", attributes={"job": job.id}):
        kind = job.payload.get("kind", "ok")
        if kind == "fail":
            raise RuntimeError(f"boom on attempt {job.attempts}")
        if kind == "perm":
            raise PermanentFailure("never")
        if kind == "fail_once" and job.attempts == 1:
            raise RuntimeError("first attempt fails")
        return {"ok": True}
