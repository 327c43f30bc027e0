"""Backup and restore of django-fq's data as JSON Lines (``manage.py fq export`` / ``fq import``).

A backup is a text file of one JSON object per line (UTF-8; the export writes
ASCII only, with ``\\u`` escapes):

* line 1, the header: ``{"format": "django-fq", "version": 1,
  "exported_at": <epoch ms, database clock>, "database": "postgresql"}``;
* per queue, in name order: a ``queue`` line, then its ``job`` lines (in claim
  order: enqueue sequence), then its ``token`` lines.

``{"type": "queue", "name", "created_at", "policy": {every policy field, the rate limit's included},
"totals": {enqueued, deduplicated, claimed, ..., wait_ms_sum, wait_count,
run_ms_sum, run_count}, "paused", "paused_at"}`` — ``paused`` true while the
queue was paused (docs/reference/semantics.md §9 "Pause"), ``paused_at`` its
epoch ms, null while it ran; both absent in files of earlier exports (a
running queue). They came in 0.1.0 before any release, so the format stays
version 1.

``{"type": "job", "queue", "id", "state", "priority", "run_at",
"enqueued_at", "changed_at", "claimed_at", "finished_at", "attempts",
"max_attempts", "generation", "timeout_ms", "payload", "result",
"last_error", "errors", "unique_key", "idempotency", "worker", "metadata",
"concurrency_key", "depends_on"}`` — ``state``
is ``waiting``, ``scheduled``, ``ready``, ``succeeded``, ``dead`` or ``cancelled``;
``payload`` and ``result`` are JSON values (``result`` null when unset);
``metadata`` the job's metadata object (null or absent when it has none; its
``"tags"`` rebuild the tags column on import). The key came with metadata in
0.1.0 before any release, so the format stays version 1. ``concurrency_key``
(docs/reference/semantics.md §9 "Per-key limits"; absent or null: none) came
the same way: a job waiting for its key's slot is exported ``scheduled`` or
``ready``, and an import into a queue with ``key_concurrency`` admits the
waiting keyed jobs again, in claim order, up to the limit (a ``waiting`` keyed
job takes no slot until its dependencies have succeeded). ``depends_on`` (absent
when the job has no dependency) lists ``{"id", "on_failure", "pending"}`` per
dependency (and ``"name"`` for a named edge, the key of its result in
``job.upstream``), which may be a job of any queue, in the file or in the importing
database; the import writes the edges once every line is in (an unknown
dependency is refused by line and ``depends_on[i]``), and keeps an edge pending
only while its dependency has not succeeded there
(docs/reference/semantics.md §9 "Dependencies"). It came with dependencies, and
older importers refuse it as an unknown key; the format stays version 1.

``{"type": "token", "queue", "token", "job_id", "created_at", "expires_at"}``

``{"type": "batch", "queue", "id", "state", "total", "succeeded", "dead",
"cancelled", "callback", "callback_job", "created_at", "sealed_at",
"finished_at"}`` — a batch (docs/how-to/workflows.md "Batches"), written after
its queue's line; ``callback`` is ``{"queue", "payload", <options>}`` (null:
none), as :func:`django_fq.batches.create` takes it. A member's job line says
``"batch": ID`` (absent for other jobs). On import a batch new to the database
is created with the file's state and counts, and the jobs the import creates
that name it become its members; a batch that exists already is skipped, and
jobs the import creates do not join it. A sealed batch whose counts are all
finished gets its callback at the end of the import. Batches came before any
release, so the format stays version 1.

What a backup leaves out, on purpose: leases and receipts (a **running** job
is exported as ``release`` would leave it: ``ready``, the interrupted attempt
given back — attempts − 1 — with a ``release`` history entry at
``exported_at`` and :data:`RUNNING_NOTE` as last error; so it runs again
after a restore and never past ``max_attempts``; no receipt issued before
the backup works after it), the settle records that answer a repeated ack as
a replay, and the internal sequence numbers (imported jobs get new ones, in
file order, so their claim order among themselves is kept).

Import (:func:`import_jsonl`) runs in **one transaction** and validates
every line before it is used: a bad line raises :class:`InvalidBackup`
naming the line and the field, and nothing at all is changed. It is
idempotent: queues are keyed by name, jobs by id, tokens by (queue, token),
and what already exists is skipped, never overwritten. A queue the import
creates gets the policy, creation time, totals and pause of the file (a queue
paused when exported is paused when restored, so no claim takes its jobs
until it is resumed); a queue that already exists keeps its own policy,
totals and pause. Either way the queue-full
counters (active jobs, token rows) grow by exactly the rows inserted, so the
queue-full checks and ``stats`` agree with the tables afterwards.

The bounds of an import keep every restored row workable: ``attempts`` is
0..``max_attempts`` of its line (a waiting job with every attempt used —
what older exports wrote for a job running on its last attempt — gets its
last attempt back: attempts − 1); ``generation``, instants and the totals'
counts are at most 2**53 − 1 and the ``*_ms_sum`` totals at most 2**62, so
the next claim or enqueue cannot overflow a column. The error history is cut
to the engine's caps: the newest 100 entries, each ``error`` text (and
``last_error``) cut to 64 KiB as a nack cuts it. When rows committed
concurrently collide with the import's inserts (another import, a producer
taking a ``unique_key`` or token), the import rolls back and runs again, up
to :data:`IMPORT_TRIES` times, then raises :class:`ImportConflict`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import stat
import struct
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import IO, Any, cast

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Case, F, Field, Value, When

from . import conf, db, payloads, routing, storage, validation
from .exceptions import ImportConflict, InvalidArgument, InvalidBackup, QueueNotFound, TooManyQueues
from .models import QUEUED_STATES, Batch, BatchMember, Dependency, IdempotencyToken, Job, Queue
from .services import dependencies
from .services import keys as slots
from .services._base import (
    JOB,
    QUEUE,
    TOKEN,
    add_counters,
    append_history,
    check_room_for_a_queue,
    counter_sums,
    history_entry,
    manager,
    queue_overflow,
)
from .services.queues import POLICY_BOUNDS
from .storage.base import body_statement_bytes, split_by_bytes
from .types import TIMING_NAMES, TOTAL_NAMES, QueuePolicy

#: The ``format`` value of a backup's header line.
FORMAT = "django-fq"
#: The version of the format written by :func:`export_jsonl`; import reads versions up to this one.
VERSION = 1

#: The error a job running at export time is written with (last error and ``release`` history entry).
RUNNING_NOTE = "running when exported: the attempt was given back"

_BATCH = 500  # rows per SELECT page (export) and per existence check (import)
_ROWS_PER_INSERT = 200  # x 21 columns: well under SQLite's 32766 and PostgreSQL's 65535 parameters
_BIG = 2**63 - 1  # largest BIGINT
_INT = 2**31 - 1  # largest INTEGER
#: Largest instant, generation and count an import takes: 2**53 - 1, exact in every JSON reader and
#: far from BIGINT's end, so the next claim (generation + 1) or enqueue (a total + 1) cannot overflow.
_SAFE = 2**53 - 1
#: Largest ``*_ms_sum`` total an import takes: sums of waits grow fastest; 2**62 leaves room for 2**62 more.
_MS_SUM = 2**62
_HISTORY_KEEP = 100  # newest error-history entries kept, as the engine keeps them (append_history)
_POLICY_FIELDS = tuple(QueuePolicy.__dataclass_fields__)
_TOTALS = TOTAL_NAMES + TIMING_NAMES
_EXPORTED_STATES = ("waiting", "scheduled", "ready", "succeeded", "dead", "cancelled")

_HEADER_KEYS = frozenset({"format", "version", "exported_at", "database"})
_QUEUE_KEYS = frozenset({"type", "name", "created_at", "policy", "totals", "paused", "paused_at"})
_JOB_KEYS = frozenset(
    {
        "type", "queue", "id", "state", "priority", "run_at", "enqueued_at", "changed_at", "claimed_at",
        "finished_at", "attempts", "max_attempts", "generation", "timeout_ms", "payload", "result",
        "last_error", "errors", "unique_key", "idempotency", "worker", "metadata", "concurrency_key",
        "depends_on", "batch",
    }
)  # fmt: skip
_BATCH_KEYS = frozenset(
    {
        "type", "queue", "id", "state", "total", "succeeded", "dead", "cancelled", "callback", "callback_job",
        "created_at", "sealed_at", "finished_at",
    }
)  # fmt: skip
_TOKEN_KEYS = frozenset({"type", "queue", "token", "job_id", "created_at", "expires_at"})


@dataclass(frozen=True)
class ExportSummary:
    """What :func:`export_jsonl` wrote: rows per kind, and how many running jobs went out as ready."""

    queues: int
    jobs: int
    tokens: int
    running_as_ready: int
    exported_at: int
    batches: int = 0


@dataclass(frozen=True)
class ImportSummary:
    """What :func:`import_jsonl` did (or, with ``dry_run``, would do): rows created and skipped per kind."""

    lines: int
    queues_created: int
    queues_skipped: int
    jobs_created: int
    jobs_skipped: int
    tokens_created: int
    tokens_skipped: int
    dry_run: bool = False
    batches_created: int = 0
    batches_skipped: int = 0


# --- export ---------------------------------------------------------------------------------------


def export_jsonl(out: IO[str], queues: Sequence[str] | None = None, *, progress=None) -> ExportSummary:
    """Write a backup of ``queues`` (names; default: every queue) to the text stream ``out``.

    Reads one consistent snapshot of the queue database (PostgreSQL:
    a ``REPEATABLE READ, READ ONLY`` transaction; SQLite: one read
    transaction, which never takes the write lock), in pages of 500 rows by
    primary key, so neither the memory used nor a server-side cursor grows
    with the queue. Workers and producers go on meanwhile. Inside a caller's
    transaction the caller's snapshot is used.

    ``progress``, if given, is a progress bar such as ``tqdm``: its
    ``reset(total=rows)`` is called once, then ``update(n)`` as lines are
    written. Raises :class:`InvalidQueueName`, and :class:`QueueNotFound`
    for a named queue that does not exist (nothing is written then).
    """
    names = None if queues is None else list(dict.fromkeys(validation.queue_name(n) for n in queues))
    if routing.enabled() and routing.current() is None:
        return _export_every_alias(out, names, progress)
    return _export_one(out, names, progress)


def _export_every_alias(out: IO[str], names: list[str] | None, progress) -> ExportSummary:
    """:func:`export_jsonl` with ``FQ_QUEUE_DATABASES``: the queues of each alias in turn, under one header.

    Each alias is read in a snapshot of its own (one database cannot give a
    snapshot of another); the header is the first alias's. Named queues are
    looked for on their aliases before anything is written.
    """
    groups = routing.group_by_alias(names) if names is not None else dict.fromkeys(routing.aliases())
    if names is not None:
        for alias, group in groups.items():
            with routing.using(alias):
                found = set(manager(Queue).filter(name__in=group).values_list("name", flat=True))
            for name in group or ():
                if name not in found:
                    raise QueueNotFound(f"no such queue: {name}", field="queue")
    parts: list[ExportSummary] = []
    for alias, group in groups.items():
        with routing.using(alias):
            parts.append(_export_one(out, group, progress, header=not parts, owned_only=group is None))
    return ExportSummary(
        queues=sum(p.queues for p in parts), jobs=sum(p.jobs for p in parts), tokens=sum(p.tokens for p in parts),
        running_as_ready=sum(p.running_as_ready for p in parts), exported_at=parts[0].exported_at,
        batches=sum(p.batches for p in parts),
    )  # fmt: skip


def _export_one(
    out: IO[str], names: list[str] | None, progress, *, header: bool = True, owned_only: bool = False
) -> ExportSummary:
    """Export ``names`` (``None``: every queue) of the current alias; ``owned_only``: only the queues it is the alias of."""
    running = n_jobs = n_tokens = n_batches = 0
    with _snapshot() as conn:
        rows = list(
            manager(Queue).order_by("name") if names is None else manager(Queue).filter(name__in=names).order_by("name")
        )
        if names is not None:
            found = {q.name for q in rows}
            for name in names:
                if name not in found:
                    raise QueueNotFound(f"no such queue: {name}", field="queue")
        if owned_only:
            here = conf.database()
            rows = [q for q in rows if routing.alias_for(q.name) == here]
        ids = [q.id for q in rows]
        if progress is not None:
            total = len(rows)
            if ids:
                total += manager(Job).filter(queue_id__in=ids).count()
                total += manager(IdempotencyToken).filter(queue_id__in=ids).count()
            progress.reset(total=total)
        exported_at = db.db_now_ms()
        if header:
            _write(out, {"format": FORMAT, "version": VERSION, "exported_at": exported_at, "database": storage.for_connection(conn).export_name})
        for q in rows:
            sums = counter_sums(conn, q.id, _TOTALS)
            _write(
                out,
                {
                    "type": "queue",
                    "name": q.name,
                    "created_at": q.created_at,
                    "policy": {f: getattr(q, f) for f in _POLICY_FIELDS},
                    "totals": {n: sums[n] for n in _TOTALS},
                    "paused": bool(q.paused),
                    "paused_at": q.paused_at if q.paused else None,
                },
            )
            _tick(progress)
            for b in manager(Batch).filter(queue_id=q.id).order_by("id"):
                _write(out, {"type": "batch", "queue": q.name, **_batch_line(b)})
                n_batches += 1
            for job in _job_pages(q.id, exported_at):
                running += job.pop("was_running")
                _write(out, {"type": "job", "queue": q.name, **job})
                n_jobs += 1
                _tick(progress)
            for token in _token_pages(q.id):
                _write(out, {"type": "token", "queue": q.name, **token})
                n_tokens += 1
                _tick(progress)
    return ExportSummary(
        queues=len(rows), jobs=n_jobs, tokens=n_tokens, running_as_ready=running, exported_at=exported_at,
        batches=n_batches,
    )  # fmt: skip


def _batch_line(b: Batch) -> dict:
    """A batch as its export line (without ``type`` and ``queue``)."""
    callback = None
    if b.callback_queue is not None:
        # Decoded: the callback's payload was validated at create, so it nests within the bounds.
        payload = json.loads(b.callback_payload or "null")
        callback = {"queue": b.callback_queue, "payload": payload, **json.loads(b.callback_options or "{}")}
    return {
        "id": b.uid, "state": b.state, "total": b.total, "succeeded": b.succeeded, "dead": b.dead,
        "cancelled": b.cancelled, "callback": callback, "callback_job": b.callback_job,
        "created_at": b.created_at, "sealed_at": b.sealed_at, "finished_at": b.finished_at,
    }  # fmt: skip


#: Deepest nesting of a backup line judged on its text, before decoding: twice a payload's
#: bound, so that a payload or result a little too deep is refused by name once decoded.
_LINE_DEPTH = 2 * validation.MAX_JSON_DEPTH


class _Stored(str):
    """Compact JSON text as stored in a job row, written into an export line unchanged."""


#: Stand-ins of the stored texts while a line is encoded; NUL never occurs in a stored text.
_SPLICE = {"payload": "\x00fq-payload\x00", "result": "\x00fq-result\x00", "metadata": "\x00fq-metadata\x00"}


def _write(out: IO[str], obj: dict) -> None:
    stored = [(k, v) for k, v in obj.items() if isinstance(v, _Stored)]
    if stored:
        obj = {**obj, **{k: _SPLICE[k] for k, _ in stored}}
    line = json.dumps(obj, separators=(",", ":"), ensure_ascii=True)
    for k, text in stored:
        line = line.replace(json.dumps(_SPLICE[k]), _ascii_json(text), 1)
    out.write(line + "\n")


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _ascii_json(text: str) -> str:
    """JSON text with every non-ASCII character escaped, as ``ensure_ascii`` writes it."""
    if text.isascii():
        return text
    return _NON_ASCII.sub(lambda m: json.dumps(m.group(0))[1:-1], text)


def _tick(progress, n: int = 1) -> None:
    if progress is not None:
        progress.update(n)


@contextlib.contextmanager
def _snapshot():
    """A read-only transaction on the queue database that sees one snapshot (the caller's, if one is open)."""
    conn = db.connection()
    if conn.in_atomic_block:
        yield conn
        return
    with storage.for_connection(conn).read_snapshot(conn):
        yield conn


def _exported_state():
    """The state a job is exported with: its reported state, except ``running`` → ``ready``."""
    return Case(
        When(state="running", then=Value("ready")),
        When(state__in=QUEUED_STATES, run_at__gt=db.DbNow(), then=Value("scheduled")),
        When(state__in=QUEUED_STATES, then=Value("ready")),
        default=F("state"),
    )


def _job_pages(queue_id: int, exported_at: int):
    """The queue's jobs as export dicts, in enqueue order, read in pages by ``seq``.

    A running job is written as :func:`~django_fq.services.release` would leave
    it at ``exported_at``: ready, its attempt given back (attempts - 1), with a
    ``release`` history entry and last error :data:`RUNNING_NOTE`. A job whose
    offloaded body is gone by the time the page's bodies are read (deleted
    meanwhile: only outside a snapshot) is left out; one that exists without
    its body gets a stand-in payload (:func:`_bodiless`).
    """
    last = 0
    while True:
        page = list(
            manager(Job)
            .filter(queue_id=queue_id, seq__gt=last)
            .annotate(exported_state=_exported_state())
            .order_by("seq")
            .values(
                "seq", "uid", "state", "exported_state", "priority", "run_at", "enqueued_at", "changed_at",
                "claimed_at", "finished_at", "attempts", "max_attempts", "generation", "timeout_ms", "payload",
                "result", "last_error", "errors", "unique_key", "idempotency", "worker", "metadata",
                "concurrency_key",
            )[:_BATCH]
        )  # fmt: skip
        # Offloaded bodies (docs/explanation/storage.md#large-payloads): one more read per page, in
        # the export's snapshot; the line holds the payload as if it were in the row. Never the
        # marker (``"payload":,`` is a line no import reads): see _bodiless.
        gone = _bodiless(page, payloads.fill(db.connection(), page))
        edges = _edges_of([r["seq"] for r in page])
        member_of = dict(
            manager(BatchMember).filter(job_id__in=[r["seq"] for r in page]).values_list("job_id", "batch__uid")
        )
        for r in page:
            if gone and r["uid"] in gone:
                continue
            was_running = r["state"] == "running"
            errors = list(r["errors"] or [])
            if was_running:
                entry = history_entry(exported_at, r["attempts"], "release", RUNNING_NOTE, r["worker"])
                errors = append_history(errors, entry)
            yield {
                "id": r["uid"],
                "state": r["exported_state"],
                "priority": r["priority"],
                "run_at": r["run_at"],
                "enqueued_at": r["enqueued_at"],
                "changed_at": r["changed_at"],
                "claimed_at": r["claimed_at"],
                "finished_at": r["finished_at"],
                "attempts": max(0, r["attempts"] - 1) if was_running else r["attempts"],
                "max_attempts": r["max_attempts"],
                "generation": r["generation"],
                "timeout_ms": r["timeout_ms"],
                # The stored texts go into the line as they are, never decoded: exact, and a
                # document too deep to decode is still backed up (import refuses it by name).
                "payload": _Stored(r["payload"]),
                "result": None if r["result"] is None else _Stored(r["result"]),
                "last_error": RUNNING_NOTE if was_running else r["last_error"],
                "errors": errors,
                "unique_key": r["unique_key"],
                "idempotency": r["idempotency"],
                "concurrency_key": r["concurrency_key"],
                "worker": r["worker"],
                "metadata": None if r["metadata"] is None else _Stored(r["metadata"]),
                **({"depends_on": edges[r["seq"]]} if r["seq"] in edges else {}),
                **({"batch": member_of[r["seq"]]} if member_of.get(r["seq"]) else {}),
                "was_running": int(was_running),
            }
        if len(page) < _BATCH:
            return
        last = page[-1]["seq"]


def _edges_of(seqs: list[int]) -> dict[int, list[dict]]:
    """The dependencies of jobs ``seqs`` (one page), as export items: ``{"id", "on_failure", "pending"}`` (and ``"name"``)."""
    out: dict[int, list[dict]] = {}
    if not seqs:
        return out
    rows = (
        manager(Dependency)
        .filter(job_id__in=seqs)
        .order_by("job_id", "upstream_id")
        .values_list("job_id", "upstream__uid", "on_failure", "pending", "name")
    )
    for seq, uid, policy, pending, name in rows:
        if uid is not None:  # the dependency was pruned: the edge is history
            item = {"id": uid, "on_failure": policy, "pending": bool(pending)}
            if name is not None:
                item["name"] = name
            out.setdefault(seq, []).append(item)
    return out


#: The payload text an export writes for a job that exists without its offloaded body (made dead
#: for it at a claim): what every read face shows for it (validation.stored_json of the marker).
_NO_BODY = json.dumps(validation.stored_json(payloads.OFFLOADED, "payload"), separators=(",", ":"))


def _bodiless(page: list[dict], missing: list[str]) -> set[str]:
    """Of the ``page`` rows whose body :func:`payloads.fill` did not find (uids ``missing``), those to leave out.

    A job deleted after its page was read (possible only when the caller's
    transaction is not a snapshot, e.g. READ COMMITTED) took its body with it:
    it is left out, as if deleted before. A job still there without a body gets
    :data:`_NO_BODY` as its payload. One more read, only when a body is missing.
    """
    if not missing:
        return set()
    still = set(manager(Job).filter(uid__in=missing).values_list("uid", flat=True))
    for r in page:
        if r["uid"] in still and payloads.is_offloaded(r["payload"]):
            r["payload"] = _NO_BODY
    return set(missing) - still


def _token_pages(queue_id: int):
    """The queue's idempotency tokens as export dicts, read in pages by primary key."""
    last = 0
    while True:
        page = list(
            manager(IdempotencyToken)
            .filter(queue_id=queue_id, id__gt=last)
            .order_by("id")
            .values("id", "token", "job_uid", "created_at", "expires_at")[:_BATCH]
        )
        for r in page:
            yield {
                "token": r["token"],
                "job_id": r["job_uid"],
                "created_at": r["created_at"],
                "expires_at": r["expires_at"],
            }
        if len(page) < _BATCH:
            return
        last = page[-1]["id"]


# --- import ---------------------------------------------------------------------------------------


class _DryRun(Exception):
    """Raised inside the import transaction to roll a dry run back."""


#: How many times :func:`import_jsonl` runs when rows committed concurrently get in its way.
IMPORT_TRIES = 5
_SPOOL_IN_MEMORY = 8 * 1024 * 1024  # bytes of an unseekable input kept in memory before it goes to a temporary file


def import_jsonl(lines: Iterable[str | bytes], *, dry_run: bool = False, progress=None) -> ImportSummary:
    """Restore a backup written by :func:`export_jsonl` into the queue database.

    ``lines`` yields the file's lines, as ``bytes`` (UTF-8) or ``str`` — an
    open file works. Everything happens in one transaction (on SQLite it
    holds the write lock until the end, so workers wait meanwhile); with
    ``dry_run=True`` the transaction is rolled back at the end and the
    summary says what an import would do. ``progress``, if given (e.g. a
    ``tqdm`` bar), gets ``update(n)`` with the size of each line read (bytes
    for ``bytes`` lines, characters otherwise), each line once.

    When the transaction is django-fq's own and another transaction commits
    a row this import meant to insert (PostgreSQL: a job id, an active
    ``unique_key`` or a token another import or a producer wrote meanwhile),
    or on a deadlock, the import is rolled back and run again from the first
    line, up to :data:`IMPORT_TRIES` times; the rows committed meanwhile are
    then seen and skipped (or reported as a conflict). To read ``lines``
    again it seeks back a seekable file, iterates a list again, and keeps a
    copy of any other stream (in memory up to 8 MiB, then in a temporary
    file). Inside the caller's transaction the database error propagates.

    Raises :class:`InvalidBackup` for the first bad line (its ``line`` and
    ``field`` say where), including a job id that exists in another queue, a
    ``unique_key`` another active job holds, and a queue that would pass
    ``FQ_MAX_JOBS_PER_QUEUE`` / ``FQ_MAX_TOKENS_PER_QUEUE``;
    :class:`ImportConflict` when every try met concurrent rows; ``OSError``
    when ``lines`` cannot be read. Nothing is changed when it raises.
    """
    source = _Replayable(lines, progress)
    try:
        if routing.enabled() and routing.current() is None:
            return _import_every_alias(source, dry_run)
        return _import_one(lambda: enumerate(source.lines(), 1), dry_run)
    finally:
        source.close()


def _import_every_alias(source: _Replayable, dry_run: bool) -> ImportSummary:
    """:func:`import_jsonl` with ``FQ_QUEUE_DATABASES``: each alias gets the header and the lines of its queues.

    A line goes to the alias of its queue (``name`` of a queue line, ``queue``
    of the others) as the mapping says now, so a backup of one database can
    be restored onto another. Every alias's part is first run as a dry run
    (all of them checked before any is written); then each is imported in a
    transaction of its own, all or nothing per alias. A line that cannot be
    read goes with the first alias's part, whose import reports it by its
    line number in the file. The lines are held in memory meanwhile.
    """
    parts: dict[str, list[tuple[int, str | bytes]]] = {}
    header: tuple[int, str | bytes] | None = None
    first = routing.aliases()[0]
    for n, raw in enumerate(source.lines(), 1):
        if n == 1:
            header = (n, raw)
            continue
        alias = first
        try:
            obj = json.loads(raw)
            name = obj.get("name") if obj.get("type") == "queue" else obj.get("queue")
            if isinstance(name, str):
                alias = routing.alias_for(name)
        except (ValueError, AttributeError):
            pass
        parts.setdefault(alias, []).append((n, raw))
    if header is None:
        with routing.using(first):
            return _import_one(lambda: iter(()), dry_run)
    if not parts:
        parts[first] = []
    order = {a: i for i, a in enumerate(routing.aliases())}
    ordered = sorted(parts.items(), key=lambda kv: order.get(kv[0], len(order)))
    summaries: list[ImportSummary] = []
    for run_dry in (True,) if dry_run else (True, False):
        summaries = []
        for alias, numbered in ordered:
            with routing.using(alias):
                summaries.append(_import_one(lambda numbered=numbered: iter([header, *numbered]), run_dry))
    total = {f: sum(getattr(p, f) for p in summaries) for f in ImportSummary.__dataclass_fields__ if f != "dry_run"}
    total["lines"] = max(p.lines for p in summaries)  # each part counts up to its last line's number in the file
    return ImportSummary(**total, dry_run=dry_run)


def _import_one(numbered, dry_run: bool) -> ImportSummary:
    """Import the ``(line number, raw line)`` pairs ``numbered()`` yields (called again for each try) on the current alias."""
    owned = not db.connection().in_atomic_block
    for attempt in range(IMPORT_TRIES):
        imp = _Importer()
        try:
            with db.write_atomic():
                for n, raw in numbered():
                    imp.feed(n, raw)
                imp.finish()
                if dry_run:
                    raise _DryRun
        except _DryRun:
            pass
        except DatabaseError as exc:
            if not owned or not _concurrent(exc):
                raise
            if attempt == IMPORT_TRIES - 1:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ImportConflict(
                    f"concurrent writes got in the way {IMPORT_TRIES} times (last: {first}); "
                    "nothing was imported: run it again once the other import or producer is done"
                ) from None
            time.sleep(0.01 * (2**attempt) * (0.5 + random.random()))
            continue
        return imp.summary(dry_run)
    raise AssertionError("unreachable")  # pragma: no cover


def _import_edges(line: _Line) -> list[tuple[str, str, bool, str | None]]:
    """A job line's ``depends_on``: ``(uid, on_failure, pending, name)`` per item; ``[]`` when absent."""
    raw = line.get("depends_on", default=None)
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise line.error('must be a list of {"id", "on_failure", "pending"} objects', "depends_on")
    pending = []
    for i, e in enumerate(raw):
        flag = e.get("pending", True)
        if not isinstance(flag, bool):
            raise line.error(f"must be true or false, not {_kind(flag)}", f"depends_on[{i}].pending")
        pending.append(flag)
    try:
        parsed = dependencies.parse([{k: v for k, v in e.items() if k != "pending"} for e in raw]) or ()
    except InvalidArgument as exc:
        raise line.error(exc.message, exc.field) from None
    return [(e.id, e.on_failure, flag, e.name) for e, flag in zip(parsed, pending, strict=True)]


def _history_entry(line: _Line, entry: dict) -> dict:
    """An imported error-history entry as the engine writes one (:func:`history_entry`): its keys only, bounded."""
    numbers, texts = {}, {}
    for key, what in (("at", "an instant in epoch milliseconds"), ("attempt", "a whole number")):
        value = 0 if entry.get(key) is None else entry[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _SAFE:
            raise line.error(f'each "{key}" must be {what}', "errors")
        numbers[key] = value
    for key in ("kind", "worker"):
        value = "" if entry.get(key) is None else entry[key]
        if not isinstance(value, str) or len(value) > 200:
            raise line.error(f'each "{key}" must be text of at most 200 characters', "errors")
        texts[key] = value
    error = validation.error_text(entry.get("error", ""))
    return history_entry(numbers["at"], numbers["attempt"], texts["kind"], error, texts["worker"])


def _concurrent(exc: DatabaseError) -> bool:
    """Whether ``exc`` comes from another transaction (a unique row it committed, a deadlock), not from the file."""
    if isinstance(exc, IntegrityError):
        return True  # every value was validated: a duplicate is a row committed after the existence check
    # The errors db.retrying retries: a deadlock, a serialization failure, a lock wait that ran out.
    return storage.for_connection(db.connection()).is_retryable(exc)


class _Replayable:
    """The lines of an import's input, readable again from the first one for a retry.

    A list (anything ``iter()`` gives a fresh iterator of) is iterated again,
    a seekable stream is sought back to where it started, any other stream
    (stdin from a pipe, a generator) is copied as it is read into a
    :class:`~tempfile.SpooledTemporaryFile` (memory, then disk) and read back
    from there. ``progress`` is ticked once per line, on its first reading.
    """

    def __init__(self, lines: Iterable[str | bytes], progress=None):
        self._progress = progress
        self._seen = 0  # lines read (and ticked) so far, over all passes
        self._spool: IO[bytes] | None = None
        self._spooled = 0
        self._start: int | None = None
        self._stream: Any = lines
        it = iter(lines)
        self._source: Iterable[str | bytes] | None = lines if it is not lines else None  # a container
        self._it = it
        if self._source is not None:
            return
        stream = cast(Any, lines)  # a file object, when it has seekable()
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream.seekable():
                self._start = stream.tell()
                return
        self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 - closed in close()

    def lines(self):
        """Yield the lines from the first one (each call starts again)."""
        if self._source is not None:
            yield from self._count(iter(self._source), 0)
        elif self._start is not None:
            self._stream.seek(self._start)
            yield from self._count(self._it, 0)
        else:
            yield from self._replay_spool()

    def _count(self, it, n: int):
        for raw in it:
            n += 1
            if n > self._seen:
                self._seen = n
                _tick(self._progress, len(raw))
            yield raw

    def _replay_spool(self):
        spool = cast(IO[bytes], self._spool)
        spool.seek(0)
        for _ in range(self._spooled):
            tag, size = _RECORD.unpack(spool.read(_RECORD.size))
            data = spool.read(size)
            yield data if tag == b"b" else data.decode("utf-8", "surrogatepass")
        for raw in self._it:  # new lines: keep a copy (the spool's position is at its end now)
            if isinstance(raw, bytes):
                spool.write(_RECORD.pack(b"b", len(raw)) + raw)
            else:
                data = raw.encode("utf-8", "surrogatepass")
                spool.write(_RECORD.pack(b"s", len(data)) + data)
            self._spooled += 1
            self._seen += 1
            _tick(self._progress, len(raw))
            yield raw

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()


_RECORD = struct.Struct(">cQ")  # a spooled line: b"b" (bytes) or b"s" (str, UTF-8), then its length


@dataclass
class _QueueState:
    """What the import knows of one queue of the file."""

    name: str
    line: int
    id: int
    created: bool
    totals: dict
    active: int = 0  # scheduled/ready jobs inserted
    tokens: int = 0  # token rows inserted
    keyed: bool = False  # scheduled/ready jobs with a concurrency key inserted


#: Columns an import writes, in the order of :class:`_Row` values (the settle record stays NULL).
_JOB_COLUMNS = (
    "uid", "queue_id", "state", "priority", "run_at", "enqueued_at", "changed_at", "claimed_at", "finished_at",
    "attempts", "max_attempts", "generation", "timeout_ms", "payload", "payload_size", "result", "last_error",
    "errors", "unique_key", "idempotency", "worker", "metadata", "tags", "concurrency_key",
)  # fmt: skip
_TOKEN_COLUMNS = ("queue_id", "token", "job_uid", "created_at", "expires_at")


class _Row(SimpleNamespace):
    """The column values of one row to insert (cheaper than a model instance, which the ORM would compile)."""


@dataclass
class _PendingJob:
    line: int
    queue: _QueueState
    job: _Row = field(repr=False)
    #: ``(uid, on_failure, pending)`` of each dependency the line lists.
    edges: list = field(default_factory=list, repr=False)


@dataclass
class _PendingToken:
    line: int
    queue: _QueueState
    token: _Row = field(repr=False)


class _Importer:
    """Line-by-line state of one import: validates, batches inserts, keeps the counters' deltas."""

    def __init__(self):
        self.header_line: int | None = None
        self.lines = 0
        self.queues: dict[str, _QueueState] = {}
        self.job_lines: dict[str, int] = {}
        self.token_lines: dict[tuple[str, str], int] = {}
        self.key_lines: dict[tuple[str, str], int] = {}
        self.jobs: list[_PendingJob] = []
        self.tokens: list[_PendingToken] = []
        self.token_queues: dict[str, dict[str, int]] = {}  # job id -> {queue name: first token line naming it}
        self.counts = defaultdict(int)
        #: Jobs this import created that list dependencies: their edges are written at the end,
        #: once every job of the file is in (a dependency may come later in the file).
        self.with_edges: list[_PendingJob] = []
        #: Batch lines read: id -> (line, queue, pk, created by this import).
        self.batches: dict[str, tuple[int, _QueueState, int, bool]] = {}
        #: Job lines naming a batch: job id -> (line, queue, batch id); and the job ids this import created.
        self.job_batch: dict[str, tuple[int, _QueueState, str]] = {}
        self.created_members: list[str] = []

    # -- reading lines --------------------------------------------------------------------------

    def feed(self, n: int, raw: str | bytes) -> None:
        """Validate and stage line ``n``; flush full batches."""
        self.lines = n
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidBackup(f"not UTF-8 text ({exc.reason} at byte {exc.start})", line=n) from None
        if not raw.strip():
            return
        if validation.nests_deeper(raw, _LINE_DEPTH):
            # Checked on the text: decoding it could exhaust the stack first.
            raise InvalidBackup(
                f"nests deeper than {_LINE_DEPTH} levels (a payload or result may nest {validation.MAX_JSON_DEPTH})",
                line=n,
            )
        try:
            obj = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise InvalidBackup(f"not valid JSON: {exc}", line=n) from None
        if not isinstance(obj, dict):
            raise InvalidBackup("expected a JSON object", line=n)
        if self.header_line is None:
            self._header(n, obj)
            return
        kind = obj.get("type")
        if kind == "queue":
            self._queue(_Line(n, obj, _QUEUE_KEYS))
        elif kind == "job":
            self._job(_Line(n, obj, _JOB_KEYS))
        elif kind == "token":
            self._token(_Line(n, obj, _TOKEN_KEYS))
        elif kind == "batch":
            self._batch(_Line(n, obj, _BATCH_KEYS))
        elif "format" in obj and "type" not in obj:
            raise InvalidBackup("a second header: only line 1 may be a header", line=n)
        else:
            raise InvalidBackup('must be one of "queue", "job", "token", "batch"', line=n, field="type")
        if len(self.jobs) >= _BATCH:
            self._flush_jobs()
        if len(self.tokens) >= _BATCH:
            self._flush_tokens()

    def _header(self, n: int, obj: dict) -> None:
        if obj.get("format") != FORMAT:
            raise InvalidBackup(f'the first line must be a header with "format": "{FORMAT}"', line=n, field="format")
        line = _Line(n, obj, _HEADER_KEYS)
        version = line.integer("version", 1, _INT)
        if version > VERSION:
            raise InvalidBackup(
                f"format version {version} is newer than this django-fq reads ({VERSION})", line=n, field="version"
            )
        line.integer("exported_at", 0, _SAFE, default=None)
        line.text("database", 100, default=None)
        self.header_line = n

    def _queue(self, line: _Line) -> None:
        name = line.get("name", required=True)
        try:
            validation.queue_name(name)
        except InvalidArgument as exc:
            raise line.error(exc.message, "name") from None
        if name in self.queues:
            raise line.error(f"queue {name} is declared twice (first on line {self.queues[name].line})", "name")
        policy = line.obj_of("policy", _POLICY_FIELDS)
        merged = {f: getattr(QueuePolicy(), f) for f in _POLICY_FIELDS}
        for f in _POLICY_FIELDS:
            if f in policy:
                merged[f] = line.int_in(policy, f, *POLICY_BOUNDS[f], where=f"policy.{f}")
        if merged["max_backoff_ms"] < merged["backoff_ms"]:
            raise line.error("must be at least policy.backoff_ms", "policy.max_backoff_ms")
        totals_raw = line.obj_of("totals", _TOTALS)
        totals = {
            t: line.int_in(totals_raw, t, 0, _MS_SUM if t.endswith("_ms_sum") else _SAFE, where=f"totals.{t}")
            for t in _TOTALS
            if t in totals_raw
        }
        created_at = line.integer("created_at", 0, _SAFE, default=None)
        paused = line.get("paused", default=False)
        if paused is None:
            paused = False
        if not isinstance(paused, bool):
            raise line.error(f"must be true or false, not {_kind(paused)}", "paused")
        paused_at = line.integer("paused_at", 0, _SAFE, default=None)
        if paused_at is not None and not paused:
            raise line.error("must be null unless paused is true", "paused_at")

        conn = db.connection()
        existing = _find_queue(name)
        created = False
        if existing is None:
            try:
                with transaction.atomic(using=conn.alias):
                    check_room_for_a_queue(conn, name)  # FQ_MAX_QUEUES, as every other way of creating one
                    pause = {"paused": True, "paused_at": paused_at if paused_at is not None else db.DbNow()}
                    q = manager(Queue).create(
                        name=name,
                        created_at=created_at if created_at is not None else db.DbNow(),
                        **(pause if paused else {}),
                        **merged,
                    )
                existing, created = q.id, True
            except IntegrityError:  # created concurrently: it is an existing queue now
                existing = _find_queue(name)
            except TooManyQueues as exc:
                raise line.error(exc.message, "name") from None
        if existing is None:
            raise line.error(f"queue {name} was deleted while the import ran; nothing was imported", "name")
        # Hold the queue row as enqueues do, so a concurrent delete_queue waits for this import.
        if not storage.for_connection(conn).lock_queue_row(conn, QUEUE, existing):
            raise line.error(f"queue {name} was deleted while the import ran; nothing was imported", "name")
        self.queues[name] = _QueueState(
            name=name, line=line.n, id=existing, created=created, totals=totals if created else {}
        )
        self.counts["queues_created" if created else "queues_skipped"] += 1

    def _declared(self, line: _Line) -> _QueueState:
        name = line.get("queue", required=True)
        if not isinstance(name, str) or name not in self.queues:
            raise line.error(f"queue {name!r} is not declared by a queue line before this one", "queue")
        return self.queues[name]

    def _job(self, line: _Line) -> None:
        q = self._declared(line)
        uid = line.get("id", required=True)
        if not validation.job_id(uid):
            raise line.error("must be a job id: 32 lowercase hexadecimal characters", "id")
        if uid in self.job_lines:
            raise line.error(f"job {uid} already appears on line {self.job_lines[uid]}", "id")
        state = line.get("state", required=True)
        if state not in _EXPORTED_STATES:
            raise line.error(
                f"must be one of {', '.join(_EXPORTED_STATES)} (running jobs are exported as ready)", "state"
            )
        payload, size = line.json("payload", required=True)
        result = line.json("result")[0] if line.get("result") is not None else None
        metadata, tags = line.metadata("metadata")
        errors = line.get("errors", default=[])
        if not isinstance(errors, list) or not all(
            isinstance(e, dict) and isinstance(e.get("error", ""), str) for e in errors
        ):
            raise line.error('must be a list of objects, each "error" a string', "errors")
        line.json("errors", limit=_BIG)  # no NUL or lone surrogate: PostgreSQL could not store them
        # The engine's caps (docs/reference/semantics.md §9): the newest 100 entries, each error text cut to 64 KiB as a nack cuts it.
        # Each entry is rebuilt from the engine's own keys, so no other key (of any size) is stored.
        errors = [_history_entry(line, e) for e in errors[-_HISTORY_KEEP:]]
        enqueued_at = line.integer("enqueued_at", 0, _SAFE)
        max_attempts = line.integer("max_attempts", *POLICY_BOUNDS["max_attempts"])
        attempts = line.integer("attempts", 0, max_attempts, hint="a job never passes its max_attempts")
        edges = _import_edges(line)
        if state == "waiting" and not any(pending for _, _, pending, _ in edges):
            raise line.error("a waiting job needs a pending dependency", "depends_on")
        waiting = state in ("scheduled", "ready", "waiting")
        if waiting and attempts == max_attempts:
            # Only a job running on its last attempt is exported so (by exports before the attempt was
            # given back on export): give it back now, so its next claim is its last attempt.
            attempts -= 1
        job = _Row(
            uid=uid,
            queue_id=q.id,
            state="queued" if state in ("scheduled", "ready") else state,
            priority=line.integer("priority", validation.MIN_PRIORITY, validation.MAX_PRIORITY),
            run_at=line.integer("run_at", 0, _SAFE),
            enqueued_at=enqueued_at,
            changed_at=line.integer("changed_at", 0, _SAFE, default=enqueued_at),
            claimed_at=line.integer("claimed_at", 0, _SAFE, default=None),
            finished_at=line.integer("finished_at", 0, _SAFE, default=None),
            attempts=attempts,
            max_attempts=max_attempts,
            generation=line.integer("generation", 0, _SAFE, default=attempts),
            timeout_ms=line.integer("timeout_ms", *POLICY_BOUNDS["timeout_ms"], default=0),
            payload=payload,
            payload_size=size,
            result=result,
            last_error=validation.error_text(line.text("last_error", None, default="")),
            errors=errors,
            unique_key=line.key("unique_key"),
            idempotency=line.key("idempotency"),
            worker=line.text("worker", 200, default=""),
            metadata=metadata,
            tags=tags,
            concurrency_key=line.concurrency_key(),
        )
        if job.unique_key is not None and job.state in ("queued", "waiting"):
            other = self.key_lines.setdefault((q.name, job.unique_key), line.n)
            if other != line.n:
                raise line.error(f"the active job on line {other} holds the same unique_key", "unique_key")
        batch = line.get("batch", default=None)
        if batch is not None:
            if not validation.job_id(batch):
                raise line.error("must be a batch id: 32 lowercase hexadecimal characters", "batch")
            self.job_batch[uid] = (line.n, q, batch)
        self.job_lines[uid] = line.n
        self.jobs.append(_PendingJob(line.n, q, job, edges))

    def _batch(self, line: _Line) -> None:
        from . import batches

        q = self._declared(line)
        uid = line.get("id", required=True)
        if not validation.job_id(uid):
            raise line.error("must be a batch id: 32 lowercase hexadecimal characters", "id")
        if uid in self.batches:
            raise line.error(f"batch {uid} already appears on line {self.batches[uid][0]}", "id")
        state = line.get("state", required=True)
        if state not in batches.STATES:
            raise line.error(f"must be one of {', '.join(batches.STATES)}", "state")
        counts = {k: line.integer(k, 0, _SAFE) for k in ("total", "succeeded", "dead", "cancelled")}
        if counts["succeeded"] + counts["dead"] + counts["cancelled"] > counts["total"]:
            raise line.error("succeeded + dead + cancelled must not pass total", "total")
        cb_queue = cb_payload = cb_options = None
        callback = line.get("callback", default=None)
        if callback is not None:
            try:
                cb_queue, cb_payload, cb_options = batches._parse_callback(callback, q.name)
            except InvalidArgument as exc:
                raise line.error(exc.message, exc.field) from None
        callback_job = line.get("callback_job", default=None)
        if callback_job is not None and not validation.job_id(callback_job):
            raise line.error("must be a job id: 32 lowercase hexadecimal characters", "callback_job")
        times = {k: line.integer(k, 0, _SAFE, default=None) for k in ("created_at", "sealed_at", "finished_at")}
        have = manager(Batch).filter(uid=uid).values_list("id", "queue_id").first()
        if have is not None and have[1] != q.id:
            raise line.error(f"batch {uid} already exists in another queue", "id")
        if have is not None:
            self.batches[uid] = (line.n, q, have[0], False)
            self.counts["batches_skipped"] += 1
            return
        row = manager(Batch).create(
            uid=uid, queue_id=q.id, state=state, **counts, callback_queue=cb_queue, callback_payload=cb_payload,
            callback_options=cb_options, callback_job=callback_job,
            created_at=times["created_at"] if times["created_at"] is not None else db.db_now_ms(),
            sealed_at=times["sealed_at"], finished_at=times["finished_at"],
        )  # fmt: skip
        self.batches[uid] = (line.n, q, row.pk, True)
        self.counts["batches_created"] += 1

    def _token(self, line: _Line) -> None:
        q = self._declared(line)
        token = cast(str, line.key("token", required=True))  # required: never None
        if (q.name, token) in self.token_lines:
            raise line.error(f"token already appears on line {self.token_lines[q.name, token]}", "token")
        job_uid = line.get("job_id", required=True)
        if not validation.job_id(job_uid):
            raise line.error("must be a job id: 32 lowercase hexadecimal characters", "job_id")
        created_at = line.integer("created_at", 0, _SAFE)
        expires_at = line.integer("expires_at", 0, _SAFE)
        if expires_at < created_at:
            raise line.error("must not be before created_at", "expires_at")
        self.token_lines[q.name, token] = line.n
        self.token_queues.setdefault(job_uid, {}).setdefault(q.name, line.n)
        row = _Row(queue_id=q.id, token=token, job_uid=job_uid, created_at=created_at, expires_at=expires_at)
        self.tokens.append(_PendingToken(line.n, q, row))

    # -- writing --------------------------------------------------------------------------------

    def _flush_jobs(self) -> None:
        batch, self.jobs = self.jobs, []
        if not batch:
            return
        have = dict(manager(Job).filter(uid__in=[p.job.uid for p in batch]).values_list("uid", "queue_id"))
        new = []
        for p in batch:
            where = have.get(p.job.uid)
            if where is None:
                new.append(p)
            elif where == p.queue.id:
                self.counts["jobs_skipped"] += 1
            else:
                other = manager(Queue).filter(id=where).values_list("name", flat=True).first()
                raise InvalidBackup(f"job {p.job.uid} already exists in queue {other}", line=p.line, field="id")
        # A token line read earlier in this file for another queue, naming this id, would answer that
        # queue's enqueues with a job its get() cannot find (tokens read later are checked by _flush_tokens).
        for p in new:
            named = self.token_queues.get(p.job.uid, {})
            others = {q for q, n in named.items() if q != p.queue.name and n < p.line}
            if others:
                raise InvalidBackup(
                    f"job {p.job.uid} is named by an idempotency token of queue {min(others)}", line=p.line, field="id"
                )
        keyed = defaultdict(list)
        for p in new:
            if p.job.unique_key is not None and p.job.state in ("queued", "waiting"):
                keyed[p.queue.id].append(p)
        for queue_id, items in keyed.items():
            holders = dict(
                manager(Job)
                .filter(
                    queue_id=queue_id,
                    state__in=("waiting", "queued", "running", "held"),
                    unique_key__in=[p.job.unique_key for p in items],
                )
                .values_list("unique_key", "uid")
            )
            for p in items:
                if p.job.unique_key in holders:
                    raise InvalidBackup(
                        f"unique_key {p.job.unique_key!r} is held by active job {holders[p.job.unique_key]} "
                        f"of queue {p.queue.name}",
                        line=p.line,
                        field="unique_key",
                    )
        # Payloads above this site's FQ_PAYLOAD_OFFLOAD_BYTES go to the side table, whatever the
        # exporting site did: the backup line holds the payload itself either way.
        stored, bodies = payloads.split([(p.job.uid, p.job.payload, p.job.payload_size) for p in new])
        # A body travels in a statement of its own: refused by line as _insert refuses a row, before
        # anything of the batch is written (the row check below no longer sees the payload).
        _refuse_large_bodies(bodies, {p.job.uid: p.line for p in new})
        for p, text in zip(new, stored, strict=True):
            p.job.payload = text
        _insert(JOB, _JOB_COLUMNS, [p.job for p in new], lines=[p.line for p in new])
        conn = db.connection()
        storage.for_connection(conn).insert_bodies(conn, bodies)
        for p in new:
            p.queue.active += int(p.job.state in ("queued", "waiting"))
            p.queue.keyed |= p.job.state == "queued" and p.job.concurrency_key is not None
        self.with_edges += [p for p in new if p.edges]
        self.created_members += [p.job.uid for p in new if p.job.uid in self.job_batch]
        self.counts["jobs_created"] += len(new)

    def _flush_tokens(self) -> None:
        self._flush_jobs()  # the jobs read so far are in the database: the token check below sees them
        batch, self.tokens = self.tokens, []
        if not batch:
            return
        by_queue = defaultdict(list)
        for p in batch:
            by_queue[p.queue.id].append(p)
        # A token names a job of its own queue (or a job pruned since): one naming another queue's job
        # would make a later enqueue there return an id that get() in this queue cannot find.
        owners = dict(manager(Job).filter(uid__in={p.token.job_uid for p in batch}).values_list("uid", "queue_id"))
        for p in batch:
            owner = owners.get(p.token.job_uid, p.queue.id)
            if owner != p.queue.id:
                other = manager(Queue).filter(id=owner).values_list("name", flat=True).first()
                raise InvalidBackup(
                    f"job {p.token.job_uid} belongs to queue {other}, not {p.queue.name}", line=p.line, field="job_id"
                )
        new = []
        for queue_id, items in by_queue.items():
            have = set(
                manager(IdempotencyToken)
                .filter(queue_id=queue_id, token__in=[p.token.token for p in items])
                .values_list("token", flat=True)
            )
            for p in items:
                if p.token.token in have:
                    self.counts["tokens_skipped"] += 1
                else:
                    new.append(p)
        _insert(TOKEN, _TOKEN_COLUMNS, [p.token for p in new], lines=[p.line for p in new])
        for p in new:
            p.queue.tokens += 1
        self.counts["tokens_created"] += len(new)

    def finish(self) -> None:
        """Write what is staged, check the queue limits, and add the counter deltas (same transaction)."""
        if self.header_line is None:
            raise InvalidBackup(
                f'the file is empty: expected a header with "format": "{FORMAT}"', line=max(self.lines, 1)
            )
        self._flush_jobs()
        self._flush_tokens()
        self._write_edges()
        self._write_members()
        conn = db.connection()
        for q in self.queues.values():
            # The rule every writer of jobs and tokens follows (the enqueue's), with the import's error.
            over = queue_overflow(conn, q.id, jobs=q.active, tokens=q.tokens)
            if over is not None:
                what = (
                    "scheduled/ready/running jobs" if over.setting == "FQ_MAX_JOBS_PER_QUEUE" else "idempotency tokens"
                )
                raise InvalidBackup(
                    f"queue {q.name} would hold {over.held + over.adding} {what}, "
                    f"more than {over.setting} ({over.limit})",
                    line=q.line,
                    field="name",
                )
            # Through the counters' one writer (it asks the store), whose ** mappings the SQL audit reviews.
            add_counters(conn, q.id, **q.totals, active=q.active, token_rows=q.tokens)
            limits = manager(Queue).filter(id=q.id).values_list("key_concurrency", "key_rate_limit").first()
            if q.keyed and limits and any(limits):
                # Imported as queued: held and admitted again in claim order, up to the limits.
                slots.rebalance(conn, queue_id=q.id, queue=q.name)
            if q.active:
                db.notify(conn, q.name)  # delivered at commit: idle workers look at once

    def _write_edges(self) -> None:
        """The edges of the jobs this import created, now that every job of the file is in.

        A dependency must exist (in the file or the database): else the line is
        refused, naming ``depends_on[i]``. An edge stays pending only for a
        waiting job and a dependency that has not succeeded (nor failed under
        ``run``) in the database now; a waiting job left with no pending edge is ready.
        """
        if not self.with_edges:
            return
        conn = db.connection()
        store = storage.for_connection(conn)
        found = store.lock_dependencies(conn, [uid for p in self.with_edges for uid, *_ in p.edges])
        seqs = store.job_seqs(conn, [p.job.uid for p in self.with_edges])
        rows: list[tuple[int, int, str, bool, str | None]] = []
        waiting: list[tuple[int, int]] = []
        ready: list[tuple[int, int]] = []
        for p in self.with_edges:
            n = 0
            for i, (uid, policy, pending, name) in enumerate(p.edges):
                if uid not in found:
                    raise InvalidBackup(
                        f"no job {uid} in the file or the database (export the queue it belongs to too)",
                        line=p.line,
                        field=f"depends_on[{i}]",
                    )
                up_state = found[uid][1]
                done = up_state == "succeeded" or (up_state in ("dead", "cancelled") and policy == "run")
                still = pending and p.job.state == "waiting" and not done
                n += still
                rows.append((seqs[p.job.uid], found[uid][0], policy, still, name))
            if p.job.state == "waiting":
                (waiting if n else ready).append((seqs[p.job.uid], n))
                # Made queued below: a keyed one is admitted to its key's slots by finish() (rebalance).
                p.queue.keyed |= not n and p.job.concurrency_key is not None
        store.insert_dependencies(conn, rows)
        store.mark_waiting(conn, waiting)
        if ready:
            manager(Job).filter(seq__in=[seq for seq, _ in ready]).update(state="queued")

    def _write_members(self) -> None:
        """Memberships of the jobs this import created in the batches it created; the callbacks now due.

        A job line's ``batch`` must be a batch of its queue in the file or the
        database (else refused by line, field ``batch``). The counts are the
        batch line's: the members join without adding to ``total``.
        """
        from . import batches

        for n, q, bid in self.job_batch.values():
            known = self.batches.get(bid)
            if known is None:
                have = manager(Batch).filter(uid=bid).values_list("queue_id", flat=True).first()
                if have != q.id:
                    raise InvalidBackup(f"no batch {bid} of queue {q.name} in the file or the database", line=n, field="batch")
            elif known[1] is not q:
                raise InvalidBackup(f"batch {bid} belongs to queue {known[1].name}", line=n, field="batch")
        conn = db.connection()
        store = storage.for_connection(conn)
        joined: dict[int, list[str]] = defaultdict(list)
        for uid in self.created_members:
            known = self.batches.get(self.job_batch[uid][2])
            if known is not None and known[3]:
                joined[known[2]].append(uid)
        for pk, uids in sorted(joined.items()):
            store.join_batch(conn, pk, uids)
        for _, _, pk, created in self.batches.values():
            if created:
                batches._fire_if_done(conn, pk)  # a sealed batch whose members had all finished

    def summary(self, dry_run: bool) -> ImportSummary:
        c = self.counts
        return ImportSummary(
            lines=self.lines,
            queues_created=c["queues_created"],
            queues_skipped=c["queues_skipped"],
            jobs_created=c["jobs_created"],
            jobs_skipped=c["jobs_skipped"],
            tokens_created=c["tokens_created"],
            tokens_skipped=c["tokens_skipped"],
            dry_run=dry_run,
            batches_created=c["batches_created"],
            batches_skipped=c["batches_skipped"],
        )


def _insert(table: str, columns: Sequence[str], rows: list[_Row], *, lines: Sequence[int]) -> None:
    """``INSERT`` ``rows`` (validated values) through the store, many rows per statement; JSON adapted as the ORM does.

    ``lines`` are the backup file's line numbers of ``rows`` (1-based, one
    each). Raises :class:`InvalidBackup` naming the line and its largest
    column, before writing anything of the batch, when one row alone is
    longer than a statement the server accepts (MariaDB/MySQL:
    ``max_allowed_packet``, see W030 in docs/reference/checks.md): a job
    with a payload, a result and 100 error entries of 64 KiB each at
    their caps is ~8.5 MiB of text, which escaping may double past the
    default 16 MiB. Without this the server would drop the connection.
    """
    if not rows:
        return
    conn = db.connection()
    model = Job if table == JOB else IdempotencyToken
    fields = {c: cast(Field, model._meta.get_field(c)) for c in columns}
    json_fields = {c: f for c, f in fields.items() if f.get_internal_type() == "JSONField"}
    params = []
    for row in rows:
        values = [getattr(row, c) for c in columns]
        for i, c in enumerate(columns):
            if c in json_fields:
                values[i] = json_fields[c].get_db_prep_save(values[i], connection=conn)
        params.append(values)
    store = storage.for_connection(conn)
    # At most _ROWS_PER_INSERT rows, and within the store's statement size (a run of payloads
    # at the cap is megabytes: MariaDB refuses a statement past max_allowed_packet).
    budget = store.statement_budget(conn)
    sizes = [_escaped_bytes(values) for values in params]
    if budget is not None:
        for values, size, line in zip(params, sizes, lines, strict=True):
            if size > budget:
                widest = max(range(len(columns)), key=lambda i: _escaped_bytes([values[i]]))
                raise InvalidBackup(
                    f"this row needs up to {size} bytes of statement text, more than the server takes in one "
                    f"statement ({budget} bytes, from its max_allowed_packet); raise max_allowed_packet",
                    line=line,
                    field=columns[widest],
                )
    for start in range(0, len(params), _ROWS_PER_INSERT):
        page = params[start : start + _ROWS_PER_INSERT]
        for run in split_by_bytes(page, sizes[start : start + _ROWS_PER_INSERT], budget):
            store.insert_rows(conn, table, columns, run)


def _refuse_large_bodies(bodies: Sequence[tuple[str, str]], line_of: dict[str, int]) -> None:
    """Raise :class:`InvalidBackup` (field ``payload``) for the first offloaded body longer than one statement.

    ``bodies`` are :func:`payloads.split`'s ``(job uid, text)``; ``line_of`` the
    backup line of each uid. The bytes are what
    :meth:`~django_fq.storage.base.Store.insert_bodies` allows for a body
    (:func:`~django_fq.storage.base.body_statement_bytes`); the budget is the
    store's (MariaDB/MySQL: from ``max_allowed_packet``; none elsewhere).
    """
    if not bodies:
        return
    conn = db.connection()
    budget = storage.for_connection(conn).statement_budget(conn)
    if budget is None:
        return
    for uid, text in bodies:
        size = body_statement_bytes(text)
        if size > budget:
            raise InvalidBackup(
                f"this payload needs up to {size} bytes of statement text, more than the server takes in one "
                f"statement ({budget} bytes, from its max_allowed_packet); raise max_allowed_packet",
                line=line_of[uid],
                field="payload",
            )


def _escaped_bytes(values: Sequence[Any]) -> int:
    """Bytes a row of parameter ``values`` may take in a statement's text: escaping at most doubles text."""
    size = 0
    for v in values:
        if isinstance(v, str):
            size += 2 * len(v.encode()) + 8
        elif isinstance(v, bytes):
            size += 2 * len(v) + 8
        else:
            size += 32  # a number, NULL, or a value adapted by the driver
    return size


def _find_queue(name: str) -> int | None:
    return manager(Queue).filter(name=name).values_list("id", flat=True).first()


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


_MISSING: Any = object()


class _Line:
    """One parsed line: typed access to its keys, raising :class:`InvalidBackup` that names line and key."""

    def __init__(self, n: int, obj: dict, allowed: frozenset):
        self.n = n
        self.obj = obj
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise InvalidBackup("unknown field", line=n, field=unknown[0])

    def error(self, problem: str, key: str | None = None) -> InvalidBackup:
        return InvalidBackup(problem, line=self.n, field=key)

    def get(self, key: str, *, required: bool = False, default=None):
        if key not in self.obj:
            if required:
                raise self.error("is required", key)
            return default
        return self.obj[key]

    def integer(self, key: str, lo: int, hi: int, *, default=_MISSING, hint: str = "") -> int:
        """``key`` as an int within ``lo..hi``; absent (or null) gives ``default``, or fails when it has none."""
        value = self.obj.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise self.error("is required", key)
            return default
        return self.int_in(self.obj, key, lo, hi, where=key, hint=hint)

    def int_in(self, obj: dict, key: str, lo: int, hi: int, *, where: str, hint: str = "") -> int:
        """``obj[key]`` as an int within ``lo..hi``; errors name ``where`` (and add ``hint``, if any)."""
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"must be an integer, not {_kind(value)}", where)
        if not lo <= value <= hi:
            raise self.error(f"must be between {lo} and {hi}" + (f" ({hint})" if hint else ""), where)
        return value

    def text(self, key: str, max_len: int | None, *, default=_MISSING) -> str:
        """``key`` as a string PostgreSQL and SQLite both store (no NUL, no lone surrogate)."""
        if key not in self.obj or (self.obj[key] is None and default is not _MISSING):
            if default is _MISSING:
                raise self.error("is required", key)
            return default
        value = self.obj[key]
        if not isinstance(value, str):
            raise self.error(f"must be a string, not {_kind(value)}", key)
        if max_len is not None and len(value) > max_len:
            raise self.error(f"must be at most {max_len} characters", key)
        if "\x00" in value:
            raise self.error("must not contain a NUL character", key)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise self.error("contains a lone surrogate", key) from None
        return value

    def key(self, key: str, *, required: bool = False) -> str | None:
        value = self.get(key, required=required)
        if value is None and required:
            raise self.error("must be a string of 1-255 characters", key)
        try:
            return validation.key(value, key)
        except InvalidArgument:
            raise self.error(
                f"must be null or a string of 1-{validation.MAX_KEY_LENGTH} characters without NUL", key
            ) from None

    def concurrency_key(self) -> str | None:
        try:
            return validation.concurrency_key(self.get("concurrency_key"))
        except InvalidArgument:
            raise self.error(
                f"must be null or a string of 1-{validation.MAX_CONCURRENCY_KEY_LENGTH} characters without NUL",
                "concurrency_key",
            ) from None

    def json(self, key: str, *, required: bool = False, limit: int | None = None) -> tuple[str, int]:
        value = self.get(key, required=required)
        try:
            return validation.json_text(value, key, limit)
        except InvalidArgument as exc:
            raise self.error(exc.message, key) from None

    def metadata(self, key: str) -> tuple[str | None, str | None]:
        """Job metadata and its tags column, under enqueue's rules but the hard cap (64 KiB), not the site's limit."""
        try:
            return validation.metadata(self.get(key), key, conf.HARD_METADATA_CAP_BYTES)
        except InvalidArgument as exc:
            raise self.error(exc.message, exc.field or key) from None

    def obj_of(self, key: str, allowed: Sequence[str]) -> dict:
        value = self.get(key, default={})
        if not isinstance(value, dict):
            raise self.error(f"must be an object, not {_kind(value)}", key)
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise self.error("unknown field", f"{key}.{unknown[0]}")
        return value


def _kind(value) -> str:
    if value is None:
        return "null"
    kinds = {
        bool: "a boolean",
        int: "an integer",
        str: "a string",
        float: "a number with a fraction",
        list: "a list",
        dict: "an object",
    }
    return kinds.get(type(value), type(value).__name__)


# --- command-line helpers -------------------------------------------------------------------------


def progress_bar(stream, *, enabled: bool, total: int | None = None, unit: str = "row", desc: str = ""):
    """A ``tqdm`` bar on ``stream`` when ``enabled`` and ``stream`` is a terminal, else ``None``.

    ``unit="B"`` scales the counts as bytes. The caller closes the bar.
    """
    isatty = getattr(stream, "isatty", None)
    if not enabled or not callable(isatty) or not isatty():
        return None
    from tqdm import tqdm

    out = getattr(stream, "_out", stream)  # Django's OutputWrapper
    scale = unit == "B"
    return tqdm(
        total=total, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000, desc=desc, file=out, leave=False
    )


def export_to_path(path: str, queues: Sequence[str] | None = None, *, progress=None) -> ExportSummary:
    """:func:`export_jsonl` into the file ``path`` (a string), which is replaced only once the export is complete.

    A symbolic link is followed: its target is written and the link stays.
    For a regular file (or a new one), a temporary file is written in the
    same directory and renamed over it; on any error the temporary file is
    removed and the file is left as it was. A file that exists keeps its
    permission bits; a new file is created with mode 0600. Something that
    exists and is not a regular file (a named pipe, a character device) is
    written into directly: no temporary file, no rename, and an export that
    fails leaves what was written so far. So is an open descriptor
    (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``; see
    :func:`names_a_descriptor`), appended to when it is a regular file.

    Raises :class:`InvalidArgument` (field ``output``) when ``path`` is a
    directory or cannot be written, and what :func:`export_jsonl` raises.
    """
    validation.file_path(path, "output")
    try:
        st: os.stat_result | None = os.stat(path)  # follows symbolic links
    except FileNotFoundError:
        st = None  # a new file, or a link to one
    except OSError as exc:
        raise InvalidArgument(f"cannot write {path}: {exc.strerror or exc}", field="output") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InvalidArgument(f"cannot write {path}: it is a directory", field="output")
    target = os.path.realpath(path)
    if st is not None and (names_a_descriptor(path) or not stat.S_ISREG(st.st_mode) or not _same_file(target, st)):
        # A pipe or a device, an open descriptor (/dev/stdout), or a link that does not name its file
        # by path: write into it (appending, for a regular file: `>>` and `{ ...; } > f` keep what they hold).
        return _export_into(path, queues, progress, append=stat.S_ISREG(st.st_mode))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".fq-export-", suffix=".jsonl", dir=os.path.dirname(target))
    except OSError as exc:
        raise InvalidArgument(f"cannot write {path}: {exc.strerror or exc}", field="output") from None
    try:
        if st is not None:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            summary = export_jsonl(fh, queues, progress=progress)
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise InvalidArgument(f"cannot write {path}: {exc.strerror or exc}", field="output") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return summary


def _same_file(path: str, st: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(path), st)
    except OSError:
        return False


#: Paths that name a descriptor the process already has open, rather than a file by its path.
_DESCRIPTOR_PATH = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|thread-self|\d+)/fd/\d+")


def names_a_descriptor(path: str) -> bool:
    """Whether ``path`` (a string) names an open descriptor (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``).

    Such a path resolves to whatever the descriptor is open on, which may be a
    regular file (``fq export -o /dev/stdout >> backups.jsonl``); that file
    must be written into, never replaced by a rename.
    """
    return _DESCRIPTOR_PATH.fullmatch(os.path.normpath(path)) is not None


def _export_into(path: str, queues: Sequence[str] | None, progress, *, append: bool = False) -> ExportSummary:
    """:func:`export_jsonl` straight into the existing ``path``: a pipe, a device, or (``append``) an open file."""
    try:
        fh = open(path, "a" if append else "w", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise InvalidArgument(f"cannot write {path}: {exc.strerror or exc}", field="output") from None
    try:
        with fh:
            return export_jsonl(fh, queues, progress=progress)
    except OSError as exc:  # the reader of the pipe went away, the device is full
        raise InvalidArgument(f"cannot write {path}: {exc.strerror or exc}", field="output") from None


def open_source(source: str, stdin=None):
    """``(lines, size_in_bytes or None)`` of a backup file path, or of ``stdin`` for ``-``.

    A path is opened in binary mode (lines are decoded, and a bad byte
    reported with its line, by :func:`import_jsonl`). Raises
    :class:`InvalidArgument` (field ``source``) when the file cannot be read.
    """
    if source == "-":
        stream = stdin if stdin is not None else sys.stdin
        return getattr(stream, "buffer", stream), None
    validation.file_path(source, "source")
    try:
        fh = open(source, "rb")  # noqa: SIM115 - closed by the caller through the returned file
        return fh, os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise InvalidArgument(f"cannot read {source}: {exc.strerror or exc}", field="source") from None
