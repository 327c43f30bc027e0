"""The OpenAPI 3 schema of the API (drf-spectacular), served at ``schema/``."""

from __future__ import annotations

import threading

from django.db import connections, transaction
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer

from .. import __version__
from .permissions import CAPABILITIES
from .views import FqAPIView

DESCRIPTION = (
    "Leased background jobs over HTTP. Times are epoch milliseconds, durations milliseconds. "
    'Errors are JSON objects {"code", "message", "field"}. Access needs a Django permission: '
    "django_fq.produce (enqueue), django_fq.consume (claim, ack, nack, release, extend, progress) or "
    "django_fq.manage (everything else)."
)


#: drf-spectacular applies per-view settings by patching its global settings for the
#: duration of a generation: one generation at a time per process.
_generating = threading.Lock()


#: Response components that carry exactly their fields: a producer's ``wait`` answer
#: (``JobOutcome``) must not pass for the whole job, nor the whole job for it.
CLOSED_RESPONSES = frozenset({"JobOutcome"})


def close_request_objects(result, generator, request, public):
    """drf-spectacular post-processing hook: request bodies admit no unknown keys.

    The views reject unknown fields (400, naming the field); the schema says so,
    which also lets schema-driven clients and fuzzers generate bodies the API accepts.
    The components of :data:`CLOSED_RESPONSES` are closed too.
    """
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if (name.endswith("Request") or name in CLOSED_RESPONSES) and component.get("type") == "object":
            component["additionalProperties"] = False
    return result


def spectacular_settings(mount: str) -> dict:
    """drf-spectacular settings of the schema of the API mounted at ``mount`` (e.g. ``/api/fq``)."""
    return {
        "TITLE": "django-fq REST API",
        "DESCRIPTION": DESCRIPTION,
        "VERSION": __version__,
        "SERVERS": [{"url": mount.rstrip("/") or "/"}],
        "COMPONENT_SPLIT_REQUEST": True,
        # A batch's states are a choice set of their own, beside the job states.
        "ENUM_NAME_OVERRIDES": {"BatchStateEnum": "django_fq.batches.STATES"},
        "SCHEMA_PATH_PREFIX": "/",
        "POSTPROCESSING_HOOKS": [
            "drf_spectacular.hooks.postprocess_schema_enums",
            "django_fq.api.schema.close_request_objects",
        ],
    }


def build_schema(mount: str = "/api/fq") -> dict:
    """The schema as a dict, without a request (tests, ``manage.py spectacular``-like exports)."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.settings import patched_settings

    from .urls import api_patterns

    with _generating, patched_settings(spectacular_settings(mount)):
        return SchemaGenerator(patterns=api_patterns()).get_schema(request=None, public=True)


class SchemaView(SpectacularAPIView):
    """The OpenAPI 3 schema of this API (YAML; JSON with ``?format=json`` or ``Accept: application/vnd.oai.openapi+json``).

    Its paths are relative to the mount point, which the schema names as its
    server (``servers[0].url``), so tools resolve them wherever the API is
    included. Readable by any user holding one of the three django-fq permissions.
    """

    capabilities = {"GET": CAPABILITIES}
    get_authenticators = FqAPIView.get_authenticators
    get_permissions = FqAPIView.get_permissions
    get_exception_handler = FqAPIView.get_exception_handler
    perform_authentication = FqAPIView.perform_authentication  # credentials holding NUL: refused (401/403)

    @classmethod
    def as_view(cls, **initkwargs):
        view = super().as_view(**initkwargs)
        for alias in connections:
            view = transaction.non_atomic_requests(using=alias)(view)
        return view

    def handle_exception(self, exc):
        # Errors are JSON like everywhere else in the API, not an OpenAPI document.
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response

    def get(self, request, *args, **kwargs):
        from .urls import api_patterns

        path = request.path
        mount = path.removesuffix("/").removesuffix("schema")  # served at schema/ and at schema
        self.urlconf = list(api_patterns())  # type: ignore[assignment]  # drf-spectacular takes a list of patterns too
        self.custom_settings = spectacular_settings(mount)
        with _generating:
            return super().get(request, *args, **kwargs)
