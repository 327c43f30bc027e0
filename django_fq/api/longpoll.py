"""Waiting over HTTP without holding a database connection per waiting request.

A long-poll ``claim`` (``wait_ms`` up to 20 s) and ``wait`` for a job keep a
web worker's thread busy while they wait. What they must not keep is a
database connection (docs/reference/semantics.md §9, REST specifics): on a database server the request's
connection is closed (or handed back to Django's connection pool) before
every pause and opened again for the next look, and the pause itself waits on
the process-wide LISTEN connection of :mod:`django_fq.wakeup`, so a hundred
waiting requests cost one listening connection.

Between looks a waiting claim sleeps until a notification for its queue
(an enqueue, release or retry committed by any process) or, at the latest,
``FQ_API_LONG_POLL_RECHECK_MS`` (default 1 s): jobs whose delay runs out and
leases freed under a concurrency limit send no notification. On MariaDB/MySQL
there is nothing to listen to: the connection is still given back before each
pause, and the claim looks again every 200 ms. On SQLite a connection is a
file handle: the claim keeps it and looks again every 100 ms, as
:func:`django_fq.services.claim` does. On every backend an enqueue committed
by the same process ends the pause at once (:mod:`django_fq.wakeup`).

A request inside ``transaction.atomic`` (not the API's own views, which opt
out of ``ATOMIC_REQUESTS``) keeps its connection: closing it would end the
caller's transaction.
"""

from __future__ import annotations

import time

from .. import db, routing, services, storage, validation, wakeup
from ..exceptions import WaitTimeout
from ..types import ClaimedJobs, JobInfo
from . import conf

#: Pause between looks where no notification from another process can end it early (SQLite).
POLL_S = 0.1
#: The same on a database server without LISTEN (MariaDB/MySQL; PostgreSQL before LISTEN is up), where
#: the connection is given back before each pause and opened again for the next look.
POLL_SERVER_S = 0.2
#: ``wait`` keeps its connection through pauses shorter than this (reconnecting would cost more).
RELEASE_FROM_S = 0.25
#: Final job states: ``wait`` returns once a job is in one of them.
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled"})


def release_connection() -> bool:
    """Close django-fq's connection of this thread if that is safe and worth it; True if closed.

    Only connections to a server are released (PostgreSQL: a server process
    and maybe a pooler slot each; see ``Store.release_connection``); never
    inside an atomic block.
    """
    conn = db.connection()
    return storage.for_connection(conn).release_connection(conn)


@routing.by_queue
def claim(queue: str, *, count: int, visibility_ms: int | None, wait_ms: int, worker: str) -> ClaimedJobs:
    """:func:`django_fq.services.claim` with a long poll that holds no connection while it waits.

    A claim stopped by the queue's rate limit sleeps until the next slot frees
    (``rate_wait_ms``) or the wait ends, rather than looking again on each wakeup.
    """
    validation.integer(wait_ms, "wait_ms", 0, validation.MAX_WAIT_MS)
    if not wait_ms:
        return services.claim(queue, count=count, visibility_ms=visibility_ms, wait_ms=0, worker=worker)
    give_up = time.monotonic() + wait_ms / 1000
    listener = wakeup.listener()
    while True:
        mark = listener.mark()
        jobs = services.claim(queue, count=count, visibility_ms=visibility_ms, wait_ms=0, worker=worker)
        remaining = give_up - time.monotonic()
        if jobs or remaining <= 0:
            return jobs
        if jobs.rate_wait_ms:
            # The queue's rate limit: no enqueue frees a slot sooner; sleep without a connection.
            release_connection()
            time.sleep(min(jobs.rate_wait_ms / 1000, remaining))
            continue
        if listener.listening and release_connection():
            pause = conf.long_poll_recheck_s()
        elif release_connection():
            pause = POLL_SERVER_S  # no LISTEN (MariaDB/MySQL): look again soon, holding no server thread meanwhile
        else:
            pause = POLL_S
        listener.wait(mark, {queue}, min(pause, remaining))


@routing.by_queue
def wait(queue: str, job_id: str, *, timeout_ms: int) -> JobInfo:
    """:func:`django_fq.services.wait` for HTTP: at most 20 s, no connection held between looks.

    Looks after 10 ms, then twice as long each time, at most every second;
    the connection is released before pauses of 250 ms and more.
    Raises :class:`~django_fq.exceptions.WaitTimeout` (with the job's
    ``state``) when the job is not final in time.
    """
    validation.integer(timeout_ms, "timeout_ms", 0, validation.MAX_WAIT_MS)
    give_up = time.monotonic() + timeout_ms / 1000
    pause = 0.01
    while True:
        info = services.get(queue, job_id)
        if info.state in FINAL_STATES:
            return info
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(
                f"job {job_id} is still {info.state} after {timeout_ms} ms", field="timeout_ms", state=info.state
            )
        if pause >= RELEASE_FROM_S:
            release_connection()
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, 1.0)
