"""The worker's log lines: ``event key=value ...`` on the ``django_fq.worker`` logger, receipts masked.

Every part of the worker logs through :func:`emit`; the fields are also
attached to the record as ``record.fq`` for structured handlers. The helpers
at the end turn an exception into the one-line summary of a log line or the
full text a failed run stores.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
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
    cls = value.__class__
    if cls is int:  # the common case (counts, ms): never needs quoting
        return str(value)
    if cls is str:  # job ids, queue names, attempts: the next most common
        if value and _NEEDS_QUOTES.search(value) is None:
            return value
        return json.dumps(value, ensure_ascii=False)
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
    its stack walk (see :data:`_CALLER`) and, with the stock record factory, built by
    :func:`_record` instead of ``Logger.makeRecord``.
    """
    if not log.isEnabledFor(level):
        return
    kept: dict[str, Any] = {"event": event}
    parts = [event]
    for k, v in fields.items():
        if v is not None:
            kept[k] = v
            parts.append(f"{k}={_fmt(v)}")
    log.handle(_record(level, " ".join(parts), kept))


def emit_job(level: int, event: str, running: Any, **fields: Any) -> None:
    """:func:`emit` for a line about the job ``running`` (a :class:`~django_fq.worker.state.Running`).

    The same line and ``record.fq`` as ``emit(level, event, **running.where(), **fields)``;
    the job's part is formatted once per job (``Running.logged``), not once per line.
    """
    if not log.isEnabledFor(level):
        return
    job_fields, job_text = running.logged()
    kept: dict[str, Any] = {"event": event, **job_fields}
    parts = [event, job_text] if job_text else [event]
    for k, v in fields.items():
        if v is not None:
            kept[k] = v
            parts.append(f"{k}={_fmt(v)}")
    log.handle(_record(level, " ".join(parts), kept))


def fields_text(fields: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``fields`` without its ``None`` values, and their ``key=value`` text as :func:`emit` writes it."""
    kept = {k: v for k, v in fields.items() if v is not None}
    return kept, " ".join(f"{k}={_fmt(v)}" for k, v in kept.items())


def job_fields_text(job_id: Any, queue: Any, attempts: Any, max_attempts: Any) -> tuple[dict[str, Any], str]:
    """``fields_text({"job": job_id, "queue": queue, "attempt": "attempts/max_attempts"})``, made cheaply.

    The job part of every per-job line. A job id (32 hex digits) and a queue name
    (``[A-Za-z0-9:._-]``) never need quoting and the attempt is two integers, so the
    text is one f-string; anything else (a row written by hand) takes :func:`fields_text`.
    """
    attempt = f"{attempts}/{max_attempts}"
    fields = {"job": job_id, "queue": queue, "attempt": attempt}
    if (
        job_id.__class__ is str
        and queue.__class__ is str
        and attempts.__class__ is int
        and max_attempts.__class__ is int
        and job_id
        and queue
        and _NEEDS_QUOTES.search(job_id) is None
        and _NEEDS_QUOTES.search(queue) is None
    ):
        return fields, f"job={job_id} queue={queue} attempt={attempt}"
    return fields_text(fields)


#: Where a record made by :func:`emit` says it was logged from. ``Logger.log`` would find it by
#: walking the stack on every call (``findCaller``), and the first frame outside the logging
#: package is always :func:`emit` itself; a worker logs a line per job, so it is set once here.
_CALLER = (__file__, emit.__code__.co_firstlineno, "emit")

#: Per level: the attributes of an :func:`emit` record that never change (name, level, caller, ...).
_STATIC: dict[int, dict[str, Any]] = {}
#: The record attributes :func:`_record` sets itself; a stock ``LogRecord`` whose ``__init__`` sets
#: others (a newer Python) sends every record through ``Logger.makeRecord`` instead.
_OWN_KEYS = frozenset(
    {
        "name", "msg", "args", "levelname", "levelno", "pathname", "filename", "module", "exc_info",
        "exc_text", "stack_info", "lineno", "funcName", "created", "msecs", "relativeCreated",
        "thread", "threadName", "processName", "process", "taskName",
    }
)


def _slow_record(level: int, message: str, kept: dict[str, Any]) -> logging.LogRecord:
    path, line, func = _CALLER
    return log.makeRecord(log.name, level, path, line, message, (), None, func, {"fq": kept})


def _record(level: int, message: str, kept: dict[str, Any]) -> logging.LogRecord:
    """The record ``Logger.makeRecord`` would build for :func:`emit`, at a third of its cost.

    A worker writes a line per job; ``LogRecord.__init__`` recomputes for each the file name,
    module and level name of a caller that is always :func:`emit`. Here those come from a
    per-level copy (:data:`_STATIC`), and what changes per record is set as ``LogRecord``
    sets it: the time (``created``, ``msecs``, ``relativeCreated``), the thread, the process
    and the asyncio task, each honouring ``logging.logThreads`` and the other switches. A
    project that installed its own record factory or logger class gets ``makeRecord``.
    """
    if logging.getLogRecordFactory() is not logging.LogRecord or type(log).makeRecord is not logging.Logger.makeRecord:
        return _slow_record(level, message, kept)
    static = _STATIC.get(level)
    if static is None:
        template = _slow_record(level, message, kept)
        if set(template.__dict__) - {"fq"} != _OWN_KEYS - _missing_keys():
            return template  # a LogRecord with attributes this code does not know: stay on the stock path
        static = {k: template.__dict__[k] for k in ("name", "args", "levelname", "levelno", "pathname", "filename",
                                                    "module", "exc_info", "exc_text", "stack_info", "lineno", "funcName")}
        _STATIC[level] = static
    record = _new_record(logging.LogRecord)
    d = record.__dict__
    d.update(static)
    d["msg"] = message
    _stamp(d)
    if logging.logThreads:
        d["thread"] = threading.get_ident()
        d["threadName"] = threading.current_thread().name
    else:
        d["thread"] = d["threadName"] = None
    if logging.logMultiprocessing:
        d["processName"] = "MainProcess"
        mp = sys.modules.get("multiprocessing")
        if mp is not None:
            try:
                d["processName"] = mp.current_process().name
            except Exception:  # noqa: BLE001 - as LogRecord does
                pass
    else:
        d["processName"] = None
    d["process"] = os.getpid() if logging.logProcesses else None
    if _HAS_TASK_NAME:
        d["taskName"] = None
        if logging.logAsyncioTasks:  # type: ignore[attr-defined]  # Python 3.12+
            aio = sys.modules.get("asyncio")
            # current_task() raises without a running loop (LogRecord catches it): ask first, it is cheaper.
            if aio is not None and aio._get_running_loop() is not None:
                try:
                    d["taskName"] = aio.current_task().get_name()
                except Exception:  # noqa: BLE001 - no current task, as LogRecord does
                    pass
    d["fq"] = kept
    return record


_new_record = logging.LogRecord.__new__
#: Python 3.12+ records carry the asyncio task's name.
_HAS_TASK_NAME = hasattr(logging, "logAsyncioTasks")


def _missing_keys() -> frozenset[str]:
    return frozenset() if _HAS_TASK_NAME else frozenset({"taskName"})


#: When the logging package started (``relativeCreated`` counts from it): nanoseconds on 3.13+.
_START = logging._startTime  # type: ignore[attr-defined]
_NS_CLOCK = isinstance(_START, int)


def _stamp(d: dict[str, Any]) -> None:
    """Set ``created``, ``msecs`` and ``relativeCreated`` as this Python's ``LogRecord`` does."""
    if _NS_CLOCK:  # Python 3.13+
        ct = time.time_ns()
        created = ct / 1e9
        msecs = (ct % 1_000_000_000) // 1_000_000 + 0.0
        if msecs == 999.0 and int(created) != ct // 1_000_000_000:
            msecs = 0.0  # the float seconds rounded up into the next second (as LogRecord does)
        d["created"], d["msecs"], d["relativeCreated"] = created, msecs, (ct - _START) / 1e6
    else:
        now = time.time()
        d["created"], d["msecs"], d["relativeCreated"] = now, int((now - int(now)) * 1000) + 0.0, (now - _START) * 1000


class WorkerFormatter(logging.Formatter):
    """A :class:`logging.Formatter` that writes the same text, formatting each second's ``asctime`` once.

    ``Formatter.formatTime`` converts and ``strftime``s the time of every record; a worker
    logs thousands a second, so the text of the current second is kept (per thread: a
    formatter is shared by the threads of a handler) and only the milliseconds are added.
    A ``datefmt`` or a replaced ``converter`` takes the stock path.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seconds = threading.local()

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or self.converter is not time.localtime or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cache = self._seconds
        if getattr(cache, "second", None) != second:
            cache.text = time.strftime(self.default_time_format, time.localtime(record.created))
            cache.second = second
        return self.default_msec_format % (cache.text, record.msecs)

    def plain(self) -> bool:
        """True when this formatter writes :data:`WORKER_LOG_FORMAT` with the default time (what :func:`emit_jobs` writes itself)."""
        return (
            type(self) is WorkerFormatter
            and self._fmt == WORKER_LOG_FORMAT
            and type(self._style) is logging.PercentStyle
            and not self.datefmt
            and self.converter is time.localtime
            and self.default_time_format == logging.Formatter.default_time_format
            and self.default_msec_format == logging.Formatter.default_msec_format
        )


#: The formatter of the worker's own stderr handler (``fq_worker``, when ``LOGGING`` gives none).
WORKER_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class WorkerLogHandler(logging.StreamHandler):
    """The ``fq_worker`` command's stderr handler: a ``StreamHandler`` that can hold lines back for one write.

    Inside :func:`held_lines` the records this thread emits are formatted at once and
    written together, one write and one flush at the block's end, instead of one of each per
    line: the completer logs a ``job.acked`` line for every job of an ack batch. Records of
    other threads, and every record outside such a block, are written as ``StreamHandler``
    writes them.
    """

    def emit(self, record: logging.LogRecord) -> None:
        held = getattr(_held, "by_handler", None)
        if held is None:
            super().emit(record)
            return
        try:
            text = self.format(record) + self.terminator
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as StreamHandler.emit
            self.handleError(record)
        else:
            held.setdefault(self, []).append(text)

    def write_held(self, text: str) -> None:
        """Write ``text`` (lines this handler formatted in a :func:`held_lines` block) and flush, under its lock."""
        try:
            with self.lock:  # type: ignore[union-attr]
                self.stream.write(text)
                self.stream.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as StreamHandler.emit: a log stream that fails must not break the worker
            self.handleError(logging.makeLogRecord({"msg": text.rstrip("\n"), "levelno": logging.ERROR}))


_held = threading.local()


def emit_jobs(level: int, event: str, rows: list[tuple[Any, dict[str, Any]]]) -> None:
    """``emit_job(level, event, running, **fields)`` for each ``(running, fields)`` of ``rows``, in order.

    When the worker's logger would hand these records to nothing but the ``fq_worker``
    command's own handler (:class:`WorkerLogHandler` with :class:`WorkerFormatter`, no
    other handler on the way to the root, no filter but the receipt mask, the stock record
    factory and logger class), the lines are written as that handler would write them,
    in one write, without making the records: nobody would see them. Otherwise each goes
    through :func:`emit_job` (inside :func:`held_lines`).
    """
    if not rows or not log.isEnabledFor(level):
        return
    handler = _sole_plain_handler(level)
    if handler is None:
        with held_lines():
            for running, fields in rows:
                emit_job(level, event, running, **fields)
        return
    head = f" {logging.getLevelName(level)} {log.name}: {event} "
    seconds = handler.formatter._seconds  # type: ignore[union-attr]
    out = []
    for running, fields in rows:
        parts = [running.logged()[1]]
        for k, v in fields.items():
            if v is not None:
                parts.append(f"{k}={_fmt(v)}")
        message = " ".join(parts)
        if "fq1." in message:  # ReceiptMaskingFilter's rule (the worker never logs a receipt)
            message = _RECEIPT_TEXT.sub("fq1.[masked]", message)
        now = time.time()
        second = int(now)
        if getattr(seconds, "second", None) != second:
            seconds.text = time.strftime(logging.Formatter.default_time_format, time.localtime(now))
            seconds.second = second
        out.append(f"{seconds.text},{int((now - second) * 1000):03d}{head}{message}\n")
    handler.write_held("".join(out))


def _sole_plain_handler(level: int) -> WorkerLogHandler | None:
    """The one handler a record of ``level`` from the worker's logger would reach, if it is a plain :class:`WorkerLogHandler`."""
    if (
        log.disabled
        or type(log) is not logging.Logger
        or logging.getLogRecordFactory() is not logging.LogRecord
        or len(log.filters) != 1
        or type(log.filters[0]) is not ReceiptMaskingFilter
    ):
        return None
    found: list[logging.Handler] = []
    logger: logging.Logger | None = log
    while logger is not None:
        found.extend(h for h in logger.handlers if level >= h.level)
        if not logger.propagate:
            break
        logger = logger.parent
    if len(found) != 1:
        return None
    handler = found[0]
    if (
        type(handler) is not WorkerLogHandler
        or handler.filters
        or handler.terminator != "\n"
        or not isinstance(handler.formatter, WorkerFormatter)
        or not handler.formatter.plain()
    ):
        return None
    return handler


@contextmanager
def held_lines() -> Iterator[None]:
    """On this thread, let each :class:`WorkerLogHandler` write the lines emitted in the block at its end, at once.

    Nests (the outermost block writes). The lines keep their order; what another thread
    logs meanwhile may come before them, as with any two threads.
    """
    if getattr(_held, "by_handler", None) is not None:
        yield
        return
    held: dict[WorkerLogHandler, list[str]] = {}
    _held.by_handler = held
    try:
        yield
    finally:
        _held.by_handler = None
        for handler, lines in held.items():
            handler.write_held("".join(lines))


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
