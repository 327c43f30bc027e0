"""The test settings with a django-fq ``TASKS`` backend but without ``django_fq`` in ``INSTALLED_APPS``."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_fq"] + ["tests.checkapps.taskapp"]  # noqa: F405
TASKS = {"default": {"BACKEND": "django_fq.tasks.FqBackend", "QUEUES": ["default"]}}
