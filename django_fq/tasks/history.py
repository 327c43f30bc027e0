"""Reading a job's error history as Django Tasks ``errors`` and ``worker_ids``.

The worker stores a failed attempt's error as ``"Type: message\\n\\n<traceback>"``.
The Tasks runner (:mod:`django_fq.tasks.runner`) adds a note to the exception
before the worker formats it; Python prints notes at the end of the
traceback, so the stored text ends with a line::

    [django-fq] exception class: myapp.errors.PaymentDeclined

which gives back the exception's full class path. History entries
(``{"at", "attempt", "kind", "error", "worker"}``) map to attempts like this:

* ``nack`` / ``expired`` / ``timeout`` — one failed attempt each (a worker id,
  a :class:`TaskError`);
* ``cancel`` — a :class:`TaskError` naming :class:`TaskCancelled`; also an
  attempt when the job was running when it was cancelled;
* ``release`` — a worker shutting down gave the attempt back: not an attempt.

A running or succeeded job adds its current attempt (the job's ``worker``).
The history keeps the newest 100 entries, so very old attempts drop out.
"""

from __future__ import annotations

import builtins
import re

from . import _compat as tasks
from .errors import LeaseExpired, TaskCancelled, TaskFailed, TaskTimedOut, class_path

NOTE_PREFIX = "[django-fq] exception class: "
_NOTE = re.compile(r"^\[django-fq\] exception class: (\S+)[ \t]*$", re.M)
_TRACEBACK_START = "\n\nTraceback (most recent call last):"
_HEAD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FAILED_KINDS = {"nack", "expired", "timeout"}


def exception_note(path: str) -> str:
    """The note the runner adds to a task's exception."""
    return f"{NOTE_PREFIX}{path}"


def parse_error(text: str) -> tuple[str, str]:
    """``(exception_class_path, traceback)`` of an error text the worker stored for a failed run."""
    text = text or ""
    found = _NOTE.findall(text)
    path = found[-1] if found else _guess_path(text)
    start = text.find(_TRACEBACK_START)
    body = text[start + 2 :] if start >= 0 else text
    body = _NOTE.sub("", body).rstrip("\n") + "\n"
    return path, body


def _guess_path(text: str) -> str:
    """A class path for an error text without the runner's note (cut, or not written by the runner)."""
    match = _HEAD_NAME.match(text)
    name = match.group(0) if match else ""
    rest = text[len(name) :]
    if name and (rest == "" or rest.startswith((":", "\n"))):
        candidate = getattr(builtins, name, None)
        if isinstance(candidate, type) and issubclass(candidate, BaseException):
            return f"builtins.{name}"
    return class_path(TaskFailed)


def _error_of(entry: dict):
    kind = entry.get("kind")
    text = str(entry.get("error") or "")
    if kind == "nack":
        path, body = parse_error(text)
    elif kind == "timeout":
        path, body = class_path(TaskTimedOut), text
    elif kind == "expired":
        path, body = class_path(LeaseExpired), text
    else:  # cancel
        path, body = class_path(TaskCancelled), text or "cancelled"
    return tasks.TaskError(exception_class_path=path, traceback=body)


def attempt_history(info) -> tuple[list, list[str]]:
    """``(errors, worker_ids)`` of a job (a ``JobInfo`` with ``errors``), oldest first."""
    errors: list = []
    worker_ids: list[str] = []
    last_at = None  # time of the last entry that ended or gave back an attempt
    last_failed_attempt = None
    for entry in info.errors or []:
        kind = entry.get("kind")
        if kind in _FAILED_KINDS:
            errors.append(_error_of(entry))
            worker_ids.append(str(entry.get("worker") or ""))
            last_at = entry.get("at")
            last_failed_attempt = entry.get("attempt")
        elif kind == "release":
            last_at = entry.get("at")
            last_failed_attempt = None
        elif kind == "cancel":
            errors.append(_error_of(entry))
            if _was_running(info, entry, last_at, last_failed_attempt):
                worker_ids.append(str(entry.get("worker") or info.worker or ""))
    if info.state in ("running", "succeeded"):
        worker_ids.append(info.worker or "")
    return errors, worker_ids


def _was_running(info, entry: dict, last_at, last_failed_attempt) -> bool:
    """Whether a cancel ended a running attempt (one claimed after the last failure or release).

    The cancel is a job's final entry, so the job's ``claimed_at`` is the time
    of its last claim: a claim later than the last failure/release is an
    attempt that the cancel cut short.
    """
    claimed = info.claimed_at
    if claimed is None or not entry.get("attempt"):
        return False
    if last_at is None:
        return True
    if claimed > last_at:
        return True
    return claimed == last_at and entry.get("attempt") != last_failed_attempt
