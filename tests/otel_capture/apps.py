import os

from django.apps import AppConfig


class OtelCaptureConfig(AppConfig):
    """Installs the capturing TracerProvider once Django is ready, when ``FQ_TEST_SPANS_FILE`` is set."""

    name = "tests.otel_capture"
    label = "otel_capture"

    def ready(self) -> None:
        path = os.environ.get("FQ_TEST_SPANS_FILE")
        if path:
            from .exporter import install

            install(path)
