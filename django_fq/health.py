"""Health of the queues for monitoring: stuck leases, dead jobs, the age of the oldest ready job.

``check()`` is what ``manage.py fq health`` runs; :func:`queue_gauges` is the
same reading for the Prometheus exporter (:mod:`django_fq.metrics`). Every
age is computed by the database from its own clock (``db.now_sql``), never by
comparing with Python's clock.

Three checks, each over one queue or every queue:

* **stuck leases** (always on) — leases whose deadline passed more than
  ``stuck_lease_ms`` ago and that were still not handled as expired. The
  reaper of every ``fq_worker`` (and each claim, for its own queue) handles
  an expired lease within about a second, so a lease left far past its
  deadline means no reaper runs and nothing claims from that queue: those
  jobs stay ``running`` for ever. Severity: critical.
* **dead jobs** (``max_dead``) — more than ``max_dead`` jobs of a queue are
  ``dead`` (out of attempts, or failed permanently) and wait for a person to
  retry or cancel them. Severity: warning.
* **oldest ready job** (``max_ready_age_ms``) — a job has been eligible
  (``ready``) for longer than ``max_ready_age_ms`` without being claimed:
  no worker serves the queue, or the workers cannot keep up. The age counts
  from ``max(enqueued_at, run_at)``, the instant the job became eligible,
  as the wait time of ``stats`` does. Severity: critical.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from . import conf, db, routing, storage, validation
from .exceptions import QueueNotFound
from .models import Job, Lease, Queue

OK, WARNING, CRITICAL = "ok", "warning", "critical"
#: Exit status of ``fq health`` per status (the Nagios plugin convention; 3 is "unknown").
EXIT_CODES = {OK: 0, WARNING: 1, CRITICAL: 2}
UNKNOWN_EXIT = 3
_RANK = {OK: 0, WARNING: 1, CRITICAL: 2}

#: Default of ``stuck_lease_ms``: one minute past the deadline (a reaper passes every second by default).
DEFAULT_STUCK_LEASE_MS = 60_000
#: Largest accepted age threshold: 30 days, in ms.
MAX_AGE_MS = 30 * validation.DAY_MS
#: Largest accepted ``max_dead``.
MAX_DEAD = 1_000_000_000

_JOB = Job._meta.db_table
_LEASE = Lease._meta.db_table
_QUEUE = Queue._meta.db_table


@dataclass(frozen=True)
class QueueHealth:
    """What the checks read for one queue.

    ``stuck_leases``: leases past their deadline by more than the threshold
    (the exporter uses a threshold of 0: every expired lease not yet handled);
    ``stuck_for_ms``: how far past its deadline the oldest of them is (0 when
    none); ``dead``: dead jobs; ``oldest_ready_age_ms``: how long the oldest
    ready job has been eligible, ``None`` when no job is ready.
    """

    queue: str
    stuck_leases: int = 0
    stuck_for_ms: int = 0
    dead: int = 0
    oldest_ready_age_ms: int | None = None


@dataclass(frozen=True)
class Problem:
    """One failed check: ``check`` is ``stuck_leases``, ``dead_jobs`` or ``ready_age``."""

    check: str
    queue: str
    status: str
    message: str
    value: int
    threshold: int


@dataclass(frozen=True)
class HealthReport:
    """The outcome of :func:`check`.

    ``status`` is the worst status of the problems (``ok`` when there is
    none) and ``exit_code`` its exit status (0 ok, 1 warning, 2 critical).
    ``thresholds`` echoes the arguments (``None``: check not run);
    ``queues`` has one :class:`QueueHealth` per checked queue, by name.
    """

    status: str
    exit_code: int
    thresholds: dict
    problems: list[Problem] = field(default_factory=list)
    queues: list[QueueHealth] = field(default_factory=list)


def check(
    queue: str | None = None,
    *,
    stuck_lease_ms: int = DEFAULT_STUCK_LEASE_MS,
    max_dead: int | None = None,
    max_ready_age_ms: int | None = None,
) -> HealthReport:
    """Run the health checks on ``queue`` (or every queue) and report.

    Args:
        queue: a queue name, or ``None`` for every queue.
        stuck_lease_ms: a lease this many ms (0 – 30 days) past its deadline
            and not yet handled is a critical problem. Always checked.
        max_dead: more dead jobs than this (0 – 1,000,000,000) in a queue is a
            warning; ``None`` skips the check.
        max_ready_age_ms: a job ready for longer than this (0 – 30 days) is a
            critical problem; ``None`` skips the check.

    Raises :class:`~django_fq.exceptions.InvalidArgument` naming the field
    (``stuck_lease_ms``, ``max_dead``, ``max_ready_age_ms``) for a value out
    of range, :class:`~django_fq.exceptions.InvalidQueueName` and
    :class:`~django_fq.exceptions.QueueNotFound` (field ``queue``).
    """
    validation.integer(stuck_lease_ms, "stuck_lease_ms", 0, MAX_AGE_MS)
    if max_dead is not None:
        validation.integer(max_dead, "max_dead", 0, MAX_DEAD)
    if max_ready_age_ms is not None:
        validation.integer(max_ready_age_ms, "max_ready_age_ms", 0, MAX_AGE_MS)
    readings = _read(queue, stuck_lease_ms)
    problems: list[Problem] = []
    for h in readings:
        if h.stuck_leases:
            problems.append(
                Problem(
                    "stuck_leases",
                    h.queue,
                    CRITICAL,
                    f"{h.stuck_leases} lease(s) expired more than {stuck_lease_ms} ms ago and not reaped "
                    f"(the oldest {h.stuck_for_ms} ms ago): is a worker with a reaper running?",
                    h.stuck_leases,
                    stuck_lease_ms,
                )
            )
        if max_dead is not None and h.dead > max_dead:
            problems.append(
                Problem("dead_jobs", h.queue, WARNING, f"{h.dead} dead job(s), more than {max_dead}", h.dead, max_dead)
            )
        age = h.oldest_ready_age_ms
        if max_ready_age_ms is not None and age is not None and age > max_ready_age_ms:
            problems.append(
                Problem(
                    "ready_age",
                    h.queue,
                    CRITICAL,
                    f"the oldest ready job has waited {age} ms, more than {max_ready_age_ms} ms",
                    age,
                    max_ready_age_ms,
                )
            )
    status = max((p.status for p in problems), key=_RANK.__getitem__, default=OK)
    problems.sort(key=lambda p: (-_RANK[p.status], p.queue, p.check))
    return HealthReport(
        status=status,
        exit_code=EXIT_CODES[status],
        thresholds={"stuck_lease_ms": stuck_lease_ms, "max_dead": max_dead, "max_ready_age_ms": max_ready_age_ms},
        problems=problems,
        queues=readings,
    )


def queue_gauges() -> list[QueueHealth]:
    """Every queue's reading with a stuck-lease threshold of 0 (every expired lease not yet handled).

    Four statements, whatever the number of queues. Used by the Prometheus exporter.
    """
    return _read(None, 0)


def database_setting_error() -> str | None:
    """What is wrong with the ``FQ_DATABASE`` setting, as one line, or ``None`` when it names an alias of ``DATABASES``.

    Django raises ``ConnectionDoesNotExist`` for such a typo only when the
    queues are read; ``fq`` and the exporter view report this line instead.
    """
    alias = conf.database()
    if alias not in settings.DATABASES:
        return f"FQ_DATABASE={alias!r} is not in DATABASES"
    missing = [a for a in routing.aliases() if a not in settings.DATABASES]
    return f"FQ_QUEUE_DATABASES names {missing[0]!r}, which is not in DATABASES" if missing else None


@routing.every_alias(lambda answers: sorted((h for _alias, rows in answers for h in rows), key=lambda h: h.queue))
def _read(queue: str | None, stuck_lease_ms: int) -> list[QueueHealth]:
    conn = db.connection()
    if queue is None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, name FROM {_QUEUE} ORDER BY name")
            names = dict(cur.fetchall())
    else:
        validation.queue_name(queue)
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, name FROM {_QUEUE} WHERE name = %s", [queue])
            names = dict(cur.fetchall())
        if not names:
            raise QueueNotFound(f"no such queue: {queue}", field="queue")
    if not names:
        return []
    only, params = ("", []) if queue is None else (" AND queue_id = %s", [next(iter(names))])
    now = db.now_sql(conn)
    eligible_since = storage.for_connection(conn).greatest_sql("enqueued_at", "run_at")
    stuck: dict[int, tuple[int, int]] = {}
    dead: dict[int, int] = {}
    ready: dict[int, int] = {}
    with conn.cursor() as cur:
        # A lease is valid strictly before its deadline; "expired more than X ms ago": now - deadline > X.
        cur.execute(
            f"SELECT queue_id, COUNT(*), MAX({now} - deadline) FROM {_LEASE} "
            f"WHERE deadline < {now} - %s{only} GROUP BY queue_id",
            [stuck_lease_ms, *params],
        )
        for qid, n, late in cur.fetchall():
            stuck[qid] = (int(n), int(late))
        cur.execute(f"SELECT queue_id, COUNT(*) FROM {_JOB} WHERE state = 'dead'{only} GROUP BY queue_id", params)
        dead = {qid: int(n) for qid, n in cur.fetchall()}
        cur.execute(
            f"SELECT queue_id, {now} - MIN({eligible_since}) FROM {_JOB} "
            f"WHERE state = 'queued' AND run_at <= {now}{only} GROUP BY queue_id",
            params,
        )
        ready = {qid: max(0, int(age)) for qid, age in cur.fetchall()}
    out = []
    for qid, name in sorted(names.items(), key=lambda item: item[1]):
        n, late = stuck.get(qid, (0, 0))
        out.append(
            QueueHealth(
                queue=name, stuck_leases=n, stuck_for_ms=late, dead=dead.get(qid, 0), oldest_ready_age_ms=ready.get(qid)
            )
        )
    return out
