"""Helpers of the security tests: where secrets could hide, and how to look for them."""

from __future__ import annotations

import hashlib
import logging
import re

from django.apps import apps
from django.db import connection

#: A receipt's secret: 43 characters of URL-safe base64 (256 bits).
_SECRET_WINDOW = 43
_URLSAFE_RUN = re.compile(r"[A-Za-z0-9_-]{43,}")


def secret_of(receipt: str) -> str:
    """The secret part of a receipt ``fq1.<job>.<generation>.<secret>``."""
    return receipt.rsplit(".", 1)[1]


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def leaked(text: str, receipts) -> list[str]:
    """The receipts of ``receipts`` whose full text or secret occurs in ``text``."""
    return [r for r in receipts if r in text or secret_of(r) in text]


def secrets_matching(text: str, hashes: set[str]) -> list[str]:
    """Every 43-character URL-safe window of ``text`` whose SHA-256 is one of ``hashes``.

    Finds a receipt secret in output whose receipts the test never saw (a
    worker's), through the hashes the database keeps: no window of the text
    may hash to a stored receipt hash.
    """
    found = []
    for run in _URLSAFE_RUN.findall(text):
        for i in range(len(run) - _SECRET_WINDOW + 1):
            window = run[i : i + _SECRET_WINDOW]
            if sha256_hex(window) in hashes:
                found.append(window)
    return found


def fq_table_text() -> str:
    """Every row of every django_fq table, every column cast to text (each backend's own cast), as one string."""
    from django.db.models import F, TextField
    from django.db.models.functions import Cast

    chunks = []
    for model in apps.get_app_config("django_fq").get_models():
        casts = {f"c{i}": Cast(F(f.attname), TextField()) for i, f in enumerate(model._meta.concrete_fields)}
        for row in model._default_manager.using(connection.alias).annotate(**casts).values_list(*casts):
            chunks.append("\t".join("" if v is None else str(v) for v in row))
    return "\n".join(chunks)


class Records(logging.Handler):
    """A logging handler keeping every record, formatted (with tracebacks) and raw."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        """Every record as a handler would write it, plus its raw args and extra fields."""
        out = []
        for r in self.records:
            out.append(self.format(r))
            out.append(repr(r.args))
            out.append(repr({k: v for k, v in r.__dict__.items() if k not in ("msg", "args", "exc_info")}))
        return "\n".join(out)


class capture_all_logs:
    """Route every logger to a :class:`Records` handler at DEBUG (root, SQL, requests, django-fq).

    Loggers that do not propagate are given the handler directly. Levels and
    handlers are restored on exit.
    """

    NAMES = ("", "django", "django.db.backends", "django.request", "django.server", "django_fq", "django_fq.worker")

    def __enter__(self) -> Records:
        self.handler = Records()
        self.saved = []
        for name in self.NAMES:
            logger = logging.getLogger(name)
            self.saved.append((logger, logger.level, logger.disabled))
            logger.setLevel(logging.DEBUG)
            logger.disabled = False
            if name == "" or not logger.propagate:
                logger.addHandler(self.handler)
        return self.handler

    def __exit__(self, *exc):
        for logger, level, disabled in self.saved:
            logger.setLevel(level)
            logger.disabled = disabled
            if self.handler in logger.handlers:
                logger.removeHandler(self.handler)
        return False
