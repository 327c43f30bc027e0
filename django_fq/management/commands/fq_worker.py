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

import logging
import os
import shutil
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, OperationalError, connections

from django_fq import conf, services, storage, validation
from django_fq.checks import HandlerLoadError, load_handlers
from django_fq.exceptions import InvalidArgument, QueueNotFound
from django_fq.worker import (
    EX_CONFIG,
    MAX_PREFETCH,
    SUPERVISOR_ENV,
    Supervisor,
    Worker,
    WorkerConfigError,
    child_command,
    emit,
)

#: Longest accepted --poll-interval / --max-poll-interval / --reaper-interval / --prune-interval: one hour.
MAX_INTERVAL_MS = 3_600_000
#: Most threads (--concurrency) and processes (--processes) one command runs.
MAX_CONCURRENCY, MAX_PROCESSES = 1000, 256
#: Waiting for SQLite's write lock at start: first pause and longest pause between tries, in seconds.
_LOCK_WAIT_FIRST_S, _LOCK_WAIT_MAX_S = 0.25, 5.0


class Command(BaseCommand):
    help = "Run django-fq workers: claim jobs, run their handlers, ack or nack them; reap expired leases."
    #: Set once the worker runs: an error before that is a start-up error (EX_CONFIG in a supervised child).
    _running = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Queue to serve (repeatable). Default: every queue with a registered handler.",
        )
        parser.add_argument("--concurrency", type=int, default=1, metavar="N", help="Jobs run at once per process (threads). Default 1.")
        parser.add_argument(
            "--prefetch",
            type=int,
            default=0,
            metavar="N",
            help="Jobs claimed ahead of a free thread (0-10000), so short jobs are claimed in bigger batches. Default 0.",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            metavar="P",
            help="Worker processes to run under a supervisor that restarts crashed ones and forwards signals. Default 1.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit (status 0) once no served queue has an eligible job and none runs; scheduled jobs are not waited for.",
        )
        parser.add_argument(
            "--visibility",
            type=int,
            metavar="MS",
            help="Lease length of each claim in ms (1 ms - 24 h); heartbeats extend it by as much. Default: each queue's policy.",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="On SIGTERM/SIGINT, how long running jobs may still finish before they are released. Default 30.",
        )
        parser.add_argument(
            "--poll-interval",
            type=int,
            default=200,
            metavar="MS",
            help="First pause (ms) when there is no work; it doubles while idle up to --max-poll-interval. Default 200.",
        )
        parser.add_argument(
            "--max-poll-interval",
            type=int,
            default=1000,
            metavar="MS",
            help="Longest idle pause (ms). PostgreSQL wakes idle workers at once on enqueue anyway. Default 1000.",
        )
        parser.add_argument(
            "--reaper-interval",
            type=int,
            default=1000,
            metavar="MS",
            help="Run the reaper (expire abandoned leases, periodic jobs) this often, in ms. Default 1000.",
        )
        parser.add_argument(
            "--prune-interval",
            type=int,
            default=60_000,
            metavar="MS",
            help="Prune finished jobs and expired tokens this often (with the reaper), in ms; 0 disables. Default 60000.",
        )
        parser.add_argument("--no-reaper", action="store_true", help="Do not run the reaper in this worker.")
        parser.add_argument("--max-jobs", type=int, metavar="N", help="Stop after N jobs (per process).")
        parser.add_argument("--worker-id", metavar="ID", help="Worker id recorded on leases (default host:pid:random).")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar with --burst, even on a terminal.")
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="Serve this process's Prometheus metrics over HTTP on this port (0: any free port, logged). "
            "With --processes P, worker i listens on PORT+i. Needs prometheus-client (django-fq[metrics]).",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help="Address the metrics server listens on. Default 127.0.0.1 (this host only).",
        )

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
        self._validate(options)
        self._check_database(options)
        try:
            load_handlers()
        except HandlerLoadError as exc:
            # A broken fq_handlers module, a wrong FQ_HANDLERS path, two handlers for one queue,
            # a bad TASKS backend (InvalidTaskBackend): one line, no traceback.
            raise CommandError(str(exc)) from exc

        if options["processes"] > 1 and not os.environ.get(SUPERVISOR_ENV):
            self._supervise(options)
            return

        supervisor = os.environ.get(SUPERVISOR_ENV)
        worker_id = options["worker_id"]
        if worker_id and supervisor and os.environ.get("FQ_WORKER_INDEX"):
            worker_id = f"{worker_id}-{os.environ['FQ_WORKER_INDEX']}"
        worker_class = Worker
        if options["metrics_port"] is not None:
            worker_class = self._metrics_worker_class()
        try:
            worker = worker_class(
                options["queues"],
                concurrency=options["concurrency"],
                prefetch=options["prefetch"],
                visibility_ms=options["visibility"],
                poll_interval_ms=options["poll_interval"],
                max_poll_interval_ms=options["max_poll_interval"],
                reaper_interval_ms=options["reaper_interval"],
                prune_interval_ms=options["prune_interval"],
                reaper=not options["no_reaper"],
                grace_s=options["grace"],
                burst=options["burst"],
                max_jobs=options["max_jobs"],
                worker_id=worker_id,
                install_signals=True,
                supervisor_pid=int(supervisor) if supervisor else None,
            )
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from exc

        server = None
        if options["metrics_port"] is not None:
            server = self._serve_metrics(options)
        progress = None
        if options["burst"] and not options["no_progress"] and _isatty(sys.stderr):
            progress = _DrainProgress(worker)
        self._running = True
        try:
            if progress is not None:
                with progress:
                    stats = worker.run()
            else:
                stats = worker.run()
        except InvalidArgument as exc:  # a value every claim refuses: never a traceback, never "0 jobs ok"
            raise CommandError(f"fq_worker: {exc.message}") from exc
        except DatabaseError as exc:  # only a --burst run gives up on the database
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "django_fq_" in text:  # a missing table: the database is there, the migrations are not
                raise CommandError(f"database error: {text} (run `manage.py migrate`?)") from exc
            raise CommandError(f"database unavailable: {text}") from exc
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
        if options["burst"] or options["max_jobs"] is not None:
            line = f"fq_worker: {stats.ok} jobs ok, {stats.failed} failed"
            if stats.timed_out:
                line += f", {stats.timed_out} timed out"
            if stats.settle_errors > stats.timed_out:
                line += f", {stats.settle_errors - stats.timed_out} not settled"
            if stats.released:
                line += f", {stats.released} released"
            self.stdout.write(line)

    def _validate(self, options: dict) -> None:
        for name in options["queues"] or ():
            try:
                validation.queue_name(name)
            except InvalidArgument:
                raise CommandError(f"invalid queue name {name!r}: use 1-200 characters from [A-Za-z0-9:._-]") from None
        worker_id = options["worker_id"]
        if worker_id is not None:
            # Checked here, not at the first claim: every claim would refuse it and the jobs would
            # stay ready. Supervised children add "-INDEX", so the longest of those must fit too.
            longest = worker_id + (f"-{options['processes'] - 1}" if options["processes"] > 1 else "")
            try:
                if not worker_id:
                    raise InvalidArgument("empty", field="--worker-id")
                validation.worker_id(longest, "--worker-id")
            except InvalidArgument:
                limit = 200 - (len(longest) - len(worker_id))
                raise CommandError(
                    f"--worker-id must be 1-{limit} characters of valid UTF-8 text without NUL"
                    + (f" (with --processes {options['processes']}, each process adds -INDEX)" if limit < 200 else "")
                ) from None
        if not 0 <= options["prefetch"] <= MAX_PREFETCH:
            raise CommandError(f"--prefetch must be between 0 and {MAX_PREFETCH}")
        visibility = options["visibility"]
        if visibility is not None:
            try:
                validation.visibility(visibility)
            except InvalidArgument as exc:
                raise CommandError(f"--visibility: {exc.message}") from exc
        for flag, key in (
            ("--poll-interval", "poll_interval"),
            ("--max-poll-interval", "max_poll_interval"),
            ("--reaper-interval", "reaper_interval"),
            ("--prune-interval", "prune_interval"),
        ):
            if not 0 <= options[key] <= MAX_INTERVAL_MS:
                raise CommandError(f"{flag} must be between 0 and {MAX_INTERVAL_MS} ms")
        if options["max_poll_interval"] < options["poll_interval"]:
            raise CommandError("--max-poll-interval must not be below --poll-interval")
        if options["max_jobs"] is not None and options["max_jobs"] < 1:
            raise CommandError("--max-jobs must be at least 1")
        if not 1 <= options["concurrency"] <= MAX_CONCURRENCY:
            raise CommandError(f"--concurrency must be between 1 and {MAX_CONCURRENCY}")
        if not 1 <= options["processes"] <= MAX_PROCESSES:
            raise CommandError(f"--processes must be between 1 and {MAX_PROCESSES}")
        if not 0 <= options["grace"] <= 86_400:
            raise CommandError("--grace must be between 0 and 86400 seconds")
        port = options["metrics_port"]
        if port is not None:
            last = port + (options["processes"] - 1 if port else 0)
            if port < 0 or last > 65535:
                raise CommandError("--metrics-port must be between 0 and 65535 (with --processes P, PORT+P-1 at most 65535)")
            self._metrics_worker_class()  # fail now, not in every child, when prometheus-client is missing

    @staticmethod
    def _metrics_worker_class():
        try:
            from django_fq.metrics.worker import MetricsWorker
        except ImportError as exc:
            raise CommandError(
                f"--metrics-port needs the prometheus-client package (pip install 'django-fq[metrics]'): {exc}"
            ) from exc
        return MetricsWorker

    def _serve_metrics(self, options: dict):
        """Start the metrics HTTP server of this process; a port that cannot be bound is a one-line error."""
        from django_fq.metrics.worker import serve

        port, addr = options["metrics_port"], options["metrics_addr"]
        index = os.environ.get("FQ_WORKER_INDEX") if os.environ.get(SUPERVISOR_ENV) else None
        if port and index:
            port += int(index)
        try:
            return serve(port, addr)
        except (OSError, ValueError) as exc:  # address in use, not an address of this host, ...
            raise _cannot_listen(addr, port, exc) from None

    def _check_database(self, options: dict) -> None:
        """SQLite: run the database checks on ``FQ_DATABASE`` before working, as ``migrate`` does.

        A SQLite file database without WAL (``django_fq.E004``) stops the
        worker here: worker processes and web requests sharing it would block
        each other. ``--skip-checks`` or ``SILENCED_SYSTEM_CHECKS`` lets it start.
        Other databases are not asked anything here, so a worker can start
        while its PostgreSQL server is still coming up (it reconnects).
        """
        store = None if options.get("skip_checks") else storage.find(connections[conf.database()])
        if store is None or not store.embedded:
            return
        self.check(tags=[Tags.database], databases=[conf.database()])

    def _supervise(self, options: dict) -> None:
        """Run ``--processes`` copies of this command (each with ``--processes 1``) under a :class:`Supervisor`."""
        try:
            # Fail here, not in every child, when a queue has no handler.
            Worker(options["queues"], concurrency=options["concurrency"])
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from exc
        if not getattr(settings, "SETTINGS_MODULE", None):
            raise CommandError("--processes needs a settings module (DJANGO_SETTINGS_MODULE)")
        port, addr = options["metrics_port"], options["metrics_addr"]
        if port:  # refuse a taken port before starting anyone (a child still refuses it, with EX_CONFIG)
            from django_fq.metrics.worker import check_port

            for p in range(port, port + options["processes"]):
                try:
                    check_port(p, addr)
                except (OSError, ValueError) as exc:
                    raise _cannot_listen(addr, p, exc) from None
        connections.close_all()  # the children open their own

        def command(index: int) -> list[str]:
            args = _child_args(options)
            if index > 0 and "--no-reaper" not in args:
                args.append("--no-reaper")  # one reaper per supervisor is enough
            return child_command(args)

        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
        paths = [p for p in sys.path if p] + [os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        supervisor = Supervisor(command, options["processes"], env=env)
        code = supervisor.run()
        if code == EX_CONFIG:
            raise CommandError(
                f"worker process {supervisor.failed_index} could not start (its error is above); "
                "the other worker processes were stopped"
            )
        if code:
            raise CommandError(f"{options['processes']} worker processes ended, not all cleanly", returncode=code)

    def _setup_logging(self, verbosity: int) -> None:
        """Send the worker's log lines to stderr unless the project routes them somewhere already."""
        logger = logging.getLogger("django_fq.worker")
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        if logger.level == logging.NOTSET or verbosity != 1:
            logger.setLevel(level)
        if not logger.hasHandlers():
            stream = logging.StreamHandler(sys.stderr)
            stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(stream)


def _cannot_listen(addr: str, port: int, exc: Exception) -> CommandError:
    """The one-line error of a metrics port that cannot be bound: ``--metrics-port: cannot listen on ADDR:PORT: REASON``."""
    reason = getattr(exc, "strerror", None) or str(exc)
    return CommandError(f"--metrics-port: cannot listen on {addr}:{port}: {reason}")


def _child_args(options: dict) -> list[str]:
    """The command line of one supervised child (the same options, one process)."""
    args = [f"--queue={q}" for q in options["queues"] or ()]
    args += [
        f"--concurrency={options['concurrency']}",
        f"--prefetch={options['prefetch']}",
        f"--grace={options['grace']}",
        f"--poll-interval={options['poll_interval']}",
        f"--max-poll-interval={options['max_poll_interval']}",
        f"--reaper-interval={options['reaper_interval']}",
        f"--prune-interval={options['prune_interval']}",
        f"--verbosity={options['verbosity']}",
        "--no-progress",
    ]
    if options["visibility"] is not None:
        args.append(f"--visibility={options['visibility']}")
    if options["burst"]:
        args.append("--burst")
    if options["no_reaper"]:
        args.append("--no-reaper")
    if options["max_jobs"] is not None:
        args.append(f"--max-jobs={options['max_jobs']}")
    if options["worker_id"]:
        args.append(f"--worker-id={options['worker_id']}")
    if options["metrics_port"] is not None:
        args += [f"--metrics-port={options['metrics_port']}", f"--metrics-addr={options['metrics_addr']}"]
    return args


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
