"""The worker's log lines: ``event key=value ...`` on the ``django_fq.worker`` logger, receipts masked.

Every part of the worker logs through :func:`emit`; the fields are also
attached to the record as ``record.fq`` for structured handlers. The helpers
at the end turn an exception into the one-line summary of a log line or the
full text a failed run stores.
"""

from __future__ import annotations

import json
import logging
import re
import time
import traceback
from typing import Any

log = logging.getLogger("django_fq.worker")

#: Anything shaped like a receipt (``fq1.<job>.<generation>.<secret>``), masked in log lines.
_RECEIPT_TEXT = re.compile(r"fq1\.[0-9A-Za-z_.\-]+")
#: Longest exception message repeated in a log line (the full text goes into the job's error).
_LOG_MESSAGE_CHARS = 200


class ReceiptMaskingFilter(logging.Filter):
    """Mask receipt-shaped text in a log record (defence in depth: the worker never logs one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "fq1." in message:
            record.msg = _RECEIPT_TEXT.sub("fq1.[masked]", message)
            record.args = None
        return True


if not any(isinstance(f, ReceiptMaskingFilter) for f in log.filters):
    log.addFilter(ReceiptMaskingFilter())


#: Characters that make a value need quoting in a ``key=value`` field.
_NEEDS_QUOTES = re.compile(r'[ "=\n\t]')


def _fmt(value: Any) -> str:
    if value.__class__ is int:  # the common case (counts, ms): never needs quoting
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    text = str(value)
    if text and _NEEDS_QUOTES.search(text) is None:
        return text
    return json.dumps(text, ensure_ascii=False)


def emit(level: int, event: str, **fields: Any) -> None:
    """Log ``event key=value ...`` on the worker's logger (``None`` values are left out).

    The fields are also attached to the record as ``record.fq`` (``{"event": event, **fields}``).
    The record goes through the logger's filters and handlers as with ``log.log``, without
    its stack walk (see :data:`_CALLER`).
    """
    if not log.isEnabledFor(level):
        return
    kept: dict[str, Any] = {"event": event}
    parts = [event]
    for k, v in fields.items():
        if v is not None:
            kept[k] = v
            parts.append(f"{k}={_fmt(v)}")
    path, line, func = _CALLER
    log.handle(log.makeRecord(log.name, level, path, line, " ".join(parts), (), None, func, {"fq": kept}))


#: Where a record made by :func:`emit` says it was logged from. ``Logger.log`` would find it by
#: walking the stack on every call (``findCaller``), and the first frame outside the logging
#: package is always :func:`emit` itself; a worker logs a line per job, so it is set once here.
_CALLER = (__file__, emit.__code__.co_firstlineno, "emit")


def since(started: float) -> int:
    """Milliseconds elapsed since the monotonic time ``started`` (seconds)."""
    return int((time.monotonic() - started) * 1000)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= _LOG_MESSAGE_CHARS else line[: _LOG_MESSAGE_CHARS - 1] + "…"


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception cannot even describe itself."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return "<exception message could not be rendered>"


def summary(exc: BaseException) -> str:
    """``Type: first line of the message`` for a log line."""
    message = _first_line(_text_of(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def error_text(exc: BaseException) -> str:
    """What a failed run stores: ``Type: message``, then the full traceback."""
    message = _text_of(exc)
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    try:
        trace = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001
        trace = "".join(traceback.format_tb(exc.__traceback__))
    return head + "\n\n" + trace
