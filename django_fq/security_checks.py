"""System checks for settings that make a django-fq deployment unsafe (see ``docs/security.md``).

=================  ========  ===========================================================
id                 tag       meaning
=================  ========  ===========================================================
django_fq.E020     (always)  an ``FQ_API_*`` size or count setting is not a positive
                             integer: every request of the REST API would fail with a 500;
                             or ``FQ_API_CREATE_QUEUES`` is not ``"manage"``/``"produce"``
django_fq.W010     deploy    ``DEBUG`` is on while the REST API is mounted: error pages
                             show the local variables of every frame (receipts, payloads)
                             and every SQL statement is kept with its parameters
django_fq.W011     deploy    ``FQ_API_PERMISSION_CLASSES`` lets anonymous callers in (empty,
                             or nothing but ``AllowAny`` / ``IsAuthenticatedOrReadOnly``)
django_fq.W012     deploy    ``FQ_MAX_PAYLOAD_BYTES`` is above 8 MiB: every request, claim
                             and job row may hold that much in memory
django_fq.W013     deploy    ``FQ_TEST_CLOCK_OFFSET_MS`` is set: a test-only setting that
                             moves every deadline
=================  ========  ===========================================================

The ``deploy`` checks run with ``manage.py check --deploy``. ``fq_worker``
also runs the database checks of ``FQ_DATABASE`` when it starts, so a
SQLite file database without WAL (``django_fq.E004``) stops a worker as it
stops ``migrate``.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.utils.module_loading import import_string

from . import conf

#: ``FQ_MAX_PAYLOAD_BYTES`` above this draws ``django_fq.W012`` (8 MiB).
LARGE_PAYLOAD_BYTES = 8 * 1024 * 1024
#: ``FQ_API_*`` settings that must be positive integers when set (``django_fq.E020``).
API_INT_SETTINGS = (
    "FQ_API_MAX_BODY_BYTES",
    "FQ_API_MAX_BULK_BODY_BYTES",
    "FQ_API_MAX_BULK_JOBS",
    "FQ_API_MAX_BODY_VALUES",
    "FQ_API_LONG_POLL_RECHECK_MS",
)
#: DRF permission classes that admit anonymous callers (to some or all requests).
_OPEN_PERMISSIONS = {
    "rest_framework.permissions.AllowAny",
    "rest_framework.permissions.IsAuthenticatedOrReadOnly",
}


@register()
def check_api_settings(app_configs=None, **kwargs):
    """``django_fq.E020``: the REST API's size and count settings are positive integers."""
    errors = []
    for name in API_INT_SETTINGS:
        if not hasattr(settings, name):
            continue
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(
                    f"{name} must be a positive integer, not {value!r}.",
                    hint="Every request of the django-fq REST API reads it; remove it to use the default.",
                    id="django_fq.E020",
                )
            )
    if hasattr(settings, "FQ_API_CREATE_QUEUES"):
        from .api.conf import CREATE_QUEUES_CHOICES

        value = getattr(settings, "FQ_API_CREATE_QUEUES", None)
        if value not in CREATE_QUEUES_CHOICES:
            errors.append(
                Error(
                    f'FQ_API_CREATE_QUEUES must be "manage" or "produce", not {value!r}.',
                    hint="It names the capability a REST user needs to create a queue by enqueueing to it; "
                    'until it is fixed "manage" applies.',
                    id="django_fq.E020",
                )
            )
    return errors


@register(Tags.security, deploy=True)
def check_deployment(app_configs=None, **kwargs):
    """``django_fq.W010``–``W013``: settings that are fine in development and unsafe in production."""
    warnings = []
    if settings.DEBUG and api_is_mounted():
        warnings.append(
            Warning(
                "DEBUG is on while the django-fq REST API is mounted.",
                hint="With DEBUG, error pages show the local variables of every frame (receipts and payloads "
                "included: Django's error-report filter is off) and every SQL statement is kept and logged "
                "with its parameters. Set DEBUG = False in production.",
                id="django_fq.W010",
            )
        )
    opened = _open_permission_classes()
    if opened is not None:
        warnings.append(
            Warning(
                f"FQ_API_PERMISSION_CLASSES lets anonymous callers in ({opened}).",
                hint="Anyone who can reach the API could enqueue, claim, settle or delete jobs, or read them. "
                "Remove the setting (the default requires the produce/consume/manage permissions) or list "
                "a class that checks them.",
                id="django_fq.W011",
            )
        )
    size = conf.get("FQ_MAX_PAYLOAD_BYTES")
    if isinstance(size, int) and not isinstance(size, bool) and size > LARGE_PAYLOAD_BYTES:
        warnings.append(
            Warning(
                f"FQ_MAX_PAYLOAD_BYTES is {size} bytes (above 8 MiB).",
                hint="Each payload lives in its job row and is read whole by every claim (up to 32 MiB per "
                "claim), and a REST request body may be three times the limit. Keep payloads small and "
                "store large data elsewhere, passing a reference.",
                id="django_fq.W012",
            )
        )
    if conf.get("FQ_TEST_CLOCK_OFFSET_MS"):
        warnings.append(
            Warning(
                "FQ_TEST_CLOCK_OFFSET_MS is set.",
                hint="It shifts the database clock of every deadline and schedule; it is for tests only. Remove it.",
                id="django_fq.W013",
            )
        )
    return warnings


def api_is_mounted(urlconf=None) -> bool:
    """Whether any URL pattern of ``urlconf`` (default: ``ROOT_URLCONF``) serves a django-fq REST API view."""
    try:
        from django.urls import URLPattern, URLResolver, get_resolver

        from .api.views import FqAPIView
    except ImportError:  # Django REST framework is not installed: no API
        return False
    try:
        patterns = list(get_resolver(urlconf).url_patterns)
    except Exception:  # noqa: BLE001 - a broken URLconf is reported by Django's own checks
        return False
    while patterns:
        pattern = patterns.pop()
        if isinstance(pattern, URLResolver):
            try:
                patterns.extend(pattern.url_patterns)
            except Exception:  # noqa: BLE001 - as above
                continue
        elif isinstance(pattern, URLPattern):
            view = getattr(pattern.callback, "view_class", None)
            if isinstance(view, type) and issubclass(view, FqAPIView):
                return True
    return False


def _open_permission_classes() -> str | None:
    """The dotted names of ``FQ_API_PERMISSION_CLASSES`` when they admit anonymous callers, else ``None``."""
    value = getattr(settings, "FQ_API_PERMISSION_CLASSES", None)
    if value is None:
        return None  # the default: HasQueuePermission
    if not value:
        return "an empty list: no permission is checked"
    names = []
    for item in value:
        cls = item
        if isinstance(item, str):
            try:
                cls = import_string(item)
            except ImportError:
                return None  # reported when a request imports it; not this check's business
        names.append(f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', repr(cls))}")
    if all(name in _OPEN_PERMISSIONS for name in names):
        return ", ".join(names)
    return None
