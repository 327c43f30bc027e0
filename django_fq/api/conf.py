"""Settings of the REST API (``FQ_API_*``), read from ``django.conf.settings`` on each use.

Nothing is read at import time, so ``override_settings`` works in tests and
the URL conf can be imported before the settings are final.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string
from rest_framework.settings import api_settings

from .. import conf

KIB = 1024
MIB = 1024 * KIB
#: Room for everything in a request body besides the payload (options, receipt, result, whitespace).
ENVELOPE_OVERHEAD_BYTES = 64 * KIB
#: A body may encode the payload less compactly than django-fq measures it: ``\\uXXXX``
#: escapes (6 bytes for a 2-byte UTF-8 character) and whitespace. Three times the
#: payload limit admits any ``ensure_ascii`` encoding of a payload within the limit.
ESCAPE_FACTOR = 3
DEFAULT_PERMISSION_CLASSES = ("django_fq.api.permissions.HasQueuePermission",)


def _classes(value) -> list:
    return [import_string(v) if isinstance(v, str) else v for v in value]


def authentication_classes() -> list:
    """``FQ_API_AUTHENTICATION_CLASSES``, else DRF's ``DEFAULT_AUTHENTICATION_CLASSES``."""
    value = getattr(settings, "FQ_API_AUTHENTICATION_CLASSES", None)
    if value is None:
        return list(api_settings.DEFAULT_AUTHENTICATION_CLASSES)
    return _classes(value)


def permission_classes() -> list:
    """``FQ_API_PERMISSION_CLASSES`` (default: :class:`~django_fq.api.permissions.HasQueuePermission`)."""
    value = getattr(settings, "FQ_API_PERMISSION_CLASSES", None)
    return _classes(DEFAULT_PERMISSION_CLASSES if value is None else value)


def max_body_bytes() -> int:
    """Largest request body accepted by every endpoint except bulk enqueue."""
    value = getattr(settings, "FQ_API_MAX_BODY_BYTES", None)
    if value is None:
        return ESCAPE_FACTOR * conf.max_payload_bytes() + ENVELOPE_OVERHEAD_BYTES
    return int(value)


def max_bulk_body_bytes() -> int:
    """Largest bulk enqueue body (never below :func:`max_body_bytes`)."""
    value = getattr(settings, "FQ_API_MAX_BULK_BODY_BYTES", None)
    return max(32 * MIB if value is None else int(value), max_body_bytes())


#: Default of ``FQ_API_MAX_BODY_VALUES``: a million JSON values cost about 100 MB while
#: decoded, whatever their bytes (docs/rest-api.md, "Limits").
DEFAULT_MAX_BODY_VALUES = 1_000_000


def max_body_values() -> int:
    """Most JSON values (array items and object members, at any depth) one request body may hold."""
    return int(getattr(settings, "FQ_API_MAX_BODY_VALUES", DEFAULT_MAX_BODY_VALUES))


def max_bulk_jobs() -> int:
    """Most envelopes one bulk enqueue takes."""
    return int(getattr(settings, "FQ_API_MAX_BULK_JOBS", 1000))


def long_poll_recheck_s() -> float:
    """Seconds between looks of a waiting claim on PostgreSQL when no notification arrives."""
    return max(1, int(getattr(settings, "FQ_API_LONG_POLL_RECHECK_MS", 1000))) / 1000


#: Values of ``FQ_API_CREATE_QUEUES``: the capability a user needs to create a queue by enqueueing to it.
CREATE_QUEUES_CHOICES = ("manage", "produce")


def create_queues() -> str:
    """``FQ_API_CREATE_QUEUES``: ``"manage"`` (default) or ``"produce"``.

    The capability (on that queue) a REST user needs for an enqueue into a
    queue that does not exist to create it; without it the enqueue answers 404
    ``queue_not_found`` and writes nothing. An unknown value counts as the
    default (check ``django_fq.E020`` reports it).
    """
    value = getattr(settings, "FQ_API_CREATE_QUEUES", "manage")
    return value if value in CREATE_QUEUES_CHOICES else "manage"
