"""A Hypothesis state machine: random sequences of every verb against the real database and a model.

Each step runs one verb through :mod:`django_fq.services` (on SQLite or
PostgreSQL, whichever ``FQ_TEST_DB`` picks; django-fq owns its transactions,
as in production) and the same verb on the in-memory model of
:mod:`tests.property.model`, written from docs/reference/semantics.md §2–6 and §9. The step passes when
both answer the same — return values field by field, or the same error code —
and after every step the invariants compare the whole database with the model:

* every job's stored state, attempts, run_at, priority, generation, history,
  result and payload; every lease (exactly one per running job, same deadline);
  every idempotency token and its expiry;
* ``stats``: counts per state, every total, wait/run time sums and counts, and
  the internal counters the queue-full limits use;
* receipts of ended leases: none is accepted (``extend`` must refuse them).

Listing (``jobs``, in claim order, page by page) is a step of its own. The
steps are drawn with weights (``OPS``); a test that ends with too few of the
outcomes it is about (``MUST_SEE``: replays, expiries, queue-full, cancelled
receipts, …) fails, so a change that starves a path cannot pass silently.

The database clock is frozen (a constant in the clock SQL) and moved only by
the test setting ``FQ_TEST_CLOCK_OFFSET_MS``, inside the SQL expression, so
the model knows "now" to the millisecond and the exact-deadline rule (a lease
is valid strictly before its deadline) is tested at deadline − 1 and deadline.

Fast tier: a fixed number of derandomized examples (repeatable in CI). The
``slow`` tier runs many random ones; ``FQ_PROPERTY_EXAMPLES`` /
``FQ_PROPERTY_STEPS`` raise both for a local soak. On failure Hypothesis prints
the shrunk sequence of steps.
"""

from __future__ import annotations

import collections
import json
import os
import string

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from django_fq import conf
from django_fq import db as fqdb
from django_fq import services as fq
from django_fq.exceptions import FqError
from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter
from django_fq.services._base import counter_sums

from .model import NEW, TIMINGS, TOTALS, Model, Refused

QUEUES = ("pm.a", "pm.b")
MAX_JOBS = 5  # FQ_MAX_JOBS_PER_QUEUE in this test: the queue-full path is reached often
MAX_TOKENS = 4  # FQ_MAX_TOKENS_PER_QUEUE
TOKENS = ("t1", "t2", "t3")
KEYS = ("k1", "k2")
#: What the steps saw (verb: outcome -> times), to show the run reached what it claims to test.
SEEN: collections.Counter = collections.Counter()
SECRET_ALPHABET = string.ascii_letters + string.digits + "-_"

#: Each step runs one of these verbs; an op listed n times is drawn n times as often
#: (and Hypothesis favours the first entry a little).
OPS = (
    ["time_passes"] * 3 + ["claim"] * 4 + ["ack"] * 4 + ["nack"] * 4 + ["release"] * 2 + ["extend"] * 2
    + ["enqueue"] * 5 + ["enqueue_many"] * 2 + ["repeat_a_settle"] * 3 + ["forged_receipt"] * 2 + ["repair"] * 5
    + ["list_jobs"] + ["prune"] * 2 + ["reconfigure"] + ["bad_input"] + ["race_the_deadline"] * 3
    + ["cancel_while_running"] * 2 + ["fill_the_queue"] + ["work"] * 6 + ["reap"] * 3
)  # fmt: skip
#: Ops that need a receipt (or a recorded settle) to act on.
NEEDS_RECEIPT = frozenset({"ack", "nack", "release", "extend", "forged_receipt"})
#: Ops that need a live lease.
NEEDS_LEASE = frozenset({"race_the_deadline", "cancel_while_running"})
FORGERIES = [
    "secret", "generation+1", "generation-1", "generation0", "generation-huge", "other-job", "truncated",
    "uppercase", "prefix", "extra-part", "nul", "newline", "empty", "spaces",
]  # fmt: skip
BAD_INPUTS = [
    "claim.count0", "claim.count1001", "claim.visibility0", "claim.visibility-big", "claim.unknown-queue",
    "enqueue.delay-1", "enqueue.delay+at", "enqueue.priority-big", "enqueue.nan", "enqueue.queue-name",
    "enqueue.token-long", "enqueue.key-nul", "nack.delay-1", "nack.delay-big", "extend.visibility0",
    "ack.result-nan", "ack.result-too-big", "jobs.count0", "reap.limit0", "configure.attempts0",
]  # fmt: skip


@st.composite
def policies(draw) -> dict:
    """A valid queue policy with small numbers, so that limits, backoffs and deadlines are reached."""
    backoff = draw(st.sampled_from([0, 1, 100, 1000]))
    return {
        "concurrency": draw(st.sampled_from([0, 0, 1, 2, 3])),
        "max_attempts": draw(st.integers(1, 4)),
        "backoff_ms": backoff,
        "max_backoff_ms": backoff + draw(st.sampled_from([0, 500, 5000])),
        "visibility_ms": draw(st.sampled_from([1, 1000, 30_000, 30_000])),
        "idempotency_retention_ms": draw(st.sampled_from([1, 1000, 10_000, 300_000])),
        "timeout_ms": draw(st.sampled_from([0, 0, 0, 500, 2000])),
    }


envelopes = st.fixed_dictionaries(
    {"payload": st.one_of(st.integers(-5, 5), st.dictionaries(st.sampled_from("ab"), st.integers(0, 3), max_size=2))},
    optional={
        "priority": st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]),
        "delay_ms": st.sampled_from([0, 1, 100, 1000, 5000]),
        "idempotency": st.sampled_from(TOKENS),
        "idempotency_retention_ms": st.sampled_from([1, 500, 5000]),
        "unique_key": st.sampled_from(KEYS),
        "max_attempts": st.integers(1, 3),
        "timeout_ms": st.sampled_from([0, 300, 3000]),
    },
)


def real(fn):
    """``("ok", value)`` or ``("err", code)`` of a call to django-fq; any other exception fails the test."""
    try:
        return ("ok", fn())
    except FqError as exc:
        return ("err", exc.code)


def settled(res) -> tuple:
    return (res.id, res.state, res.run_at, res.replay)


def info(res) -> tuple:
    return (res.id, res.state, res.attempts)


class QueueMachine(RuleBasedStateMachine):
    """Drives the services and the model side by side (see the module docstring)."""

    def __init__(self, start: int):
        super().__init__()
        self.start = start
        self._set_offset(0)
        with connection.cursor() as cur:
            for model in (Lease, IdempotencyToken, QueueCounter, Job, Queue):
                cur.execute(f"DELETE FROM {model._meta.db_table}")
        self.model = Model(start, max_jobs=MAX_JOBS, max_tokens=MAX_TOKENS)
        self.receipts: list[tuple[str, str]] = []  # (queue, receipt) of every claim, oldest first
        self.ended: list[tuple[str, str]] = []  # (queue, receipt) whose lease ended, in the order they ended
        self.settles: list[tuple[str, str, str, dict]] = []  # (op, queue, receipt, kwargs) of settle calls

    # --- plumbing ------------------------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.model.now

    def expect(self, fn):
        """Run ``fn(model copy)``; return (answer, copy). A refusal keeps the model as it was."""
        trial = self.model.copy()
        try:
            return ("ok", fn(trial)), trial
        except Refused as refused:
            return ("err", refused.code), self.model

    def check(self, expected, actual, what: str):
        assert expected == actual, f"{what}: model says {expected!r}, django-fq says {actual!r}"

    def _match_ids(self, expected: list[tuple], actual: list[tuple], trial: Model, what: str) -> None:
        """Compare ``(id, created)`` lists where the model's new jobs have placeholder ids; then rename them."""
        assert len(expected) == len(actual), (what, expected, actual)
        mapping: dict[str, str] = {}
        for (eid, ecreated), (aid, acreated) in zip(expected, actual, strict=True):
            assert ecreated == acreated, f"{what}: created model={expected} real={actual}"
            if eid.startswith(NEW):
                assert mapping.setdefault(eid, aid) == aid, f"{what}: one new job got two ids: {actual}"
                assert aid not in trial.jobs and aid not in trial.pruned, f"{what}: reused id {aid}"
            else:
                assert eid == aid, f"{what}: model={expected} real={actual}"
        assert len(set(mapping.values())) == len(mapping), f"{what}: two new jobs share an id: {actual}"
        for placeholder, real_id in mapping.items():
            trial.rename(placeholder, real_id)

    def pick_job(self, data, verb: str) -> tuple[str, str]:
        """(queue, job id): mostly a job ``verb`` applies to, else any job, or a pruned, unknown or malformed id."""
        m = self.model
        jobs = m.by_seq()  # never ordered by id: ids are random, the draws must not depend on them
        fits = {
            "retry": lambda j: j.state == "dead",
            "requeue": lambda j: m.reported(j) == "scheduled",
            "cancel": lambda j: True,
            "get": lambda j: True,
        }[verb]
        groups = [
            *[[j.id for j in jobs if fits(j)]] * 3,
            [j.id for j in jobs if j.state == "running"],
            [j.id for j in jobs],
            [*m.pruned, "0" * 32, "not-a-job-id"],
        ]
        group = data.draw(st.sampled_from([g for g in groups if g]), label="kind of job")
        job_id = data.draw(st.sampled_from(group), label="job")
        queue = m.jobs[job_id].queue if job_id in m.jobs else QUEUES[0]
        if data.draw(st.integers(0, 9), label="other queue?") == 0:
            queue = QUEUES[1] if queue == QUEUES[0] else QUEUES[0]
        return queue, job_id

    def live_receipts(self) -> list[tuple[str, str]]:
        live = {j.lease.receipt for j in self.model.jobs.values() if j.lease is not None}
        return [(q, r) for q, r in self.receipts if r in live]

    def pick_receipt(self, data) -> tuple[str, str]:
        """(queue, receipt): mostly a live one, else one of the last to end, else any ever issued."""
        live = self.live_receipts()
        groups = [live] * 4 + [self.ended[-3:], self.receipts]
        group = data.draw(st.sampled_from([g for g in groups if g]), label="kind of receipt")
        queue, receipt = data.draw(st.sampled_from(group), label="receipt")
        if data.draw(st.integers(0, 19), label="other queue?") == 0:
            queue = QUEUES[1] if queue == QUEUES[0] else QUEUES[0]
        return queue, receipt

    # --- setup -----------------------------------------------------------------------------------

    @initialize(pa=policies(), pb=policies())
    def configure_queues(self, pa, pb):
        for name, pol in zip(QUEUES, (pa, pb), strict=True):
            expected, trial = self.expect(lambda m, name=name, pol=pol: m.configure(name, pol))
            got = real(lambda name=name, pol=pol: fq.configure(name, **pol).__dict__)
            self.check(expected, got, f"configure {name}")
            self.model = trial
        self.queue_ids = dict(Queue.objects.filter(name__in=QUEUES).values_list("name", "id"))

    # --- the one rule: a step runs one verb, drawn with the weights of OPS -----------------------------

    @rule(data=st.data())
    def step(self, data):
        ops = [
            op for op in OPS
            if not (op in NEEDS_RECEIPT and not self.receipts)
            and not (op == "repeat_a_settle" and not self.settles)
            and not (op in NEEDS_LEASE and not self.live_receipts())
        ]  # fmt: skip
        op = data.draw(st.sampled_from(ops), label="op")
        SEEN[f"op {op}"] += 1
        live = set(self.live_receipts())
        getattr(self, f"do_{op}")(data)
        still = set(self.live_receipts())
        self.ended += [qr for qr in self.receipts if qr in live and qr not in still]

    # --- producing ------------------------------------------------------------------------------------

    def do_enqueue(self, data):
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        env = data.draw(envelopes, label="env")
        use_at = data.draw(st.booleans(), label="use_at")
        env = dict(env)
        if use_at and "delay_ms" in env:
            env["at"] = self.now + data.draw(st.sampled_from([-1000, -1, 0, 1, 2000]), label="at - now")
            del env["delay_ms"]
        self._enqueue(queue, env)

    def _enqueue(self, queue: str, env: dict) -> None:
        env = dict(env)
        expected, trial = self.expect(lambda m: m.enqueue(queue, env))
        payload = env.pop("payload")
        got = real(lambda: fq.enqueue(queue, payload, **env))
        SEEN["enqueue: " + (expected[1] if expected[0] == "err" else "created" if expected[1][1] else "duplicate")] += 1
        if expected[0] == "ok" and got[0] == "ok":
            self._match_ids([expected[1]], [(got[1].id, got[1].created)], trial, f"enqueue {queue}")
        else:
            self.check(expected, got, f"enqueue {queue} {payload!r} {env}")
        self.model = trial

    def do_enqueue_many(self, data):
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        items = data.draw(st.lists(envelopes, min_size=1, max_size=4), label="items")
        self._enqueue_many(queue, items)

    def _enqueue_many(self, queue: str, items: list[dict]) -> None:
        def batch(m: Model):
            return [m.enqueue(queue, dict(it)) for it in items]

        expected, trial = self.expect(batch)
        got = real(lambda: [(r.id, r.created) for r in fq.enqueue_many(queue, items)])
        SEEN["enqueue_many: " + (expected[1] if expected[0] == "err" else "ok")] += 1
        if expected[0] == "ok" and got[0] == "ok":
            self._match_ids(expected[1], got[1], trial, f"enqueue_many {queue}")
        else:
            self.check(expected, got, f"enqueue_many {queue} {items}")
        self.model = trial

    def do_fill_the_queue(self, data):
        """Enqueue plain jobs until the queue is full (docs/reference/semantics.md §3, §9): a batch one job too big, then one by one.

        The batch is refused whole; single enqueues succeed until the limit,
        the next one is refused with ``queue_full`` and changes nothing.
        """
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        room = max(0, MAX_JOBS - self.model.active(queue))
        self._enqueue_many(queue, [{"payload": {"fill": i}} for i in range(room + 1)])
        for i in range(room + 1):
            self._enqueue(queue, {"payload": {"fill": i}})

    # --- consuming ------------------------------------------------------------------------------

    def do_claim(self, data):
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        count = data.draw(st.integers(1, 4), label="count")
        visibility = data.draw(st.sampled_from([None, None, 1, 100, 1000, 60_000]), label="visibility")
        self._claim(queue, count, visibility)

    def _claim(self, queue: str, count: int, visibility: int | None) -> None:
        expected, trial = self.expect(lambda m: m.claim(queue, count, visibility))
        for name in ("expired", "timed_out", "dead"):
            SEEN[f"claim reaped: {name}"] += trial.queues[queue].totals[name] - self.model.queues[queue].totals[name]
        got = real(lambda: fq.claim(queue, count=count, visibility_ms=visibility))
        if got[0] == "ok":
            jobs = got[1]
            got = (
                "ok",
                [
                    {
                        "id": j.id, "payload": j.payload, "deadline": j.deadline, "attempts": j.attempts,
                        "max_attempts": j.max_attempts, "priority": j.priority, "enqueued_at": j.enqueued_at,
                        "claimed_at": j.claimed_at, "generation": int(j.receipt.split(".")[2]),
                    }
                    for j in jobs
                ],
            )  # fmt: skip
        self.check(expected, got, f"claim {queue} count={count} visibility={visibility}")
        SEEN["claim: " + ("jobs" if got[0] == "ok" and got[1] else "none")] += 1
        if got[0] == "ok":
            for j in jobs:
                assert j.receipt.startswith(f"fq1.{j.id}."), "receipt shape"
                assert j.queue == queue
                trial.leased(j.id, j.receipt)
                self.receipts.append((queue, j.receipt))
        self.model = trial

    def _settle(self, op: str, queue: str, receipt: str, kwargs: dict):
        verbs = {
            "ack": (lambda m: m.ack(queue, receipt, kwargs.get("result")), lambda: settled(fq.ack(queue, receipt, **kwargs))),
            "nack": (
                lambda m: m.nack(queue, receipt, kwargs.get("delay_ms"), kwargs.get("error"), kwargs.get("permanent", False)),
                lambda: settled(fq.nack(queue, receipt, **kwargs)),
            ),
            "release": (lambda m: m.release(queue, receipt, kwargs.get("error")), lambda: settled(fq.release(queue, receipt, **kwargs))),
            "extend": (
                lambda m: m.extend(queue, receipt, kwargs["visibility_ms"]),
                lambda: fq.extend(queue, receipt, **kwargs),
            ),
        }  # fmt: skip
        model_fn, real_fn = verbs[op]
        held = next((j.lease for j in self.model.jobs.values() if j.lease and j.lease.receipt == receipt), None)
        if held is not None and held.deadline - self.now in (0, 1):
            SEEN["settle at the deadline" if held.deadline == self.now else "settle 1 ms before the deadline"] += 1
        expected, trial = self.expect(model_fn)
        got = real(real_fn)
        SEEN[f"{op}: " + (expected[1] if expected[0] == "err" else "replay" if op != "extend" and expected[1][3] else "ok")] += 1
        if expected[0] == "ok" and op in ("nack", "release"):
            SEEN[f"{op} -> {expected[1][1]}"] += 1
        self.check(expected, got, f"{op} {queue} {kwargs}")
        self.model = trial
        if op != "extend" and expected[0] == "ok" and not expected[1][3]:
            self.settles.append((op, queue, receipt, kwargs))  # a settle that took effect, to repeat later
        return got

    def do_work(self, data):
        """A worker's round: claim, then settle each job it got (or leave its lease to expire).

        Some settles are sent twice (a retried request: the second is a
        replay), and a job made dead is sometimes retried at once.
        """
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        before = len(self.receipts)
        self._claim(queue, data.draw(st.integers(1, 2), label="count"), None)
        for queue, receipt in self.receipts[before:]:
            outcome = data.draw(
                st.sampled_from(
                    ["ack", "ack twice", "nack", "nack twice", "later", "dead", "dead, retry", "dead, retry", "release", "leave"]
                ),
                label="outcome",
            )
            verb, kwargs = {
                "ack": ("ack", {"result": {"done": True}}),
                "nack": ("nack", {"error": "failed"}),
                "later": ("nack", {"error": "try later", "delay_ms": 1000}),
                "dead": ("nack", {"error": "failed", "permanent": True}),
                "release": ("release", {}),
                "leave": (None, {}),
            }[outcome.split()[0].rstrip(",")]
            if verb is None:
                continue
            self._settle(verb, queue, receipt, kwargs)
            if outcome.endswith("twice"):
                self._settle(verb, queue, receipt, kwargs)
            if outcome.endswith("retry"):
                self._repair("retry", queue, receipt.split(".")[1])

    def do_ack(self, data):
        result = data.draw(st.one_of(st.none(), st.integers(0, 2), st.just({"ok": True})), label="result")
        queue, receipt = self.pick_receipt(data)
        self._settle("ack", queue, receipt, {} if result is None else {"result": result})

    def do_nack(self, data):
        delay = data.draw(st.one_of(st.none(), st.sampled_from([0, 1, 1000])), label="delay")
        error = data.draw(st.sampled_from([None, "", "boom", "x\x00y"]), label="error")
        permanent = data.draw(st.booleans(), label="permanent")
        queue, receipt = self.pick_receipt(data)
        kwargs = {"delay_ms": delay, "error": error}
        if permanent:
            kwargs["permanent"] = True
        self._settle("nack", queue, receipt, kwargs)

    def do_release(self, data):
        error = data.draw(st.sampled_from([None, "released", "bye"]), label="error")
        queue, receipt = self.pick_receipt(data)
        self._settle("release", queue, receipt, {"error": error})

    def do_extend(self, data):
        visibility = data.draw(st.sampled_from([1, 100, 1000, 10_000]), label="visibility")
        queue, receipt = self.pick_receipt(data)
        self._settle("extend", queue, receipt, {"visibility_ms": visibility})

    def do_cancel_while_running(self, data):
        """Cancel a running job; its receipt then says ``cancelled`` to every verb, and a second cancel is refused."""
        queue, receipt = data.draw(st.sampled_from(self.live_receipts()), label="lease")
        job = next(j for j in self.model.jobs.values() if j.lease and j.lease.receipt == receipt)
        self._repair("cancel", queue, job.id)
        op = data.draw(st.sampled_from(["ack", "nack", "release", "extend"]), label="verb")
        self._settle(op, queue, receipt, {"visibility_ms": 1000} if op == "extend" else {})
        self._repair("cancel", queue, job.id)

    def do_repeat_a_settle(self, data):
        """The very same call again (docs/reference/semantics.md §9): a replay while it is the job's last settle, else refused.

        With ``forge``, the receipt's generation is edited first: a forged
        receipt, not a repeat, so it is refused whatever it repeats.
        """
        forge = data.draw(st.sampled_from([None, None, 1, -1]), label="forge")
        recent = data.draw(st.booleans(), label="a recent one?")
        op, queue, receipt, kwargs = data.draw(
            st.sampled_from(self.settles[-3:] if recent else self.settles), label="settle to repeat"
        )
        if forge:
            prefix, uid, gen, secret = receipt.split(".")
            receipt = f"{prefix}.{uid}.{int(gen) + forge}.{secret}"
        self._settle(op, queue, receipt, kwargs)

    def do_forged_receipt(self, data):
        """A receipt made up from a real one: never accepted, never changes anything."""
        how = data.draw(st.sampled_from(FORGERIES), label="how")
        op = data.draw(st.sampled_from(["ack", "nack", "release", "extend"]), label="op")
        queue, receipt = self.pick_receipt(data)
        prefix, uid, gen, secret = receipt.split(".")
        ids = [j.id for j in self.model.by_seq()]
        forged = {
            "secret": lambda: f"{prefix}.{uid}.{gen}.{data.draw(st.text(SECRET_ALPHABET, min_size=43, max_size=43), label='secret')}",
            "generation+1": lambda: f"{prefix}.{uid}.{int(gen) + 1}.{secret}",
            "generation-1": lambda: f"{prefix}.{uid}.{int(gen) - 1}.{secret}",
            "generation0": lambda: f"{prefix}.{uid}.0{gen}.{secret}",
            "generation-huge": lambda: f"{prefix}.{uid}.{10**18 - 1}.{secret}",
            "other-job": lambda: f"{prefix}.{data.draw(st.sampled_from(ids), label='other id') if ids else '0' * 32}.{gen}.{secret}",
            "truncated": lambda: receipt[: data.draw(st.integers(0, len(receipt) - 1), label="cut")],
            "uppercase": lambda: f"{prefix}.{uid.upper()}.{gen}.{secret}",
            "prefix": lambda: f"fq2.{uid}.{gen}.{secret}",
            "extra-part": lambda: f"{receipt}.x",
            "nul": lambda: f"{receipt}\x00",
            "newline": lambda: f"{receipt}\n",
            "empty": lambda: "",
            "spaces": lambda: f" {receipt} ",
        }[how]()
        if forged != receipt:
            kwargs = {"visibility_ms": 1000} if op == "extend" else {}
            self._settle(op, queue, forged, kwargs)

    # --- repair --------------------------------------------------------------------------------

    def do_repair(self, data):
        verb = data.draw(st.sampled_from(["retry", "requeue", "cancel", "get"]), label="verb")
        queue, job_id = self.pick_job(data, verb)
        self._repair(verb, queue, job_id)

    def _repair(self, verb: str, queue: str, job_id: str) -> None:
        expected, trial = self.expect(lambda m: getattr(m, verb)(queue, job_id))
        got = real(lambda: info(getattr(fq, verb)(queue, job_id)))
        self.check(expected, got, f"{verb} {queue} {job_id}")
        SEEN[f"{verb}: " + (expected[1] if expected[0] == "err" else "ok")] += 1
        self.model = trial

    def do_list_jobs(self, data):
        """``jobs``: ready in claim order, scheduled by run_at then claim order; pages follow on (docs/reference/semantics.md §9)."""
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        state = data.draw(st.sampled_from(["ready", "scheduled"]), label="state")
        count = data.draw(st.sampled_from([1, 2, 1000]), label="count")
        listed, cursor = [], None
        while True:
            page = fq.jobs(queue, state=state, cursor=cursor, count=count)
            listed += [j.id for j in page.jobs]
            assert len(page.jobs) <= count
            cursor = page.next_cursor
            if cursor is None:
                break
        assert listed == self.model.claim_order(queue, state), f"{state} listing of {queue}"
        SEEN["jobs: listed"] += len(listed)

    # --- maintenance and time ------------------------------------------------------------------

    def do_reap(self, data):
        queue = data.draw(st.sampled_from([None, *QUEUES]), label="queue")
        expected, trial = self.expect(lambda m: m.reap(queue))
        got = real(lambda: tuple(fq.reap(queue).__dict__.values()))
        self.check(expected, got, f"reap {queue}")
        if got[0] == "ok":
            SEEN["reap: expired"] += got[1][0]
            SEEN["reap: timed out"] += got[1][1]
            SEEN["reap: dead"] += got[1][2]
        self.model = trial

    def do_prune(self, data):
        retention = data.draw(st.sampled_from([0, 1000, 10**9]), label="retention")
        expected, trial = self.expect(lambda m: m.prune(retention))
        # The model keeps jobs, tokens and queues; the registry's and the history's rows are not its business.
        got = real(lambda: tuple(fq.prune(retention_ms=retention).__dict__.values())[:3])
        self.check(expected, got, f"prune {retention}")
        SEEN["prune: jobs"] += got[1][0]
        SEEN["prune: tokens"] += got[1][1]
        self.model = trial

    def do_reconfigure(self, data):
        """Change some policy fields mid-run (max_attempts then applies to future jobs only)."""
        queue = data.draw(st.sampled_from(QUEUES), label="queue")
        pol = data.draw(policies(), label="pol")
        keys = data.draw(st.sets(st.sampled_from(sorted(pol)), max_size=3), label="fields")
        changes = {k: pol[k] for k in sorted(keys)}
        if "max_backoff_ms" in changes and data.draw(st.booleans(), label="invalid?"):
            changes["max_backoff_ms"] = -1 if changes["max_backoff_ms"] == 0 else 0
            changes["backoff_ms"] = max(1, changes.get("backoff_ms", 1))
        if not changes:
            return
        expected, trial = self.expect(lambda m: m.configure(queue, changes))
        got = real(lambda: fq.configure(queue, **changes).__dict__)
        self.check(expected, got, f"configure {queue} {changes}")
        SEEN["configure: " + (expected[1] if expected[0] == "err" else "ok")] += 1
        self.model = trial

    def do_race_the_deadline(self, data):
        """The clock reaches a lease's deadline, 1 ms before it, or 1 ms after it, and its holder acts.

        docs/reference/semantics.md §5: the lease is valid strictly before its deadline; at the exact
        deadline every use of the receipt is refused and changes nothing. One
        millisecond before it, the holder extends (always accepted); then the
        clock goes to the new deadline, or past it, and the holder tries again.
        """
        queue, receipt = data.draw(st.sampled_from(self.live_receipts()), label="lease")
        lease = next(j.lease for j in self.model.jobs.values() if j.lease and j.lease.receipt == receipt)
        if lease.deadline - 1 > self.now:
            self._move_clock(lease.deadline - 1 - self.now)
        if lease.deadline - 1 == self.now:
            self._settle("extend", queue, receipt, {"visibility_ms": data.draw(st.sampled_from([1, 2, 1000]), label="by")})
        job = next((j for j in self.model.jobs.values() if j.lease and j.lease.receipt == receipt), None)
        if job is None:
            return  # the extend found the lease ended (it cannot, but the model decides)
        target = job.lease.deadline + data.draw(st.sampled_from([0, 0, 1]), label="deadline +")
        self._move_clock(max(0, target - self.now))  # (a lease already past its deadline: no move)
        op = data.draw(st.sampled_from(["ack", "nack", "release", "extend"]), label="verb")
        kwargs = {"extend": {"visibility_ms": 1000}, "nack": {"delay_ms": 0}}.get(op, {})
        self._settle(op, queue, receipt, kwargs)

    @staticmethod
    def _set_offset(ms: int) -> None:
        # Set on the settings layer the frozen_start fixture overrides (and removes at
        # the end): one layer per move would nest thousands of override_settings.
        django_settings.FQ_TEST_CLOCK_OFFSET_MS = ms

    def _move_clock(self, ms: int) -> None:
        assert ms >= 0, "the clock never goes back"
        self.model.now += ms
        self._set_offset(self.model.now - self.start)
        assert fqdb.db_now_ms() == self.model.now

    def do_time_passes(self, data):
        """Move the database clock forward: by a step, or to an instant that matters (a deadline, a run_at)."""
        marks = set()
        for j in self.model.jobs.values():
            if j.lease is not None:
                marks |= {j.lease.deadline - 1, j.lease.deadline}
            if j.state == "queued":
                marks |= {j.run_at - 1, j.run_at}
        for q in self.model.queues.values():
            for _, expires in q.tokens.values():
                marks |= {expires - 1, expires}
        marks = sorted(m - self.now for m in marks if m > self.now)
        steps = [1, 7, 100, 1000, 5000, 60_000]
        if marks and data.draw(st.booleans(), label="to a mark?"):
            ms = data.draw(st.sampled_from(marks[:6]), label="advance ms")
            SEEN["time: to a mark"] += 1
        else:
            ms = data.draw(st.sampled_from(steps), label="advance ms")
            SEEN["time: a step"] += 1
        self._move_clock(ms)

    def do_bad_input(self, data):
        """Input the contract refuses: the named error, and nothing changes (the invariants check that)."""
        bad = data.draw(st.sampled_from(BAD_INPUTS), label="bad")
        live = self.live_receipts()
        receipt = data.draw(st.sampled_from(live), label="receipt")[1] if live else "fq1.x"
        q = data.draw(st.sampled_from(QUEUES), label="queue")
        calls = {
            "claim.count0": (lambda: fq.claim(q, count=0), "count_out_of_range"),
            "claim.count1001": (lambda: fq.claim(q, count=1001), "count_out_of_range"),
            "claim.visibility0": (lambda: fq.claim(q, visibility_ms=0), "visibility_out_of_range"),
            "claim.visibility-big": (lambda: fq.claim(q, visibility_ms=86_400_001), "visibility_out_of_range"),
            "claim.unknown-queue": (lambda: fq.claim("pm.none"), "queue_not_found"),
            "enqueue.delay-1": (lambda: fq.enqueue(q, 1, delay_ms=-1), "invalid_delay"),
            "enqueue.delay+at": (lambda: fq.enqueue(q, 1, delay_ms=1, at=self.now), "delay_and_at"),
            "enqueue.priority-big": (lambda: fq.enqueue(q, 1, priority=2**31), "invalid"),
            "enqueue.nan": (lambda: fq.enqueue(q, float("nan")), "invalid_json"),
            "enqueue.queue-name": (lambda: fq.enqueue("pm a", 1), "invalid_queue_name"),
            "enqueue.token-long": (lambda: fq.enqueue(q, 1, idempotency="t" * 256), "invalid"),
            "enqueue.key-nul": (lambda: fq.enqueue(q, 1, unique_key="k\x00"), "invalid"),
            "nack.delay-1": (lambda: fq.nack(q, receipt, delay_ms=-1), "invalid_delay"),
            "nack.delay-big": (lambda: fq.nack(q, receipt, delay_ms=30 * 86_400_000 + 1), "invalid_delay"),
            "extend.visibility0": (lambda: fq.extend(q, receipt, visibility_ms=0), "visibility_out_of_range"),
            "ack.result-nan": (lambda: fq.ack(q, receipt, result=[float("inf")]), "invalid_json"),
            "ack.result-too-big": (lambda: fq.ack(q, receipt, result="x" * conf.max_payload_bytes()), "payload_too_large"),
            "jobs.count0": (lambda: fq.jobs(q, count=0), "count_out_of_range"),
            "reap.limit0": (lambda: fq.reap(q, limit=0), "invalid"),
            "configure.attempts0": (lambda: fq.configure(q, max_attempts=0), "invalid_policy"),
        }
        call, code = calls[bad]
        self.check(("err", code), real(call), bad)
        SEEN["bad input"] += 1

    # --- invariants -----------------------------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self):
        m = self.model
        jobs = {
            r["uid"]: r
            for r in Job.objects.filter(queue__name__in=QUEUES).values(
                "uid", "queue__name", "state", "attempts", "run_at", "generation", "max_attempts", "priority",
                "timeout_ms", "unique_key", "idempotency", "last_error", "errors", "result", "finished_at",
                "enqueued_at", "payload",
            )
        }  # fmt: skip
        assert sorted(jobs) == sorted(m.jobs), "the set of jobs differs"
        for job_id, j in m.jobs.items():
            row = jobs[job_id]
            want = {
                "queue__name": j.queue, "state": j.state, "attempts": j.attempts, "run_at": j.run_at,
                "generation": j.generation, "max_attempts": j.max_attempts, "priority": j.priority,
                "timeout_ms": j.timeout_ms, "unique_key": j.unique_key, "idempotency": j.token,
                "last_error": j.last_error, "result": j.result, "finished_at": j.finished_at,
                "enqueued_at": j.enqueued_at, "payload": json.dumps(j.payload, separators=(",", ":")),
                "errors": j.history,
            }  # fmt: skip
            have = {k: row[k] for k in want}
            have["errors"] = [(e["kind"], e["attempt"], e["error"]) for e in row["errors"]]
            assert have == want, f"job {job_id}: model {want} != database {have}"
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT j.uid, l.generation, l.claimed_at, l.deadline, l.timeout_at FROM {Lease._meta.db_table} l "
                f"JOIN {Job._meta.db_table} j ON j.seq = l.job_id"
            )
            leases = {r[0]: tuple(r[1:]) for r in cur.fetchall()}
            cur.execute(
                f"SELECT q.name, t.token, t.job_uid, t.expires_at FROM {IdempotencyToken._meta.db_table} t "
                f"JOIN {Queue._meta.db_table} q ON q.id = t.queue_id"
            )
            tokens = {(r[0], r[1]): (r[2], r[3]) for r in cur.fetchall()}
        want_leases = {
            j.id: (j.lease.generation, j.lease.claimed_at, j.lease.deadline, j.lease.timeout_at)
            for j in m.jobs.values()
            if j.lease is not None
        }
        assert leases == want_leases, "leases differ from the model"
        running = {uid for uid, r in jobs.items() if r["state"] == "running"}
        assert running == set(leases), "a lease exists exactly for each running job"
        want_tokens = {(q.name, t): tuple(v) for q in m.queues.values() for t, v in q.tokens.items()}
        assert tokens == want_tokens, "idempotency tokens differ from the model"

    @invariant()
    def stats_match_the_model(self):
        m = self.model
        for name in QUEUES:
            st_ = fq.stats(name)
            assert st_.counts == m.counts(name), f"counts of {name}"
            totals = {k: st_.totals[k] for k in TOTALS} | {k: getattr(st_, k) for k in TIMINGS}
            assert totals == m.queues[name].totals, f"totals of {name}"
            internal = counter_sums(connection, self.queue_ids[name], ("active", "token_rows"))
            assert internal == {"active": m.active(name), "token_rows": len(m.queues[name].tokens)}, name

    @invariant()
    def ended_receipts_are_refused(self):
        """The receipt whose lease ended last: extend refuses it (a cancelled job's distinctly), now and later."""
        if not self.ended:
            return
        queue, receipt = self.ended[-1]
        expected, _ = self.expect(lambda m: m.extend(queue, receipt, 1000))
        assert expected[0] == "err", expected
        self.check(expected, real(lambda: fq.extend(queue, receipt, visibility_ms=1000)), "extend of an ended lease")


# --- the tests -------------------------------------------------------------------------------------


@pytest.fixture
def frozen_start(monkeypatch):
    """Freeze the database clock (a constant in the clock SQL, plus the test offset); return its start.

    Also sets this test's queue limits. The settings are one ``override_settings``
    layer for the whole test; the machine moves the clock by changing
    ``FQ_TEST_CLOCK_OFFSET_MS`` on that layer.
    """
    with override_settings(
        FQ_TEST_CLOCK_OFFSET_MS=0, FQ_MAX_JOBS_PER_QUEUE=MAX_JOBS, FQ_MAX_TOKENS_PER_QUEUE=MAX_TOKENS
    ):
        start = fqdb.db_now_ms()
        # A parenthesized integer literal: every backend reads it as a 64-bit integer (a ms epoch
        # is past int4, so PostgreSQL types it bigint), where ``CAST(… AS BIGINT)`` is
        # PostgreSQL/SQLite spelling that MariaDB/MySQL refuse (they cast to SIGNED).
        monkeypatch.setattr(fqdb, "now_sql", lambda conn=None: f"({start + conf.clock_offset_ms():d})")
        assert fqdb.db_now_ms() == start
        yield start


def _run(start: int, *, examples: int, steps: int, derandomize: bool, fresh: bool = True) -> None:
    if fresh:
        SEEN.clear()
    run_state_machine_as_test(
        lambda: QueueMachine(start),
        settings=hsettings(
            max_examples=int(os.environ.get("FQ_PROPERTY_EXAMPLES", examples)),
            stateful_step_count=int(os.environ.get("FQ_PROPERTY_STEPS", steps)),
            deadline=None,
            derandomize=derandomize,
            database=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        ),
    )


#: Outcomes a run must have reached, or it proved less than it claims.
MUST_SEE = (
    "enqueue: created", "enqueue: duplicate", "enqueue: queue_full", "enqueue_many: ok", "claim: jobs",
    "ack: ok", "ack: replay", "ack: invalid_receipt", "nack -> scheduled", "nack -> dead", "nack: replay",
    "release: ok", "extend: ok", "extend: invalid_receipt", "receipt of a cancelled job", "retry: ok",
    "retry: invalid_state", "requeue: ok", "cancel: ok", "cancel: invalid_state", "get: job_not_found",
    "lease expired", "prune: jobs", "prune: tokens", "time: to a mark", "bad input",
    "settle at the deadline", "settle 1 ms before the deadline",
)  # fmt: skip


def _missing() -> list[str]:
    SEEN["lease expired"] = SEEN["reap: expired"] + SEEN["claim reaped: expired"]
    SEEN["receipt of a cancelled job"] = sum(n for k, n in SEEN.items() if k.endswith(": cancelled"))
    return [name for name in MUST_SEE if not SEEN[name]]


@pytest.mark.django_db(transaction=True)
def test_random_sequences_of_verbs_match_the_model(frozen_start):
    _run(frozen_start, examples=25, steps=40, derandomize=True)  # every MUST_SEE outcome is reached at 25
    print("outcomes seen:", dict(sorted(SEEN.items())))
    assert _missing() == [], sorted(SEEN.items())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_many_random_sequences_of_verbs_match_the_model(frozen_start):
    # Random runs of 40 examples now and then reach every outcome but one (a lease expiring is the
    # rarest): explore further, in more random rounds, until each is reached, at most 5 rounds.
    # Every round's sequences must match the model; the run must still reach every outcome.
    for round_ in range(5):
        _run(frozen_start, examples=40, steps=40, derandomize=False, fresh=round_ == 0)  # FQ_PROPERTY_EXAMPLES=500: longer
        if not _missing():
            break
    print("outcomes seen:", dict(sorted(SEEN.items())), "rounds:", round_ + 1)
    assert _missing() == [], sorted(SEEN.items())
