"""``manage.py fq_worker``: run the handlers of django-fq queues.

    manage.py fq_worker                       # every queue with a registered handler
    manage.py fq_worker --queue emails --queue reports
    manage.py fq_worker --burst               # drain what is eligible now, then exit 0

Log lines go to the ``django_fq.worker`` logger (to stderr when the project
configured no handler for it): start and stop, and one line per job with its
id, queue, attempt and run time. Receipts and payloads are never logged.
"""

from __future__ import annotations

import logging
import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_fq import handlers, validation
from django_fq.exceptions import InvalidArgument
from django_fq.worker import Worker, WorkerConfigError

#: Longest accepted --poll-interval / --reaper-interval: one hour.
MAX_INTERVAL_MS = 3_600_000


class Command(BaseCommand):
    help = "Run django-fq workers: claim jobs, run their handlers, ack or nack them; reap expired leases."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Queue to serve (repeatable). Default: every queue with a registered handler.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit (status 0) once no served queue has an eligible job; scheduled jobs are not waited for.",
        )
        parser.add_argument(
            "--visibility",
            type=int,
            metavar="MS",
            help="Lease length of each claim in ms (1 ms - 24 h). Default: each queue's policy.",
        )
        parser.add_argument(
            "--poll-interval",
            type=int,
            default=200,
            metavar="MS",
            help="Sleep this long (ms) when there is no work. Default 200.",
        )
        parser.add_argument(
            "--reaper-interval",
            type=int,
            default=1000,
            metavar="MS",
            help="Run the reaper (expire abandoned leases) at most this often, in ms. Default 1000.",
        )
        parser.add_argument("--no-reaper", action="store_true", help="Do not run the reaper in this worker.")
        parser.add_argument("--max-jobs", type=int, metavar="N", help="Stop after N jobs.")

    def handle(self, *args, **options) -> None:
        self._setup_logging(options["verbosity"])
        for name in options["queues"] or ():
            try:
                validation.queue_name(name)
            except InvalidArgument:
                raise CommandError(f"invalid queue name {name!r}: use 1-200 characters from [A-Za-z0-9:._-]")
        visibility = options["visibility"]
        if visibility is not None:
            try:
                validation.visibility(visibility)
            except InvalidArgument as exc:
                raise CommandError(f"--visibility: {exc.message}")
        for flag, key in (("--poll-interval", "poll_interval"), ("--reaper-interval", "reaper_interval")):
            if not 0 <= options[key] <= MAX_INTERVAL_MS:
                raise CommandError(f"{flag} must be between 0 and {MAX_INTERVAL_MS} ms")
        if options["max_jobs"] is not None and options["max_jobs"] < 1:
            raise CommandError("--max-jobs must be at least 1")

        handlers.autodiscover()
        try:
            worker = Worker(
                options["queues"],
                visibility_ms=visibility,
                poll_interval_ms=options["poll_interval"],
                reaper_interval_ms=options["reaper_interval"],
                reaper=not options["no_reaper"],
                burst=options["burst"],
                max_jobs=options["max_jobs"],
            )
        except WorkerConfigError as exc:
            raise CommandError(str(exc))

        stats = worker.run()
        if options["burst"] or options["max_jobs"] is not None:
            line = f"fq_worker: {stats.ok} jobs ok, {stats.failed} failed"
            if stats.settle_errors:
                line += f", {stats.settle_errors} not settled"
            self.stdout.write(line)

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
