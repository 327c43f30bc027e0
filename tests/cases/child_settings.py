"""Settings for the case tests' child processes.

``tests.settings`` names the SQLite file after the current pid, so a child
would open a database of its own. The parent passes the name of its *test*
database (and its clock offset, if any) through the environment instead.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

_name = os.environ["FQ_CHILD_DB_NAME"]
DATABASES["default"]["NAME"] = _name
DATABASES["default"]["TEST"] = {**DATABASES["default"].get("TEST", {}), "NAME": _name}

FQ_TEST_CLOCK_OFFSET_MS = int(os.environ.get("FQ_CHILD_CLOCK_OFFSET_MS", "0"))
