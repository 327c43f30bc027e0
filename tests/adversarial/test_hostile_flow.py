"""Adversarial tests of flow control and workflows (issues 16 and 17): races on the real database.

docs/reference/semantics.md §9 "Dependencies": deleting a queue treats its
unfinished jobs as cancelled for the jobs of other queues that depend on them;
a job never waits for a job that no longer exists. §2: no job outlives its queue.
The interleavings are forced by hooks, and waits are for lock waiters, never sleeps.
"""

from __future__ import annotations

import importlib

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidDependency
from django_fq.models import Dependency, Job, Queue

from .helpers import Background, wait_for_lock_waiter

deps_module = importlib.import_module("django_fq.services.dependencies")
queues_module = importlib.import_module("django_fq.services.queues")


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["delete_queue", "ttl"])
def test_queue_removal_racing_an_enqueue_that_depends_on_its_job_orphans_nothing(monkeypatch, how):
    """An enqueue into queue B depending on job J of queue A; A is deleted (or expires) between its check and commit.

    Either the enqueue fails cleanly (J gone) or its job lands and then follows
    the rule for a deleted dependency (cancelled under ``cancel``); never a
    job left waiting on an edge to a job that no longer exists.
    """
    a, b = "adv.hostile.del.a", "adv.hostile.del.b"
    if how == "ttl":
        fq.configure(a, ttl_ms=1)
        j = fq.enqueue(a, "j").id
        fq.cancel(a, j)  # finished: the queue is empty for its time to live
    else:
        j = fq.enqueue(a, "j").id
    fq.configure(b)
    real_check = deps_module.check
    removing: list[Background] = []

    def remove():
        if how == "ttl":
            return queues_module.expire_idle_queues()
        return fq.delete_queue(a)

    def check_then_remove(conn, wanted):
        found = real_check(conn, wanted)
        if not removing:
            removing.append(Background(remove).start())
            wait_for_lock_waiter(1, thread=removing[0])  # the removal waits for this enqueue
        return found

    monkeypatch.setattr(deps_module, "check", check_then_remove)
    try:
        k = fq.enqueue(b, "k", depends_on=[j]).id
    except InvalidDependency:
        k = None
    assert removing[0].join().error is None, removing[0].error
    assert not Queue.objects.filter(name=a).exists()
    assert not Job.objects.filter(uid=j).exists()
    seqs = set(Job.objects.values_list("seq", flat=True))
    # No edge names a job that is gone.
    assert not Dependency.objects.exclude(upstream_id__in=seqs).exists()
    if k is not None:
        assert fq.get(b, k).state == "cancelled"
    assert not Job.objects.filter(state="waiting").exists()


# --- workflow bounds (docs/reference/python-api.md "Workflows": 10,000 steps, 100,000 edges) -------------


@pytest.mark.django_db(transaction=True)
def test_a_workflow_of_10001_steps_is_refused_naming_the_step_and_writes_nothing():
    from django_fq.workflows import MAX_STEPS, Workflow, WorkflowError

    q = "adv.hostile.wf.big"
    wf = Workflow()
    for i in range(MAX_STEPS + 1):
        wf.step(q, i, name=f"s{i}")
    with pytest.raises(WorkflowError) as err:
        wf.enqueue()
    assert err.value.field == f"steps[s{MAX_STEPS}]"
    assert f"s{MAX_STEPS}" in err.value.message and "10000" in err.value.message
    assert not Job.objects.exists() and not Queue.objects.filter(name=q).exists()


@pytest.mark.django_db(transaction=True)
def test_a_workflow_over_the_edge_limit_names_the_step_and_writes_nothing(monkeypatch):
    from django_fq import workflows
    from django_fq.workflows import Workflow, WorkflowError

    monkeypatch.setattr(workflows, "MAX_EDGES", 5)
    q = "adv.hostile.wf.edges"
    wf = Workflow()
    roots = [wf.step(q, i, name=f"r{i}") for i in range(3)]
    wf.step(q, "x", name="x", after=roots)
    wf.step(q, "y", name="y", after=roots)  # edges 4-6: the sixth is over
    with pytest.raises(WorkflowError) as err:
        wf.enqueue()
    assert err.value.field == "steps[y].after"
    assert not Job.objects.exists()


# --- kill -9 of a process mid-ack (docs/reference/semantics.md §7: a killed worker loses no job) -------


def _key_books_balance(queue: str) -> None:
    """Each key's ``admitted`` equals its jobs that are queued or running (no slot leaked or given twice)."""
    from django_fq.models import ConcurrencyKey

    for row in ConcurrencyKey.objects.filter(queue__name=queue):
        live = Job.objects.filter(queue__name=queue, concurrency_key=row.key, state__in=("queued", "running")).count()
        assert row.admitted == live, (row.key, row.admitted, live)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["dependents", "key"])
def test_kill_9_mid_ack_of_a_keyed_job_with_dependents_leaks_nothing_and_releases_after_redelivery(
    tmp_path, clock, where
):
    """A process is killed inside the ack's transaction (after the job's own update, at the release of
    its dependents or the give-back of its key's slot): nothing of the ack commits; the lease expires,
    the job runs again, and its second ack releases the dependent and gives the slot back once."""
    import os
    import signal
    import subprocess
    import sys

    from django.db import connection

    from tests.worker.helpers import ROOT, child_env, wait_until

    q = "adv.hostile.kill.ack"
    fq.configure(q, key_concurrency=1, visibility_ms=60_000)
    up = fq.enqueue(q, "up", concurrency_key="k").id
    down = fq.enqueue(q, "down", depends_on=[up], concurrency_key="k").id
    other = fq.enqueue(q, "other", concurrency_key="k").id  # held behind up: the slot's next job
    job = fq.claim(q)[0]
    assert job.id == up
    marker = tmp_path / "marker"
    # The release: on PostgreSQL one statement acks the job and releases its dependents (its last part
    # names the keyed jobs released); elsewhere the edges are read after the job's own update.
    release = "*UNION ALL SELECT 'k', seq" if connection.vendor == "postgresql" else (
        "SELECT id, job_id, upstream_id, on_failure FROM django_fq_dependency"
    )  # fmt: skip
    prefix = {
        "dependents": release,
        "key": "SELECT id, concurrency_key, admitted, wake_at FROM django_fq_key",  # the key slot's lock
    }[where]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.adversarial.hostile_ack_child", q, job.receipt, str(marker), prefix],
        cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(lambda: marker.exists() or child.poll() is not None, 60, what="the child inside the ack")
        assert child.poll() is None, child.stderr.read().decode()[-3000:]
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    # Nothing of the ack committed (the database ends the killed session's transaction).
    wait_until(lambda: fq.get(q, up).state == "running", 30, what="the killed ack to roll back")
    assert fq.get(q, down).state == "waiting"
    assert Job.objects.get(uid=other).state == "held"
    _key_books_balance(q)
    # The lease runs out: the job is redelivered, and this time the ack commits.
    clock.advance(61_000)
    fq.reap(q)
    again = fq.claim(q)
    assert [j.id for j in again] == [up] and again[0].attempts == 2
    assert fq.ack(q, again[0].receipt).state == "succeeded"
    _key_books_balance(q)
    # The slot went back once and went to the key's next job in claim order; the dependent waits its turn.
    states = {uid: Job.objects.get(uid=uid).state for uid in (down, other)}
    assert sorted(states.values()) == ["held", "queued"], states
    ran = []
    for _ in range(2):
        nxt = fq.claim(q)
        assert len(nxt) == 1
        ran.append(nxt[0].id)
        fq.ack(q, nxt[0].receipt)
        _key_books_balance(q)
    assert sorted(ran) == sorted([down, other])
    assert fq.stats(q).counts["succeeded"] == 3


# --- snooze vs lease expiry vs a stale ack on a keyed job (docs/reference/semantics.md §9 "Per-key limits") ---


@pytest.mark.django_db(transaction=True)
def test_snooze_expiry_and_ack_racing_on_one_keyed_lease_give_the_slot_back_once(clock):
    """Three threads end one expired lease at once: a snooze, the reaper and an ack with its receipt.

    At most one of snooze/ack wins (the other gets an error, never a second
    give-back); the key's books balance after each round, and its next job is
    admitted exactly once.
    """
    q = "adv.hostile.snooze.race"
    fq.configure(q, key_concurrency=1, visibility_ms=1000, max_attempts=1000, backoff_ms=0)
    rounds = 8
    for n in range(rounds):
        fq.enqueue(q, n, concurrency_key="k")
    won: set[str] = set()
    for r in range(rounds):
        job = fq.claim(q)[0]
        _key_books_balance(q)
        if r % 2:
            clock.advance(1500)  # past its deadline: the reaper ends it, the receipt is stale
        outcomes = _end_three_ways(q, job.receipt)
        won.update(outcomes)
        assert not (outcomes[0] == "snoozed" and outcomes[2] == "acked"), outcomes
        _key_books_balance(q)
        # A reaper pass skips a lease another writer holds at that instant; the next pass ends it.
        fq.reap(q)
        _key_books_balance(q)
        states = list(Job.objects.filter(queue__name=q).values_list("state", flat=True))
        assert states.count("running") == 0 and states.count("queued") <= 1, (outcomes, states)
        if Job.objects.filter(uid=job.id, state="succeeded").exists():
            continue
        # The job went back (snoozed or expired): it runs again, then the slot passes on.
        again = fq.claim(q)
        assert len(again) == 1, (outcomes, states)
        fq.ack(q, again[0].receipt)
        _key_books_balance(q)
    assert fq.stats(q).counts["succeeded"] == rounds
    _key_books_balance(q)
    assert won & {"snoozed", "acked"} and "invalid_receipt" in won  # both races did happen


def _end_three_ways(q: str, receipt: str) -> list[str]:
    """A snooze, a reaper pass and an ack of ``receipt``, on three threads released at once; their outcomes."""
    import threading

    from django_fq.exceptions import FqError
    from tests.threads import in_threads

    barrier = threading.Barrier(3)
    verbs = (
        (lambda: fq.release(q, receipt, delay_ms=0), "snoozed"),
        (lambda: fq.reap(q), "reaped"),
        (lambda: fq.ack(q, receipt), "acked"),
    )

    def end(i: int) -> tuple[str, str]:
        call, name = verbs[i]
        barrier.wait()
        try:
            call()
        except FqError as exc:
            return exc.code, exc.message
        return name, ""

    results = in_threads(3, end)
    assert not any(receipt in message for _, message in results)  # errors never carry the receipt
    return [code for code, _ in results]


@pytest.mark.django_db(transaction=True)
def test_workflow_cancel_racing_the_ack_that_releases_a_step_leaves_nothing_runnable():
    """An ack of the running first step (releasing the second) and a cancel of the workflow, at once.

    Whichever commits first, every step ends finished (the first succeeded or
    cancelled, the rest cancelled), none is left queued, held or waiting, and the
    key's slot (the released step is keyed) is given back.
    """
    import threading

    from django_fq import workflows
    from django_fq.exceptions import FqError
    from tests.threads import in_threads

    q = "adv.hostile.wf.cancel"
    fq.configure(q, key_concurrency=1)
    for _ in range(6):
        a = fq.enqueue(q, "a").id
        b = fq.enqueue(q, "b", depends_on=[a], concurrency_key="k").id
        c = fq.enqueue(q, "c", depends_on=[b], concurrency_key="k").id
        job = fq.claim(q)[0]
        assert job.id == a
        barrier = threading.Barrier(2)

        def act(i: int, receipt: str = job.receipt, last: str = c, barrier=barrier) -> str:
            barrier.wait()
            try:
                if i == 0:
                    fq.ack(q, receipt)
                    return "acked"
                workflows.cancel(q, last)
                return "cancelled"
            except FqError as exc:
                return exc.code

        outcome = tuple(in_threads(2, act))
        assert outcome[1] == "cancelled", outcome
        states = [Job.objects.get(uid=u).state for u in (a, b, c)]
        assert states[0] in ("succeeded", "cancelled") and states[1:] == ["cancelled", "cancelled"], (outcome, states)
        assert (states[0] == "succeeded") == (outcome[0] == "acked"), (outcome, states)
        _key_books_balance(q)
    assert not Job.objects.filter(queue__name=q, state__in=("queued", "held", "waiting", "running")).exists()


@pytest.mark.django_db(transaction=True)
def test_plain_enqueues_racing_ttl_expiry_land_in_a_live_queue(clock):
    """4 threads enqueue one job (the one-statement path) into each of 40 expired, empty queues while
    passes of the time to live run: each enqueue lands in a queue that exists at the end (kept, or
    created again), or fails cleanly; no job is left in, or deleted with, a removed queue."""
    import random
    import threading

    from django_fq.exceptions import FqError

    names = [f"adv.hostile.ttl.{i}" for i in range(40)]
    for name in names:
        fq.configure(name, ttl_ms=1)
    clock.advance(10_000)  # every queue is empty and idle past its time to live
    stop = threading.Event()
    landed: list[tuple[str, str]] = []
    refused: list[str] = []

    def enqueue_all(i: int) -> None:
        order = names[:]
        random.Random(i).shuffle(order)
        for name in order:
            try:
                landed.append((name, fq.enqueue(name, {"i": i}).id))
            except FqError as exc:
                refused.append(exc.code)

    def expire_until_stopped() -> int:
        passes = 0
        while not stop.is_set():
            queues_module.expire_idle_queues()
            passes += 1
        return passes

    expirer = Background(expire_until_stopped).start()
    try:
        from tests.threads import in_threads

        in_threads(4, enqueue_all, timeout_s=120)
    finally:
        stop.set()
    assert expirer.join(60).error is None, expirer.error
    assert expirer.value > 0
    assert not refused or set(refused) <= {"queue_not_found"}, refused
    live = dict(Queue.objects.values_list("id", "name"))
    jobs = dict(Job.objects.values_list("uid", "queue_id"))
    assert set(jobs.values()) <= set(live), "a job outlived its queue"
    for name, uid in landed:
        assert uid in jobs, f"job {uid} of {name} was deleted with an expired queue"
        assert live[jobs[uid]] == name


@pytest.mark.django_db(transaction=True)
def test_two_acks_releasing_one_dependent_across_queues_release_it_once():
    """The last two dependencies of one job, in two other queues, acked by two threads at once (20 rounds):
    the dependent is released once (one ready job, the counters agree, one claim gets it)."""
    import threading

    from tests.threads import in_threads

    qa, qb, qd = "adv.hostile.rel.a", "adv.hostile.rel.b", "adv.hostile.rel.d"
    for r in range(20):
        a = fq.enqueue(qa, r).id
        b = fq.enqueue(qb, r).id
        d = fq.enqueue(qd, r, depends_on=[a, b]).id
        ja, jb = fq.claim(qa)[0], fq.claim(qb)[0]
        barrier = threading.Barrier(2)

        def ack(i: int, jobs=((qa, ja.receipt), (qb, jb.receipt)), barrier=barrier) -> str:
            barrier.wait()
            return fq.ack(*jobs[i]).state

        assert in_threads(2, ack) == ["succeeded", "succeeded"]
        assert fq.get(qd, d).state == "ready"
        stats = fq.stats(qd)
        assert (stats.counts["ready"], stats.counts["waiting"]) == (1, 0)
        got = fq.claim(qd, count=10)
        assert [j.id for j in got] == [d]
        fq.ack(qd, got[0].receipt)
    assert fq.stats(qd).counts["succeeded"] == 20


@pytest.mark.django_db
@pytest.mark.parametrize("coalesce", ["idempotency", "unique_key"])
def test_a_duplicate_enqueue_cannot_make_a_job_depend_on_itself(coalesce):
    """The only way to name a job's own id at its enqueue is a duplicate that coalesces onto it:
    the duplicate keeps the existing job's dependencies (none), so no cycle of one is ever written."""
    q = "adv.hostile.selfdep"
    first = fq.enqueue(q, 1, **{coalesce: "same"})
    again = fq.enqueue(q, 2, depends_on=[first.id], **{coalesce: "same"})
    assert (again.id, again.created) == (first.id, False)
    assert not Dependency.objects.exists()
    assert fq.get(q, first.id).state == "ready"
    # A chain built over several calls is acyclic by construction: each call names only existing jobs.
    b = fq.enqueue(q, 3, depends_on=[first.id]).id
    c = fq.enqueue(q, 4, depends_on=[b], **{coalesce: "same"})
    assert c.id == first.id and not c.created  # coalesced: first does not come to depend on b
    assert list(Dependency.objects.values_list("job__uid", "upstream__uid")) == [(b, first.id)]


@pytest.mark.django_db(transaction=True)
def test_ttl_keeps_a_queue_whose_finished_job_an_unfinished_job_still_needs(clock):
    """docs/reference/semantics.md §9 "Dependencies": pruning never removes a finished job that an
    unfinished one depends on; the time to live (which prune runs) must not either."""
    a, b = "adv.hostile.ttl.needed.a", "adv.hostile.ttl.needed.b"
    fq.configure(a, ttl_ms=1)
    s = fq.enqueue(a, "s").id
    done = fq.claim(a)[0]
    fq.ack(a, done.receipt)
    x = fq.enqueue(b, "x").id
    w = fq.enqueue(b, "w", depends_on=[s, x]).id
    clock.advance(10_000)
    assert queues_module.expire_idle_queues() == []
    assert Queue.objects.filter(name=a).exists()
    assert [e["id"] for e in fq.get(b, w).depends_on] == sorted([s, x], key=lambda u: Job.objects.get(uid=u).seq)
    job = fq.claim(b)[0]
    assert job.id == x
    fq.ack(b, job.receipt)
    job = fq.claim(b)[0]
    assert job.id == w
    assert queues_module.expire_idle_queues() == []  # w is running: it still needs s
    fq.ack(b, job.receipt)
    clock.advance(10_000)
    assert queues_module.expire_idle_queues() == [a]  # nothing needs it any more


_KEY_BOOKS_SQL = (
    "SELECT k.concurrency_key, k.admitted, (SELECT COUNT(*) FROM django_fq_job j WHERE j.queue_id = k.queue_id "
    "AND j.concurrency_key = k.concurrency_key AND j.state IN ('queued', 'running')), "
    "(SELECT COUNT(*) FROM django_fq_job j WHERE j.queue_id = k.queue_id "
    "AND j.concurrency_key = k.concurrency_key AND j.state = 'running') "
    "FROM django_fq_key k JOIN django_fq_queue q ON q.id = k.queue_id WHERE q.name = %s"
)


@pytest.mark.django_db(transaction=True)
def test_configure_of_key_concurrency_racing_claims_acks_and_enqueues_keeps_the_books():
    """Threads claim and ack, one enqueues, one sets key_concurrency to 1, 3, 2, … while they run.

    Every sample (one statement: one snapshot) finds each key's ``admitted``
    equal to its queued and running jobs and no key running more jobs than
    the highest limit ever set; once the limit is 1 and the excess has run
    out, no key ever runs two jobs again.
    """
    import threading

    from django.db import connection

    from tests.threads import in_threads

    q = "adv.hostile.keys.configure"
    keys = [f"k{i}" for i in range(5)]
    fq.configure(q, key_concurrency=2)
    fq.enqueue_many(q, [{"payload": n, "concurrency_key": keys[n % 5]} for n in range(200)])
    stop = threading.Event()
    samples: list[tuple] = []
    bad: list[tuple] = []
    progress = threading.Condition()
    produced = [0]

    def sample() -> None:
        with connection.cursor() as cur:
            cur.execute(_KEY_BOOKS_SQL, [q])
            rows = cur.fetchall()
        with progress:
            samples.append(tuple(rows))
            progress.notify_all()
        for key, admitted, live, running in rows:
            if admitted != live or running > 3:
                bad.append((key, admitted, live, running))

    def work(i: int) -> None:
        if i == 0:  # the operator
            for limit in (1, 3, 2, 3, 1, 2, 1):
                fq.configure(q, key_concurrency=limit)
                sample()
                with progress:  # the consumers claim under each limit before the next change
                    seen = len(samples)
                    assert progress.wait_for(lambda seen=seen: len(samples) >= seen + 6, timeout=60)
            stop.set()
            return
        if i == 1:  # a producer, until the operator is done: the consumers never run dry before it
            while not stop.is_set() and produced[0] < 600:
                fq.enqueue(q, produced[0], concurrency_key=keys[produced[0] % 5])
                produced[0] += 1
            return
        while not stop.is_set():  # consumers
            for job in fq.claim(q, count=3):
                sample()
                fq.ack(q, job.receipt)

    in_threads(5, work, timeout_s=180)
    assert not bad, bad[:5]
    # The limit is 1 now: drain the rest one claim at a time; no key ever has two running.
    while True:
        got = fq.claim(q, count=10)
        if not got:
            break
        by_key: dict[str, int] = {}
        for job in got:
            k = Job.objects.get(uid=job.id).concurrency_key
            by_key[k] = by_key.get(k, 0) + 1
        assert max(by_key.values()) == 1, by_key
        sample()
        for job in got:
            fq.ack(q, job.receipt)
    assert not bad, bad[:5]
    assert fq.stats(q).counts["succeeded"] == 200 + produced[0]
    _key_books_balance(q)


@pytest.mark.django_db
def test_a_batch_naming_more_than_100000_dependencies_is_refused_before_any_read(django_assert_max_num_queries):
    """1,000 items of 1,000 made-up ids each held the enqueue's transaction for tens of seconds
    (every id locked and read); past 100,000 in all the batch is refused, naming the item, unread."""
    import secrets

    from django_fq.services.dependencies import MAX_BATCH_DEPENDENCIES

    q = "adv.hostile.bulkdeps"
    per = 1000
    items = [{"payload": i, "depends_on": [secrets.token_hex(16) for _ in range(per)]} for i in range(101)]
    with django_assert_max_num_queries(0), pytest.raises(InvalidDependency) as err:
        fq.enqueue_many(q, items)
    assert err.value.field == f"items[{MAX_BATCH_DEPENDENCIES // per}].depends_on"
    assert not Queue.objects.filter(name=q).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_chain_of_10000_steps_enqueues_shows_prints_and_cancels_within_bounds():
    """The deepest workflow the limits allow: one chain of 10,000 steps (10,000 levels).

    It is enqueued whole, shown whole and in order (not truncated), printed by
    ``fq workflow show`` in bounded width, and a cancel of its head cascades
    to its last step.
    """
    import io

    from django.core.management import call_command

    from django_fq import workflows
    from django_fq.workflows import MAX_STEPS, Workflow

    q = "adv.hostile.chain"
    wf = Workflow()
    prev = None
    for i in range(MAX_STEPS):
        prev = wf.step(q, i, name=f"c{i}", after=[prev] if prev else [])
    ids = wf.enqueue()
    info = workflows.show(q, ids["c5000"])
    assert not info.truncated and [s["id"] for s in info.steps] == [ids[f"c{i}"] for i in range(MAX_STEPS)]
    out = io.StringIO()
    call_command("fq", "workflow", "show", q, ids["c0"], stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == MAX_STEPS and max(len(line) for line in lines) < 150
    fq.cancel(q, ids["c0"])
    assert fq.get(q, ids[f"c{MAX_STEPS - 1}"]).state == "cancelled"
    assert fq.stats(q).counts["cancelled"] == MAX_STEPS
