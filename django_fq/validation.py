"""Pure input checks shared by every interface. No database access here.

Each check raises a subclass of :class:`~django_fq.exceptions.InvalidArgument`
naming the offending field, before anything is written.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import os
import re

from django.conf import settings
from django.utils import timezone

from . import conf
from .exceptions import (
    CountOutOfRange,
    DelayAndAt,
    InvalidArgument,
    InvalidDelay,
    InvalidJson,
    InvalidQueueName,
    InvalidTime,
    PayloadTooLarge,
    VisibilityOutOfRange,
)

QUEUE_NAME = re.compile(r"[A-Za-z0-9:._-]{1,200}")  # always used with fullmatch()

SECOND_MS = 1000
HOUR_MS = 3600 * SECOND_MS
DAY_MS = 24 * HOUR_MS
#: Bounds of every queue policy field (docs/reference/semantics.md §2), inclusive, in the field's unit
#: (also ``services.queues.POLICY_BOUNDS``).
POLICY_BOUNDS = {
    "concurrency": (0, 100_000),
    "max_attempts": (1, 1000),
    "backoff_ms": (0, DAY_MS),
    "max_backoff_ms": (0, 30 * DAY_MS),
    "visibility_ms": (1, DAY_MS),
    "idempotency_retention_ms": (1, 30 * DAY_MS),
    "timeout_ms": (0, 7 * DAY_MS),
    "ttl_ms": (0, 365 * DAY_MS),
    "key_concurrency": (0, 100_000),
    "rate_limit": (0, 1_000_000),
    "rate_window_ms": (1, DAY_MS),
    "key_rate_limit": (0, 1_000_000),
}
#: Longest enqueue delay, and furthest ``at`` from now: 10 years (docs/reference/semantics.md §9).
MAX_DELAY_MS = 3653 * DAY_MS
#: Most snoozes of one job, counted from its enqueue or its last retry (docs/reference/semantics.md §9).
MAX_SNOOZES = 1000
#: Longest nack delay: 30 days (docs/reference/semantics.md §9).
MAX_NACK_DELAY_MS = 30 * DAY_MS
#: Visibility bounds for claims and extensions: 1 ms – 24 h (docs/reference/semantics.md §5).
MIN_VISIBILITY_MS, MAX_VISIBILITY_MS = 1, 24 * HOUR_MS
#: Claim count bounds (docs/reference/semantics.md §5).
MAX_CLAIM_COUNT = 1000
#: Longest long-poll wait of a claim (docs/reference/semantics.md §5).
MAX_WAIT_MS = 20_000
#: Job listing page size: default and max (docs/reference/semantics.md §9).
DEFAULT_PAGE, MAX_PAGE = 20, 1000
#: Priority is a 32-bit signed integer (docs/reference/semantics.md §9).
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: Longest idempotency token / unique key, in characters.
MAX_KEY_LENGTH = 255
#: Each error entry is capped at 64 KiB of text (docs/reference/semantics.md §9).
MAX_ERROR_BYTES = 64 * 1024
#: Deepest nesting of arrays and objects in a payload or result (``[]`` is one level,
#: ``[[1]]`` two). Every face must read a stored document back: Python's JSON decoder and
#: encoder recurse once per level, and the indented renderings (admin page, ``fq get``,
#: DRF's ``indent`` renderer) run in pure Python below a web request's or a worker's
#: stack, where a few hundred levels already fail. 64 stays far below that on every
#: supported Python and far above what a real job carries (docs/reference/errors.md).
MAX_JSON_DEPTH = 64
#: A tag of job metadata: 1-64 characters from [A-Za-z0-9:._-] (always used with fullmatch()).
TAG = re.compile(r"[A-Za-z0-9:._-]{1,64}")
#: Most tags one job carries.
MAX_TAGS = 16
#: Key of the stand-in a read shows for a stored document deeper than MAX_JSON_DEPTH
#: (written before the bound existed, or by raw SQL): ``{"fq_unreadable": message, "bytes": n}``.
UNREADABLE_KEY = "fq_unreadable"


def queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name (1–200 of ``[A-Za-z0-9:._-]``)."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidQueueName(field="queue")
    return name


def integer(value: object, field: str, lo: int, hi: int, exc: type[InvalidArgument] = InvalidArgument) -> int:
    """Return ``value`` if it is an int (not a bool) within ``lo..hi`` inclusive."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise exc(f"{field} must be an integer", field=field)
    if not lo <= value <= hi:
        raise exc(f"{field} must be between {lo} and {hi}", field=field)
    return value


def count(value: object, field: str = "count") -> int:
    """A claim count: 1–1000."""
    return integer(value, field, 1, MAX_CLAIM_COUNT, CountOutOfRange)


def visibility(value: object, field: str = "visibility_ms") -> int:
    """A lease length in ms: 1 ms – 24 h."""
    return integer(value, field, MIN_VISIBILITY_MS, MAX_VISIBILITY_MS, VisibilityOutOfRange)


def key(value: object, field: str) -> str | None:
    """An idempotency token or unique key: ``None`` or 1–255 characters without NUL."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_LENGTH or "\x00" in value:
        raise InvalidArgument(f"{field} must be a string of 1-{MAX_KEY_LENGTH} characters", field=field)
    _check_text(value, field)
    return value


#: The longest concurrency key (characters; the column's max_length).
MAX_CONCURRENCY_KEY_LENGTH = 200


def concurrency_key(value: object, field: str = "concurrency_key") -> str | None:
    """A job's concurrency key: ``None`` or a string of 1–200 characters without NUL or lone surrogates.

    Compared byte for byte on every database (``"a"``, ``"A"`` and ``"a "`` are three keys).
    """
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CONCURRENCY_KEY_LENGTH or "\x00" in value:
        raise InvalidArgument(
            f"{field} must be a string of 1-{MAX_CONCURRENCY_KEY_LENGTH} characters without NUL", field=field
        )
    _check_text(value, field)
    return value


def worker_id(value: object, field: str = "worker") -> str:
    """A worker id as stored on leases: a string of at most 200 characters, no NUL or lone surrogate."""
    if not isinstance(value, str) or len(value) > 200 or "\x00" in value:
        raise InvalidArgument(f"{field} must be a string of at most 200 characters without NUL", field=field)
    _check_text(value, field)
    return value


#: The longest progress message a handler may report (characters; the column's max_length).
MAX_PROGRESS_MESSAGE = 200


def progress(value: object, message: object = "") -> tuple[float, str]:
    """A progress report: ``(percentage, message)`` as stored.

    ``value`` is a percentage, a finite number from 0 to 100 (an ``int`` or
    ``float``, not a ``bool``), returned as a float; ``message`` a string of at
    most 200 characters without NUL or lone surrogate (``None`` is ``""``).
    Raises :class:`InvalidArgument` naming the field (``progress`` or ``message``).
    """
    # The range test also refuses NaN and the infinities (every comparison with NaN is false),
    # and compares a huge int without converting it to float (no OverflowError).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise InvalidArgument("progress must be a finite number from 0 to 100 (a percentage)", field="progress")
    if message is None:
        message = ""
    if not isinstance(message, str) or len(message) > MAX_PROGRESS_MESSAGE or "\x00" in message:
        raise InvalidArgument(
            f"message must be a string of at most {MAX_PROGRESS_MESSAGE} characters without NUL", field="message"
        )
    _check_text(message, "message")
    return float(value), message


def file_path(value: object, field: str) -> str:
    """A file path the operating system can take: a non-empty string without NUL, in the file-system encoding."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidArgument(f"{field} must be a non-empty file path without NUL characters", field=field)
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise InvalidArgument(f"{field} is not a file name this system can use", field=field) from None
    return value


def job_id(value: object) -> bool:
    """True when ``value`` is shaped like a job id (32 lowercase hex characters)."""
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def epoch_ms(value: object, field: str = "at") -> int:
    """An instant as epoch milliseconds, from an int of epoch ms or an aware datetime.

    A naive datetime is rejected when ``USE_TZ`` is on (it names no instant);
    with ``USE_TZ`` off it is read in the current time zone.
    """
    if isinstance(value, dt.datetime):
        if timezone.is_naive(value):
            if settings.USE_TZ:
                raise InvalidTime(f"{field} must be timezone-aware (USE_TZ is on)", field=field)
            value = timezone.make_aware(value)
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        value = delta // dt.timedelta(milliseconds=1)
        if value < 0:
            raise InvalidTime(f"{field} must not be before 1970", field=field)
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTime(f"{field} must be epoch milliseconds or an aware datetime", field=field)
    if value < 0:
        raise InvalidTime(f"{field} must not be before 1970", field=field)
    return value


def schedule(delay_ms: object, at: object) -> tuple[int | None, int | None]:
    """Validate the pair (``delay_ms``, ``at``): at most one, delay 0 – 10 years."""
    if delay_ms is not None and at is not None:
        raise DelayAndAt(field="delay_ms")
    if delay_ms is not None:
        return integer(delay_ms, "delay_ms", 0, MAX_DELAY_MS, InvalidDelay), None
    if at is not None:
        return None, epoch_ms(at, "at")
    return None, None


#: Compact UTF-8 JSON without NaN/Infinity. One encoder for every call: ``json.dumps`` with
#: options builds a new encoder each time, a visible cost in a 20,000-item bulk enqueue.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def batch_encoder():
    """A function ``value -> str`` writing exactly the text of ``_COMPACT.encode``, for one batch.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs
    about as much as encoding a small payload (a third of the time of a
    20,000-item ``enqueue_many``); this builds it once. The C encoder keeps the
    containers it is inside of (its cycle check) in a dict of its own, so the
    function belongs to one call on one thread, and is dropped after it raised
    (the batch fails then anyway). Without the C encoder (another Python
    implementation, a changed private signature): ``_COMPACT.encode`` itself.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _COMPACT.encode
    try:
        # The arguments JSONEncoder.iterencode passes for _COMPACT's options (Python 3.11-3.14).
        chunks = make({}, _COMPACT.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    except TypeError:
        return _COMPACT.encode
    join = "".join

    def encode(value: object) -> str:
        return join(chunks(value, 0))

    return encode


def json_text(value: object, field: str = "payload", limit: int | None = None, encode=None) -> tuple[str, int]:
    """Encode ``value`` as compact UTF-8 JSON; return ``(text, size_in_bytes)``.

    Rejects what no backend can store alike: NaN/Infinity, NUL characters, lone
    surrogates, non-JSON types, nesting too deep. ``limit`` defaults to
    ``FQ_MAX_PAYLOAD_BYTES``; a larger encoding raises :class:`PayloadTooLarge`.
    ``encode``: a :func:`batch_encoder` of the caller's batch (the same text, cheaper per call).
    """
    limit = conf.max_payload_bytes() if limit is None else limit
    try:
        text = _COMPACT.encode(value) if encode is None else encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJson(f"{field} is not valid JSON: {exc}", field=field) from None
    except RecursionError:
        raise _too_deep(field) from None
    if len(text) > MAX_JSON_DEPTH and nests_deeper(text, MAX_JSON_DEPTH):  # a shorter text has fewer brackets
        raise _too_deep(field)
    if text.isascii():  # a flag of the string (O(1)): one byte per character, no surrogate
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidJson(f"{field} contains a lone surrogate", field=field) from None
    if size > limit:
        raise PayloadTooLarge(f"{field} is {size} bytes; the limit is {limit}", field=field, limit=limit, size=size)
    if "\\u0000" in text and _has_nul(value):
        raise InvalidJson(f"{field} contains a NUL character", field=field)
    return text, size


def metadata(value: object, field: str = "metadata", limit: int | None = None) -> tuple[str | None, str | None]:
    """Validate job metadata; return ``(json_text, tags_column)``, ``(None, None)`` for ``None`` or ``{}``.

    ``value`` must be a JSON object (a ``dict``) of at most ``limit`` bytes of
    compact UTF-8 JSON (default ``FQ_MAX_METADATA_BYTES``, 4096; hard cap 64 KiB),
    under the payload's JSON rules (no NUL, lone surrogates, NaN). Its optional
    key ``"tags"`` is a list of at most 16 distinct strings of 1-64 characters
    from ``[A-Za-z0-9:._-]``; the tags column text is ``"|a|b|"`` (``None``
    without tags). Raises :class:`InvalidArgument` (field ``metadata``,
    ``metadata.tags``, ``metadata.tags[i]``), :class:`InvalidJson`,
    :class:`PayloadTooLarge` (field ``metadata``).
    """
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field} must be a JSON object", field=field)
    if not value:
        return None, None
    tags_column = None
    if "tags" in value:
        tags = value["tags"]
        where = f"{field}.tags"
        if not isinstance(tags, list):
            raise InvalidArgument(f"{where} must be a list of strings", field=where)
        if len(tags) > MAX_TAGS:
            raise InvalidArgument(f"{where} holds {len(tags)} tags; at most {MAX_TAGS}", field=where)
        seen: set[str] = set()
        for i, tag in enumerate(tags):
            if not isinstance(tag, str) or not TAG.fullmatch(tag):
                raise InvalidArgument(
                    f"{where}[{i}] must be 1-64 characters from [A-Za-z0-9:._-]", field=f"{where}[{i}]"
                )
            if tag in seen:
                raise InvalidArgument(f"{where}[{i}] repeats the tag {tag!r}", field=f"{where}[{i}]")
            seen.add(tag)
        if tags:
            tags_column = "|" + "|".join(tags) + "|"
    if limit is None:
        limit = conf.max_metadata_bytes()
    text, _ = json_text(value, field, limit)
    return text, tags_column


def tag(value: object, field: str = "tag") -> str:
    """A tag to filter on: 1-64 characters from ``[A-Za-z0-9:._-]``; else :class:`InvalidArgument` naming ``field``."""
    if not isinstance(value, str) or not TAG.fullmatch(value):
        raise InvalidArgument(f"{field} must be 1-64 characters from [A-Za-z0-9:._-]", field=field)
    return value


def parse_json(text: str, field: str = "payload", limit: int | None = None) -> tuple[object, str, int]:
    """Parse a JSON document given as text (CLI, REST) and re-encode it compactly.

    Returns ``(value, compact_text, size)``; errors as :func:`json_text`. Nesting
    deeper than :data:`MAX_JSON_DEPTH` is refused before the text is decoded.
    """
    if nests_deeper(text, MAX_JSON_DEPTH):
        raise _too_deep(field)
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise _too_deep(field) from None
    except ValueError as exc:
        raise InvalidJson(f"{field} is not valid JSON: {exc}", field=field) from None
    compact, size = json_text(value, field, limit)
    return value, compact, size


def too_deep_message(field: str, limit: int = MAX_JSON_DEPTH) -> str:
    """The one wording of a nesting refusal: ``"<field> nests deeper than <limit> levels"``."""
    return f"{field} nests deeper than {limit} levels"


def _too_deep(field: str) -> InvalidJson:
    return InvalidJson(too_deep_message(field), field=field)


#: ``bytes.translate`` arguments keeping only brackets and quotes, with ``{}`` read as ``[]``.
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_SHAPE = bytes(c for c in range(256) if c not in b'[]{}"')


def nests_deeper(text: str | bytes, limit: int) -> bool:
    """True when the JSON text ``text`` nests arrays/objects more than ``limit`` levels deep.

    Works on the text without decoding it, so it is safe on any input, and
    cheap (C-speed byte operations): a text with at most ``limit`` opening
    brackets is never deeper; otherwise escapes, strings and everything but
    brackets are dropped and each pass removes the innermost empty pairs, one
    level per pass, ``limit`` passes at most. Malformed text (brackets that
    never pair up) is left to the decoder to report.
    """
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= limit:
            return False
        data = text.encode("utf-8", "surrogatepass")
    else:
        data = bytes(text)
        if data.count(b"[") + data.count(b"{") <= limit:
            return False
    # Escaped backslashes first, so that ``\\"`` still ends its string.
    shape = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_SQUARE, _NOT_SHAPE)
    shape = shape.replace(b'""', b"")  # most strings hold no bracket and are gone now
    if b'"' in shape:
        shape = b"".join(shape.split(b'"')[::2])  # odd pieces are string contents
    for _ in range(limit):
        if not shape:
            return False
        peeled = shape.replace(b"[]", b"")
        if len(peeled) == len(shape):
            return False  # brackets that do not pair: not JSON, the decoder says so
        shape = peeled
    return bool(shape)


def stored_json(text: str | None, field: str = "payload"):
    """Decode JSON text django-fq stored (a payload or result) for a read face.

    ``None`` stays ``None``. A document nesting deeper than
    :data:`MAX_JSON_DEPTH` (stored before the bound existed, or by raw SQL),
    or one that does not decode, comes back as the stand-in
    ``{"fq_unreadable": "<field> nests deeper than 64 levels", "bytes": n}`` so
    that every read (get, wait, retry, cancel, the admin, ``fq get``) answers.
    """
    if text is None:
        return None
    if not nests_deeper(text, MAX_JSON_DEPTH):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return {UNREADABLE_KEY: f"{field} is not valid JSON", "bytes": len(text.encode("utf-8", "replace"))}
    return {UNREADABLE_KEY: too_deep_message(field), "bytes": len(text.encode("utf-8", "replace"))}


def error_text(value: object, field: str = "error") -> str:
    """An error message: ``None`` → ``""``; text cut to 64 KiB of UTF-8 (lone surrogates replaced)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string", field=field)
    data = value.replace("\x00", "\\0").encode("utf-8", "replace")
    if len(data) > MAX_ERROR_BYTES:
        data = data[: MAX_ERROR_BYTES - 16]
        return data.decode("utf-8", "ignore") + "\n…[truncated]"
    return data.decode("utf-8")


def _check_text(value: str, field: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{field} contains a lone surrogate", field=field) from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _has_nul(value: object) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, float) and not math.isfinite(v):  # pragma: no cover - caught by allow_nan
            return True
    return False


def dotted_name(name: str) -> bool:
    """Whether ``name`` is a dotted Python name (``a``, ``a.b.c``; each part an identifier)."""
    return all(part.isidentifier() for part in name.split("."))


def task_modules_problem(value: object) -> str | None:
    """Why ``value`` is not a valid ``FQ_TASK_MODULES`` setting, or ``None`` when it is.

    A valid value is a list or tuple of dotted module names (see docs/security.md).
    """
    if isinstance(value, str) or not isinstance(value, list | tuple):
        return "FQ_TASK_MODULES must be a list of module names, e.g. ['myproject.tasks']"
    for item in value:
        if not isinstance(item, str) or not dotted_name(item):
            return f"FQ_TASK_MODULES must be a list of module names; {item!r} is not a dotted module name"
    return None


def credentials_problem(authorization: str, session_key: str | None = None) -> str | None:
    """Why a request's credentials cannot name a user, or ``None``: a NUL character somewhere in them.

    ``authorization`` is the ``Authorization`` header (``""`` if none); its
    NUL may also hide in the user name or password of ``Basic`` credentials
    once decoded (the same byte in UTF-8 and Latin-1, as DRF reads them).
    ``session_key`` is the session cookie's value as Django parsed it (it
    unquotes ``"\\000"``). PostgreSQL cannot compare text holding NUL, so such
    credentials must never reach a lookup. Malformed Basic credentials are
    left to the authentication class.
    """
    if session_key and "\x00" in session_key:
        return "invalid credentials: the session cookie holds a NUL character"
    if "\x00" in authorization:
        return "invalid credentials: the Authorization header holds a NUL character"
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not value.strip():
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=False)
    except (binascii.Error, ValueError):
        return None
    if b"\x00" in raw:  # the same NUL in UTF-8 and in Latin-1
        return "invalid credentials: the Basic user name or password holds a NUL character"
    return None
