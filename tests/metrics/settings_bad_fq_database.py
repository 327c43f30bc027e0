"""``tests.worker_settings`` with ``FQ_DATABASE`` naming an alias that ``DATABASES`` lacks (a typo)."""

from tests.worker_settings import *  # noqa: F403

FQ_DATABASE = "queue"  # not in DATABASES
