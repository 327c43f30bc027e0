"""Rows of the worker registry written as a worker writes them (the store's own upsert), for the face tests.

A row is made *gone* by moving its heartbeat back by more than
``STALE_BEATS`` intervals on the database clock, so no test sleeps.
"""

from __future__ import annotations

from django.db import connections

from django_fq import __version__, db, storage
from django_fq.services.workers import STALE_BEATS
from django_fq.storage.workers import WORKER_TABLE


def add_worker(worker_id: str, *, queues=("w:q",), host="host-a", pid=4242, concurrency=4, running=1,
               heartbeat_ms=10_000, gone=False, alias="default") -> None:  # fmt: skip
    """Register ``worker_id`` on ``alias`` as a worker would; ``gone``: its heartbeat ``STALE_BEATS + 1`` intervals old."""
    conn = connections[alias]
    store = storage.for_connection(conn)
    row = (worker_id, host, pid, ",".join(queues), concurrency, running, "threads", __version__, heartbeat_ms)
    store.register_worker(conn, now=db.now_sql(conn), row=row, started_ago_ms=60_000)
    if gone:
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {WORKER_TABLE} SET heartbeat_at = heartbeat_at - %s WHERE worker_id = %s",
                [(STALE_BEATS + 1) * heartbeat_ms, worker_id],
            )
