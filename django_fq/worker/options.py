"""The options of ``fq_worker``, in one place: :class:`WorkerOptions`.

Each field of the frozen dataclass carries its command-line flag, help,
metavar, check and the :class:`~django_fq.worker.Worker` argument it feeds
(:func:`option`). From that one declaration come:

* the command's argparse arguments (:meth:`WorkerOptions.add_arguments`),
* their defaults (the field's default),
* their validation (:meth:`WorkerOptions.validate`: each field's check, then
  the few rules that relate two fields),
* the keyword arguments of the :class:`~django_fq.worker.Worker`
  (:meth:`WorkerOptions.worker_kwargs`),
* the command line of each child of ``--processes`` (:meth:`WorkerOptions.child_argv`).

Adding an option is one new field here (and using it where it acts).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import validation
from ..exceptions import InvalidArgument, WorkerConfigError

#: Longest accepted --poll-interval / --max-poll-interval / --reaper-interval / --prune-interval: one hour.
MAX_INTERVAL_MS = 3_600_000
#: Most threads (--concurrency) and processes (--processes) one command runs.
MAX_CONCURRENCY, MAX_PROCESSES = 1000, 256
#: Most jobs a worker may claim ahead of its runner threads.
MAX_PREFETCH = 10_000
#: The values of --pool: handlers run on threads of the worker (default) or in child processes.
POOLS = ("threads", "processes")
#: --soft-timeout-ms when not given (with --pool processes), and its largest value: the longest
#: timeout_ms a queue may have (7 days, docs/reference/semantics.md).
DEFAULT_SOFT_TIMEOUT_MS, MAX_SOFT_TIMEOUT_MS = 1000, 604_800_000


def _between(low: float, high: float, what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else what

    return check


def _interval(flag: str) -> Callable[[Any], str | None]:
    return _between(0, MAX_INTERVAL_MS, f"{flag} must be between 0 and {MAX_INTERVAL_MS} ms")


def _queue_names(names: Any) -> str | None:
    for name in names or ():
        try:
            validation.queue_name(name)
        except InvalidArgument:
            return f"invalid queue name {name!r}: use 1-200 characters from [A-Za-z0-9:._-]"
    return None


def _visibility(value: Any) -> str | None:
    if value is None:
        return None
    try:
        validation.visibility(value)
    except InvalidArgument as exc:
        return f"--visibility: {exc.message}"
    return None


def _max_jobs(value: Any) -> str | None:
    return "--max-jobs must be at least 1" if value is not None and value < 1 else None


def option(
    default: Any,
    *flags: str,
    help: str,
    metavar: str | None = None,
    type: Callable[[str], Any] | None = None,
    action: str | None = None,
    check: Callable[[Any], str | None] | None = None,
    worker: str | None = None,
    to_worker: Callable[[Any], Any] | None = None,
    child: bool = True,
) -> Any:
    """Declare one option: a dataclass field whose metadata says how the command line and the worker see it.

    Args:
        default: the value when the flag is not given (``None``: not set).
        flags: the command-line flag(s), ``--name`` first.
        help, metavar, type, action: as for ``argparse.add_argument``. ``action="store_true"``
            makes a flag without a value; ``action="append"`` a repeatable one (a tuple here).
        check: ``check(value)`` returns the error text of a bad value, or ``None`` when it is good.
        worker: the :class:`~django_fq.worker.Worker` keyword argument the value feeds (``None``: none).
        to_worker: turns the option's value into that argument's (default: the same value).
        child: False for an option a supervised child must not get from its parent.
    """
    meta = {
        "flags": flags,
        "help": help,
        "metavar": metavar,
        "type": type,
        "action": action,
        "check": check,
        "worker": worker,
        "to_worker": to_worker,
        "child": child,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class WorkerOptions:
    """The options of one ``fq_worker`` run (see ``docs/reference/cli.md``); build it with :meth:`from_options`.

    The field names are the command's option names (``options["poll_interval"]``).
    """

    queues: tuple[str, ...] | None = option(
        None,
        "--queue",
        action="append",
        metavar="QUEUE",
        help="Queue to serve (repeatable). Default: every queue with a registered handler.",
        check=_queue_names,
        worker="queues",
    )
    concurrency: int = option(
        1,
        "--concurrency",
        type=int,
        metavar="N",
        help=(
            "Jobs run at once per process (threads; async def handlers: tasks on one event loop; "
            "child processes with --pool processes). Default 1."
        ),
        check=_between(1, MAX_CONCURRENCY, f"--concurrency must be between 1 and {MAX_CONCURRENCY}"),
        worker="concurrency",
    )
    prefetch: int = option(
        0,
        "--prefetch",
        type=int,
        metavar="N",
        help="Jobs claimed ahead of a free thread (0-10000), so short jobs are claimed in bigger batches. Default 0.",
        check=_between(0, MAX_PREFETCH, f"--prefetch must be between 0 and {MAX_PREFETCH}"),
        worker="prefetch",
    )
    processes: int = option(
        1,
        "--processes",
        type=int,
        metavar="P",
        help="Worker processes to run under a supervisor that restarts crashed ones and forwards signals. Default 1.",
        check=_between(1, MAX_PROCESSES, f"--processes must be between 1 and {MAX_PROCESSES}"),
        child=False,  # each child is one process
    )
    pool: str = option(
        "threads",
        "--pool",
        metavar="KIND",
        help="Where handlers run: 'threads' (default: --concurrency threads of this process) or 'processes' "
        "(--concurrency long-lived child processes; a job past its timeout_ms is killed with its child). "
        "Not --processes, which runs several whole workers.",
        check=lambda value: None if value in POOLS else "--pool must be 'threads' or 'processes'",
        worker="pool",
    )
    soft_timeout_ms: int | None = option(
        None,
        "--soft-timeout-ms",
        type=int,
        metavar="MS",
        help="With --pool processes: raise django_fq.exceptions.SoftTimeout in the handler this long before "
        "the job's timeout_ms kills it (at most half the timeout); 0: no soft timeout. Default 1000.",
        check=lambda value: None
        if value is None or 0 <= value <= MAX_SOFT_TIMEOUT_MS
        else f"--soft-timeout-ms must be between 0 and {MAX_SOFT_TIMEOUT_MS}",
        worker="soft_timeout_ms",
        to_worker=lambda value: DEFAULT_SOFT_TIMEOUT_MS if value is None else value,
    )
    max_jobs_per_child: int | None = option(
        None,
        "--max-jobs-per-child",
        type=int,
        metavar="N",
        help="With --pool processes: replace a child process after it ran N jobs (frees what a handler leaks). "
        "Default: never.",
        check=lambda value: None if value is None or value >= 1 else "--max-jobs-per-child must be at least 1",
        worker="max_jobs_per_child",
    )
    burst: bool = option(
        False,
        "--burst",
        action="store_true",
        help="Exit (status 0) once no served queue has an eligible job and none runs; scheduled jobs are not waited for.",
        worker="burst",
    )
    visibility: int | None = option(
        None,
        "--visibility",
        type=int,
        metavar="MS",
        help="Lease length of each claim in ms (1 ms - 24 h); heartbeats extend it by as much. Default: each queue's policy.",
        check=_visibility,
        worker="visibility_ms",
    )
    grace: float = option(
        30.0,
        "--grace",
        type=float,
        metavar="SECONDS",
        help="On SIGTERM/SIGINT, how long running jobs may still finish before they are released. Default 30.",
        check=_between(0, 86_400, "--grace must be between 0 and 86400 seconds"),
        worker="grace_s",
    )
    poll_interval: int = option(
        200,
        "--poll-interval",
        type=int,
        metavar="MS",
        help="First pause (ms) when there is no work; it doubles while idle up to --max-poll-interval. Default 200.",
        check=_interval("--poll-interval"),
        worker="poll_interval_ms",
    )
    max_poll_interval: int = option(
        1000,
        "--max-poll-interval",
        type=int,
        metavar="MS",
        help="Longest idle pause (ms). PostgreSQL wakes idle workers at once on enqueue anyway. Default 1000.",
        check=_interval("--max-poll-interval"),
        worker="max_poll_interval_ms",
    )
    reaper_interval: int = option(
        1000,
        "--reaper-interval",
        type=int,
        metavar="MS",
        help="Run the reaper (expire abandoned leases, periodic jobs) this often, in ms. Default 1000.",
        check=_interval("--reaper-interval"),
        worker="reaper_interval_ms",
    )
    prune_interval: int = option(
        60_000,
        "--prune-interval",
        type=int,
        metavar="MS",
        help="Prune finished jobs and expired tokens this often (with the reaper), in ms; 0 disables. Default 60000.",
        check=_interval("--prune-interval"),
        worker="prune_interval_ms",
    )
    no_reaper: bool = option(
        False,
        "--no-reaper",
        action="store_true",
        help="Do not run the reaper in this worker.",
        worker="reaper",
        to_worker=lambda value: not value,
    )
    max_jobs: int | None = option(
        None, "--max-jobs", type=int, metavar="N", help="Stop after N jobs (per process).", check=_max_jobs, worker="max_jobs"
    )
    worker_id: str | None = option(
        None,
        "--worker-id",
        metavar="ID",
        help="Worker id recorded on leases (default host:pid:random).",
        worker="worker_id",
    )  # checked in validate(): the children of --processes add -INDEX to it
    no_progress: bool = option(
        False, "--no-progress", action="store_true", help="No progress bar with --burst, even on a terminal."
    )
    metrics_port: int | None = option(
        None,
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="Serve this process's Prometheus metrics over HTTP on this port (0: any free port, logged). "
        "With --processes P, worker i listens on PORT+i. Needs prometheus-client (django-fq[metrics]).",
    )  # checked in validate(): the children of --processes listen on PORT+INDEX
    metrics_addr: str = option(
        "127.0.0.1",
        "--metrics-addr",
        metavar="ADDR",
        help="Address the metrics server listens on. Default 127.0.0.1 (this host only).",
    )

    # --- where the options come from and go to ------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        """Add every option to ``parser`` (an ``argparse.ArgumentParser``), defaults and help included."""
        for f in dataclasses.fields(cls):
            meta = f.metadata
            kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"]}
            if meta["action"] is not None:
                kwargs["action"] = meta["action"]
            if meta["action"] != "store_true":
                kwargs["metavar"] = meta["metavar"]
            if meta["type"] is not None:
                kwargs["type"] = meta["type"]
            if f.default is not None and meta["action"] != "store_true":
                kwargs["default"] = f.default
            parser.add_argument(*meta["flags"], **kwargs)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> WorkerOptions:
        """The options of a parsed command (``options`` of ``handle``; keys not declared here are ignored)."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in options:
                value = options[f.name]
                if f.metadata["action"] == "append" and value is not None:
                    value = tuple(value)
                values[f.name] = value
        return cls(**values)

    def validate(self) -> None:
        """Check every option, and the rules between two of them.

        Raises:
            WorkerConfigError: the first bad value, with the flag it came from in its message.
        """
        for f in dataclasses.fields(self):
            check = f.metadata["check"]
            error = check(getattr(self, f.name)) if check is not None else None
            if error:
                raise WorkerConfigError(error)
        if self.max_poll_interval < self.poll_interval:
            raise WorkerConfigError("--max-poll-interval must not be below --poll-interval")
        if self.pool != "processes":
            for flag, value, why in (
                ("--soft-timeout-ms", self.soft_timeout_ms, "a thread cannot be interrupted from outside"),
                ("--max-jobs-per-child", self.max_jobs_per_child, "only that pool has child processes to replace"),
            ):
                if value is not None:
                    raise WorkerConfigError(f"{flag} needs --pool processes ({why})")
        self._check_worker_id()
        port = self.metrics_port
        if port is not None:
            last = port + (self.processes - 1 if port else 0)
            if port < 0 or last > 65535:
                raise WorkerConfigError("--metrics-port must be between 0 and 65535 (with --processes P, PORT+P-1 at most 65535)")

    def _check_worker_id(self) -> None:
        worker_id = self.worker_id
        if worker_id is None:
            return
        # Checked here, not at the first claim: every claim would refuse it and the jobs would
        # stay ready. Supervised children add "-INDEX", so the longest of those must fit too.
        longest = worker_id + (f"-{self.processes - 1}" if self.processes > 1 else "")
        try:
            if not worker_id:
                raise InvalidArgument("empty", field="--worker-id")
            validation.worker_id(longest, "--worker-id")
        except InvalidArgument:
            limit = 200 - (len(longest) - len(worker_id))
            raise WorkerConfigError(
                f"--worker-id must be 1-{limit} characters of valid UTF-8 text without NUL"
                + (f" (with --processes {self.processes}, each process adds -INDEX)" if limit < 200 else "")
            ) from None

    def worker_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~django_fq.worker.Worker` these options give (``queues`` included)."""
        kwargs = {}
        for f in dataclasses.fields(self):
            target = f.metadata["worker"]
            if target is None:
                continue
            value = getattr(self, f.name)
            convert = f.metadata["to_worker"]
            kwargs[target] = convert(value) if convert is not None else value
        if kwargs.get("queues") is not None:
            kwargs["queues"] = list(kwargs["queues"])
        return kwargs

    def argv(self) -> list[str]:
        """The command-line arguments that give these options (every option that is set, ``--flag=value``)."""
        args: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = f.metadata["flags"][0]
            if f.metadata["action"] == "store_true":
                if value:
                    args.append(flag)
            elif f.metadata["action"] == "append":
                args += [f"{flag}={item}" for item in value or ()]
            elif value is not None:
                if isinstance(value, float) and not math.isfinite(value):
                    raise WorkerConfigError(f"{flag} must be a finite number")
                args.append(f"{flag}={value}")
        return args

    def child(self, index: int) -> WorkerOptions:
        """The options of supervised child ``index``: one process, no progress bar, one reaper (child 0's)."""
        changes: dict[str, Any] = {
            f.name: f.default for f in dataclasses.fields(self) if not f.metadata["child"]
        }
        changes["no_progress"] = True
        if index > 0:
            changes["no_reaper"] = True  # one reaper per supervisor is enough
        return dataclasses.replace(self, **changes)

    def child_argv(self, index: int, verbosity: int = 1) -> list[str]:
        """The ``fq_worker`` arguments of supervised child ``index`` (Django's ``--verbosity`` passed along)."""
        return [*self.child(index).argv(), f"--verbosity={verbosity}"]
