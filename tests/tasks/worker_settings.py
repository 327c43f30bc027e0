"""Settings of an ``fq_worker`` child started by the Tasks tests: the worker test settings plus ``TASKS``."""

from tests.tasks.config import TEST_TASKS
from tests.worker_settings import *  # noqa: F403

TASKS = TEST_TASKS
