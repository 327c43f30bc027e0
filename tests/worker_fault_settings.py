"""Settings of a worker child process with injected faults: :mod:`tests.worker_settings` plus :mod:`tests.worker_faults`.

Start the child with ``DJANGO_SETTINGS_MODULE=tests.worker_fault_settings``
and ``FQ_TEST_WORKER_FAULTS=ack_before=1`` (say); production settings never
name that app, so production code never sees a fault.
"""

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.worker_faults"]
