"""``manage.py fq_worker``: run the handlers of django-fq queues, and the reaper.

    manage.py fq_worker                                  # every queue with a registered handler
    manage.py fq_worker --queue emails --queue reports   # only these queues
    manage.py fq_worker --concurrency 8                  # 8 jobs at once (threads)
    manage.py fq_worker --processes 4 --concurrency 8    # 4 processes under a small supervisor
    manage.py fq_worker --burst                          # drain what is eligible now, then exit 0

SIGTERM or SIGINT stops claiming at once, lets running jobs finish for
``--grace`` seconds, releases the rest (ready again at once, attempt given
back) and exits 0; a second signal exits at once. See
:mod:`django_fq.worker` for how the pieces fit, and ``docs/deployment.md``.

Log lines go to the ``django_fq.worker`` logger (to stderr when the project
configured no handler for it) as ``event key=value ...``: start and stop,
claims, acks, nacks, lease losses, reconnects. Receipts and payloads are
never logged. With ``--burst`` on a terminal a progress bar shows the served
queues draining (not when stderr is not a terminal, nor with ``--no-progress``).
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.core.checks import Tags
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, OperationalError, connections

from django_fq import routing, services, storage
from django_fq.checks import HandlerLoadError, load_handlers
from django_fq.exceptions import InvalidArgument, QueueNotFound
from django_fq.worker import (
    EX_CONFIG,
    SUPERVISOR_ENV,
    Supervisor,
    Worker,
    WorkerConfigError,
    WorkerOptions,
    child_command,
    emit,
)
from django_fq.worker.logs import WORKER_LOG_FORMAT, WorkerFormatter, WorkerLogHandler

#: Waiting for SQLite's write lock at start: first pause and longest pause between tries, in seconds.
_LOCK_WAIT_FIRST_S, _LOCK_WAIT_MAX_S = 0.25, 5.0


class Command(BaseCommand):
    help = "Run django-fq workers: claim jobs, run their handlers, ack or nack them; reap expired leases."
    #: Set once the worker runs: an error before that is a start-up error (EX_CONFIG in a supervised child).
    _running = False

    def add_arguments(self, parser: CommandParser) -> None:
        """Every option of :class:`~django_fq.worker.WorkerOptions` (flags, defaults, help come from there)."""
        WorkerOptions.add_arguments(parser)

    def execute(self, *args, **options):
        """Run the command; in a supervised child, a :class:`CommandError` before the worker runs exits 78.

        Those errors (a metrics port that cannot be bound, a failed system
        check, handlers that do not load, a queue without a handler) come
        back at every restart, so the child exits with ``EX_CONFIG`` and the
        supervisor stops instead of restarting it for ever. Unsupervised, the
        exit status stays 1.
        """
        try:
            self._wait_for_sqlite_lock(options)
            return super().execute(*args, **options)
        except CommandError as exc:
            if os.environ.get(SUPERVISOR_ENV) and not self._running:
                exc.returncode = EX_CONFIG
            raise

    def _wait_for_sqlite_lock(self, options: dict) -> None:
        """SQLite: before the system checks run, wait (with backoff) while another process holds the write lock.

        Django's checks ask SQLite whether it supports JSON inside a
        transaction; with ``IMMEDIATE`` transactions that transaction waits
        for the write lock, and past the busy timeout the answer is a false
        "SQLite does not support JSONFields" (``fields.E180``) that would end
        the worker at start. So the same probe runs here first, once per
        SQLite database, retried while the error is a lock (logged as
        ``worker.db_wait``, every 0.25 s doubling to 5 s, for as long as the
        lock is held); once it succeeds its answer is kept, so the checks
        do not have to get the lock a second time. Any other error is left
        for the checks to report. Nothing is asked with ``--skip-checks``.
        """
        if options.get("skip_checks"):
            return  # no check to protect; the worker loop itself rides out a locked database
        self._setup_logging(options.get("verbosity", 1))
        for alias in connections:
            conn = connections[alias]
            store = storage.find(conn)
            if store is None or not store.embedded:
                continue  # only a database file can be locked whole by another process
            delay, waited_since = _LOCK_WAIT_FIRST_S, None
            while True:
                try:
                    store.startup_probe(conn)
                except OperationalError as exc:
                    text = str(exc).lower()
                    if "locked" not in text and "busy" not in text:
                        break  # not a lock: the checks say what it is
                    waited_since = waited_since or time.monotonic()
                    emit(logging.WARNING, "worker.db_wait", database=alias, reason="locked", retry_in_s=delay)
                    conn.close()
                    time.sleep(delay)  # a backoff between tries, not a wait for an event
                    delay = min(_LOCK_WAIT_MAX_S, delay * 2)
                    continue
                conn.features.__dict__["supports_json_field"] = True  # proven just now, cached as Django does
                if waited_since is not None:
                    emit(logging.WARNING, "worker.db_ready", database=alias, waited_s=round(time.monotonic() - waited_since, 3))
                break

    def handle(self, *args, **options) -> None:
        self._setup_logging(options["verbosity"])
        opts = WorkerOptions.from_options(options)
        try:
            opts.validate()
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from None
        if opts.metrics_port is not None:
            self._metrics_subscriber_class()  # fail now, not in every child, when prometheus-client is missing
        self._tracing_subscribers()  # FQ_TRACING without the OpenTelemetry API: fail now, not in every child
        self._check_database(options)
        try:
            load_handlers()
        except HandlerLoadError as exc:
            # A broken fq_handlers module, a wrong FQ_HANDLERS path, two handlers for one queue,
            # a bad TASKS backend (InvalidTaskBackend): one line, no traceback.
            raise CommandError(str(exc)) from exc

        if opts.processes > 1 and not os.environ.get(SUPERVISOR_ENV):
            self._supervise(opts, options["verbosity"])
            return

        supervisor = os.environ.get(SUPERVISOR_ENV)
        kwargs = opts.worker_kwargs()
        if opts.worker_id and supervisor and os.environ.get("FQ_WORKER_INDEX"):
            kwargs["worker_id"] = f"{opts.worker_id}-{os.environ['FQ_WORKER_INDEX']}"
        subscribers = []
        if opts.metrics_port is not None:
            subscribers.append(self._metrics_subscriber_class()())
        subscribers.extend(self._tracing_subscribers())
        try:
            worker = Worker(
                install_signals=True,
                supervisor_pid=int(supervisor) if supervisor else None,
                subscribers=subscribers,
                **kwargs,
            )
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from exc

        server = None
        if opts.metrics_port is not None:
            server = self._serve_metrics(opts)
        progress = None
        if opts.burst and not opts.no_progress and _isatty(sys.stderr):
            progress = _DrainProgress(worker)
        # Everything loaded so far (Django, the project, the handlers) lives as long as the
        # process: keep it out of the cyclic collector's full passes, which a worker making
        # objects for thousands of jobs a second would otherwise run over all of it
        # (docs/performance.md#where-a-jobs-time-goes). Before a process pool forks, too.
        gc.freeze()
        self._running = True
        try:
            if progress is not None:
                with progress:
                    stats = worker.run()
            else:
                stats = worker.run()
        except InvalidArgument as exc:  # a value every claim refuses: never a traceback, never "0 jobs ok"
            raise CommandError(f"fq_worker: {exc.message}") from exc
        except WorkerConfigError as exc:  # --pool processes: a child process could not start
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:  # only a --burst run gives up on the database
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "django_fq_" in text:  # a missing table: the database is there, the migrations are not
                raise CommandError(f"database error: {text} (run `manage.py migrate`?)") from exc
            raise CommandError(f"database unavailable: {text}") from exc
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
        if opts.burst or opts.max_jobs is not None:
            line = f"fq_worker: {stats.ok} jobs ok, {stats.failed} failed"
            if stats.timed_out:
                line += f", {stats.timed_out} timed out"
            if stats.settle_errors > stats.timed_out:
                line += f", {stats.settle_errors - stats.timed_out} not settled"
            if stats.released:
                line += f", {stats.released} released"
            self.stdout.write(line)

    @staticmethod
    def _tracing_subscribers() -> list:
        """The tracing subscriber when ``FQ_TRACING = True`` (django_fq.tracing), else none; a bad setup is a CommandError."""
        from django_fq import tracing

        try:
            return tracing.worker_subscribers()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc

    @staticmethod
    def _metrics_subscriber_class():
        try:
            from django_fq.metrics.worker import MetricsSubscriber
        except ImportError as exc:
            raise CommandError(
                f"--metrics-port needs the prometheus-client package (pip install 'django-fq[metrics]'): {exc}"
            ) from exc
        return MetricsSubscriber

    def _serve_metrics(self, opts: WorkerOptions):
        """Start the metrics HTTP server of this process; a port that cannot be bound is a one-line error."""
        from django_fq.metrics.worker import serve

        port, addr = opts.metrics_port, opts.metrics_addr
        assert port is not None
        index = os.environ.get("FQ_WORKER_INDEX") if os.environ.get(SUPERVISOR_ENV) else None
        if port and index:
            port += int(index)
        try:
            return serve(port, addr)
        except (OSError, ValueError) as exc:  # address in use, not an address of this host, ...
            raise _cannot_listen(addr, port, exc) from None

    def _check_database(self, options: dict) -> None:
        """SQLite: run the database checks on ``FQ_DATABASE`` (and each SQLite alias of ``FQ_QUEUE_DATABASES``) before working, as ``migrate`` does.

        A SQLite file database without WAL (``django_fq.E004``) stops the
        worker here: worker processes and web requests sharing it would block
        each other. ``--skip-checks`` or ``SILENCED_SYSTEM_CHECKS`` lets it start.
        Other databases are not asked anything here, so a worker can start
        while its PostgreSQL server is still coming up (it reconnects).
        """
        if options.get("skip_checks"):
            return
        embedded = [
            a for a in routing.aliases()
            if a in settings.DATABASES and (store := storage.find(connections[a])) is not None and store.embedded
        ]  # fmt: skip
        if embedded:
            self.check(tags=[Tags.database], databases=embedded)

    def _supervise(self, opts: WorkerOptions, verbosity: int) -> None:
        """Run ``--processes`` copies of this command (each with one process) under a :class:`Supervisor`."""
        try:
            # Fail here, not in every child, when a queue has no handler.
            Worker(opts.worker_kwargs()["queues"], concurrency=opts.concurrency)
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from exc
        if not getattr(settings, "SETTINGS_MODULE", None):
            raise CommandError("--processes needs a settings module (DJANGO_SETTINGS_MODULE)")
        port, addr = opts.metrics_port, opts.metrics_addr
        if port:  # refuse a taken port before starting anyone (a child still refuses it, with EX_CONFIG)
            from django_fq.metrics.worker import check_port

            for p in range(port, port + opts.processes):
                try:
                    check_port(p, addr)
                except (OSError, ValueError) as exc:
                    raise _cannot_listen(addr, p, exc) from None
        connections.close_all()  # the children open their own

        def command(index: int) -> list[str]:
            return child_command(opts.child_argv(index, verbosity))

        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
        paths = [p for p in sys.path if p] + [os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        supervisor = Supervisor(command, opts.processes, env=env)
        code = supervisor.run()
        if code == EX_CONFIG:
            raise CommandError(
                f"worker process {supervisor.failed_index} could not start (its error is above); "
                "the other worker processes were stopped"
            )
        if code:
            raise CommandError(f"{opts.processes} worker processes ended, not all cleanly", returncode=code)

    def _setup_logging(self, verbosity: int) -> None:
        """Send the worker's log lines to stderr unless the project routes them somewhere already."""
        logger = logging.getLogger("django_fq.worker")
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        if logger.level == logging.NOTSET or verbosity != 1:
            logger.setLevel(level)
        if not logger.hasHandlers():
            # A StreamHandler that writes the same lines, cheaper per line (django_fq.worker.logs).
            stream = WorkerLogHandler(sys.stderr)
            stream.setFormatter(WorkerFormatter(WORKER_LOG_FORMAT))
            logger.addHandler(stream)


def _cannot_listen(addr: str, port: int, exc: Exception) -> CommandError:
    """The one-line error of a metrics port that cannot be bound: ``--metrics-port: cannot listen on ADDR:PORT: REASON``."""
    reason = getattr(exc, "strerror", None) or str(exc)
    return CommandError(f"--metrics-port: cannot listen on {addr}:{port}: {reason}")


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _DrainProgress:
    """A progress bar of a ``--burst`` run: jobs finished by this worker out of finished + still waiting/running.

    A small thread refreshes it twice a second from ``services.stats`` of the
    served queues; log lines are routed through the bar so they do not break it.
    """

    REFRESH_S = 0.5

    def __init__(self, worker: Worker):
        self.worker = worker
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None  # a tqdm bar once entered
        self._redirect: Any = None

    def __enter__(self):
        try:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency; degrade to no bar
            return self
        width = shutil.get_terminal_size((80, 24)).columns or 80  # a terminal may report 0 columns
        self._bar = tqdm(total=self._remaining(), unit="job", desc="draining", file=sys.stderr, ncols=min(width, 120))
        self._redirect = logging_redirect_tqdm(loggers=[logging.getLogger("django_fq.worker")])
        self._redirect.__enter__()
        self._thread = threading.Thread(target=self._refresh_loop, name="fq-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._bar is None:
            return False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._update(final=True)
        self._bar.close()
        self._redirect.__exit__(*exc)
        return False

    def _remaining(self) -> int:
        total = 0
        for queue in self.worker.queues:
            try:
                counts = services.stats(queue).counts
            except QueueNotFound:
                continue
            total += counts.get("ready", 0) + counts.get("running", 0)
        return total

    def _update(self, final: bool = False) -> None:
        done = self.worker.stats.jobs
        remaining = 0 if final else self._remaining()
        self._bar.total = max(done + remaining, 1 if final else 0)
        self._bar.n = done
        self._bar.refresh()

    def _refresh_loop(self) -> None:
        try:
            while not self._stop.wait(self.REFRESH_S):
                try:
                    self._update()
                except Exception:  # noqa: BLE001 - a bar must never break the worker
                    connections.close_all()
        finally:
            connections.close_all()
