"""Test-only app: an OpenTelemetry SDK with an in-memory exporter inside a worker child, spans copied to a file.

A test starts a worker child with ``DJANGO_SETTINGS_MODULE=tests.tracing_settings``
and ``FQ_TEST_SPANS_FILE=/path``; :class:`~tests.otel_capture.apps.OtelCaptureConfig`
sets the process's TracerProvider with a :class:`FileCopyExporter` (the SDK's
:class:`InMemorySpanExporter` that also appends each finished span to that
file as a JSON line), which the test reads. Production settings never name it.
"""
