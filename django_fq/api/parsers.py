"""The one body parser of the API: JSON, size-checked before a byte is read."""

from __future__ import annotations

import json

from rest_framework.parsers import BaseParser

from ..exceptions import InvalidJson, PayloadTooLarge
from . import conf


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class FqJSONParser(BaseParser):
    """Parse ``application/json`` bodies.

    The declared ``Content-Length`` is checked against the view's limit first
    (413 ``payload_too_large`` without reading the body). Malformed JSON,
    invalid UTF-8, ``NaN``/``Infinity`` and nesting too deep for Python all
    give 400 ``invalid_json``.
    """

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        context = parser_context or {}
        request, view = context.get("request"), context.get("view")
        view_limit = getattr(view, "max_body_bytes", None)
        limit = view_limit() if view_limit is not None else conf.max_body_bytes()
        declared = _content_length(request)
        if declared is not None and declared > limit:
            raise PayloadTooLarge(
                f"the request body is {declared} bytes; this endpoint accepts at most {limit}",
                field=None,
                limit=limit,
                size=declared,
            )
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"the request body exceeds {limit} bytes", limit=limit)
        encoding = context.get("encoding") or "utf-8"
        try:
            text = raw.decode(encoding)
            return json.loads(text, parse_constant=_reject_constant)
        except UnicodeDecodeError:
            raise InvalidJson("the request body is not valid UTF-8") from None
        except RecursionError:
            raise InvalidJson("the request body is nested too deeply") from None
        except ValueError as exc:
            raise InvalidJson(f"the request body is not valid JSON: {exc}") from None


def _content_length(request) -> int | None:
    if request is None:
        return None
    meta = request.META
    try:
        return int(meta.get("CONTENT_LENGTH") or meta.get("HTTP_CONTENT_LENGTH") or 0)
    except (TypeError, ValueError):
        return None
