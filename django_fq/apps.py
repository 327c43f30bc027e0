"""App config: registers the system checks and autodiscovers ``fq_handlers`` modules."""

from django.apps import AppConfig


class FqConfig(AppConfig):
    """The ``django_fq`` app."""

    name = "django_fq"
    verbose_name = "Job queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, scheduler  # noqa: F401  (register the system checks)
