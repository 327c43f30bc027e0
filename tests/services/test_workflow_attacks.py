"""Attacks on the one-call-per-queue workflow write and the set cancel (docs/how-to/workflows.md).

Each scenario runs twice, on its own queues: once with ``Workflow._write`` and
``workflows.cancel`` as they are, once with the level-by-level write and the
job-by-job cancel they replaced (one ``enqueue_many`` per level and queue;
``cancel`` of each unfinished step in dependency order). The jobs' states,
reasons, edges and the queues' counters must come out the same.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from django.db import transaction
from django.db.models import Sum

from django_fq import batches, conf, db, workflows
from django_fq import services as fq
from django_fq.exceptions import FqError
from django_fq.models import ACTIVE, Batch, Dependency, Job, Queue, QueueCounter
from django_fq.workflows import Workflow

from .helpers import check_key_counts, claim_one

pytestmark = pytest.mark.django_db


def _old_write(self, levels, create_queues=True):
    """The level-by-level write of main (one ``enqueue_many`` per level and queue)."""
    from django_fq.services import enqueue_many

    ids: dict[str, str] = {}
    with transaction.atomic(using=conf.database()):
        for level in levels:
            by_queue: dict[str, list[str]] = defaultdict(list)
            for name in level:
                by_queue[self._steps[name][0]].append(name)
            for queue, names in by_queue.items():
                items = [self._envelope(n, ids) for n in names]
                create = create_queues if isinstance(create_queues, bool) else queue in create_queues
                try:
                    results = enqueue_many(queue, items, create_queue=create)
                except FqError as exc:
                    workflows._name_the_step(exc, names)
                    raise
                ids.update((n, r.id) for n, r in zip(names, results, strict=True))
    return ids


def _old_cancel(queue, job_id):
    """The job-by-job cancel of main."""

    def apply():
        info = workflows.show(queue, job_id)
        unfinished = [s for s in info.steps if s["state"] not in ("succeeded", "cancelled")]
        for step in unfinished:
            try:
                fq.cancel(step["queue"], step["id"])
            except FqError as exc:
                if exc.code != "invalid_state":
                    raise
        return workflows.CancelledWorkflow(
            id=job_id, cancelled=len(unfinished), finished=len(info.steps) - len(unfinished)
        )

    return db.retrying(apply)


def _snapshot(prefix: str, names: dict[str, str]) -> dict:
    """States, reasons, edges and counters of the queues under ``prefix``, ids replaced by names."""
    by_uid = {uid: name for name, uid in names.items()}

    def clean(text):
        return re.sub(r"[0-9a-f]{32}", lambda m: by_uid.get(m.group(0), "?"), text or "")

    jobs = {}
    for j in Job.objects.filter(queue__name__startswith=prefix).select_related("queue").order_by("seq"):
        name = by_uid.get(j.uid) or "?" + str(json.loads(j.payload))
        while name in jobs:  # two unnamed jobs of one payload (a callback fired twice) stay two
            name += "+"
        jobs[name] = (
            j.queue.name[len(prefix) :],
            j.state,
            j.waiting_on,
            clean(j.last_error),
            j.priority,
            j.max_attempts,
            # A delay kept (or not) through the write, in minutes: a job the old cancel released
            # first (a run edge) has its release time as run_at, a few ms later.
            (j.run_at - j.enqueued_at) // 60_000,
            j.concurrency_key,
            [(e.get("kind"), clean(e.get("error"))) for e in (j.errors or [])],
        )
    edges = sorted(
        (by_uid.get(d.job.uid, "?"), by_uid.get(d.upstream.uid, "?"), d.on_failure, d.pending, d.name)
        for d in Dependency.objects.filter(job__queue__name__startswith=prefix).select_related("job", "upstream")
    )
    stats = {}
    for qn in sorted({j[0] for j in jobs.values()}):
        s = fq.stats(prefix + qn)
        stats[qn] = (dict(s.counts), dict(s.totals))
    made = Batch.objects.filter(queue__name__startswith=prefix)
    counts = sorted((b.state, b.total, b.succeeded, b.dead, b.cancelled, b.callback_job is not None) for b in made)
    return {"jobs": jobs, "edges": edges, "stats": stats, "batches": counts}


def differential(monkeypatch, scenario, *, cancel_step: str | None = None, after=None):
    """Run ``scenario(prefix) -> (workflow or None, names of jobs made before)`` new and old; compare."""
    out = {}
    for mode in ("new", "old"):
        prefix = f"t{mode}:"
        with monkeypatch.context() as m:
            if mode == "old":
                m.setattr(Workflow, "_write", _old_write)
            wf, names = scenario(prefix)
            ids = dict(names)
            error = None
            try:
                ids.update(wf.enqueue())
            except FqError as exc:
                # The counts in a queue_full message are of the call that failed (one per level before).
                error = (exc.code, exc.field, re.sub(r"t(new|old):|\d+ of", "", exc.message))
            got = {"error": error, "after_enqueue": _snapshot(prefix, ids)}
            if after is not None:
                after(prefix, ids)
                got["after"] = _snapshot(prefix, ids)
            if cancel_step is not None and error is None:
                step_queue = wf._steps[cancel_step][0]
                fn = _old_cancel if mode == "old" else workflows.cancel
                res = fn(step_queue, ids[cancel_step])
                got["cancel"] = (res.cancelled, res.finished)
                got["after_cancel"] = _snapshot(prefix, ids)
            out[mode] = got
    for key in out["old"]:
        if out["new"][key] != out["old"][key]:
            import pprint

            pprint.pprint({"new": out["new"][key], "old": out["old"][key]}, width=150)
        assert out["new"][key] == out["old"][key], key
    return out["new"]


# --- the write: new against old ------------------------------------------------------------------


def _dead(queue: str, **options) -> str:
    fq.configure(queue, max_attempts=1)
    job = fq.enqueue(queue, "old", **options)
    got = claim_one(queue)
    assert got.id == job.id
    fq.nack(queue, got.receipt, error="boom")
    return job.id


def _existing(queue: str, state: str, **options) -> str:
    """A job of ``queue`` in ``state`` (queued, running, succeeded, dead, cancelled, waiting)."""
    fq.configure(queue)
    if state == "dead":
        return _dead(queue, **options)
    if state == "waiting":
        up = fq.enqueue(queue, "up", delay_ms=3_600_000)
        return fq.enqueue(queue, "old", depends_on=[up.id], **options).id
    job = fq.enqueue(queue, "old", **options)
    if state in ("running", "succeeded"):
        got = claim_one(queue)
        if state == "succeeded":
            fq.ack(queue, got.receipt, result=1)
    elif state == "cancelled":
        fq.cancel(queue, job.id)
    return job.id


@pytest.mark.parametrize("how", ["unique_key", "idempotency"])
def test_a_middle_step_that_creates_its_job_is_written_as_before(db, monkeypatch, how):
    def scenario(p):
        fq.configure(p + "a")
        fq.configure(p + "b")
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a")
        m = wf.step(p + "b", "m", name="m", after=[a], **{how: "K"})
        wf.step(p + "a", "c", name="c", after=[m])
        return wf, {}

    got = differential(monkeypatch, scenario, cancel_step="a")
    assert got["error"] is None
    assert got["after_enqueue"]["jobs"]["m"][1] == "waiting"


@pytest.mark.parametrize("state", ["queued", "running", "succeeded", "dead", "cancelled", "waiting"])
@pytest.mark.parametrize("how", ["unique_key", "idempotency"])
@pytest.mark.parametrize("policy", ["cancel", "run", "wait"])
def test_a_middle_step_coalescing_onto_a_job_in_each_state(db, monkeypatch, state, how, policy):
    def scenario(p):
        fq.configure(p + "b")
        old = _existing(p + "a", state, **{how: "K"})
        wf = Workflow()
        a = wf.step(p + "b", "a", name="a")
        m = wf.step(p + "a", "m", name="m", after=[a], **{how: "K"})
        c = wf.step(p + "b", "c", name="c", after=[m], on_failure=policy)
        wf.step(p + "a", "d", name="d", after=[c, a], on_failure=policy)
        return wf, {"old": old}

    differential(monkeypatch, scenario, cancel_step="d")


@pytest.mark.parametrize("state", ["running", "succeeded", "dead", "cancelled", "waiting", "queued"])
@pytest.mark.parametrize("policy", ["cancel", "run", "wait"])
def test_depends_on_an_existing_job_of_another_queue(db, monkeypatch, state, policy):
    def scenario(p):
        fq.configure(p + "b")
        old = _existing(p + "x", state)
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a", after=[old], on_failure=policy)
        b = wf.step(p + "b", "b", name="b", after=[a], on_failure=policy)
        wf.step(p + "a", "c", name="c", after=[b, old], on_failure=policy)
        wf.step(p + "b", "d", name="d", after=[a, b], on_failure="run")
        return wf, {"old": old}

    differential(monkeypatch, scenario, cancel_step="a")


def test_the_same_unique_key_on_two_steps(db, monkeypatch):
    def scenario(p):
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a", unique_key="U")
        b = wf.step(p + "a", "b", name="b", unique_key="U")
        c = wf.step(p + "b", "c", name="c", after=[a])
        d = wf.step(p + "a", "d", name="d", after=[c], unique_key="U")
        wf.step(p + "b", "e", name="e", after=[b, d])
        return wf, {}

    differential(monkeypatch, scenario, cancel_step="e")


def test_the_same_idempotency_token_on_a_step_and_its_dependent(db, monkeypatch):
    def scenario(p):
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a")
        b = wf.step(p + "a", "b", name="b", after=[a], idempotency="T")
        c = wf.step(p + "a", "c", name="c", after=[b], idempotency="T")
        wf.step(p + "b", "d", name="d", after=[c])
        return wf, {}

    differential(monkeypatch, scenario, cancel_step="a")


def test_key_concurrency_across_a_chain(db, monkeypatch):
    def scenario(p):
        fq.configure(p + "a", key_concurrency=1)
        fq.configure(p + "b", key_concurrency=1)
        fq.enqueue(p + "a", "busy", concurrency_key="k")
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a", concurrency_key="k")
        b = wf.step(p + "b", "b", name="b", concurrency_key="k")
        c = wf.step(p + "a", "c", name="c", after=[b], concurrency_key="k")
        wf.step(p + "b", "d", name="d", after=[a, c], concurrency_key="k", on_failure="run")
        wf.step(p + "a", "e", name="e", concurrency_key="k")
        return wf, {}

    def after(p, ids):
        for qn in ("a", "b"):
            check_key_counts(p + qn)
            got = fq.claim(p + qn)
            for j in got:
                fq.ack(p + qn, j.receipt)
            check_key_counts(p + qn)

    differential(monkeypatch, scenario, cancel_step="c", after=after)


def test_a_paused_queue_and_priorities_and_delays(db, monkeypatch):
    def scenario(p):
        fq.configure(p + "a")
        fq.pause(p + "a")
        wf = Workflow()
        a = wf.step(p + "b", "a", name="a", priority=5)
        b = wf.step(p + "a", "b", name="b", after=[a], priority=-3, delay_ms=60_000)
        wf.step(p + "b", "c", name="c", after=[b], priority=9, max_attempts=2)
        wf.step(p + "a", "d", name="d", priority=2)
        return wf, {}

    def after(p, ids):
        got = claim_one(p + "b")
        fq.ack(p + "b", got.receipt)

    differential(monkeypatch, scenario, cancel_step="c", after=after)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_full_queue_writes_nothing_and_names_the_step(db, monkeypatch, settings, where):
    settings.FQ_MAX_JOBS_PER_QUEUE = 3

    def scenario(p):
        fq.enqueue(p + "a", "x")
        fq.enqueue(p + "a", "y")
        wf = Workflow()
        s0 = wf.step(p + "b", 0, name="s0")
        s1 = wf.step(p + ("a" if where == "first" else "b"), 1, name="s1", after=[s0])
        s2 = wf.step(p + "a", 2, name="s2", after=[s1])
        s3 = wf.step(p + ("a" if where != "last" else "b"), 3, name="s3", after=[s2])
        wf.step(p + "a", 4, name="s4", after=[s3])
        return wf, {}

    got = differential(monkeypatch, scenario)
    assert got["error"][:2] == ("queue_full", "queue")  # docs/reference/errors.md: field queue
    assert set(got["after_enqueue"]["jobs"]) == {"?x", "?y"}


def test_a_batch_across_a_workflow(db, monkeypatch):
    def scenario(p):
        b = batches.create(p + "a", callback={"queue": p + "cb", "payload": "done"})
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a", batch=b.id)
        c = wf.step(p + "b", "c", name="c", after=[a])
        d = wf.step(p + "a", "d", name="d", after=[c], batch=b.id)
        wf.step(p + "a", "e", name="e", after=[d], batch=b.id, on_failure="run")
        return wf, {}

    def after(p, ids):
        batches.seal(batches_of(p)[0])

    got = differential(monkeypatch, scenario, cancel_step="a", after=after)
    assert got["after_cancel"]["jobs"]["?done"][1] == "queued"  # the callback fired once


def batches_of(prefix):
    return list(Batch.objects.filter(queue__name__startswith=prefix).values_list("uid", flat=True))


# --- cancel against a worker, with real threads ----------------------------------------------------


def _check_counters(queue: str) -> None:
    """The queue's counters agree with its rows: active jobs, cancelled jobs."""
    qid = Queue.objects.get(name=queue).id
    sums = QueueCounter.objects.filter(queue_id=qid).aggregate(a=Sum("active"), c=Sum("cancelled"))
    jobs = Job.objects.filter(queue_id=qid)
    assert (sums["a"] or 0) == jobs.filter(state__in=ACTIVE).count(), queue
    assert (sums["c"] or 0) == jobs.filter(state="cancelled").count(), queue


def _check_reasons(uids: list[str]) -> None:
    """A job cancelled by a dependency names one that did end that way."""
    every = dict(Job.objects.values_list("uid", "state"))
    for uid, error in Job.objects.filter(uid__in=uids, state="cancelled").values_list("uid", "last_error"):
        found = re.fullmatch(r"cancelled: dependency ([0-9a-f]{32}) is (\w+)", error or "")
        if found:
            assert every[found.group(1)] == found.group(2), (uid, error, every[found.group(1)])


class _Worker:
    """Claims and acks jobs of ``queues`` on a thread of its own until stopped."""

    def __init__(self, queues):
        import threading

        self.queues = queues
        self.stop = threading.Event()
        self.acked: list[str] = []
        self.refused: list[str] = []
        self.errors: list[BaseException] = []
        self.some = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        from django.db import connection

        from django_fq.exceptions import ReceiptCancelled

        try:
            while not self.stop.is_set():
                for queue in self.queues:
                    for job in fq.claim(queue, count=2):
                        try:
                            fq.ack(queue, job.receipt)
                            self.acked.append(job.id)
                        except ReceiptCancelled:
                            self.refused.append(job.id)
                        if len(self.acked) >= 3:
                            self.some.set()
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
            self.some.set()
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(8))
def test_a_cancel_while_a_worker_acks_the_steps(round_):
    qa, qb, cb = "tatk:a", "tatk:b", "tatk:cb"
    fq.configure(qa)
    fq.configure(qb, key_concurrency=1)
    b = batches.create(qa, callback={"queue": cb, "payload": "done"})
    wf = Workflow()
    heads = [wf.step(qa, i, name=f"h{i}", batch=b.id) for i in range(4)]
    prev = wf.group(*heads)
    names = [s.name for s in heads]
    for i in range(12):
        queue = (qa, qb)[i % 2]
        options = {"batch": b.id} if queue == qa else {"concurrency_key": "K"}
        policy = ("cancel", "run", "wait")[i % 3]
        step = wf.step(queue, i, name=f"s{i}", after=[prev], on_failure=policy, **options)
        names.append(step.name)
        prev = wf.group(step, wf.step(qb, i, name=f"k{i}", after=[prev], concurrency_key="K"))
        names.append(f"k{i}")
    ids = wf.enqueue()
    batches.seal(b.id)
    with _Worker((qa, qb)) as worker:
        assert worker.some.wait(30)
        out = workflows.cancel(qa, ids["h0"])
    assert not worker.errors, worker.errors
    got = dict(Job.objects.filter(uid__in=list(ids.values())).values_list("uid", "state"))
    assert set(got.values()) <= {"succeeded", "cancelled"}, got
    assert out.cancelled + out.finished == len(ids)
    cancelled = sum(1 for s in got.values() if s == "cancelled")
    assert out.cancelled == cancelled, (out, cancelled)
    _check_reasons(list(ids.values()))
    for queue in (qa, qb):
        _check_counters(queue)
        check_key_counts(queue)
    info = batches.get(b.id)
    assert info.total == info.succeeded + info.cancelled + info.dead
    assert Job.objects.filter(queue__name=cb).count() == 1  # the callback, once


@pytest.mark.parametrize("policy", ["cancel", "run", "wait"])
def test_steps_released_or_cancelled_at_enqueue_keep_key_delay_priority_and_batch(db, monkeypatch, policy):
    def scenario(p):
        fq.configure(p + "b", key_concurrency=1)
        dead = _dead(p + "x")
        fq.enqueue(p + "b", "busy", concurrency_key="K")
        bt = batches.create(p + "b", callback={"queue": p + "cb", "payload": "done"})
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a", after=[dead], on_failure=policy)
        b = wf.step(p + "b", "b", name="b", after=[a], on_failure="run", concurrency_key="K", batch=bt.id)
        c = wf.step(p + "b", "c", name="c", after=[a], on_failure="run", delay_ms=3_600_000, priority=7)
        d = wf.step(p + "b", "d", name="d", after=[a], on_failure=policy, batch=bt.id, concurrency_key="K")
        wf.step(p + "a", "e", name="e", after=[b, c, d], on_failure=policy)
        return wf, {"dead": dead}

    def after(p, ids):
        batches.seal(batches_of(p)[0])
        for queue in (p + "a", p + "b"):
            check_key_counts(queue)
            _check_counters(queue)

    differential(monkeypatch, scenario, cancel_step="e", after=after)


def test_a_step_in_a_queue_written_before_the_queue_of_its_dependency(db, monkeypatch):
    """In one round, queue ``a`` is written before queue ``b``: a step of ``a`` after a step of ``b``."""

    def scenario(p):
        fq.configure(p + "a", key_concurrency=1)
        wf = Workflow()
        first = wf.step(p + "a", "first", name="first")
        mid = wf.step(p + "b", "mid", name="mid", after=[first])
        wf.step(p + "a", "last", name="last", after=[mid], concurrency_key="K")
        wf.step(p + "a", "free", name="free", concurrency_key="K")
        return wf, {}

    def after(p, ids):
        fq.ack(p + "a", claim_one(p + "a").receipt)  # first, or free
        fq.ack(p + "a", claim_one(p + "a").receipt)
        fq.ack(p + "b", claim_one(p + "b").receipt)
        check_key_counts(p + "a")

    differential(monkeypatch, scenario, cancel_step="first", after=after)


# --- errors: all or nothing ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["priority", "missing", "queue", "batch"])
@pytest.mark.parametrize("inside", [False, True])
def test_an_error_after_a_barrier_writes_nothing_and_names_the_step(db, bad, inside):
    qa, qb = "tatk:ea", "tatk:eb"
    fq.configure(qa)
    before = Job.objects.count()
    wf = Workflow()
    a = wf.step(qa, "a", name="a")
    m = wf.step(qb, "m", name="m", after=[a], unique_key="U")
    c = wf.step(qa, "c", name="c", after=[m])
    options = {
        "priority": {"priority": "high"},
        "missing": {},
        "queue": {},
        "batch": {"batch": "0" * 32},
    }[bad]
    after = [c, "f" * 32] if bad == "missing" else [c]
    wf.step("tatk:nope" if bad == "queue" else qb, "z", name="z", after=after, **options)
    create = {qa, qb} if bad == "queue" else True

    def run():
        with pytest.raises(FqError) as err:
            wf.enqueue(create_queues=create)
        return err.value

    if inside:
        with transaction.atomic():
            mine = fq.enqueue(qa, "mine")
            exc = run()
            assert Job.objects.filter(uid=mine.id).exists()  # the caller's own write is still there
        assert Job.objects.count() == before + 1
    else:
        exc = run()
        assert Job.objects.count() == before
    assert exc.field.startswith("steps[z]"), (exc.field, exc.message)
    assert "'z'" in exc.message
    assert not Dependency.objects.exists()


def test_an_error_in_the_callers_transaction_propagates_and_rolls_back(db):
    qa = "tatk:ra"
    with pytest.raises(RuntimeError), transaction.atomic():
        wf = Workflow()
        a = wf.step(qa, "a", name="a")
        m = wf.step(qa, "m", name="m", after=[a], idempotency="T")
        wf.step(qa, "c", name="c", after=[m])
        ids = wf.enqueue()
        assert Job.objects.filter(uid__in=list(ids.values())).count() == 3
        raise RuntimeError("the caller's own failure")
    assert not Job.objects.exists() and not Dependency.objects.exists()
    # The token went with the rollback: the same workflow writes again.
    wf = Workflow()
    a = wf.step(qa, "a", name="a")
    m = wf.step(qa, "m", name="m", after=[a], idempotency="T")
    ids = wf.enqueue()
    assert fq.get(qa, ids["m"]).state == "waiting"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["enqueue", "workflow"])
@pytest.mark.parametrize("policy", ["cancel", "run", "wait"])
def test_a_cancel_racing_enqueues_that_depend_on_its_steps(policy, how):
    import threading

    from django.db import connection

    qa, qb = "tatk:ca", "tatk:cb"
    fq.configure(qa)
    fq.configure(qb)
    wf = Workflow()
    prev = wf.step(qa, 0, name="s0")
    for i in range(1, 16):
        prev = wf.step((qa, qb)[i % 2], i, name=f"s{i}", after=[prev])
    ids = wf.enqueue()
    stop, some = threading.Event(), threading.Event()
    late: list[str] = []
    errors: list[BaseException] = []

    def enqueue_late():
        try:
            i = 0
            while not stop.is_set():
                up = ids[f"s{i % 16}"]
                if how == "enqueue":
                    late.append(fq.enqueue(qb, "late", depends_on=[{"id": up, "on_failure": policy}]).id)
                else:  # a workflow of its own after the step: a plain step, a barrier, a plain one after it
                    other = Workflow()
                    x = other.step(qb, "late", name="x", after=[up], on_failure=policy)
                    y = other.step(qa, "late", name="y", after=[x], on_failure=policy, unique_key=f"u{i}")
                    other.step(qb, "late", name="z", after=[y, up], on_failure=policy)
                    late.extend(other.enqueue().values())
                i += 1
                if i >= 3:
                    some.set()
        except BaseException as exc:  # reported below
            errors.append(exc)
            some.set()
        finally:
            connection.close()

    thread = threading.Thread(target=enqueue_late)
    thread.start()
    try:
        assert some.wait(30)
        out = workflows.cancel(qb, ids["s7"])
        n = len(late)
        while len(late) < n + 3 and not errors:  # some more after the cancel committed
            some.clear()
            some.wait(5)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    # The late jobs that joined before the cancel read the workflow are steps of it too.
    assert out.cancelled >= 16 and out.cancelled + out.finished <= 16 + len(late)
    states = dict(Job.objects.filter(uid__in=late).values_list("uid", "state"))
    # A run edge: released when it joined after the cancel read the workflow, else cancelled with it.
    want = {"cancel": {"cancelled"}, "wait": {"cancelled"}, "run": {"queued", "waiting", "cancelled"}}[policy]
    assert set(states.values()) <= want, states
    if policy == "run":  # a late workflow's later steps wait for its released first step, nothing else
        for job in Job.objects.filter(uid__in=late, state="waiting"):
            ups = Dependency.objects.filter(job=job, pending=True).select_related("upstream")
            assert {d.upstream.state for d in ups} <= {"queued", "waiting"}, job.uid
    _check_reasons(late)
    # No job is left waiting on a finished dependency.
    assert not Dependency.objects.filter(pending=True, upstream__state__in=("cancelled", "succeeded")).exists()
    for queue in (qa, qb):
        _check_counters(queue)


def test_a_step_acked_between_the_plan_and_the_locks_is_not_named_as_the_cancelling_dependency(db, monkeypatch):
    """The plan (a plain read) saw r and s running; r's ack commits before the cancel locks the jobs.

    w still waits on s, whose cancel cancels it: its reason names s (as the job-by-job cancel
    would: r's cancel fails with invalid_state, s's cascades), not r, which succeeded.
    """
    from django.db import connection

    from django_fq import storage

    q = "tatk:p"
    fq.configure(q)
    wf = Workflow()
    r = wf.step(q, "r", name="r")
    s = wf.step(q, "s", name="s")
    wf.step(q, "w", name="w", after=[r, s])
    ids = wf.enqueue()
    running = {job.id: job for job in fq.claim(q, count=2)}
    assert set(running) == {ids["r"], ids["s"]}
    store_type = type(storage.for_connection(connection))
    real = store_type.cancel_unfinished
    acked: list[str] = []

    def ack_then_cancel(self, conn, **kwargs):
        if not acked:  # the worker's ack of r commits after the plan was read
            fq.ack(q, running[ids["r"]].receipt)
            acked.append(ids["r"])
        return real(self, conn, **kwargs)

    monkeypatch.setattr(store_type, "cancel_unfinished", ack_then_cancel)
    out = workflows.cancel(q, ids["w"])
    assert fq.get(q, ids["r"]).state == "succeeded"
    assert fq.get(q, ids["s"]).state == "cancelled"
    w = fq.get(q, ids["w"])
    assert w.state == "cancelled"
    assert w.last_error == f"cancelled: dependency {ids['s']} is cancelled"
    assert (out.cancelled, out.finished) == (2, 1)


@pytest.mark.parametrize("running", [False, True])
def test_a_cancelled_step_gives_its_key_slot_to_the_next_held_job(db, running):
    from django_fq.exceptions import ReceiptCancelled

    q = "tatk:k"
    fq.configure(q, key_concurrency=1)
    wf = Workflow()
    a = wf.step(q, "a", name="a", concurrency_key="K")
    wf.step(q, "b", name="b", after=[a], concurrency_key="K")
    ids = wf.enqueue()
    lease = claim_one(q) if running else None
    outside = fq.enqueue(q, "outside", concurrency_key="K")
    assert Job.objects.get(uid=outside.id).state == "held"  # the key's one slot is a's
    out = workflows.cancel(q, ids["b"])
    assert (out.cancelled, out.finished) == (2, 0)
    check_key_counts(q)
    _check_counters(q)
    got = claim_one(q)
    assert got.id == outside.id
    if lease is not None:
        with pytest.raises(ReceiptCancelled):
            fq.ack(q, lease.receipt)


@pytest.mark.parametrize("policy", ["cancel", "run", "wait"])
def test_a_step_after_one_that_a_later_queue_call_cancels_at_once(db, monkeypatch, policy):
    """Queue ``a`` is written first; its step ``x`` is after ``y`` of queue ``b``, which a dead job cancels."""

    def scenario(p):
        fq.configure(p + "a")
        dead = _dead(p + "x")
        wf = Workflow()
        first = wf.step(p + "a", "first", name="first")
        y = wf.step(p + "b", "y", name="y", after=[dead, first], on_failure=policy)
        x = wf.step(p + "a", "x", name="x", after=[y], on_failure=policy)
        wf.step(p + "b", "z", name="z", after=[x, y], on_failure="run")
        return wf, {"dead": dead}

    differential(monkeypatch, scenario, cancel_step="first")


@pytest.mark.parametrize("policy", ["wait", "run"])
def test_a_dead_batch_member_of_a_cancelled_workflow(db, monkeypatch, policy):
    def scenario(p):
        fq.configure(p + "a", max_attempts=1)
        bt = batches.create(p + "a", callback={"queue": p + "cb", "payload": "done"})
        wf = Workflow()
        a = wf.step(p + "a", "a", name="a", batch=bt.id)
        b = wf.step(p + "a", "b", name="b", after=[a], on_failure=policy, batch=bt.id)
        wf.step(p + "b", "c", name="c", after=[b], on_failure=policy)
        return wf, {}

    def after(p, ids):
        batches.seal(batches_of(p)[0])
        got = claim_one(p + "a")
        assert got.id == ids["a"]
        fq.nack(p + "a", got.receipt, error="boom")

    got = differential(monkeypatch, scenario, cancel_step="c", after=after)
    jobs = got["after_cancel"]["jobs"]
    assert jobs["a"][1] == "cancelled"
    assert "?done" in jobs and "?done+" not in jobs  # the batch's callback, once
    assert got["after"]["batches"] == [("sealed", 2, 0, 1, 0, False)]
    # The dead member now counts as cancelled; the batch finished once.
    assert got["after_cancel"]["batches"] == [("finished", 2, 0, 0, 2, True)]


@pytest.mark.django_db(transaction=True)
def test_two_workflows_over_the_same_queues_in_opposite_orders_both_write():
    import threading

    from django.db import connection

    qa, qb = "tatk:oa", "tatk:ob"
    fq.configure(qa)
    fq.configure(qb)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    made: list[dict] = []

    def write(first, second):
        try:
            for i in range(10):
                wf = Workflow()
                prev = wf.step(first, i, name="s0")
                for j in range(1, 6):
                    prev = wf.step((first, second)[j % 2], j, name=f"s{j}", after=[prev])
                barrier.wait(30)
                made.append(wf.enqueue())
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=order) for order in ((qa, qb), (qb, qa))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(made) == 20
    for ids in made:
        got = dict(Job.objects.filter(uid__in=list(ids.values())).values_list("uid", "state"))
        assert got[ids["s0"]] == "queued" and sorted(got.values()).count("waiting") == 5
    for queue in (qa, qb):
        _check_counters(queue)


def test_a_step_after_a_step_and_an_existing_job_is_released_by_both_acks(db):
    q, other = "tatk:r1", "tatk:r2"
    fq.configure(q)
    fq.configure(other)
    outside = fq.enqueue(other, "outside")
    wf = Workflow()
    a = wf.step(q, "a", name="a")
    wf.step(q, "b", name="b", after=[a, outside.id])
    ids = wf.enqueue()
    fq.ack(other, claim_one(other).receipt)
    assert fq.get(q, ids["b"]).state == "waiting"
    got = claim_one(q)
    assert got.id == ids["a"]
    fq.ack(q, got.receipt)
    assert claim_one(q).id == ids["b"]
