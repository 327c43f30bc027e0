"""The capturing exporter of the worker child (see the package docstring) and the reader of its file."""

from __future__ import annotations

import json
import threading
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def as_record(span) -> dict:
    """A finished SDK span as plain JSON: ids in hex, attributes, links, events, status."""
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "parent": format(span.parent.span_id, "016x") if span.parent is not None else None,
        "parent_trace": format(span.parent.trace_id, "032x") if span.parent is not None else None,
        "links": [
            {"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x")}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "start": span.start_time,
        "end": span.end_time,
    }


class FileCopyExporter(InMemorySpanExporter):
    """The SDK's in-memory exporter that also appends each exported span to ``path`` (one JSON line, flushed)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self._file_lock = threading.Lock()

    def export(self, spans):
        result = super().export(spans)
        lines = "".join(json.dumps(as_record(s), sort_keys=True) + "\n" for s in spans)
        with self._file_lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(lines)
        return result if result is not None else SpanExportResult.SUCCESS


def install(path: str) -> FileCopyExporter:
    """Make a TracerProvider exporting through a :class:`FileCopyExporter` on ``path`` this process's provider."""
    exporter = FileCopyExporter(path)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def read(path) -> list[dict]:
    """The span records written to ``path`` so far (complete lines only)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_for(path, predicate, timeout: float = 60.0) -> list[dict]:
    """Poll ``path`` until ``predicate(records)`` is true; return the records (AssertionError after ``timeout``)."""
    give_up = time.monotonic() + timeout
    while True:
        records = read(path)
        if predicate(records):
            return records
        if time.monotonic() > give_up:
            raise AssertionError(f"waited {timeout}s for spans; have {[r['name'] for r in records]}")
        time.sleep(0.02)
