"""Settings of the chaos processes: the worker test settings plus this package's handlers.

The database is chosen like the worker tests' (``FQ_TEST_DB``, ``FQ_CHILD_DB_NAME``);
``FQ_TEST_PG_HOST``/``FQ_TEST_PG_PORT`` let a worker in a network namespace reach
PostgreSQL through the partition scenario's forwarder.
"""

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.chaos"]

import os as _os  # noqa: E402

# FQ_CHAOS_SYNC_SETTLE=1: claims and acks wait for the WAL flush (and a synchronous standby) like enqueues.
FQ_SYNCHRONOUS_SETTLE = _os.environ.get("FQ_CHAOS_SYNC_SETTLE") == "1"
