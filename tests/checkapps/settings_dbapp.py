"""The test settings plus ``dbapp`` (its handler module reads a table at import), on the file ``FQ_CHECKAPP_DB``."""

import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.checkapps.dbapp"]  # noqa: F405
DATABASES["default"]["NAME"] = os.environ["FQ_CHECKAPP_DB"]  # noqa: F405
