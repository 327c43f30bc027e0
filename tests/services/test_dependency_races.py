"""Dependencies under concurrency, with real threads on the real database (docs/reference/semantics.md §9 "Dependencies").

The release happens in the transaction of the ack that finishes a job's last
dependency: two such acks at the same moment release the dependent exactly
once, and an enqueue that depends on a job being acked meanwhile never leaves
its job waiting for an ack that has already happened.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq.models import Job
from tests.adversarial.helpers import Background, wait_for_lock_waiter
from tests.listening import listening

from .helpers import QUEUE

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 12


def _at_once(*calls):
    """Run ``calls`` on threads of their own, released together by a barrier; re-raise the first error."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call):
        try:
            barrier.wait(30)
            call()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]


def _hold_while_waiting(first, second):
    """Run ``first`` in a transaction on a thread, and hold it open until ``second`` (another thread) waits on a lock.

    Then let ``first`` commit, wait for ``second`` and return both values.
    """
    go, inside = threading.Event(), threading.Event()

    def first_and_hold():
        with transaction.atomic():
            value = first()
            inside.set()
            assert go.wait(30)
        return value

    holder = Background(first_and_hold).start()
    assert inside.wait(30)
    waiter = Background(second).start()
    wait_for_lock_waiter(thread=waiter)
    go.set()
    holder.join()
    waiter.join()
    assert holder.error is None and waiter.error is None, (holder.error, waiter.error)
    return holder.value, waiter.value


@pytest.mark.parametrize("verb", ["ack", "ack_many"])
def test_the_last_two_dependencies_acked_at_once_release_the_dependent_once(verb):
    fq.configure(QUEUE)
    for _ in range(ROUNDS):
        a = fq.enqueue(QUEUE, "a").id
        b = fq.enqueue(QUEUE, "b").id
        d = fq.enqueue(QUEUE, "d", depends_on=[a, b]).id
        first, second = fq.claim(QUEUE, count=2)
        if verb == "ack":
            calls = [lambda j=j: fq.ack(QUEUE, j.receipt) for j in (first, second)]
        else:
            calls = [lambda j=j: fq.ack_many(QUEUE, [(j.receipt, None)]) for j in (first, second)]
        _at_once(*calls)
        row = Job.objects.get(uid=d)
        assert (row.state, row.waiting_on) == ("queued", 0)
        (job,) = fq.claim(QUEUE, count=5)
        assert job.id == d
        fq.ack(QUEUE, job.receipt)
    assert fq.stats(QUEUE).counts["waiting"] == 0


def test_enqueue_racing_the_ack_of_its_dependency_never_leaves_it_waiting():
    fq.configure(QUEUE)
    for _ in range(ROUNDS):
        a = fq.enqueue(QUEUE, "a").id
        (job,) = fq.claim(QUEUE)
        made: dict[str, str] = {}
        _at_once(
            lambda job=job: fq.ack(QUEUE, job.receipt),
            lambda made=made, a=a: made.setdefault("d", fq.enqueue(QUEUE, "d", depends_on=[a]).id),
        )
        assert fq.get(QUEUE, made["d"]).state == "ready"
        (dep,) = fq.claim(QUEUE)
        fq.ack(QUEUE, dep.receipt)


@pytest.mark.row_locks
def test_an_ack_waits_for_an_enqueue_that_depends_on_its_job():
    """The enqueue commits its edge while the ack waits on the job row: the ack must release it."""
    fq.configure(QUEUE)
    a = fq.enqueue(QUEUE, "a").id
    (job,) = fq.claim(QUEUE)
    made = _hold_while_waiting(
        lambda: fq.enqueue(QUEUE, "d", depends_on=[a]).id, lambda: fq.ack(QUEUE, job.receipt)
    )
    assert fq.get(QUEUE, made[0]).state == "ready"


@pytest.mark.row_locks
def test_an_enqueue_waits_for_the_ack_of_its_dependency():
    """The ack commits while the enqueue waits on the job row: the enqueue sees it succeeded."""
    fq.configure(QUEUE)
    a = fq.enqueue(QUEUE, "a").id
    (job,) = fq.claim(QUEUE)
    _, made = _hold_while_waiting(
        lambda: fq.ack(QUEUE, job.receipt), lambda: fq.enqueue(QUEUE, "d", depends_on=[a]).id
    )
    assert fq.get(QUEUE, made).state == "ready"


@pytest.mark.postgres_only
def test_the_release_wakes_the_dependents_queue_at_commit():
    other = "tests:svc-woken"
    fq.configure(QUEUE)
    a = fq.enqueue(QUEUE, "a").id
    fq.enqueue(other, "b", depends_on=[a])
    (job,) = fq.claim(QUEUE)
    with listening() as listener:
        fq.ack(QUEUE, job.receipt)
        got = next(listener.notifies(timeout=5), None)
    assert got is not None and got.payload == other
