"""``manage.py fq …``: the command line of django-fq.

One subcommand per operation of :mod:`django_fq.services`, with the same
names and rules; this module only parses arguments and prints results. Every
subcommand accepts ``--json`` for machine-readable output on stdout. Times are
epoch milliseconds and durations milliseconds, as everywhere in django-fq.

Exit status: 0 on success; 1 when django-fq refuses the request (unknown queue
or job, bad JSON, value out of range, invalid receipt, wrong state, …) — the
message goes to stderr (with ``--json``: the error's JSON object) and nothing
is changed; 2 for malformed command lines (argparse usage errors: one line on
stderr, with ``--json`` the object ``{"code": "usage", "message", "field"}``).
``fq health`` answers 3 (unknown) instead of 1 and 2, for monitoring systems.

Django's own options (``--settings``, ``--pythonpath``, ``--traceback``,
``-v``, ``--no-color``, ``--force-color``, ``--skip-checks``) are accepted before or after the
subcommand: ``manage.py fq stats emails --settings=mysite.settings``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import re
import sys
from dataclasses import asdict
from typing import IO, cast

from django.core import checks
from django.core.management.base import BaseCommand, CommandError, SystemCheckError
from django.db import OperationalError, ProgrammingError
from django.utils.connection import ConnectionDoesNotExist

from ... import backup, batches, conf, health, services, workflows
from ...exceptions import FqError, InvalidArgument, InvalidBackup, InvalidJson
from ...services import dependencies
from ...services.history import history_series
from ...types import STATE_NAMES, TOTAL_NAMES
from ...validation import file_path, parse_json

#: Service argument names → the command-line option that supplies them (for error messages).
OPTION_OF_FIELD = {
    "queue": "QUEUE",
    "job_id": "JOB_ID",
    "receipt": "RECEIPT",
    "payload": "PAYLOAD_JSON",
    "source": "SOURCE",
    "priority": "--priority",
    "delay_ms": "--delay",
    "at": "--at",
    "idempotency": "--idempotency",
    "idempotency_retention_ms": "--idempotency-retention",
    "unique_key": "--unique-key",
    "concurrency_key": "--concurrency-key",
    "batch": "--batch",
    "batch_id": "BATCH_ID",
    "key_concurrency": "--key-concurrency",
    "key_rate_limit": "--key-rate-limit",
    "max_attempts": "--max-attempts",
    "timeout_ms": "--timeout",
    "concurrency": "--concurrency",
    "backoff_ms": "--backoff",
    "max_backoff_ms": "--max-backoff",
    "visibility_ms": "--visibility",
    "ttl_ms": "--ttl",
    "rate_limit": "--rate-limit",
    "rate_window_ms": "--rate-window",
    "count": "--count",
    "wait_ms": "--wait",
    "worker": "--worker",
    "result": "--result",
    "error": "--error",
    "state": "--state",
    "cursor": "--cursor",
    "retention_ms": "--retention",
    "progress": "PERCENT",
    "message": "--message",
    "limit": "--limit",
    "stuck_lease_ms": "--stuck-lease-ms",
    "max_dead": "--max-dead",
    "max_ready_age_ms": "--max-ready-age-ms",
}

#: ``config`` options → policy field names.
POLICY_OPTIONS = (
    ("concurrency", "concurrency", "N", "jobs running at once across all workers (0-100000, 0 = unlimited)"),
    ("max-attempts", "max_attempts", "N", "attempts before a job is dead (1-1000; future jobs only)"),
    ("backoff", "backoff_ms", "MS", "base of the exponential retry delay (0-86400000)"),
    ("max-backoff", "max_backoff_ms", "MS", "cap of the retry delay (>= backoff, <= 30 days)"),
    ("visibility", "visibility_ms", "MS", "default lease length of claims (1 ms - 24 h)"),
    ("idempotency-retention", "idempotency_retention_ms", "MS", "how long an idempotency token deduplicates (1 ms - 30 days)"),
    ("timeout", "timeout_ms", "MS", "a running job past this fails with a timeout (0-7 days, 0 = none)"),
    ("ttl", "ttl_ms", "MS", "delete the queue once empty and idle this long (0-365 days, 0 = never)"),
    ("key-concurrency", "key_concurrency", "N", "jobs of one concurrency key running at once (0-100000, 0 = unlimited)"),
    ("rate-limit", "rate_limit", "N", "claims allowed in any window of --rate-window (0-1000000, 0 = no rate limit)"),
    ("rate-window", "rate_window_ms", "MS", "the rate limits' sliding window (1 ms - 24 h, default 1000)"),
    ("key-rate-limit", "key_rate_limit", "N", "claims of one concurrency key allowed in any window of --rate-window (0-1000000, 0 = none)"),
)


def _names(message: str, where: str) -> bool:
    """Whether ``message`` already names ``where`` as it would be appended (``items[1].priority``)."""
    return re.search(rf"(?<![\w.\[-]){re.escape(where)}(?![\w\[-])", message) is not None


def _django_options(p: argparse.ArgumentParser) -> None:
    """Django's own options on an operation's parser, so they may follow the operation too.

    Django reads ``--settings`` and ``--pythonpath`` from anywhere on the
    command line before the command runs; without these, the operation's
    parser would then refuse them. Hidden from the operation's help (they are
    in ``manage.py fq --help``) and left unset unless given, so a value given
    before the operation stands.
    """
    hidden = argparse.SUPPRESS
    p.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=hidden, help=hidden)
    p.add_argument("--settings", default=hidden, help=hidden)
    p.add_argument("--pythonpath", default=hidden, help=hidden)
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        p.add_argument(flag, action="store_true", default=hidden, help=hidden)


class Command(BaseCommand):
    help = "Inspect and operate django-fq queues: the command-line mirror of django_fq.services."
    #: ``call_command("fq", "enqueue-many", "q", "-", stdin=...)`` reads that stream instead of sys.stdin.
    stealth_options = ("stdin",)

    # --- argument parsing -------------------------------------------------------------

    def add_arguments(self, parser):
        # --json is accepted before or after the operation; the operation's copy
        # leaves the value alone unless given, so it cannot reset the other.
        parser.add_argument("--json", dest="as_json", action="store_true", help="print machine-readable JSON")
        parser.error = functools.partial(_usage_error, parser)
        sub = parser.add_subparsers(dest="op", metavar="OP", required=True, title="operations")
        parse_known_args = parser.parse_known_args

        def parse_known_args_of_fq(args=None, namespace=None):
            # Arguments no parser took are refused by the top-level parser (exit 2), after the
            # operation's parser ran: refuse them as that operation, so fq health exits 3.
            parser.fq_argv = list(sys.argv[1:] if args is None else args)  # where _usage_error looks for --json
            found, extras = parse_known_args(args, namespace)
            op_parser = sub.choices.get(getattr(found, "op", None) or "")
            if extras and op_parser is not None:
                op_parser.error(f"unrecognized arguments: {' '.join(extras)}")
            return found, extras

        parser.parse_known_args = parse_known_args_of_fq

        def op(name, help_text):
            p = sub.add_parser(name, help=help_text, description=help_text)
            p.error = functools.partial(_usage_error, p, root=parser)
            p.add_argument(
                "--json", dest="as_json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON"
            )
            _django_options(p)
            return p

        def queue(p, optional=False):
            if optional:
                p.add_argument("queue", metavar="QUEUE", nargs="?", default=None, help="queue name (default: every queue)")
            else:
                p.add_argument("queue", metavar="QUEUE", help="queue name: 1-200 of [A-Za-z0-9:._-]")

        p = op("config", "Print a queue's policy, or set policy fields (creating the queue).")
        queue(p)
        for flag, dest, metavar, text in POLICY_OPTIONS:
            p.add_argument(f"--{flag}", dest=dest, type=_integer, metavar=metavar, help=text)

        op("queues", "List every queue with its policy and job counts.")

        p = op("delete", "Delete a queue with all its jobs, leases and idempotency tokens.")
        queue(p)

        p = op("pause", "Stop every claim of a queue (running jobs finish; enqueues go on) until resume.")
        queue(p)

        p = op("resume", "Let claims of a paused queue take jobs again.")
        queue(p)

        p = op("enqueue", "Add one job; prints its id and whether it was created (0 for a duplicate).")
        queue(p)
        p.add_argument("payload", metavar="PAYLOAD_JSON", help='the payload as JSON (e.g. \'{"to": 1}\'), or - to read stdin')
        self._enqueue_options(p)

        p = op(
            "enqueue-many",
            "Add many jobs in one transaction (all or nothing) from a JSON array of envelopes or JSON lines "
            '(one envelope per line). An envelope is {"payload": ..., "priority", "delay_ms", "at", '
            '"idempotency", "idempotency_retention_ms", "unique_key", "max_attempts", "timeout_ms", "metadata", '
            '"concurrency_key", "depends_on", "batch"}.',
        )
        queue(p)
        p.add_argument("source", metavar="SOURCE", help="file path, or - to read stdin")

        p = op("claim", "Take up to --count eligible jobs under new leases; prints each job's receipt.")
        queue(p)
        p.add_argument("--count", type=_integer, default=1, metavar="N", help="jobs at most (1-1000, default 1)")
        p.add_argument("--visibility", dest="visibility_ms", type=_integer, metavar="MS", help="lease length (1 ms - 24 h; default: the queue's policy)")
        p.add_argument("--wait", dest="wait_ms", type=_integer, default=0, metavar="MS", help="long-poll up to this long for a job (0-20000, default 0)")
        p.add_argument("--worker", default="", help="worker id recorded on the leases")

        p = op("ack", "Mark the job of a receipt succeeded.")
        self._receipt(p)
        p.add_argument("--result", metavar="JSON", help="result to store, as JSON")

        p = op("nack", "Record a failed attempt: retry after --delay or the queue's backoff, or dead when out of attempts.")
        self._receipt(p)
        p.add_argument("--delay", dest="delay_ms", type=_integer, metavar="MS", help="retry after this long (0 - 30 days; default: backoff)")
        p.add_argument("--error", metavar="TEXT", help="error text to record")
        p.add_argument("--permanent", action="store_true", help="make the job dead now, whatever its attempts")

        p = op("release", "Give a job back, the attempt not counted: ready again now, or after --delay-ms (a snooze).")
        self._receipt(p)
        p.add_argument("--error", metavar="TEXT", help='reason to record (default "released", or "snoozed" with --delay-ms)')
        p.add_argument("--delay-ms", dest="delay_ms", type=_integer, metavar="MS", help="eligible again this long from now (0 - 30 days; default: now)")

        p = op("extend", "Move a lease's deadline to now + --visibility; prints the new deadline.")
        self._receipt(p)
        p.add_argument("--visibility", dest="visibility_ms", type=_integer, metavar="MS", required=True, help="1 ms - 24 h")

        p = op("progress", "Store how far the running job of a receipt got: a percentage and a short message.")
        self._receipt(p)
        p.add_argument("progress", metavar="PERCENT", type=_number, help="a number from 0 to 100")
        p.add_argument("--message", default="", metavar="TEXT", help="at most 200 characters (default: none)")

        for name, text in (
            ("get", "Show a job: metadata, payload, result and error history."),
            ("retry", "Make a dead job ready again with attempts reset to 0."),
            ("requeue", "Make a scheduled job (delayed or waiting to retry) ready now."),
            ("cancel", "Cancel a waiting, scheduled, ready, running or dead job (and its dependents, as their edges say)."),
        ):
            p = op(name, text)
            queue(p)
            p.add_argument("job_id", metavar="JOB_ID")

        p = op(
            "workflow",
            "Show the workflow of a job (every job connected to it by dependencies) as a tree with states, "
            "cancel every step of it that has not finished, list the results of a job's dependencies "
            "(upstream QUEUE JOB_ID), or create a whole workflow from a JSON document (create FILE|-).",
        )
        p.add_argument(
            "action",
            choices=("show", "cancel", "upstream", "create"),
            help="show the tree, cancel the unfinished steps, list the upstream results, or create a workflow",
        )
        p.add_argument("queue", metavar="QUEUE|FILE", help="the job's queue; for create: the workflow file, or - for stdin")
        p.add_argument("job_id", metavar="JOB_ID", nargs="?", default=None, help="any job of the workflow (not with create)")

        p = op("results", "List the results of the jobs a job depends on (as its handler reads them in job.upstream).")
        queue(p)
        p.add_argument("job_id", metavar="JOB_ID")

        p = op(
            "batch",
            "Batches of jobs with one callback once every member finished: create QUEUE, add BATCH_ID SOURCE "
            "(envelopes as for enqueue-many), seal BATCH_ID, show BATCH_ID (counts, progress, members), "
            "list [QUEUE], cancel BATCH_ID.",
        )
        p.add_argument("action", choices=("create", "add", "seal", "show", "list", "cancel"), help="what to do")
        p.add_argument("target", metavar="QUEUE|BATCH_ID", nargs="?", default=None, help="QUEUE for create and list, else BATCH_ID")
        p.add_argument("source", metavar="SOURCE", nargs="?", default=None, help="add: file path of envelopes, or - to read stdin")
        p.add_argument("--callback", metavar="PAYLOAD_JSON", help="create: the callback's payload (no callback without it)")
        p.add_argument("--callback-queue", dest="callback_queue", metavar="QUEUE", help="create: the callback's queue (default: the batch's)")
        p.add_argument("--callback-options", dest="callback_options", metavar="JSON", help='create: the callback\'s options, e.g. \'{"priority": 5, "metadata": {...}}\'')
        p.add_argument("--state", help="show: only members in this state; list: only batches in this state")
        p.add_argument("--count", type=_integer, default=20, metavar="N", help="show: members listed; list: batches listed (1-1000, default 20)")
        p.add_argument("--after", metavar="ID", help="show: members after this job id; list: batches after this batch id")

        p = op("jobs", "List a queue's jobs (metadata only), one page at a time.")
        queue(p)
        p.add_argument("--state", choices=STATE_NAMES, help="only jobs in this state")
        p.add_argument("--cursor", help="next_cursor of the previous page")
        p.add_argument("--count", type=_integer, default=20, metavar="N", help="page size (1-1000, default 20)")
        p.add_argument("--tag", metavar="TAG", help='only jobs whose metadata "tags" hold TAG (exact)')

        p = op(
            "workers",
            "List the worker processes (host, pid, queues, concurrency, jobs running, last heartbeat, version); "
            "a worker with no heartbeat for 3 intervals is shown as gone.",
        )
        p.add_argument("--state", choices=("live", "gone"), help="only workers in this state")
        p.add_argument("--queue", metavar="QUEUE", help="only workers serving this queue")

        p = op("stats", "Show counts per state, totals, and wait/run time sums of a queue.")
        queue(p)

        p = op(
            "history",
            "Show the per-minute history (enqueued, succeeded, failed, dead; wait and run time median/p95) of a "
            "queue, or of every queue, over the last hour, day or week (docs/reference/history.md).",
        )
        queue(p, optional=True)
        p.add_argument("--span", default="hour", metavar="SPAN", help="hour (1-minute buckets, the default), day (15 min) or week (1 h)")
        p.add_argument("--all", dest="all_buckets", action="store_true", help="list empty buckets too")

        p = op("wait", "Block until a job succeeded, died or was cancelled; print it.")
        queue(p)
        p.add_argument("job_id", metavar="JOB_ID")
        p.add_argument("--timeout", dest="timeout_ms", type=_integer, default=30_000, metavar="MS", help="give up after this long (0 - 24 h, default 30000); exit 1")

        p = op("reap", "Handle leases past their deadline now (as failed attempts).")
        queue(p, optional=True)
        p.add_argument("--limit", type=_integer, default=10_000, metavar="N", help="leases handled at most (default 10000)")

        p = op(
            "prune",
            "Delete finished (succeeded/cancelled) jobs past the retention, expired tokens, and queues past their ttl_ms.",
        )
        p.add_argument("--retention", dest="retention_ms", type=_integer, metavar="MS", help="default: FQ_FINISHED_RETENTION_MS (7 days)")
        p.add_argument("--limit", type=_integer, default=100_000, metavar="N", help="rows of each kind deleted at most (default 100000)")

        p = op(
            "health",
            "Check the queues for monitoring; exit 0 ok, 1 warning, 2 critical, 3 unknown (bad arguments, "
            "unknown queue, database unreachable). Stuck leases (past their deadline by more than "
            "--stuck-lease-ms and not reaped: no reaper runs) and a ready job older than --max-ready-age-ms "
            "are critical; more than --max-dead dead jobs is a warning.",
        )
        queue(p, optional=True)
        p.add_argument(
            "--stuck-lease-ms", dest="stuck_lease_ms", type=_integer, default=health.DEFAULT_STUCK_LEASE_MS, metavar="MS",
            help=f"a lease this long past its deadline is stuck (0 - 30 days, default {health.DEFAULT_STUCK_LEASE_MS})",
        )  # fmt: skip
        p.add_argument("--max-dead", dest="max_dead", type=_integer, metavar="N", help="warn when a queue has more dead jobs than this (default: not checked)")
        p.add_argument(
            "--max-ready-age-ms", dest="max_ready_age_ms", type=_integer, metavar="MS",
            help="critical when a job has been ready (not claimed) for longer than this (0 - 30 days; default: not checked)",
        )  # fmt: skip
        # A monitoring system reads exit 2 as "critical": a usage error must be "unknown" (3) instead.
        p.error = functools.partial(_usage_error, p, root=parser, exit_code=health.UNKNOWN_EXIT)

        p = op(
            "export",
            "Back up queues as JSON Lines: policy and totals, jobs in every state (running ones as ready), "
            "idempotency tokens. Writes stdout unless --output; the summary goes to stderr then.",
        )
        p.add_argument("queues", metavar="QUEUE", nargs="*", help="queues to export (default: every queue)")
        p.add_argument("--output", "-o", metavar="FILE", help="write FILE (replaced only once the export is complete)")

        p = op(
            "import",
            "Restore a backup written by export, in one transaction: existing queues, jobs (by id) and tokens "
            "are skipped, a bad line changes nothing.",
        )
        p.add_argument("source", metavar="FILE", help="the backup file, or - to read stdin")
        p.add_argument("--dry-run", action="store_true", help="check every line and count what would be imported; change nothing")

    @staticmethod
    def _receipt(p):
        p.add_argument("queue", metavar="QUEUE", help="queue name")
        p.add_argument("receipt", metavar="RECEIPT", help="the receipt printed by claim")

    @staticmethod
    def _enqueue_options(p):
        p.add_argument("--priority", type=_integer, metavar="N", help="higher is claimed first (32-bit signed, default 0)")
        p.add_argument("--delay", dest="delay_ms", type=_integer, metavar="MS", help="eligible this long from now (0 - 10 years); not with --at")
        p.add_argument("--at", type=_integer, metavar="EPOCH_MS", help="eligible at this instant (within 10 years); not with --delay")
        p.add_argument("--idempotency", metavar="TOKEN", help="deduplicate enqueues with this token")
        p.add_argument("--idempotency-retention", dest="idempotency_retention_ms", type=_integer, metavar="MS", help="token lifetime (default: the queue's policy)")
        p.add_argument("--unique-key", dest="unique_key", metavar="KEY", help="coalesce onto the active job holding this key")
        p.add_argument("--concurrency-key", dest="concurrency_key", metavar="KEY", help="1-200 characters; at most the queue's key_concurrency jobs of one key run at once")
        p.add_argument("--max-attempts", dest="max_attempts", type=_integer, metavar="N", help="1-1000 (default: the queue's policy)")
        p.add_argument("--timeout", dest="timeout_ms", type=_integer, metavar="MS", help="0 - 7 days, 0 = none (default: the queue's policy)")
        p.add_argument("--metadata", metavar="JSON", help='job metadata, a JSON object (e.g. \'{"tenant": "acme", "tags": ["eu"]}\'); at most FQ_MAX_METADATA_BYTES')
        p.add_argument("--depends-on", dest="depends_on", action="append", metavar="ID[:POLICY]", help="run only after this job succeeded (repeatable, at most 1000; any queue); POLICY when it goes dead or is cancelled: cancel (default), run or wait")
        p.add_argument("--batch", metavar="BATCH_ID", help="join this open batch of the queue (fq batch create)")

    # --- dispatch -------------------------------------------------------------------------

    def execute(self, *args, **options):
        """Run the command; the operation decides how errors end (``fq health``: 3), system checks included."""
        self.as_json = options.get("as_json", False)
        self.op = options["op"]
        self.fail_status = health.UNKNOWN_EXIT if self.op == "health" else 1
        return super().execute(*args, **options)

    def check(self, *args, **kwargs):
        """Django's system checks; for ``fq health`` a failed one is a one-line error and exit 3 (unknown).

        Takes :meth:`BaseCommand.check`'s arguments. For the other operations
        a failed check raises :class:`SystemCheckError` as in every command
        (Django prints the report and exits 1).
        """
        try:
            return super().check(*args, **kwargs)
        except SystemCheckError:
            if getattr(self, "op", None) != "health":
                raise
            self._fail("health", _SettingError(_failed_checks(**kwargs)))

    def handle(self, *args, **options):
        self.as_json = options.get("as_json", False)
        self.stdin = options.get("stdin") or sys.stdin
        op = options["op"]
        self.fail_status = health.UNKNOWN_EXIT if op == "health" else 1
        try:
            getattr(self, "do_" + op.replace("-", "_"))(options)
        except FqError as exc:
            self._fail(op, exc)
        except ConnectionDoesNotExist as exc:  # FQ_DATABASE (or a router) names no alias of DATABASES
            self._fail(op, _SettingError(health.database_setting_error() or str(exc), field="FQ_DATABASE"))
        except (ProgrammingError, OperationalError) as exc:
            # A missing table or an unreachable server is not a bug of the caller's
            # input, but a traceback helps no one: say what is wrong and what to do.
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            hint = " (run `manage.py migrate`?)" if "django_fq_" in text else ""
            self._fail(op, FqError(f"database error: {text}{hint}"))

    def _fail(self, op: str, exc: FqError):
        """Report ``exc`` on stderr and exit with status 1 (as ``makemigrations --check`` does; 3 for ``health``)."""
        if self.as_json:
            self.stderr.write(json.dumps(exc.as_dict(), default=str), style_func=lambda s: s)
        else:
            where = None if isinstance(exc, InvalidBackup) else OPTION_OF_FIELD.get(exc.field or "", exc.field)
            # Name the option or field once: not again when the message already does.
            hint = f" ({where})" if where and not _names(exc.message, where) else ""
            # One line, whatever the message quotes (a path or a value may hold a line break).
            message = exc.message.replace("\r", "\\r").replace("\n", "\\n")
            self.stderr.write(f"fq {op}: error: {message}{hint}")
        sys.exit(getattr(self, "fail_status", 1))

    def _emit(self, data, human) -> None:
        """Print ``data`` as JSON with --json, else the human form ``human(data)`` (a str)."""
        if self.as_json:
            self.stdout.write(json.dumps(data))
        else:
            self.stdout.write(human(data))

    # --- queues -----------------------------------------------------------------------------

    def do_config(self, o):
        changes = {dest: o[dest] for _, dest, _, _ in POLICY_OPTIONS if o.get(dest) is not None}
        pol = services.configure(o["queue"], **changes) if changes else services.policy(o["queue"])
        data = {"queue": o["queue"], **asdict(pol)}
        self._emit(data, lambda d: _pairs(d.items()))

    def do_queues(self, o):
        data = [_queue_dict(q) for q in services.queues()]

        def human(rows):
            if not rows:
                return "no queues"
            head = ["QUEUE", *(s.upper() for s in STATE_NAMES), "CONCURRENCY", "MAX_ATTEMPTS", "VISIBILITY_MS", "PAUSED"]
            body = [
                [r["name"], *(r["counts"][s] for s in STATE_NAMES), r["policy"]["concurrency"],
                 r["policy"]["max_attempts"], r["policy"]["visibility_ms"], "yes" if r["paused"] else "no"]
                for r in rows
            ]  # fmt: skip
            return _table(head, body)

        self._emit(data, human)

    def do_workers(self, o):
        try:
            found = services.workers(state=o.get("state"), queue=o.get("queue"))
        except InvalidArgument as exc:
            if exc.field == "queue":  # the option here, not an argument QUEUE
                exc.field = "--queue"
            raise
        data = [asdict(w) for w in found]

        def human(rows):
            if not rows:
                return "no workers"
            several = len({r["database"] for r in rows}) > 1
            head = ["WORKER", "HOST", "PID", "QUEUES", "CONCURRENCY", "RUNNING", "POOL", "VERSION", "STARTED (UTC)",
                    "HEARTBEAT", "STATE", *(["DATABASE"] if several else [])]  # fmt: skip
            body = [
                [r["worker_id"], r["host"], r["pid"], ",".join(r["queues"]), r["concurrency"], r["running"], r["pool"],
                 r["version"], _utc(r["started_at"]), f"{r['age_ms'] / 1000:.1f} s ago", r["state"],
                 *([r["database"]] if several else [])]
                for r in rows
            ]  # fmt: skip
            return _table(head, body)

        self._emit(data, human)

    def do_pause(self, o):
        self._paused(services.pause(o["queue"]))

    def do_resume(self, o):
        self._paused(services.resume(o["queue"]))

    def _paused(self, res):
        def human(d):
            if d["paused"]:
                verb = "paused queue" if d["changed"] else "queue already paused:"
                return f"{verb} {d['queue']} (since {_when(d['paused_at'])})"
            return f"resumed queue {d['queue']}" if d["changed"] else f"queue not paused: {d['queue']}"

        self._emit(asdict(res), human)

    def do_delete(self, o):
        services.delete_queue(o["queue"])
        self._emit({"queue": o["queue"], "deleted": True}, lambda d: f"deleted queue {d['queue']}")

    # --- enqueue ----------------------------------------------------------------------------

    def do_enqueue(self, o):
        text = self._read("payload", o["payload"]) if o["payload"] == "-" else o["payload"]
        payload, _, _ = parse_json(text, "payload")
        # Any JSON value: enqueue refuses what is not an object, naming the field.
        metadata = None if o["metadata"] is None else parse_json(o["metadata"], "metadata", conf.max_metadata_bytes())[0]
        res = services.enqueue(
            o["queue"],
            payload,
            priority=0 if o["priority"] is None else o["priority"],
            delay_ms=o["delay_ms"],
            at=o["at"],
            idempotency=o["idempotency"],
            idempotency_retention_ms=o["idempotency_retention_ms"],
            unique_key=o["unique_key"],
            max_attempts=o["max_attempts"],
            timeout_ms=o["timeout_ms"],
            metadata=cast(dict, metadata),
            concurrency_key=o["concurrency_key"],
            depends_on=dependencies.parse_cli(o.get("depends_on")),
            batch=o.get("batch"),
        )
        self._emit(_enqueued(res), _enqueued_line)

    def do_enqueue_many(self, o):
        items = _envelopes(self._read("source", o["source"]))
        results = services.enqueue_many(o["queue"], items)
        data = [_enqueued(r) for r in results]

        def human(rows):
            made = sum(r["created"] for r in rows)
            lines = [_enqueued_line(r) for r in rows]
            lines.append(f"{made} created, {len(rows) - made} duplicate(s)")
            return "\n".join(lines)

        self._emit(data, human)

    def _read(self, field: str, source: str) -> str:
        """The text of ``source``: a file path, or ``-`` for stdin."""
        if source != "-":
            file_path(source, field)
        try:
            if source == "-":
                return self.stdin.read()
            with open(source, encoding="utf-8") as fh:
                return fh.read()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {source}: {exc.strerror or exc}", field=field) from None
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"cannot read {source}: {exc}", field=field) from None

    # --- leases -----------------------------------------------------------------------------

    def do_claim(self, o):
        claimed = services.claim(
            o["queue"], count=o["count"], visibility_ms=o["visibility_ms"], wait_ms=o["wait_ms"], worker=o["worker"]
        )
        data = [
            {
                "id": j.id,
                "payload": j.payload,
                "receipt": j.receipt,
                "deadline": j.deadline,
                "attempts": j.attempts,
                "enqueued_at": j.enqueued_at,
            }
            for j in claimed
        ]

        def human(_):
            limited = f"rate limit reached: the next job may be claimed in {claimed.rate_wait_ms} ms"
            if not claimed:
                return limited if claimed.rate_wait_ms else "no eligible job"
            blocks = []
            for j in claimed:
                blocks.append(
                    f"job {j.id} (attempt {j.attempts}/{j.max_attempts}, priority {j.priority})\n"
                    + _pairs(
                        [("deadline", _when(j.deadline)), ("receipt", j.receipt), ("payload", _dumps(j.payload))],
                        indent="  ",
                    )
                )
            return "\n".join([*blocks, limited] if claimed.rate_wait_ms else blocks)

        self._emit(data, human)

    def do_ack(self, o):
        result = None if o["result"] is None else parse_json(o["result"], "result")[0]
        self._settled(services.ack(o["queue"], o["receipt"], result=result))

    def do_nack(self, o):
        self._settled(
            services.nack(o["queue"], o["receipt"], delay_ms=o["delay_ms"], error=o["error"], permanent=o["permanent"])
        )

    def do_release(self, o):
        self._settled(services.release(o["queue"], o["receipt"], error=o["error"], delay_ms=o["delay_ms"]))

    def _settled(self, res):
        def human(d):
            line = f"job {d['id']}: {d['state']}"
            if d["run_at"] is not None and d["state"] in ("scheduled", "ready"):
                line += f", eligible at {_when(d['run_at'])}"
            if d["replay"]:
                line += " (repeat of a recorded settle; nothing changed)"
            return line

        self._emit({"id": res.id, "state": res.state, "run_at": res.run_at, "replay": res.replay}, human)

    def do_extend(self, o):
        deadline = services.extend(o["queue"], o["receipt"], visibility_ms=o["visibility_ms"])
        self._emit({"deadline": deadline}, lambda d: f"deadline {_when(d['deadline'])}")

    def do_progress(self, o):
        value, message = services.report_progress(o["queue"], o["receipt"], o["progress"], o["message"])
        self._emit({"progress": value, "message": message}, lambda d: f"progress {d['progress']:g}% stored")

    # --- inspection and repair ----------------------------------------------------------------

    def do_workflow(self, o):
        if o["action"] == "create":
            if o["job_id"] is not None:
                raise InvalidArgument("workflow create takes one FILE (or -), not a job id", field="job_id")
            spec, _, _ = parse_json(self._read("source", o["queue"]), "source")
            ids = workflows.create(spec)
            self._emit({"ids": ids}, lambda d: "\n".join(f"{name}  {uid}" for name, uid in d["ids"].items()))
            return
        if o["job_id"] is None:
            raise InvalidArgument(f"workflow {o['action']} needs QUEUE and JOB_ID", field="job_id")
        if o["action"] == "upstream":
            self.do_results(o)
            return
        if o["action"] == "cancel":
            self._emit(asdict(workflows.cancel(o["queue"], o["job_id"])), lambda d: f"cancelled {d['cancelled']} step(s); {d['finished']} had finished")
            return
        self._emit(asdict(workflows.show(o["queue"], o["job_id"])), _workflow_tree)

    def do_batch(self, o):
        action, target = o["action"], o["target"]
        if action == "list":
            rows = [b.as_dict() for b in batches.list_batches(target, state=o["state"], limit=o["count"], after=o["after"])]
            head = ["BATCH", "QUEUE", "STATE", "DONE", "TOTAL", "SUCCEEDED", "DEAD", "CANCELLED", "CALLBACK"]
            body = [
                [r["id"], r["queue"], r["state"], r["done"], r["total"], r["succeeded"], r["dead"], r["cancelled"], r["callback_job"] or "-"]
                for r in rows
            ]  # fmt: skip
            self._emit(rows, lambda rows: _table(head, body) if rows else "no batches")
            return
        if target is None:
            field = "queue" if action == "create" else "batch_id"
            raise InvalidArgument(f"fq batch {action} needs {'QUEUE' if action == 'create' else 'BATCH_ID'}", field=field)
        if action == "create":
            callback = None
            if o["callback"] is not None:
                payload = parse_json(o["callback"], "callback.payload")[0]
                options = {} if o["callback_options"] is None else parse_json(o["callback_options"], "callback")[0]
                if not isinstance(options, dict):
                    raise InvalidArgument("--callback-options must be a JSON object", field="callback")
                callback = {**options, "payload": payload, "queue": o["callback_queue"]}
            elif o["callback_queue"] or o["callback_options"]:
                raise InvalidArgument("--callback (the payload) is required with a callback queue or options", field="callback.payload")
            self._emit(batches.create(target, callback=callback).as_dict(), _batch_text)
        elif action == "add":
            if o["source"] is None:
                raise InvalidArgument("fq batch add needs SOURCE (a file of envelopes, or -)", field="source")
            results = batches.add(target, _envelopes(self._read("source", o["source"])))
            rows = [_enqueued(r) for r in results]
            made = sum(r["created"] for r in rows)
            self._emit(rows, lambda rows: "\n".join([*(_enqueued_line(r) for r in rows), f"{made} added to batch {target}, {len(rows) - made} duplicate(s)"]))
        elif action == "seal":
            self._emit(batches.seal(target).as_dict(), _batch_text)
        elif action == "cancel":
            self._emit(batches.cancel(target).as_dict(), _batch_text)
        else:
            shown = batches.get(target).as_dict()
            shown["members"] = batches.members(target, state=o["state"], limit=o["count"], after=o["after"])
            self._emit(shown, _batch_text)

    def do_results(self, o):
        found = services.results(o["queue"], o["job_id"])
        self._emit({"id": o["job_id"], "upstream": found.as_list()}, _upstream_lines)

    def do_get(self, o):
        self._job(services.get(o["queue"], o["job_id"]))

    def do_retry(self, o):
        self._job(services.retry(o["queue"], o["job_id"]))

    def do_requeue(self, o):
        self._job(services.requeue(o["queue"], o["job_id"]))

    def do_cancel(self, o):
        self._job(services.cancel(o["queue"], o["job_id"]))

    def do_wait(self, o):
        self._job(services.wait(o["queue"], o["job_id"], timeout_ms=o["timeout_ms"]))

    def _job(self, info):
        self._emit(asdict(info), _job_text)

    def do_jobs(self, o):
        page = services.jobs(o["queue"], state=o["state"], cursor=o["cursor"], count=o["count"], tag=o["tag"])
        data = {"jobs": [_listed(j) for j in page.jobs], "next_cursor": page.next_cursor}

        def human(d):
            if not d["jobs"]:
                text = "no jobs"
            else:
                head = ["ID", "STATE", "PRIORITY", "ATTEMPTS", "RUN_AT", "CHANGED_AT", "TAGS", "LAST_ERROR"]
                body = [
                    [j["id"], j["state"], j["priority"], f"{j['attempts']}/{j['max_attempts']}",
                     j["run_at"], j["changed_at"], ",".join(j["tags"]) or "-", _first_line(j["last_error"], 60)]
                    for j in d["jobs"]
                ]  # fmt: skip
                text = _table(head, body)
            if d["next_cursor"]:
                text += f"\nnext page: --cursor {d['next_cursor']}"
            return text

        self._emit(data, human)

    def do_stats(self, o):
        st = services.stats(o["queue"])
        data = asdict(st)

        def human(d):
            paused = f"paused since {_when(d['paused_at'])}" if d["paused"] else "running (not paused)"
            lines = [f"queue {d['queue']}", f"state: {paused}", "counts:"]
            lines.append(_pairs(((s, d["counts"].get(s, 0)) for s in STATE_NAMES), indent="  "))
            lines.append("totals:")
            names = [n for n in TOTAL_NAMES if n in d["totals"]] + [n for n in d["totals"] if n not in TOTAL_NAMES]
            lines.append(_pairs(((n, d["totals"][n]) for n in names), indent="  "))
            for kind in ("wait", "run"):
                total, n = d[f"{kind}_ms_sum"], d[f"{kind}_count"]
                mean = f", mean {total / n:.1f} ms" if n else ""
                lines.append(f"{kind} time: {total} ms over {n}{mean}")
            return "\n".join(lines)

        self._emit(data, human)

    def do_history(self, o):
        data = history_series(o["queue"], o["span"])

        def times(t):
            if not t["count"]:
                return "-"
            return f"{t['median']:g} / {t['p95']:g} ms"

        def human(d):
            t = d["totals"]
            head = ["bucket (UTC)", "enqueued", "succeeded", "failed", "dead", "wait med/p95", "run med/p95"]
            body = [
                [_when(b["start"]).split("(")[-1].rstrip(")"), b["enqueued"], b["succeeded"], b["failed"], b["dead"],
                 times(b["wait_ms"]), times(b["run_ms"])]
                for b in d["buckets"]
                if o["all_buckets"] or b["enqueued"] or b["succeeded"] or b["failed"] or b["dead"] or b["wait_ms"]["count"]
            ]  # fmt: skip
            lines = [
                f"history of {d['queue'] or 'every queue'}, last {d['span']}, buckets of {d['step_ms'] // 60_000} min",
                f"totals: enqueued {t['enqueued']}, succeeded {t['succeeded']}, failed {t['failed']}, dead {t['dead']}; "
                f"wait {times(t['wait_ms'])}, run {times(t['run_ms'])} (median / p95, within 9.1 %)",
            ]
            lines.append(_table(head, body) if body else "(no activity in this span)")
            return "\n".join(lines)

        self._emit(data, human)

    # --- maintenance ----------------------------------------------------------------------------

    def do_reap(self, o):
        res = services.reap(o["queue"], limit=o["limit"])
        self._emit(asdict(res), lambda d: f"expired {d['expired']}, timed out {d['timed_out']}, dead {d['dead']}")

    def do_prune(self, o):
        res = services.prune(retention_ms=o["retention_ms"], limit=o["limit"])
        self._emit(
            asdict(res),
            lambda d: (
                f"pruned {d['jobs']} job(s), {d['tokens']} token(s), {d['queues']} queue(s) past their ttl_ms"
                f", {d['workers']} gone worker(s), {d['history']} history row(s)"
            ),
        )

    def do_health(self, o):
        report = health.check(
            o["queue"], stuck_lease_ms=o["stuck_lease_ms"], max_dead=o["max_dead"], max_ready_age_ms=o["max_ready_age_ms"]
        )
        data = asdict(report)

        def human(d):
            # First line in the style of a monitoring plugin; then the problems and one row per queue.
            worst = [p for p in d["problems"] if p["status"] == d["status"]]
            if not d["problems"]:
                lines = [f"OK: {len(d['queues'])} queue(s) checked, no problem"]
            else:
                lines = [f"{d['status'].upper()}: " + "; ".join(f"{p['queue']}: {p['message']}" for p in worst)]
                lines += [f"{p['status'].upper()}: {p['queue']}: {p['message']}" for p in d["problems"] if p not in worst]
            if d["queues"]:
                head = ["QUEUE", "STUCK_LEASES", "DEAD", "OLDEST_READY_MS"]
                body = [
                    [q["queue"], q["stuck_leases"], q["dead"], "-" if q["oldest_ready_age_ms"] is None else q["oldest_ready_age_ms"]]
                    for q in d["queues"]
                ]  # fmt: skip
                lines.append(_table(head, body))
            return "\n".join(lines)

        self._emit(data, human)
        if report.exit_code:
            sys.exit(report.exit_code)

    # --- backup and restore (logic in django_fq.backup) --------------------------------------

    def do_export(self, o):
        to_file = o["output"] not in (None, "-")
        bar = backup.progress_bar(self.stderr, enabled=not self.as_json, desc="export")
        try:
            if to_file:
                res = backup.export_to_path(o["output"], o["queues"] or None, progress=bar)
            else:
                # The raw stream under Django's OutputWrapper (which would add line endings).
                out = cast(IO[str], self.stdout._out)
                try:
                    res = backup.export_jsonl(out, o["queues"] or None, progress=bar)
                except BrokenPipeError:
                    # The reader went away (`fq export | head`): stop quietly, like other
                    # Unix tools; point stdout at /dev/null so the interpreter's final
                    # flush does not fail again.
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                    sys.exit(1)
        finally:
            if bar is not None:
                bar.close()
        data = asdict(res)
        text = (
            f"exported {res.queues} queue(s), {res.jobs} job(s) ({res.running_as_ready} running, as ready), "
            f"{res.tokens} token(s)"
        )
        summary = json.dumps(data) if self.as_json else text
        # With -o the summary goes to stdout, unless -o was stdout itself (`-o /dev/stdout | gzip`).
        to_stdout = to_file and not _is_stdout(self.stdout, o["output"])
        (self.stdout if to_stdout else self.stderr).write(summary, style_func=lambda s: s)

    def do_import(self, o):
        lines, size = backup.open_source(o["source"], self.stdin)
        bar = backup.progress_bar(self.stderr, enabled=not self.as_json, total=size, unit="B", desc="import")
        try:
            res = backup.import_jsonl(lines, dry_run=o["dry_run"], progress=bar)
        except OSError as exc:  # the file could be opened but not read (a device, a vanished mount)
            raise InvalidArgument(f"cannot read {o['source']}: {exc.strerror or exc}", field="source") from None
        finally:
            if bar is not None:
                bar.close()
            if lines is not self.stdin and o["source"] != "-":
                lines.close()

        def human(d):
            text = (
                f"queues: {d['queues_created']} created, {d['queues_skipped']} skipped; "
                f"jobs: {d['jobs_created']} created, {d['jobs_skipped']} skipped; "
                f"tokens: {d['tokens_created']} created, {d['tokens_skipped']} skipped; "
                f"batches: {d['batches_created']} created, {d['batches_skipped']} skipped"
            )
            return text + (" (dry run: nothing was changed)" if d["dry_run"] else "")

        self._emit(asdict(res), human)


# --- helpers --------------------------------------------------------------------------------


_DECIMAL = re.compile(r"[+-]?[0-9]+")


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number(text: str) -> float | str:
    """A decimal number (ASCII, as JSON writes them) as a float; other text is passed on as it is.

    The service then refuses it with field ``progress`` (``nan`` and ``inf`` are not numbers here).
    """
    stripped = text.strip()
    return float(stripped) if _NUMBER.fullmatch(stripped) else text


def _integer(text: str) -> int:
    """An integer option: ASCII decimal digits with an optional sign, as the REST API reads numbers.

    (Python's ``int()`` would also take ``1_000`` and digits of other scripts.)
    """
    stripped = text.strip()
    if _DECIMAL.fullmatch(stripped):
        try:
            return int(stripped)
        except ValueError:  # more digits than Python converts
            pass
    raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")


def _is_stdout(stdout, path: str) -> bool:
    """Whether ``path`` is the file this command's ``stdout`` (an OutputWrapper) writes to (``-o /dev/stdout``)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(stdout._out.fileno()))
    except (AttributeError, OSError, ValueError):  # no such file, or stdout is not a file (call_command's StringIO)
        return False


_ARGUMENT = re.compile(r"argument ([^\s:/]+)|arguments are required: ([^\s,]+)")


def _usage_error(parser, message: str, *, root=None, exit_code: int = 2):
    """A malformed command line: one line on stderr, or with ``--json`` an error object; exit ``exit_code``.

    ``parser`` is the parser that found the mistake, ``root`` the command's
    top-level parser (it keeps the arguments being parsed, ``fq_argv``:
    ``--json`` among them asks for the object; default ``sys.argv``).

    The line reads ``manage.py fq OP: error: MESSAGE (see manage.py fq OP --help)``;
    the object is ``{"code": "usage", "message", "field"}`` with the option or
    argument to blame (``--count``, ``JOB_ID``, …) when there is one. Inside
    ``call_command()`` an ordinary usage error raises :class:`CommandError`, as
    Django's own parser does; ``fq health`` exits 3 ("unknown", for monitoring)
    wherever it runs.
    """
    if exit_code == 2 and not getattr(parser, "called_from_command_line", False):
        raise CommandError(f"Error: {message}")
    found = _ARGUMENT.search(message)
    field = (found.group(1) or found.group(2)) if found else None
    argv = getattr(root or parser, "fq_argv", None)
    if "--json" in (sys.argv[1:] if argv is None else argv):
        text = json.dumps({"code": "usage", "message": message, "field": field})
    else:
        text = f"{parser.prog}: error: {message} (see {parser.prog} --help)"
    sys.stderr.write(text + "\n")
    sys.exit(exit_code)


class _SettingError(FqError):
    """The project's settings keep django-fq from working (a failed system check, FQ_DATABASE naming no alias)."""

    code = "configuration"


def _failed_checks(app_configs=None, tags=None, include_deployment_checks=False, fail_level=checks.ERROR,
                   databases=None, **_ignored) -> str:  # fmt: skip
    """One line naming the first system check that failed (and how many more did), for ``fq health``.

    Takes :meth:`BaseCommand.check`'s arguments and runs the same checks again.
    """
    issues = checks.run_checks(
        app_configs=app_configs, tags=tags, include_deployment_checks=include_deployment_checks, databases=databases
    )
    serious = [i for i in issues if i.is_serious(fail_level) and not i.is_silenced()]
    if not serious:
        return "a system check failed (see manage.py check)"
    first = serious[0]
    text = f"system check {first.id} failed: {str(first.msg).strip()}"
    if len(serious) > 1:
        text += f" (and {len(serious) - 1} more: see manage.py check)"
    return text


def _envelopes(text: str) -> list:
    """Parse a JSON array of envelopes, a single envelope, or JSON lines (one envelope per line)."""
    limit = sys.maxsize  # each payload is size-checked by enqueue_many; the batch as a whole is not
    try:
        value, _, _ = parse_json(text, "source", limit)
    except InvalidJson:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2:
            raise
        return [parse_json(line, f"line {n}", limit)[0] for n, line in lines]
    if isinstance(value, dict):
        return [value]
    if not isinstance(value, list):
        raise InvalidJson("expected a JSON array of envelopes or JSON lines", field="source")
    return value


def _queue_dict(q) -> dict:
    return {
        "name": q.name,
        "policy": asdict(q.policy),
        "counts": dict(q.counts),
        "created_at": q.created_at,
        "paused": q.paused,
        "paused_at": q.paused_at,
    }


def _enqueued(res) -> dict:
    return {"id": res.id, "created": 1 if res.created else 0}


def _enqueued_line(d) -> str:
    return f"{d['id']} {'created' if d['created'] else 'duplicate (existing job)'}"


def _listed(info) -> dict:
    """A job of the ``jobs`` listing: metadata only."""
    d = asdict(info)
    for key in ("payload", "result", "errors", "depends_on", "dependents"):
        d.pop(key, None)
    return d


def _job_text(d: dict) -> str:
    rows = [
        ("id", d["id"]),
        ("queue", d["queue"]),
        ("state", d["state"]),
        ("priority", d["priority"]),
        ("attempts", f"{d['attempts']}/{d['max_attempts']}"),
        ("snoozes", d["snoozes"]),
        ("run_at", _when(d["run_at"])),
        ("enqueued_at", _when(d["enqueued_at"])),
        ("changed_at", _when(d["changed_at"])),
        ("claimed_at", _when(d["claimed_at"])),
        ("finished_at", _when(d["finished_at"])),
        ("lease_deadline", _when(d["lease_deadline"])),
        ("timeout_ms", d["timeout_ms"]),
        ("unique_key", d["unique_key"] or "-"),
        ("concurrency_key", d["concurrency_key"] or "-"),
        ("idempotency", d["idempotency"] or "-"),
        ("worker", d["worker"] or "-"),
        ("progress", _progress_text(d)),
        ("last_error", _first_line(d["last_error"], 200) or "-"),
        ("tags", ",".join(d["tags"]) or "-"),
        ("metadata", _dumps(d["metadata"])),
        ("payload", _dumps(d["payload"])),
        ("result", _dumps(d["result"])),
        ("errors", len(d["errors"])),
    ]
    for key in ("depends_on", "dependents"):
        edges = d.get(key) or []
        rows.append((key, ", ".join(f"{e['id']} ({e['queue']}, {e['state']}, {e['on_failure']})" for e in edges) or "-"))
    text = _pairs(rows)
    for e in d["errors"]:
        if isinstance(e, dict):
            text += (
                f"\n  {_when(e.get('at'))} attempt {e.get('attempt')} {e.get('kind', '')}"
                f"{' on ' + e['worker'] if e.get('worker') else ''}: {_first_line(e.get('error', ''), 200)}"
            )
    return text


#: Deepest indentation of ``fq workflow show``'s tree (levels); deeper steps show their depth as ``[N]``.
_TREE_INDENT = 20


def _upstream_lines(d: dict) -> str:
    """A job's upstream results for people: one line per dependency, its key, queue, state and result."""
    if not d["upstream"]:
        return f"job {d['id']} has no dependencies"
    lines = []
    for e in d["upstream"]:
        key = e["name"] if e["name"] is not None else e["id"]
        shown = _dumps(e["result"]) if e["state"] == "succeeded" else "(no result)"
        lines.append(f"{key}  {e['queue']}  {e['state']}  {shown}")
    return "\n".join(lines)


def _workflow_tree(d: dict) -> str:
    """A workflow for people: each job under the one it depends on (indented by depth), with queue and state."""
    depth: dict[str, int] = {}
    lines = []
    for step in d["steps"]:
        ups = step["depends_on"]
        depth[step["id"]] = 1 + max((depth.get(u, 0) for u in ups), default=-1)
        more = f"  (after {len(ups)} jobs)" if len(ups) > 1 else ""
        mark = "  <-" if step["id"] == d["id"] else ""
        # Indentation stops at _TREE_INDENT levels, the depth then written out: a chain of 10,000
        # steps indented all the way down printed 100 MB of spaces.
        level = depth[step["id"]]
        indent = "  " * min(level, _TREE_INDENT) + (f"[{level}] " if level > _TREE_INDENT else "")
        lines.append(f"{indent}{step['id']}  {step['queue']}  {step['state']}{more}{mark}")
    if d["truncated"]:
        lines.append(f"… more jobs are connected (the first {len(d['steps'])} are shown)")
    return "\n".join(lines)


def _batch_text(d: dict) -> str:
    """A batch for people: state, progress, counts, callback, then its members listed (``show``)."""
    rows = [
        ("batch", d["id"]), ("queue", d["queue"]), ("state", d["state"]),
        ("progress", f"{d['done']}/{d['total']} ({d['progress'] * 100:.1f}%)"),
        ("succeeded", d["succeeded"]), ("dead", d["dead"]), ("cancelled", d["cancelled"]),
        ("callback", f"{d['callback_queue']} job {d['callback_job'] or '(not yet)'}" if d["callback_queue"] else "-"),
        ("created", _when(d["created_at"])), ("sealed", _when(d["sealed_at"])), ("finished", _when(d["finished_at"])),
    ]  # fmt: skip
    text = _pairs(rows)
    if "members" in d:
        text += "\nmembers:" + "".join(f"\n  {m['id']}  {m['state']}" for m in d["members"]) if d["members"] else "\nmembers: none listed"
    return text


def _progress_text(d: dict) -> str:
    """The last progress report of a job for people: ``42.5% rows 425 of 1000 (at …)``, or ``-``."""
    if d.get("progress") is None:
        return "-"
    message = f" {_first_line(d['progress_message'], 200)}" if d.get("progress_message") else ""
    return f"{d['progress']:g}%{message} (at {_when(d['progress_at'])})"


def _when(ms) -> str:
    """Epoch ms with its UTC reading, for people: ``1700000000000 (2023-11-14T22:13:20.000Z)``."""
    if ms is None:
        return "-"
    try:
        iso = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{ms} ({iso.replace('+00:00', 'Z')})"


def _utc(ms: int) -> str:
    """Epoch ms as ``2026-12-03 15:04:05`` (UTC), for a table cell."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _first_line(text, width: int) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _pairs(rows, indent: str = "") -> str:
    rows = list(rows)
    width = max((len(str(k)) for k, _ in rows), default=0)
    return "\n".join(f"{indent}{str(k).ljust(width)}  {v}" for k, v in rows)


def _table(head: list, body: list) -> str:
    cells = [[str(c) for c in row] for row in [head, *body]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
