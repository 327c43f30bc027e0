"""The test settings plus ``typoapp`` (its handler module raises a NameError at import)."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.checkapps.typoapp"]  # noqa: F405
