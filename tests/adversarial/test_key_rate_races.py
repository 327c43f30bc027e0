"""Attacks on the per-key limits (docs/reference/semantics.md §9 "Per-key limits"): racing claimers of a
per-key rate limit, two configures racing, and a configure racing the admission of a held job."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from django.db import connection, connections, transaction

from django_fq import db as fqdb
from django_fq import services as fq
from django_fq.models import Job, Queue
from django_fq.services import keys as slots
from tests.services.helpers import check_key_counts, most_in_a_window
from tests.threads import elsewhere

from .helpers import Background, wait_for_lock_waiter

Q = "atk-key-rate"


@pytest.mark.django_db(transaction=True)
def test_racing_claimers_never_pass_a_keys_rate_in_any_window():
    """Four threads, each its own connection, claim batches of assorted sizes from six rate-limited keys
    (and unkeyed jobs) while another lowers and raises the limit: no key has more claims in any window
    of the database's instants than the highest limit in force, and every key keeps flowing."""
    fq.configure(Q, key_rate_limit=3, rate_window_ms=150)
    keys = [f"k{n}" for n in range(6)]
    fq.enqueue_many(Q, [{"payload": i, "concurrency_key": keys[i % 6]} for i in range(360)])
    fq.enqueue_many(Q, [{"payload": i} for i in range(40)])
    stop = threading.Event()
    errors: list[BaseException] = []
    claimed = [0]
    lock = threading.Lock()

    def claimer(count: int):
        try:
            while not stop.is_set():
                got = fq.claim(Q, count=count, visibility_ms=600_000, wait_ms=200)
                for j in got:
                    fq.ack(Q, j.receipt)
                with lock:
                    claimed[0] += len(got)
                    if claimed[0] >= 200:
                        stop.set()
        except BaseException as exc:
            errors.append(exc)
            stop.set()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in (1, 2, 5, 9)]
    for t in threads:
        t.start()
    try:
        for limit in (2, 3, 1, 3):
            if stop.is_set():
                break
            elsewhere(lambda limit=limit: fq.configure(Q, key_rate_limit=limit))
            stop.wait(0.3)  # let the claimers run a few windows under this limit
        assert stop.wait(120), "the claimers did not get through 200 jobs"
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    qid = Queue.objects.get(name=Q).id
    instants: dict[str, list[int]] = defaultdict(list)
    for key, at in Job.objects.filter(queue_id=qid, claimed_at__isnull=False).values_list(
        "concurrency_key", "claimed_at"
    ):
        instants[key].append(at)
    assert set(keys) <= set(instants)
    for key in keys:
        assert most_in_a_window(instants[key], 150) <= 3, key


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_two_configures_racing_lose_no_recount():
    """A raises key_concurrency 1 → 2 and holds its transaction open; B sets it back to 1. B must read 2
    (under the row's update lock, after A's commit) and recount: else it sees its 1 as no change and
    the key keeps two admitted jobs under a limit of 1."""
    fq.configure(Q, key_concurrency=1)
    fq.enqueue_many(Q, [{"payload": i, "concurrency_key": "k"} for i in range(3)])
    raised, go = threading.Event(), threading.Event()

    def a():
        with transaction.atomic():
            fq.configure(Q, key_concurrency=2)
            raised.set()
            assert go.wait(30)

    first = Background(a).start()
    assert raised.wait(30)
    second = Background(lambda: fq.configure(Q, key_concurrency=1)).start()
    wait_for_lock_waiter(1, thread=second)
    go.set()
    first.join()
    second.join()
    assert first.error is None and second.error is None, (first.error, second.error)
    assert fq.policy(Q).key_concurrency == 1
    assert len(fq.claim(Q, count=10)) == 1
    check_key_counts(Q)


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_a_configure_racing_the_admission_of_a_held_job_counts_it():
    """A wake admits a held job (held → queued under its key's lock) and holds its transaction open;
    configure() recounts the keys meanwhile. Its census must lock held jobs too, so it waits for the
    wake and counts the job as admitted: else the key's row says 0 while the job is queued."""
    fq.configure(Q, key_concurrency=1)
    job = fq.enqueue(Q, "later", concurrency_key="k", delay_ms=200).id
    run_at = Job.objects.get(uid=job).run_at
    assert Job.objects.get(uid=job).state == "held"
    due = threading.Event()
    while not due.wait(0.02):  # until the database clock passes the job's run_at
        if fqdb.db_now_ms() >= run_at:
            due.set()
    qid = Queue.objects.get(name=Q).id
    admitted, go = threading.Event(), threading.Event()

    def wake():
        with transaction.atomic():
            slots.admit(connection, queue_id=qid, queue=None, keys=["k"], create=False)
            admitted.set()
            assert go.wait(30)

    first = Background(wake).start()
    assert admitted.wait(30)
    second = Background(lambda: fq.configure(Q, key_concurrency=2)).start()
    wait_for_lock_waiter(1, thread=second)
    go.set()
    first.join()
    second.join()
    assert first.error is None and second.error is None, (first.error, second.error)
    assert Job.objects.get(uid=job).state == "queued"
    check_key_counts(Q)


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_a_configure_waiting_for_a_claims_jobs_never_blocks_that_claims_lease(request):
    """A claim holds its job's row lock while a configure of the queue's key limit, holding the queue
    row, waits for it; the claim then inserts its lease, which must not wait for that queue row
    (docs/explanation/storage.md "Per-key limits": the lease's queue column has no constraint whose
    check would lock it). With the constraint the two waited for each other: a deadlock, and one of
    them failed (this test fails so on MariaDB; on PostgreSQL the deadlock needs a claim statement
    caught between its job lock and its lease insert, seen in the server log of the racing test above). Here the claim's transaction takes the job's lock first (as the claim statement does
    before it inserts the lease), the configure starts waiting, then the claim runs: it goes on and
    commits, and the configure finishes after it."""
    if connection.vendor == "mysql":
        # Known, open: without the constraint MariaDB still deadlocks here, on another lock of the
        # claim (not yet found); configure retries it, and under steady claims can fail.
        request.applymarker(
            pytest.mark.xfail(reason="MariaDB: a claim and a key-limit configure still deadlock", strict=True)
        )
    fq.configure(Q, key_rate_limit=5, rate_window_ms=60_000)
    fq.enqueue_many(Q, [{"payload": i, "concurrency_key": f"k{i % 2}"} for i in range(4)])
    with transaction.atomic():
        # The job row alone (a join would lock the queue row too), as the claim statement locks it.
        queue_id = Queue.objects.get(name=Q).id
        held = Job.objects.select_for_update().filter(queue_id=queue_id, state="queued").order_by("seq").first()
        assert held is not None
        configure = Background(lambda: fq.configure(Q, key_rate_limit=4), name="configure").start()
        wait_for_lock_waiter(1, thread=configure)  # the configure holds the queue row, waits for the job
        assert configure.thread.is_alive(), configure.error
        got = fq.claim(Q, count=1, visibility_ms=60_000)
        assert [j.id for j in got] == [held.uid]
    configure.join()
    assert configure.error is None, configure.error
    assert fq.policy(Q).key_rate_limit == 4
    assert Job.objects.filter(queue__name=Q, state="running").count() == 1
