"""Settings of a worker child process started by a test: the test settings, on the parent's test database.

``tests.settings`` names the SQLite file after the process id, and the test
database of PostgreSQL is only known to the parent, so the parent passes its
database name in ``FQ_CHILD_DB_NAME`` (and may shift the database clock with
``FQ_CHILD_CLOCK_OFFSET_MS``, as the ``clock`` fixture does in-process).
"""

import copy
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _BASE

DATABASES = copy.deepcopy(_BASE)
if os.environ.get("FQ_CHILD_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["FQ_CHILD_DB_NAME"]
    DATABASES["default"]["TEST"] = {"NAME": os.environ["FQ_CHILD_DB_NAME"]}
    if "direct" in DATABASES:  # the LISTEN alias behind a pooler (tests/settings.py): same database
        DATABASES["direct"]["NAME"] = os.environ["FQ_CHILD_DB_NAME"]

FQ_TEST_CLOCK_OFFSET_MS = int(os.environ.get("FQ_CHILD_CLOCK_OFFSET_MS", "0"))

# A worker test may shorten SQLite's busy timeout (seconds) to see "database is locked" errors quickly.
if os.environ.get("FQ_CHILD_SQLITE_TIMEOUT") and DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = float(os.environ["FQ_CHILD_SQLITE_TIMEOUT"])

# A worker registry test beats often (django_fq.worker.presence), so a killed worker is gone in a second.
if os.environ.get("FQ_CHILD_WORKER_HEARTBEAT_MS"):
    FQ_WORKER_HEARTBEAT_MS = int(os.environ["FQ_CHILD_WORKER_HEARTBEAT_MS"])
