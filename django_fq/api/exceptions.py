"""The API's exception handler: every error becomes ``{"code", "message", "field"}``.

* :class:`~django_fq.exceptions.FqError` keeps its ``code``, ``status`` and
  ``field`` (plus any extra keys it carries, e.g. ``limit``/``size`` of a
  payload that is too large, or ``state`` of a job in the wrong state).
* DRF's own errors keep their status; their ``code`` is DRF's (e.g.
  ``not_authenticated``, ``permission_denied``, ``method_not_allowed``,
  ``unsupported_media_type``, ``throttled``); a parse error is ``invalid_json``.
* Django's ``RequestDataTooBig`` (a body larger than
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` read through ``request.body``) is 413
  ``payload_too_large``; ``Http404`` is 404 ``not_found``; Django's
  ``PermissionDenied`` is 403 ``permission_denied``.

* A database that refuses or drops the connection (server down, "too many
  clients", a PostgreSQL shutting down or starting, SQLite locked or not
  openable) is 503 ``database_unavailable`` with ``Retry-After``: the client
  may try again, nothing was done (see :func:`database_unavailable`).

Anything else is a bug and is left to Django (500). No message ever contains a
receipt: django-fq's errors never quote one, and DRF's do not quote request bodies.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import set_rollback

from .. import storage
from ..exceptions import FqError

#: Seconds a client is told to wait (``Retry-After``) when the database is unavailable.
RETRY_AFTER_S = 1


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve now (try later), not that the request or code is wrong.

    True for :class:`~django.db.InterfaceError` (a closed or broken
    connection), and for an :class:`~django.db.OperationalError` whose driver
    exception its backend's store calls unavailable
    (:func:`django_fq.storage.unavailable`: a refused or lost connection, too
    many connections, a server shutting down, a locked SQLite file). Any
    other OperationalError (a syntax error, a missing table) is a bug or a
    deployment error and stays a 500.
    """
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__ or exc.__context__
    return cause is not None and storage.unavailable(cause)


def error_body(code: str, message: str, field: str | None = None, **extra) -> dict:
    """The JSON body of an error response.

    Text that quotes the request (an unknown field's name, say) may hold a lone
    surrogate, which no UTF-8 response can carry: it is written as ``\\udXXX``.
    """
    extra = {k: _printable(v) for k, v in extra.items()}
    return {"code": code, "message": _printable(message), "field": _printable(field), **extra}


def _printable(value):
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def exception_handler(exc, context):
    """DRF ``EXCEPTION_HANDLER`` for django-fq's views (set on the views, not globally)."""
    headers = {}
    if isinstance(exc, FqError):
        extra = {k: v for k, v in exc.extra.items() if k not in ("code", "message", "field")}
        body, status = error_body(exc.code, exc.message, exc.field, **extra), exc.status
    elif isinstance(exc, RequestDataTooBig):
        body, status = error_body("payload_too_large", "the request body is too large"), 413
    elif isinstance(exc, Http404):
        body, status = error_body("not_found", "not found"), 404
    elif isinstance(exc, DjangoPermissionDenied):
        body, status = error_body("permission_denied", "permission denied"), 403
    elif database_unavailable(exc):
        body = error_body("database_unavailable", "the database is unavailable; try again later")
        status, headers["Retry-After"] = 503, str(RETRY_AFTER_S)
    elif isinstance(exc, drf.APIException):
        status = exc.status_code
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
        wait = getattr(exc, "wait", None)
        if wait:
            headers["Retry-After"] = str(int(wait))
        if isinstance(exc, drf.ParseError):
            body = error_body("invalid_json", _text(exc.detail))
        elif isinstance(exc, drf.ValidationError):
            field, message = _first_error(exc.detail)
            body = error_body("invalid", message, field)
        else:
            code = exc.get_codes() if not isinstance(exc.detail, (list, dict)) else exc.default_code
            body = error_body(str(code), _text(exc.detail))
    else:
        return None
    set_rollback()
    return Response(body, status=status, headers=headers)


def _text(detail) -> str:
    if isinstance(detail, (list, tuple)):
        return "; ".join(_text(d) for d in detail)
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_text(v)}" for k, v in detail.items())
    return str(detail)


def _first_error(detail, prefix: str = "") -> tuple[str | None, str]:
    """The first offending field (dotted, with list indexes) and its message."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
            return _first_error(value, name)
    if isinstance(detail, list):
        for i, value in enumerate(detail):
            if isinstance(value, (dict, list)) and value:
                return _first_error(value, f"{prefix}[{i}]")
            if not isinstance(value, (dict, list)):
                return (prefix or None), str(value)
    return (prefix or None), str(detail)
