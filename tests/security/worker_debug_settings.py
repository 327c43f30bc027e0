"""Settings of a worker child in the security tests: the worker tests' settings with every log line on stderr.

``DEBUG = True`` makes Django log each SQL statement with its parameters on
``django.db.backends``; the root logger and every logger below it write
DEBUG and up to stderr, which the test then searches for receipt secrets.
"""

from tests.worker_settings import *  # noqa: F403

DEBUG = True
LOGGING_CONFIG = "logging.config.dictConfig"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "level": "DEBUG"}},
    "root": {"handlers": ["stderr"], "level": "DEBUG"},
    "loggers": {
        "django": {"level": "DEBUG"},
        "django.db.backends": {"level": "DEBUG"},
        "django_fq": {"level": "DEBUG"},
    },
}
