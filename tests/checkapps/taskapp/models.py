"""No models; importing the tasks here builds the ``TASKS`` backend during ``django.setup()``."""

from . import tasks  # noqa: F401
