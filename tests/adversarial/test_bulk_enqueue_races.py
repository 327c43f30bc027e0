"""Concurrent enqueue_many with shared unique keys and tokens (PostgreSQL: SQLite runs writers one at a time).

docs/reference/semantics.md §4 / §9: a token returns its ORIGINAL job id for its whole retention;
unique keys coalesce onto the active job; bulk enqueue sorts keys/tokens before
inserting so concurrent bulk enqueues cannot deadlock.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq.models import IdempotencyToken, Job

from .helpers import Background, wait_for_lock_waiter

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]


def test_token_of_an_item_that_follows_a_unique_key_loser_points_at_the_real_job():
    """Item 0 holds unique_key K; item 1 carries token T and the same K, so it follows item 0.

    A concurrent producer commits an active job with K while the batch waits on it,
    so item 0 is not inserted and both items coalesce onto that producer's job
    (which the batch reports correctly). The token T must map to that job too.
    Today T keeps the id minted for item 0 — a job that never existed — so every
    later enqueue with T answers a phantom id for the whole retention.
    """
    q = "adv.bulk.phantom"
    fq.configure(q)
    holding, release = threading.Event(), threading.Event()

    def other_producer():
        with transaction.atomic():
            result = fq.enqueue(q, "other", unique_key="K")
            holding.set()
            assert release.wait(10)
        return result

    other = Background(other_producer, "adv-other").start()
    assert holding.wait(10)
    batch = Background(
        lambda: fq.enqueue_many(q, [{"payload": 1, "unique_key": "K"}, {"payload": 2, "unique_key": "K", "idempotency": "T"}]),
        "adv-batch",
    ).start()
    wait_for_lock_waiter(thread=batch)  # the batch's insert waits on the other producer's key
    release.set()
    other.join()
    batch.join()
    assert other.error is None and batch.error is None, (other.error, batch.error)

    winner = other.value.id
    assert [r.id for r in batch.value] == [winner, winner]
    assert not any(r.created for r in batch.value)
    # The token must name a job that exists: the one the batch reported for its item.
    assert IdempotencyToken.objects.get(token="T").job_uid == winner
    again = fq.enqueue(q, "again", idempotency="T")
    assert (again.id, again.created) == (winner, False)
    assert fq.get(q, again.id).payload == "other"
    assert Job.objects.count() == 1


#: Per vendor: (statements that create the triggers, statements that drop them). Updates sleep too: a
#: store may write a job's key after inserting its row (MysqlStore does, to take the keys in order).
SLOW_INSERT_TRIGGER = {
    "postgresql": (
        [
            "CREATE OR REPLACE FUNCTION fq_adv_slow_insert() RETURNS trigger AS $$ BEGIN "
            "IF NEW.unique_key LIKE 'slow-%%' THEN PERFORM pg_sleep(0.2); END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER fq_adv_slow_insert BEFORE INSERT OR UPDATE ON django_fq_job "
            "FOR EACH ROW EXECUTE FUNCTION fq_adv_slow_insert()",
        ],
        ["DROP TRIGGER IF EXISTS fq_adv_slow_insert ON django_fq_job", "DROP FUNCTION IF EXISTS fq_adv_slow_insert()"],
    ),
    "mysql": (
        [
            f"CREATE TRIGGER fq_adv_slow_{verb.lower()} BEFORE {verb} ON django_fq_job FOR EACH ROW BEGIN "
            "IF NEW.unique_key LIKE 'slow-%' THEN DO SLEEP(0.2); END IF; END"
            for verb in ("INSERT", "UPDATE")
        ],
        ["DROP TRIGGER IF EXISTS fq_adv_slow_insert", "DROP TRIGGER IF EXISTS fq_adv_slow_update"],
    ),
}


@pytest.fixture
def slow_inserts(vendor):
    """Triggers that sleep 200 ms before writing each job whose unique_key starts with 'slow-'.

    They widen the window inside one multi-row write so two batches interleave row by row.
    """
    create, drop = SLOW_INSERT_TRIGGER[vendor]
    with connection.cursor() as cur:
        for sql in create:
            cur.execute(sql)
    yield
    with connection.cursor() as cur:
        for sql in drop:
            cur.execute(sql)


def test_bulk_enqueues_with_unique_keys_in_opposite_orders_do_not_deadlock(slow_inserts):
    """Two producers, each in its own transaction, enqueue keys [a, b] and [b, a] at the same moment.

    Sorted inserts would make the second wait for the first. Today the jobs are
    inserted in input order: each producer takes one key, then waits for the other's
    (PostgreSQL: "deadlock detected"; inside the caller's transaction it propagates).
    """
    q = "adv.bulk.order"
    fq.configure(q)
    barrier = threading.Barrier(2)

    def producer(keys):
        def run():
            barrier.wait(10)
            with transaction.atomic():
                return fq.enqueue_many(q, [{"payload": k, "unique_key": k} for k in keys])

        return run

    one = Background(producer(["slow-a", "slow-b"]), "adv-ab").start()
    two = Background(producer(["slow-b", "slow-a"]), "adv-ba").start()
    one.join()
    two.join()
    assert one.error is None and two.error is None, (repr(one.error), repr(two.error))
    assert Job.objects.count() == 2
    created = [r for r in one.value + two.value if r.created]
    assert len(created) == 2
