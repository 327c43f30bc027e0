"""The test process's own TracerProvider (the global one, set once) for the spans of the enqueuing side."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


@pytest.fixture
def producer_spans() -> InMemorySpanExporter:
    """The in-memory exporter of this process's global TracerProvider (installed on first use), emptied."""
    global _exporter
    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)  # once per process: the API refuses a second one
    _exporter.clear()
    return _exporter
