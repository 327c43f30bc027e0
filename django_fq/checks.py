"""System checks (``manage.py check``) for django-fq's settings and database.

=================  ===================================================================
id                 meaning
=================  ===================================================================
django_fq.E001     ``FQ_MAX_PAYLOAD_BYTES`` is not an int within 1 byte – 32 MiB
django_fq.E002     ``FQ_DATABASE`` names no alias of ``DATABASES``
django_fq.E003     an ``FQ_MAX_*`` / retention setting is not a positive int
django_fq.E004     SQLite file database not in WAL mode (several worker processes
                   would block each other and readers); checked with ``--database``
django_fq.W001     SQLite ``transaction_mode`` is not ``IMMEDIATE``: the caller's own
                   transactions that enqueue may fail with "database is locked"
django_fq.W002     SQLite without an explicit busy timeout (``OPTIONS["timeout"]``)
django_fq.W003     ``FQ_DATABASE`` is not where Django's database routers send django-fq's
                   models (add ``django_fq.routers.FqRouter`` to ``DATABASE_ROUTERS``)
=================  ===================================================================
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from . import conf


@register()
def check_settings(app_configs=None, **kwargs):
    """Validate the ``FQ_*`` settings."""
    errors: list[CheckMessage] = []
    size = conf.get("FQ_MAX_PAYLOAD_BYTES")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= conf.HARD_PAYLOAD_CAP_BYTES:
        errors.append(
            Error(
                f"FQ_MAX_PAYLOAD_BYTES must be an integer from 1 to {conf.HARD_PAYLOAD_CAP_BYTES} (32 MiB).",
                id="django_fq.E001",
            )
        )
    if conf.database() not in settings.DATABASES:
        errors.append(Error(f"FQ_DATABASE={conf.database()!r} is not in DATABASES.", id="django_fq.E002"))
    for name in ("FQ_MAX_JOBS_PER_QUEUE", "FQ_MAX_TOKENS_PER_QUEUE", "FQ_FINISHED_RETENTION_MS"):
        value = conf.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(Error(f"{name} must be a positive integer.", id="django_fq.E003"))
    if conf.database() in settings.DATABASES:
        errors += _check_routing()
    db: dict[str, Any] = settings.DATABASES.get(conf.database(), {})
    if db.get("ENGINE", "").endswith("sqlite3"):
        options = db.get("OPTIONS", {})
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            errors.append(
                Warning(
                    "SQLite transaction_mode is not IMMEDIATE.",
                    hint="Set DATABASES[...]['OPTIONS']['transaction_mode'] = 'IMMEDIATE' so transactions "
                    "that enqueue take the write lock up front instead of failing with 'database is locked'.",
                    id="django_fq.W001",
                )
            )
        if "timeout" not in options and "busy_timeout" not in str(options.get("init_command", "")):
            errors.append(
                Warning(
                    "SQLite has no explicit busy timeout.",
                    hint="Set DATABASES[...]['OPTIONS']['timeout'] (seconds), e.g. 20.",
                    id="django_fq.W002",
                )
            )
    return errors


def _check_routing() -> list:
    """W003: Django's own queries on django-fq's models (admin filters, migrations) must reach ``FQ_DATABASE``."""
    from django.db import router

    from .models import Queue

    alias = conf.database()
    routed = {router.db_for_read(Queue), router.db_for_write(Queue)}
    migrates = router.allow_migrate_model(alias, Queue)
    if routed == {alias} and migrates:
        return []
    return [
        Warning(
            f"FQ_DATABASE is {alias!r}, but the database routers send django-fq's models to "
            f"{', '.join(map(repr, sorted(routed)))}"
            + ("" if migrates else f" and do not migrate them on {alias!r}")
            + ".",
            hint="Add 'django_fq.routers.FqRouter' to DATABASE_ROUTERS (see docs/how-to/separate-database.md). "
            "django-fq's own queries use FQ_DATABASE; Django's admin filters, model forms and "
            "migrations follow the routers.",
            id="django_fq.W003",
        )
    ]


@register(Tags.database)
def check_sqlite_wal(app_configs=None, databases=None, **kwargs):
    """A file SQLite database must be in WAL mode when worker processes share it."""
    from django.db import connections

    alias = conf.database()
    if not databases or alias not in databases:
        return []
    conn = connections[alias]
    if conn.vendor != "sqlite" or conn.is_in_memory_db():  # type: ignore[attr-defined]  # SQLite's wrapper has it
        return []
    with conn.cursor() as cur:
        cur.execute("PRAGMA journal_mode")
        mode = cur.fetchone()[0]
    if str(mode).lower() != "wal":
        return [
            Error(
                f"SQLite database {alias!r} uses journal_mode={mode}, not WAL.",
                hint="Add 'init_command': 'PRAGMA journal_mode=WAL;' to its OPTIONS: without WAL, "
                "several worker processes block each other and every reader.",
                id="django_fq.E004",
            )
        ]
    return []
