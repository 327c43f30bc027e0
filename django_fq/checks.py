"""System checks (``manage.py check``) for django-fq's settings and database.

=================  ===================================================================
id                 meaning
=================  ===================================================================
django_fq.E001     ``FQ_MAX_PAYLOAD_BYTES`` is not an int within 1 byte – 32 MiB
django_fq.E002     ``FQ_DATABASE`` names no alias of ``DATABASES``
django_fq.E003     an ``FQ_MAX_*`` / retention setting is not a positive int (or
                   ``FQ_METRICS_MAX_QUEUES`` / ``FQ_PAYLOAD_OFFLOAD_BYTES`` below 0)
django_fq.E004     SQLite file database not in WAL mode (several worker processes
                   would block each other and readers); checked with ``--database``
django_fq.E005     a ``TASKS`` alias whose ``BACKEND`` is django-fq's cannot be built
                   (its ``InvalidTaskBackend`` message: unknown ``OPTIONS`` key, …)
django_fq.E006     the job handlers cannot be loaded as ``fq_worker`` loads them (two
                   handlers for one queue, e.g. a Tasks queue that also has an
                   ``@handler``; a broken ``fq_handlers`` module or ``FQ_HANDLERS`` path)
django_fq.E007     a django-fq ``TASKS`` backend while ``django_fq`` is not in
                   ``INSTALLED_APPS`` (reported by the backend's ``check()``, which
                   the Tasks framework runs)
django_fq.E008     ``FQ_TASK_MODULES`` is not a list of dotted module names
django_fq.E009     an ``FQ_ENQUEUE_MIDDLEWARE`` entry does not import or is not callable
                   (or the setting is not a list)
django_fq.E015     (``--deploy``) handler middleware (``FQ_HANDLER_MIDDLEWARE``, a handler's
                   own) does not import, is not callable, or is async-only on a sync handler
django_fq.E016     (``--deploy``) a batch handler (``@handler(q, batch=N)``) that the worker
                   cannot run: an ``async def`` one
django_fq.W001     SQLite ``transaction_mode`` is not ``IMMEDIATE``: the caller's own
                   transactions that enqueue may fail with "database is locked"
django_fq.W002     SQLite without an explicit busy timeout (``OPTIONS["timeout"]``)
django_fq.W003     ``FQ_DATABASE`` is not where Django's database routers send django-fq's
                   models (add ``django_fq.routers.FqRouter`` to ``DATABASE_ROUTERS``)
django_fq.E030     MariaDB older than 10.6 / MySQL older than 8.0 (no ``SKIP LOCKED``)
django_fq.E031     a django-fq table (or, before ``migrate``, the default storage
                   engine) is not InnoDB
django_fq.E032     the binary log is on with ``binlog_format=STATEMENT`` (InnoDB refuses
                   READ COMMITTED writes then)
django_fq.W030     ``max_allowed_packet`` is too small for ``FQ_MAX_PAYLOAD_BYTES``
django_fq.W031     key columns compare text case- or space-insensitively again (migration
                   0003's binary collation undone)
django_fq.W032     the MariaDB/MySQL connection's character set is not ``utf8mb4``
django_fq.E040     ``FQ_TRACING = True`` without the OpenTelemetry API installed, or an
                   ``FQ_TRACING_PARENT`` other than ``"child"``/``"link"``
=================  ===================================================================
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import conf, handlers, routing, storage, validation
from .exceptions import HandlerLoadError


def load_handlers() -> None:
    """Load the job handlers as ``fq_worker`` does: ``fq_handlers`` modules, ``FQ_HANDLERS``, ``TASKS``.

    Raises :class:`HandlerLoadError` with a one-line reason: a broken
    ``fq_handlers`` module or ``FQ_HANDLERS`` path, two handlers for one queue
    (also a Django Tasks queue that has an ``@handler`` too), or a django-fq
    ``TASKS`` backend that cannot be built. Used by ``fq_worker`` before it
    starts and by the system check ``django_fq.E006``, so both say the same.
    Loading twice is harmless: a handler registered again is the same function.
    """
    try:
        handlers.autodiscover()
        if _fq_task_aliases():
            # django_fq.fq_handlers registers the Tasks queues when it is first imported; do it
            # again (a no-op when done) so a process that changed TASKS since is checked too.
            from .tasks.runner import register_configured

            register_configured()
    except handlers.HandlerImportError as exc:
        if isinstance(exc.__cause__, ImproperlyConfigured):  # django_fq.fq_handlers building a bad TASKS backend
            raise HandlerLoadError(_one_line(exc.__cause__)) from exc
        raise HandlerLoadError(f"cannot load the job handlers: {exc}") from exc
    except ImproperlyConfigured as exc:  # InvalidTaskBackend: its message starts with TASKS['alias']
        raise HandlerLoadError(_one_line(exc)) from exc
    except (ImportError, ValueError) as exc:
        raise HandlerLoadError(
            f"cannot load the job handlers (fq_handlers modules, FQ_HANDLERS): {_one_line(exc)}"
        ) from exc
    except Exception as exc:  # any other error raised while a handler module runs (a NameError, a query at import)
        raise HandlerLoadError(
            f"cannot load the job handlers (fq_handlers modules, FQ_HANDLERS): {type(exc).__name__}: {_one_line(exc)}"
        ) from exc


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


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
    for name in ("FQ_MAX_JOBS_PER_QUEUE", "FQ_MAX_TOKENS_PER_QUEUE", "FQ_MAX_QUEUES", "FQ_FINISHED_RETENTION_MS",
                 "FQ_HISTORY_RETENTION_MS"):
        value = conf.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(Error(f"{name} must be a positive integer.", id="django_fq.E003"))
    metrics_queues = getattr(settings, "FQ_METRICS_MAX_QUEUES", 0)
    if isinstance(metrics_queues, bool) or not isinstance(metrics_queues, int) or metrics_queues < 0:
        errors.append(Error("FQ_METRICS_MAX_QUEUES must be an integer of at least 0.", id="django_fq.E003"))
    ttl = conf.get("FQ_QUEUE_TTL_MS")
    ttl_hi = validation.POLICY_BOUNDS["ttl_ms"][1]
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= ttl_hi:
        errors.append(Error(f"FQ_QUEUE_TTL_MS must be an integer from 0 to {ttl_hi} (365 days).", id="django_fq.E003"))
    beat = conf.get("FQ_WORKER_HEARTBEAT_MS")
    lo, hi = conf.WORKER_HEARTBEAT_MIN_MS, conf.WORKER_HEARTBEAT_MAX_MS
    if isinstance(beat, bool) or not isinstance(beat, int) or not (beat == 0 or lo <= beat <= hi):
        errors.append(
            Error(
                f"FQ_WORKER_HEARTBEAT_MS must be 0 (no registry row) or an integer from {lo} to {hi} (1 hour).",
                id="django_fq.E003",
            )
        )
    offload = conf.get("FQ_PAYLOAD_OFFLOAD_BYTES")
    if isinstance(offload, bool) or not isinstance(offload, int) or offload < 0:
        errors.append(Error("FQ_PAYLOAD_OFFLOAD_BYTES must be an integer of at least 0.", id="django_fq.E003"))
    if getattr(settings, "FQ_TASK_MODULES", None) is not None:
        problem = validation.task_modules_problem(settings.FQ_TASK_MODULES)
        if problem:
            errors.append(
                Error(
                    f"{problem}.",
                    hint="Workers refuse every Django task while it is wrong (see docs/security.md).",
                    id="django_fq.E008",
                )
            )
    enqueue_mw = _enqueue_middleware_problem()
    if enqueue_mw:
        errors.append(
            Error(
                enqueue_mw,
                hint="Every enqueue fails while it is wrong (docs/how-to/middleware.md).",
                id="django_fq.E009",
            )
        )
    errors += _check_queue_databases()
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
    others = [a for a in routing.aliases()[1:] if a in settings.DATABASES]
    unmigrated = [a for a in others if not router.allow_migrate_model(a, Queue)]
    if unmigrated and routed == {alias} and migrates:
        return [
            Warning(
                f"FQ_QUEUE_DATABASES sends queues to {', '.join(map(repr, unmigrated))}, but the database "
                "routers do not migrate django-fq's models there.",
                hint="Add 'django_fq.routers.FqRouter' to DATABASE_ROUTERS and run migrate --database for "
                "each alias (docs/how-to/queues-over-databases.md).",
                id="django_fq.W003",
            )
        ]
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


def _check_queue_databases() -> list:
    """E050 / W050: ``FQ_QUEUE_DATABASES`` that cannot be read, names an unknown alias, or has a pattern no queue reaches."""
    raw = getattr(settings, routing.SETTING, None)
    try:
        rules = routing.parse(raw)
    except ValueError as exc:
        return [Error(f"{exc}.", hint="See docs/how-to/queues-over-databases.md.", id="django_fq.E050")]
    found: list[CheckMessage] = []
    for pattern, alias in rules:
        if alias not in settings.DATABASES:
            found.append(
                Error(
                    f"FQ_QUEUE_DATABASES sends {pattern!r} to {alias!r}, which is not in DATABASES.",
                    id="django_fq.E050",
                )
            )
    for i, (pattern, alias) in enumerate(rules):
        why = _never_matched(pattern, rules[:i])
        if why:
            found.append(
                Warning(
                    f"FQ_QUEUE_DATABASES pattern {pattern!r} (to {alias!r}) never matches: {why}.",
                    hint="Patterns are tried in order, first match wins; put the narrower one first.",
                    id="django_fq.W050",
                )
            )
    return found


#: The characters a pattern may hold besides those of queue names: fnmatch's ``* ? [ ] !``.
_PATTERN_CHARS = frozenset("*?[]!")


def _never_matched(pattern: str, earlier) -> str | None:
    """Why ``pattern`` can never route a queue (after the ``earlier`` rules), or ``None`` when it may."""
    import re
    from fnmatch import fnmatchcase

    stray = sorted({c for c in pattern if c not in _PATTERN_CHARS and not re.fullmatch(r"[A-Za-z0-9:._-]", c)})
    if stray and "[" not in pattern:
        return f"queue names never hold {''.join(stray)!r}"
    for before, alias in earlier:
        # An earlier pattern that matches this pattern's own text (its wildcards read as letters)
        # matches every name this one matches: "*" before anything, "a:*" before "a:b*".
        if fnmatchcase(pattern, before):
            return f"the earlier pattern {before!r} (to {alias!r}) matches every queue it matches"
    return None


def _fq_task_aliases() -> list[str]:
    """Aliases of ``settings.TASKS`` whose ``BACKEND`` is django-fq's (no Tasks framework import otherwise)."""
    aliases = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        path = str((params or {}).get("BACKEND", "")) if isinstance(params, dict) else ""
        if path.startswith("django_fq."):
            aliases.append(alias)
            continue
        try:
            if getattr(import_string(path), "is_fq_backend", False):
                aliases.append(alias)
        except Exception:  # noqa: BLE001 - a backend that does not import is not ours to report
            continue  # Django's own checks and backend handler report it
    return aliases


@register()
def check_tasks(app_configs=None, **kwargs):
    """E005: build each django-fq ``TASKS`` backend (settings only: no handler module is imported)."""
    errors: list[CheckMessage] = []
    aliases = _fq_task_aliases()
    if aliases:
        try:
            from .tasks import task_backends
        except ImportError as exc:  # no Tasks framework installed
            return [Error(_one_line(exc), id="django_fq.E005")]
        for alias in aliases:
            try:
                task_backends[alias]
            except (ImportError, ImproperlyConfigured) as exc:
                errors.append(
                    Error(
                        _one_line(exc),
                        hint="Fix this entry of TASKS (see docs/tasks.md); fq_worker refuses to start with it.",
                        id="django_fq.E005",
                    )
                )
    return errors


@register(deploy=True)
def check_handlers(app_configs=None, **kwargs):
    """E006 (``check --deploy``): load the handlers as ``fq_worker`` does.

    A deploy check, because it imports every ``fq_handlers`` module: ``migrate``
    and ``runserver`` must not run worker code (a handler module may query
    tables that ``migrate`` is about to create, and a web image may lack the
    workers' packages). Skipped when ``E005`` found a broken backend, which
    would only be reported twice.
    """
    if check_tasks():
        return []
    errors: list[CheckMessage] = []
    try:
        load_handlers()
    except HandlerLoadError as exc:
        errors.append(
            Error(
                str(exc),
                hint="fq_worker refuses to start with this: each queue takes one handler, and its "
                "fq_handlers modules and FQ_HANDLERS paths must import.",
                id="django_fq.E006",
            )
        )
        return errors
    from .exceptions import WorkerConfigError
    from .middleware import chain_for

    # A broken FQ_HANDLER_MIDDLEWARE entry fails every queue's chain with the
    # same message (it names the entry, not the queue): report it once.
    seen: set[str] = set()
    for queue, fn in sorted(handlers.registered().items()):
        try:
            chain_for(queue, fn)
        except WorkerConfigError as exc:
            if str(exc) not in seen:
                seen.add(str(exc))
                errors.append(Error(str(exc), hint="fq_worker refuses to start with this.", id="django_fq.E015"))
        problem = _batch_problem(queue, fn)
        if problem:
            errors.append(
                Error(problem, hint="fq_worker refuses to start with this: make it a plain def.", id="django_fq.E016")
            )
    return errors


def _batch_problem(queue: str, fn: Any) -> str | None:
    """Why the registered handler of ``queue`` cannot run as its batch handler (``None``: it can, or it is not one)."""
    if handlers.batch_of(queue) is None:
        return None
    from .worker.batch import handler_problem

    return handler_problem(queue, fn)


def _enqueue_middleware_problem() -> str | None:
    """Why ``FQ_ENQUEUE_MIDDLEWARE`` cannot be built, or ``None``."""
    from .middleware import _build_enqueue_chain

    try:
        _build_enqueue_chain()
    except ImproperlyConfigured as exc:
        return _one_line(exc)
    return None


@register(Tags.database)
def check_sqlite_wal(app_configs=None, databases=None, **kwargs):
    """A file SQLite database must be in WAL mode when worker processes share it."""
    from django.db import connections

    found = []
    for alias in routing.aliases():
        if not databases or alias not in databases:
            continue
        conn = connections[alias]
        store = storage.find(conn)
        mode = None if store is None else store.journal_mode(conn)  # None: not a file database shared by processes
        if mode is not None and mode.lower() != "wal":
            found.append(
                Error(
                    f"SQLite database {alias!r} uses journal_mode={mode}, not WAL.",
                    hint="Add 'init_command': 'PRAGMA journal_mode=WAL;' to its OPTIONS: without WAL, "
                    "several worker processes block each other and every reader.",
                    id="django_fq.E004",
                )
            )
    return found


@register(Tags.database)
def check_database_server(app_configs=None, databases=None, **kwargs):
    """E030–E032, W030–W032: the server behind each alias that holds queues as its store checks it (MariaDB/MySQL today)."""
    from django.apps import apps
    from django.db import connections

    out = []
    tables = [model._meta.db_table for model in apps.get_app_config("django_fq").get_models()]
    for alias in routing.aliases():
        if not databases or alias not in databases:
            continue
        conn = connections[alias]
        store = storage.find(conn)
        if store is None:
            continue
        found = store.check_server(conn, tables=tables, max_payload_bytes=conf.max_payload_bytes())
        out += [(Error if f.error else Warning)(f.msg, hint=f.hint, id=f.id) for f in found]
    return out


@register()
def check_tracing(app_configs=None, **kwargs):
    """E040: tracing switched on (``FQ_TRACING = True``) that ``fq_worker`` would refuse to start with."""
    from . import tracing

    if not tracing.enabled():
        return []
    try:
        tracing.require()
        tracing.parent_mode()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="See docs/how-to/tracing.md.", id="django_fq.E040")]
    return []
