"""The Prometheus exporter view of the queue metrics.

Mount it in the project's URLconf::

    from django.urls import path
    from django_fq.metrics.views import metrics_view

    urlpatterns = [..., path("metrics/", metrics_view)]

Who may read it (checked in this order):

* anyone, when the setting ``FQ_METRICS_PUBLIC`` is ``True`` (keep the path
  reachable from your monitoring network only);
* a request with ``Authorization: Bearer <token>`` where ``<token>`` equals
  the setting ``FQ_METRICS_TOKEN`` (what a Prometheus scrape job sends with
  ``authorization: {credentials: …}``);
* a logged-in active staff user (a person looking at it in a browser).

Anyone else gets 403. Answers: 200 with the text exposition format
(OpenMetrics when the scraper asks for it), 405 for a method other than
GET/HEAD (the view is CSRF-exempt: it changes nothing, so a POST gets
this 405 rather than ``CsrfViewMiddleware``'s 403 page), 503 with a
one-line reason when ``prometheus-client`` is not installed, the database
cannot be read, or ``FQ_DATABASE`` names no alias of ``DATABASES``.
"""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils.connection import ConnectionDoesNotExist
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from .. import health, validation

log = logging.getLogger("django_fq.metrics")

_registry = None


def _text(body: str, status: int, **headers) -> HttpResponse:
    response = HttpResponse(body + "\n", status=status, content_type="text/plain; charset=utf-8")
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _database_unavailable(exc: Exception, *, show: bool = True) -> HttpResponse:
    """503 with Retry-After; the error's first line only for a reader already admitted (``show``)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    log.warning("metrics scrape failed: database error: %s", first)
    return _text(f"unavailable: database error: {first}" if show else "unavailable: database error", 503, Retry_After="5")


def allowed(request: HttpRequest) -> bool:
    """True when ``request`` may read the metrics (public setting, bearer token, or a staff user)."""
    if getattr(settings, "FQ_METRICS_PUBLIC", False) is True:
        return True
    token = getattr(settings, "FQ_METRICS_TOKEN", None)
    if isinstance(token, str) and token:
        scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return True
    if validation.credentials_problem("", request.COOKIES.get(settings.SESSION_COOKIE_NAME)):
        return False  # a session key with NUL: looking it up would be a DataError on PostgreSQL, not a user
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def registry():
    """The registry of the exporter: only :class:`~django_fq.metrics.collector.QueueCollector`.

    Raises ``ImportError`` when ``prometheus-client`` is not installed.
    """
    global _registry
    if _registry is None:
        from prometheus_client import CollectorRegistry

        from .collector import QueueCollector

        reg = CollectorRegistry()
        reg.register(QueueCollector())
        _registry = reg
    return _registry


@csrf_exempt  # it only reads; exempt so a POST gets this view's 405, not the CSRF 403 page
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The ``fq_queue_*`` metrics of every queue, read from the database now, in Prometheus text format."""
    if request.method not in ("GET", "HEAD"):
        return _text("use GET", 405, Allow="GET, HEAD")
    try:
        admitted = allowed(request)
    except DatabaseError as exc:  # a staff check loads the session and the user: the database may refuse
        return _database_unavailable(exc, show=False)  # not admitted yet: no server text
    if not admitted:
        return _text(
            "forbidden: the django-fq metrics need a logged-in staff user or the bearer token of the "
            "FQ_METRICS_TOKEN setting (or FQ_METRICS_PUBLIC = True)",
            403,
        )
    try:
        reg = registry()
        from prometheus_client.exposition import choose_encoder
    except ImportError:
        return _text(
            "unavailable: the django-fq metrics need the prometheus-client package (pip install 'django-fq[metrics]')",
            503,
        )
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    try:
        body = encoder(reg)
    except DatabaseError as exc:
        return _database_unavailable(exc)
    except ConnectionDoesNotExist as exc:  # FQ_DATABASE (or a router) names an alias DATABASES lacks
        first = health.database_setting_error() or str(exc)
        log.warning("metrics scrape failed: %s", first)
        return _text(f"unavailable: {first}", 503, Retry_After="5")
    return HttpResponse(body, content_type=content_type)
