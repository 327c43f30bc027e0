"""The worker registry's read and prune verbs: which worker processes are live (issue 19; docs/admin.md "Workers").

Workers write their own rows (:mod:`django_fq.worker.presence`): at start, once
per ``FQ_WORKER_HEARTBEAT_MS`` and, on a clean shutdown, a delete. Here they
are read (:func:`workers`) and, long after they went quiet, deleted
(:func:`prune_workers`, called by :func:`~django_fq.services.prune`, so by
every worker's reaper once a minute).

The bounds, both counted on the database clock from the row's last heartbeat:

* *gone*: older than :data:`STALE_BEATS` (3) of the row's own heartbeat
  intervals — two beats may be missed (a busy database, a long GC pause)
  before a live worker is shown as gone;
* *pruned*: gone for :data:`GONE_KEEP_MS` (1 hour) more, so a crashed worker
  stays on the page as gone long enough to be noticed.
"""

from __future__ import annotations

from .. import conf, db, routing, storage, validation
from ..exceptions import InvalidArgument
from ..types import WorkerInfo

#: Missed heartbeat intervals after which a worker is reported ``gone``.
STALE_BEATS = 3
#: How long (ms) a gone worker's row is kept, after it became gone, before the prune deletes it.
GONE_KEEP_MS = 3_600_000
#: The ``state`` values of :func:`workers`.
WORKER_STATES = ("live", "gone")


def _of_every_alias(answers: list[tuple[str, list[WorkerInfo]]]) -> list[WorkerInfo]:
    return sorted((w for _alias, rows in answers for w in rows), key=lambda w: (w.host, w.pid, w.worker_id, w.database))


@routing.every_alias(_of_every_alias)
def _listed(queue: str | None = None) -> list[WorkerInfo]:
    """The rows of the current alias (of ``queue``'s alias when given: only its workers serve it)."""
    conn = db.connection()
    rows = storage.for_connection(conn).list_workers(conn, now=db.now_sql(conn), stale_beats=STALE_BEATS)
    alias = conn.alias
    return [
        WorkerInfo(
            worker_id=r[0],
            host=r[1],
            pid=int(r[2]),
            queues=[q for q in (r[3] or "").split(",") if q],
            concurrency=int(r[4]),
            running=int(r[5]),
            pool=r[6],
            version=r[7],
            started_at=int(r[8]),
            heartbeat_at=int(r[9]),
            heartbeat_ms=int(r[10]),
            state="live" if int(r[11]) else "gone",
            age_ms=max(0, int(r[12])),
            database=alias,
        )
        for r in rows
    ]


def workers(*, state: str | None = None, queue: str | None = None) -> list[WorkerInfo]:
    """The worker processes in the registry, live and gone, by host, pid and worker id.

    Args:
        state: ``"live"`` or ``"gone"`` for those only; ``None``: both. A gone
            worker's heartbeat is older than :data:`STALE_BEATS` of its
            intervals (database clock); its row is deleted by the prune
            :data:`GONE_KEEP_MS` (1 hour) later.
        queue: only the workers serving this queue (a queue name; it need not exist).

    With ``FQ_QUEUE_DATABASES`` the rows of every database alias (a worker
    serving queues on two aliases is listed once per alias, ``database``
    telling which; inside :func:`django_fq.routing.using`: that alias's only).
    One query per alias; no receipt or payload is ever part of a row.

    Raises:
        InvalidArgument: ``state`` is not ``live``/``gone`` (field ``state``), or
            ``queue`` is not a queue name (field ``queue``).
    """
    if state is not None and state not in WORKER_STATES:
        raise InvalidArgument(
            f"state must be one of {', '.join(WORKER_STATES)}, not {str(state)[:50]!r}", field="state"
        )
    if queue is not None:
        validation.queue_name(queue)
    rows = _listed(None) if queue is None else _listed(queue)
    return [w for w in rows if (state is None or w.state == state) and (queue is None or queue in w.queues)]


@routing.every_alias(lambda answers: sum(n for _alias, n in answers))
def prune_workers() -> int:
    """Delete the rows of workers gone for :data:`GONE_KEEP_MS` (1 hour); return how many.

    A gone worker's heartbeat is :data:`STALE_BEATS` intervals old; one hour
    after that, its row goes (database clock). Rows of live workers are
    never touched; a worker whose row was pruned while it could not reach
    the database registers again at its next heartbeat. Part of
    :func:`~django_fq.services.prune`.
    """
    conn = db.connection()
    return storage.for_connection(conn).prune_workers(
        conn, now=db.now_sql(conn), stale_beats=STALE_BEATS, keep_ms=GONE_KEEP_MS
    )


def heartbeat_ms() -> int:
    """The heartbeat interval new workers use (ms; ``FQ_WORKER_HEARTBEAT_MS``, 0: they write no row)."""
    return conf.worker_heartbeat_ms()
