"""Settings with a ``TASKS`` entry django-fq's backend refuses (an unknown ``OPTIONS`` key): see ``test_checks.py``."""

from tests.settings import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django_fq.tasks.FqBackend", "QUEUES": ["default"], "OPTIONS": {"bogus": 1}}}
