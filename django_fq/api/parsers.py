"""The one body parser of the API: JSON, size-checked before a byte is read.

What a body may cost is bounded before it is decoded, on its bytes: its length
(``Content-Length`` first), its nesting depth and its count of JSON values
(docs/rest-api.md, "Limits"). A bulk of ten million empty objects is refused
from a few byte counts, without building one of them.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator

from django.utils.http import parse_header_parameters
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.parsers import BaseParser

from .. import validation
from ..exceptions import InvalidJson, PayloadTooLarge
from . import conf

#: Deepest nesting of a request body. Twice a payload's bound, so that a payload or
#: result nesting 65–128 levels is refused by name (``payload nests deeper than 64
#: levels``) after decoding, while anything deeper is refused on its bytes, before
#: Python's recursive decoder sees it.
BODY_DEPTH = 2 * validation.MAX_JSON_DEPTH

_NOT_COUNTED = bytes(c for c in range(256) if c not in b'[]{}",')


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class FqJSONParser(BaseParser):
    """Parse ``application/json`` bodies.

    The declared ``Content-Length`` is checked against the view's limit first
    (413 ``payload_too_large`` without reading the body), then the count of
    JSON values (413, ``FQ_API_MAX_BODY_VALUES``) and the nesting depth (400
    ``invalid_json``, deeper than :data:`BODY_DEPTH`) on the raw bytes. A
    ``charset`` that is not a text encoding Python knows is 415
    ``unsupported_media_type`` naming it. Malformed JSON, undecodable text and
    ``NaN``/``Infinity`` give 400 ``invalid_json``.
    """

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        context = parser_context or {}
        request, view = context.get("request"), context.get("view")
        encoding = _charset(media_type) or context.get("encoding") or "utf-8"
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
        max_values = conf.max_body_values()
        if _values_over(raw, max_values, encoding):
            raise PayloadTooLarge(
                f"the request body holds more than {max_values} JSON values (FQ_API_MAX_BODY_VALUES)",
                field=getattr(view, "values_field", None),
                limit=max_values,
            )
        try:
            text = raw.decode(encoding)
        except UnicodeError:  # also codecs that refuse any text ("undefined", "punycode")
            raise InvalidJson(f"the request body is not valid {_shown(encoding)} text") from None
        # UTF-8 bytes show the same brackets as the text: judge them without another copy.
        if validation.nests_deeper(raw if codecs.lookup(encoding).name == "utf-8" else text, BODY_DEPTH):
            raise InvalidJson(
                f"the request body nests deeper than {BODY_DEPTH} levels "
                f"(a payload or result may nest {validation.MAX_JSON_DEPTH})"
            )
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except RecursionError:  # pragma: no cover - the depth check above comes first
            raise InvalidJson("the request body nests too deeply") from None
        except ValueError as exc:
            raise InvalidJson(f"the request body is not valid JSON: {exc}") from None


def _charset(media_type: str | None) -> str | None:
    """The ``charset`` of the ``Content-Type``, if any; 415 when Python has no text codec of that name.

    Django drops a charset it cannot look up, and keeps byte codecs such as
    ``hex`` or ``zlib`` that ``bytes.decode`` then refuses: both are judged here.
    """
    if not media_type:
        return None
    _, params = parse_header_parameters(media_type)
    name = params.get("charset")
    if name is None:
        return None
    try:
        known = getattr(codecs.lookup(name), "_is_text_encoding", True)
    except (LookupError, ValueError):  # ValueError: a name with NUL
        known = False
    if not known:
        raise UnsupportedMediaType(
            media_type, detail=f'charset "{_shown(name)}" is not a text encoding; send the JSON body as UTF-8'
        )
    return name


def _shown(name: str) -> str:
    """A charset name as an error message may quote it: ASCII, at most 40 characters."""
    return name.encode("ascii", "backslashreplace").decode("ascii")[:40]


#: Bytes of a body looked at at once while its values are counted: the count's own memory.
_COUNT_CHUNK = 1 << 20


def _values_over(raw: bytes, limit: int, encoding: str = "utf-8") -> bool:
    """True when the JSON text ``raw`` (in ``encoding``) holds more than ``limit`` values.

    Values are array items and object members, counted outside strings: one
    per comma and per opening bracket, plus one. For UTF-8 an upper bound of
    it comes from three byte counts; only when that bound is over ``limit``
    are strings told apart, a chunk at a time, so the count never copies more
    than :data:`_COUNT_CHUNK` bytes. Other charsets spell the punctuation with
    other bytes (EBCDIC has no 0x2C comma, a UTF-16 "∀" holds a 0x22 quote
    byte), so such a body is decoded a chunk at a time and counted on its
    characters, never decoded whole for the count.
    """
    if codecs.lookup(encoding).name == "utf-8":
        if raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1 <= limit:
            return False
        chunks: Iterable[bytes] = (raw[i : i + _COUNT_CHUNK] for i in range(0, len(raw), _COUNT_CHUNK))
    elif len(raw) + 1 <= limit:  # every value takes a character, and every character a byte at least
        return False
    else:
        chunks = _utf8_chunks(raw, encoding)
    total, inside, carry = 1, False, b""
    try:
        for chunk in chunks:
            data = carry + chunk
            # A backslash ending the chunk escapes the next chunk's first byte: carry it over
            # (only its parity matters: pairs are escaped backslashes, dropped below).
            trailing = len(data) - len(data.rstrip(b"\\"))
            carry = b"\\" if trailing % 2 else b""
            shape = data[: len(data) - trailing % 2].replace(b"\\\\", b"").replace(b'\\"', b"")
            pieces = shape.translate(None, _NOT_COUNTED).split(b'"')
            for piece in pieces[1 if inside else 0 :: 2]:  # the pieces outside strings
                total += piece.count(b",") + piece.count(b"[") + piece.count(b"{")
            inside ^= (len(pieces) - 1) % 2 == 1
            if total > limit:
                return True
    except UnicodeError:  # not text in its charset: the decoding that follows says so
        return False
    return False


def _utf8_chunks(raw: bytes, encoding: str) -> Iterator[bytes]:
    """``raw`` decoded from ``encoding`` and encoded as UTF-8, :data:`_COUNT_CHUNK` bytes of it at a time."""
    try:
        decoder = codecs.getincrementaldecoder(encoding)()
    except LookupError:  # a codec without an incremental decoder: decode it whole
        yield raw.decode(encoding).encode("utf-8", "surrogatepass")
        return
    for i in range(0, len(raw), _COUNT_CHUNK):
        piece = raw[i : i + _COUNT_CHUNK]
        yield decoder.decode(piece, final=i + _COUNT_CHUNK >= len(raw)).encode("utf-8", "surrogatepass")


def _content_length(request) -> int | None:
    if request is None:
        return None
    meta = request.META
    try:
        return int(meta.get("CONTENT_LENGTH") or meta.get("HTTP_CONTENT_LENGTH") or 0)
    except (TypeError, ValueError):
        return None
