"""App config: registers the system checks (handlers are discovered by ``fq_worker``)."""

from django.apps import AppConfig


class FqConfig(AppConfig):
    """The ``django_fq`` app."""

    name = "django_fq"
    verbose_name = "Job queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, scheduler, security_checks  # noqa: F401  (register the system checks)
