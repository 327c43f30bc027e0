"""App config: registers the system checks (handlers are discovered by ``fq_worker``)."""

from django.apps import AppConfig
from django.conf import settings
from django.core.signals import setting_changed


def _inline_setting_changed(*, setting: str, **kwargs) -> None:
    """``FQ_INLINE`` changed (``override_settings``, pytest-django's ``settings``): the inline mode follows it."""
    if setting == "FQ_INLINE":
        from .testing.inline_mode import apply_setting

        apply_setting()


class FqConfig(AppConfig):
    """The ``django_fq`` app."""

    name = "django_fq"
    verbose_name = "Job queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, scheduler, security_checks  # noqa: F401  (register the system checks)

        setting_changed.connect(_inline_setting_changed, dispatch_uid="django_fq.inline_setting")
        if getattr(settings, "FQ_INLINE", False):
            # Test settings only (docs/how-to/testing.md); production never imports the test helpers.
            from .testing.inline_mode import apply_setting

            apply_setting()
