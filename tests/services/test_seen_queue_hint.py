"""The ``_seen_queues`` hint of the plain PostgreSQL enqueue: a queue this process saw may
have been rolled back, deleted (here or by another connection) or deleted while the enqueue runs.
Whatever happens, a job is in a live queue or nowhere, and the counters match the rows.

The hint exists where the store has the one-statement enqueue
(``supports_one_statement_enqueue``); the outcomes must hold on every database
where enqueues and deletions really race (row locks), through the general path there."""

from __future__ import annotations

import importlib
import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_fq import services as fq
from django_fq import storage
from django_fq.exceptions import FqError
from django_fq.services._base import COUNTER, JOB, LEASE, QUEUE

enqueue_module = importlib.import_module("django_fq.services.enqueue")

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]


def in_thread(fn):
    """Run ``fn`` on another thread (another database connection); return its result or raise its error."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def orphans() -> dict[str, int]:
    with connection.cursor() as cur:
        found = {}
        for table in (JOB, LEASE, COUNTER):
            cur.execute(
                f"SELECT count(*) FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM {QUEUE} q WHERE q.id = t.queue_id)"
            )
            found[table] = cur.fetchone()[0]
        return found


def rows_and_counter(queue: str) -> tuple[int, int]:
    """(job rows of ``queue``, the sum of its ``active`` counter shards)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT (SELECT count(*) FROM {JOB} j JOIN {QUEUE} q ON q.id = j.queue_id WHERE q.name = %s),"
            f" (SELECT COALESCE(SUM(c.active), 0) FROM {COUNTER} c JOIN {QUEUE} q ON q.id = c.queue_id"
            "  WHERE q.name = %s)",
            [queue, queue],
        )
        return tuple(cur.fetchone())


def test_a_queue_created_by_a_rolled_back_enqueue_is_created_again_by_the_next():
    q = "rv.seen.rollback"

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        fq.enqueue(q, {"lost": True})
        if storage.for_connection(connection).supports_one_statement_enqueue:
            assert (connection.alias, q) in enqueue_module._seen_queues
        raise Boom
    assert q not in {x.name for x in fq.queues()}
    job = fq.enqueue(q, {"kept": True}).id
    assert fq.get(q, job).payload == {"kept": True}
    assert fq.stats(q).counts["ready"] == 1 and rows_and_counter(q) == (1, 1)
    assert orphans() == dict.fromkeys(orphans(), 0)


@pytest.mark.parametrize("commit", [True, False])
def test_enqueue_in_a_transaction_into_a_queue_another_connection_deleted(commit):
    q = "rv.seen.deleted"
    fq.enqueue_many(q, [{"payload": 0}])  # seen by this process
    in_thread(lambda: fq.delete_queue(q))
    try:
        with transaction.atomic():
            job = fq.enqueue_many(q, [{"payload": i} for i in range(3)])
            if not commit:
                raise RuntimeError("roll back")
    except RuntimeError:
        pass
    if commit:
        assert [fq.get(q, r.id).state for r in job] == ["ready"] * 3
        assert rows_and_counter(q) == (3, 3)
    else:
        assert q not in {x.name for x in fq.queues()}
    assert orphans() == dict.fromkeys(orphans(), 0)


@pytest.mark.parametrize("caller_transaction", [False, True])
def test_enqueues_racing_delete_queue_leave_no_orphans_and_counters_match_rows(caller_transaction):
    """One thread enqueues small plain batches into a queue it has seen, another deletes the queue
    again and again. Each enqueue either fails cleanly or leaves its rows in a live queue; after the
    race no job, lease or counter points to a deleted queue, and the counters equal the rows."""
    q = "rv.seen.race"
    fq.enqueue(q, {})
    stop = threading.Event()
    errors: list[BaseException] = []
    made: list[str] = []
    deletes = {"n": 0}

    def enqueuer():
        try:
            give_up = time.monotonic() + 2.0
            while time.monotonic() < give_up:
                try:
                    if caller_transaction:
                        with transaction.atomic():
                            res = fq.enqueue_many(q, [{"payload": i} for i in range(5)])
                    else:
                        res = fq.enqueue_many(q, [{"payload": i} for i in range(5)])
                    made.extend(r.id for r in res)
                except FqError:
                    pass  # a clean refusal (e.g. created and deleted concurrently) is acceptable
                except BaseException as exc:
                    errors.append(exc)
                    return
        finally:
            stop.set()
            connections.close_all()

    def deleter():
        try:
            while not stop.is_set():
                try:
                    fq.delete_queue(q)
                    deletes["n"] += 1
                except FqError:
                    pass
                except BaseException as exc:
                    errors.append(exc)
                    return
                time.sleep(0.002)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueuer), threading.Thread(target=deleter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [], errors
    assert deletes["n"] > 5 and len(made) > 25, (deletes, len(made))
    assert orphans() == dict.fromkeys(orphans(), 0)
    rows, active = rows_and_counter(q)
    assert rows == active, (rows, active)
    # Every job the last generation of the queue holds was reported as enqueued.
    if rows:
        assert {j.id for j in fq.jobs(q, count=1000).jobs} <= set(made)
