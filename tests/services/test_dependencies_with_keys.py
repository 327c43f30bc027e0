"""Dependencies and per-key limits together, on every database (docs/reference/semantics.md §9 "Dependencies").

A job with ``depends_on`` and a ``concurrency_key`` takes no slot of its key
while it is ``waiting``; the transaction that releases it (the ack of its last
dependency) puts it through its key's admission as a new keyed job: ``held``,
or queued while the key has room. A cascade that cancels a waiting keyed job
gives no slot back, because it had none. The key rows always count exactly
their keys' queued and running jobs.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from django_fq import services as fq
from django_fq.models import ConcurrencyKey, Job, Queue

from .helpers import check_key_counts, claim_one, key_admitted, running_by_key

pytestmark = pytest.mark.django_db

OTHER = "tests:svc-upstream"


def _state(uid: str) -> str:
    return Job.objects.get(uid=uid).state


@pytest.fixture
def keyed_waiting(q):
    """A queue with one slot per key, a plain job and a job of key ``k`` waiting for it: ``(up, dep)`` ids."""
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    return up, fq.enqueue(q, "dependent", concurrency_key="k", depends_on=[up]).id


def test_a_waiting_keyed_job_takes_no_slot(q):
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    waiting = fq.enqueue(q, "dependent", concurrency_key="k", depends_on=[up]).id
    assert _state(waiting) == "waiting" and fq.get(q, waiting).state == "waiting"
    assert Job.objects.get(uid=waiting).concurrency_key == "k"
    later = fq.enqueue(q, "later", concurrency_key="k").id
    assert _state(later) == "queued"  # the key's one slot is free: the waiting job has none
    assert key_admitted(q, "k") == 1
    check_key_counts(q)


def test_a_released_keyed_job_is_admitted_when_its_key_has_room(q, keyed_waiting):
    up, dep = keyed_waiting
    upstream = claim_one(q)
    assert upstream.id == up
    fq.ack(q, upstream.receipt)
    assert _state(dep) == "queued"
    assert key_admitted(q, "k") == 1
    assert claim_one(q).id == dep
    check_key_counts(q)


def test_a_released_keyed_job_is_held_while_its_key_is_full(q, keyed_waiting):
    up, dep = keyed_waiting
    fq.enqueue(q, "busy", concurrency_key="k", priority=1)  # claimed first: it takes the key's slot
    busy = claim_one(q)
    upstream = claim_one(q)
    assert upstream.id == up
    fq.ack(q, upstream.receipt)
    assert _state(dep) == "held"
    assert fq.get(q, dep).state == "ready"  # held reports as ready, as for any keyed job
    assert fq.claim(q) == []  # its key is full
    check_key_counts(q)
    fq.ack(q, busy.receipt)  # the slot goes to the released job
    assert _state(dep) == "queued"
    assert claim_one(q).id == dep
    check_key_counts(q)


def test_a_dependent_of_the_same_key_keeps_its_place_in_claim_order(q):
    """The ack that releases it also frees its key's slot: the released (older) job is admitted first."""
    fq.configure(q, key_concurrency=1)
    first = fq.enqueue(q, "first", concurrency_key="k").id
    dep = fq.enqueue(q, "dependent", concurrency_key="k", depends_on=[first]).id
    later = fq.enqueue(q, "later", concurrency_key="k").id
    assert _state(later) == "held"
    running = claim_one(q)
    assert running.id == first
    fq.ack(q, running.receipt)
    assert _state(dep) == "queued" and _state(later) == "held"
    assert claim_one(q).id == dep
    check_key_counts(q)


def test_a_released_job_whose_run_at_is_ahead_is_held_until_due(q, frozen):
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    dep = fq.enqueue(q, "dependent", concurrency_key="k", depends_on=[up], delay_ms=5000).id
    fq.ack(q, claim_one(q).receipt)
    assert _state(dep) == "held" and fq.get(q, dep).state == "scheduled"
    assert key_admitted(q, "k") == 0
    frozen.advance(5000)
    fq.reap()  # the key's wake_at has come: admitted
    assert _state(dep) == "queued"
    assert claim_one(q).id == dep
    check_key_counts(q)


def test_a_dependent_in_another_queue_is_admitted_by_its_own_queues_limit(q):
    fq.configure(q, key_concurrency=2)
    fq.configure(OTHER)
    ups = [fq.enqueue(OTHER, n).id for n in range(3)]
    deps = [fq.enqueue(q, n, concurrency_key="k", depends_on=[u]).id for n, u in enumerate(ups)]
    fq.ack_many(OTHER, [(j.receipt, None) for j in fq.claim(OTHER, count=3)])
    assert sorted(_state(d) for d in deps) == ["held", "queued", "queued"]
    assert [_state(d) for d in deps[:2]] == ["queued", "queued"]  # in claim order
    assert key_admitted(q, "k") == 2
    check_key_counts(q)


def test_a_queue_without_a_limit_releases_keyed_jobs_as_queued(q):
    up = fq.enqueue(q, "up").id
    deps = [fq.enqueue(q, n, concurrency_key="k", depends_on=[up]).id for n in range(3)]
    fq.ack(q, claim_one(q).receipt)
    assert [_state(d) for d in deps] == ["queued"] * 3
    assert not ConcurrencyKey.objects.filter(queue__name=q).exists()
    assert len(fq.claim(q, count=5)) == 3


def test_a_cascaded_cancel_of_a_waiting_keyed_job_changes_no_slot(q, keyed_waiting):
    _, dep = keyed_waiting
    fq.enqueue(q, "busy", concurrency_key="k", priority=1)  # claimed first: it takes the key's slot
    busy = claim_one(q)
    nxt = fq.enqueue(q, "after", concurrency_key="k", depends_on=[dep]).id
    fq.nack(q, claim_one(q).receipt, permanent=True)  # up dead: cancel cascades to dep, then nxt
    assert _state(dep) == "cancelled" and _state(nxt) == "cancelled"
    assert key_admitted(q, "k") == 1  # still the running one's
    check_key_counts(q)
    fq.ack(q, busy.receipt)
    assert key_admitted(q, "k") == 0
    check_key_counts(q)


def test_cancel_of_a_waiting_keyed_job_changes_no_slot(q, keyed_waiting):
    _, dep = keyed_waiting
    other = fq.enqueue(q, "other", concurrency_key="k").id
    fq.cancel(q, dep)
    assert key_admitted(q, "k") == 1 and _state(other) == "queued"
    check_key_counts(q)


def test_a_keyed_job_enqueued_after_its_dependency_succeeded_is_admitted_at_once(q):
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    fq.ack(q, claim_one(q).receipt)
    first = fq.enqueue(q, "first", concurrency_key="k", depends_on=[up]).id
    second = fq.enqueue(q, "second", concurrency_key="k", depends_on=[up]).id
    assert (_state(first), _state(second)) == ("queued", "held")
    check_key_counts(q)


def test_a_keyed_job_whose_dependency_is_dead_is_created_cancelled_without_a_slot(q):
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    fq.nack(q, claim_one(q).receipt, permanent=True)
    dep = fq.enqueue(q, "dependent", concurrency_key="k", depends_on=[up]).id
    assert _state(dep) == "cancelled"
    assert key_admitted(q, "k") == 0
    check_key_counts(q)


def test_setting_a_limit_leaves_waiting_keyed_jobs_waiting(q):
    up = fq.enqueue(q, "up").id
    deps = [fq.enqueue(q, n, concurrency_key="k", depends_on=[up]).id for n in range(3)]
    fq.configure(q, key_concurrency=2)
    assert [_state(d) for d in deps] == ["waiting"] * 3
    check_key_counts(q)
    fq.ack(q, claim_one(q).receipt)
    assert [_state(d) for d in deps] == ["queued", "queued", "held"]
    check_key_counts(q)


def test_retry_of_a_dead_dependency_releases_a_wait_dependent_into_its_key(q):
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    dep = fq.enqueue(q, "dependent", concurrency_key="k", depends_on=[{"id": up, "on_failure": "wait"}]).id
    fq.nack(q, claim_one(q).receipt, permanent=True)
    assert _state(dep) == "waiting"
    fq.retry(q, up)
    fq.ack(q, claim_one(q).receipt)
    assert _state(dep) == "queued"
    assert claim_one(q).id == dep
    check_key_counts(q)


def test_a_waiting_keyed_job_holds_its_unique_key(q):
    fq.configure(q, key_concurrency=1)
    up = fq.enqueue(q, "up").id
    dep = fq.enqueue(q, "dependent", concurrency_key="k", unique_key="u", depends_on=[up])
    again = fq.enqueue(q, "again", concurrency_key="k", unique_key="u")
    assert again.id == dep.id and not again.created


def test_a_workflow_fan_out_of_one_key_runs_one_step_at_a_time(q):
    from django_fq.workflows import Workflow

    fq.configure(q, key_concurrency=1)
    wf = Workflow()
    root = wf.step(q, "root", name="root")
    for i in range(3):
        wf.step(q, i, name=f"part-{i}", after=[root], concurrency_key="k")
    ids = wf.enqueue()
    parts = [ids[f"part-{i}"] for i in range(3)]
    assert [_state(p) for p in parts] == ["waiting"] * 3
    assert not ConcurrencyKey.objects.filter(queue__name=q, admitted__gt=0).exists()
    fq.ack(q, claim_one(q).receipt)
    for i in range(3):
        assert [_state(p) for p in parts] == ["succeeded"] * i + ["queued"] + ["held"] * (2 - i)
        check_key_counts(q)
        job = claim_one(q, count=5)
        assert job.id == parts[i]
        fq.ack(q, job.receipt)


def _export(queues=None) -> list[str]:
    import io

    from django_fq import backup

    out = io.StringIO()
    backup.export_jsonl(out, queues)
    return out.getvalue().splitlines()


def test_export_import_keeps_waiting_keyed_jobs_waiting_without_a_slot(q):
    from django_fq import backup

    fq.configure(q, key_concurrency=1)
    fq.configure(OTHER)
    up = fq.enqueue(OTHER, "up").id
    deps = [fq.enqueue(q, n, concurrency_key="k", depends_on=[up]).id for n in range(2)]
    ready = fq.enqueue(q, "ready", concurrency_key="k").id
    lines = _export()
    fq.delete_queue(q)
    fq.delete_queue(OTHER)
    assert backup.import_jsonl(lines).jobs_created == 4
    assert [_state(d) for d in deps] == ["waiting", "waiting"] and _state(ready) == "queued"
    check_key_counts(q)
    fq.ack(OTHER, claim_one(OTHER).receipt)
    assert [_state(d) for d in deps] == ["held", "held"]  # the key's slot is the ready job's
    fq.ack(q, claim_one(q).receipt)
    assert [_state(d) for d in deps] == ["queued", "held"]
    check_key_counts(q)


def test_an_import_admits_the_keyed_jobs_it_releases_up_to_the_limit(q):
    """Their dependency succeeded in the importing database after the export: ready at import, in claim order."""
    from django_fq import backup

    fq.configure(q, key_concurrency=1)
    fq.configure(OTHER)
    up = fq.enqueue(OTHER, "up").id
    deps = [fq.enqueue(q, n, concurrency_key="k", depends_on=[up]).id for n in range(3)]
    lines = _export([q])
    fq.delete_queue(q)
    fq.ack(OTHER, claim_one(OTHER).receipt)
    assert backup.import_jsonl(lines).jobs_created == 3
    assert [_state(d) for d in deps] == ["queued", "held", "held"]
    check_key_counts(q)
    assert claim_one(q).id == deps[0]


@pytest.mark.parametrize("state", ["waiting", "queued", "running", "held"])
def test_the_schema_holds_a_unique_key_in_every_active_state(q, state):
    """The active-unique-key constraint (MariaDB: its generated column) names the four active states."""
    from django.db import IntegrityError, transaction

    qid = Queue.objects.get(name=q).id
    fields = {"queue_id": qid, "run_at": 1, "enqueued_at": 1, "changed_at": 1, "max_attempts": 3, "payload": "{}",
              "payload_size": 2, "unique_key": "u"}  # fmt: skip
    Job.objects.create(uid="a" * 32, state=state, **fields)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(uid="b" * 32, state="queued", **fields)
    Job.objects.create(uid="c" * 32, state="succeeded", **fields)  # a finished job holds no key


# --- threads -------------------------------------------------------------------------------------


def _threads(n: int, target) -> list:
    start = threading.Barrier(n, timeout=60)
    errors: list = []

    def run():
        try:
            start.wait()
            target()
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads)
    return errors


@pytest.mark.django_db(transaction=True)
def test_two_last_dependencies_acked_at_once_admit_their_keyed_dependent_once():
    queue = "tests:keys-deps-race"
    fq.configure(queue, key_concurrency=1)
    fq.configure(OTHER)
    receipts: list[str] = []
    lock = threading.Lock()

    def ack_one():
        with lock:
            receipt = receipts.pop()
        fq.ack(OTHER, receipt)

    for _ in range(8):
        a, b = fq.enqueue(OTHER, "a").id, fq.enqueue(OTHER, "b").id
        dep = fq.enqueue(queue, "dep", concurrency_key="k", depends_on=[a, b]).id
        got = fq.claim(OTHER, count=2)
        assert {j.id for j in got} == {a, b}
        receipts[:] = [j.receipt for j in got]
        assert _threads(2, ack_one) == []
        assert _state(dep) == "queued"
        assert key_admitted(queue, "k") == 1
        fq.ack(queue, claim_one(queue).receipt)
        check_key_counts(queue)


@pytest.mark.django_db(transaction=True)
def test_threads_releasing_and_running_keyed_dependents_never_pass_the_limit():
    """Four threads claim and ack upstream jobs (which release keyed dependents) and the dependents at once.

    At no claim does a key have more running jobs than its limit; every job
    runs once; the key rows end counting nothing.
    """
    queue = "tests:keys-deps-threads"
    fq.configure(queue, key_concurrency=2)
    fq.configure(OTHER)
    ups = [r.id for r in fq.enqueue_many(OTHER, [{"payload": n} for n in range(30)])]
    deps = fq.enqueue_many(
        queue, [{"payload": n, "concurrency_key": f"k{n % 3}", "depends_on": [u]} for n, u in enumerate(ups)]
    )
    assert all(_state(d.id) == "waiting" for d in deps)
    errors: list = []
    done: list = []
    lock = threading.Lock()

    def worker():
        idle = 0
        while idle < 40:
            moved = False
            for name in (OTHER, queue):
                got = fq.claim(name, count=2)
                if not got:
                    continue
                moved = True
                if name == queue:
                    over = {k: n for k, n in running_by_key(queue).items() if n > 2}
                    if over:
                        errors.append(over)
                for j in got:
                    fq.ack(name, j.receipt)
                with lock:
                    done.extend((name, j.payload) for j in got)
            idle = 0 if moved else idle + 1

    errors += _threads(4, worker)
    assert errors == []
    assert sorted(p for name, p in done if name == queue) == list(range(30))
    assert sorted(p for name, p in done if name == OTHER) == list(range(30))
    assert Job.objects.filter(queue__name=queue, state="succeeded").count() == 30
    check_key_counts(queue)
