"""Settings of a traced worker child: :mod:`tests.worker_settings` plus :mod:`tests.otel_capture`, ``FQ_TRACING`` on.

``FQ_TEST_TRACING=0`` keeps the capturing app (and its handlers) but leaves
tracing off, for the test that a worker without it records nothing;
``FQ_TEST_TRACING_PARENT`` sets ``FQ_TRACING_PARENT``.
"""

import os

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.otel_capture"]
FQ_TRACING = os.environ.get("FQ_TEST_TRACING", "1") == "1"
if os.environ.get("FQ_TEST_TRACING_PARENT"):
    FQ_TRACING_PARENT = os.environ["FQ_TEST_TRACING_PARENT"]
