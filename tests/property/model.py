"""An in-memory model of django-fq's contract (docs/reference/semantics.md §2–6, §9), for the state-machine test.

It knows nothing of the database: it keeps queues, jobs, leases, idempotency
tokens and totals as plain Python objects, with a clock that only moves when
the test moves it (the test freezes the database clock at the same instant).
Every verb answers what docs/reference/semantics.md says the real one must answer:

* ``("ok", value)`` — the normalised return value, or
* ``("err", code)`` — the :class:`~django_fq.exceptions.FqError` code it must raise,

and changes the model's state exactly as the real verb must change the
database. Ids are not predictable, so a job an enqueue creates gets a
placeholder id (``"<new>N"``) and the test gives it the id the real call
returned with :meth:`Model.rename`.

The model is written from docs/reference/semantics.md, not from the code: where the two differ the
test fails, and one of them is wrong.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

#: Placeholder id of a job an enqueue creates (the real id is random).
NEW = "<new>"
#: Every reported state; the machine enqueues no dependencies, so ``waiting`` stays 0 in the model
#: (dependencies have their own tests: tests/services/test_dependencies.py).
STATES = ("waiting", "scheduled", "ready", "running", "succeeded", "dead", "cancelled")
TOTALS = (
    "enqueued", "deduplicated", "claimed", "acked", "nacked", "released",
    "expired", "timed_out", "retried", "cancelled", "dead",
)  # fmt: skip
TIMINGS = ("wait_ms_sum", "wait_count", "run_ms_sum", "run_count")
MAX_ERROR_BYTES = 64 * 1024


class Refused(Exception):
    """Raised inside the model when a verb must fail with ``code`` (and change nothing)."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


@dataclass
class Policy:
    concurrency: int = 0
    max_attempts: int = 25
    backoff_ms: int = 1000
    max_backoff_ms: int = 3_600_000
    visibility_ms: int = 30_000
    idempotency_retention_ms: int = 300_000
    timeout_ms: int = 0
    # Flow-control fields the machine leaves at their defaults (their own tests exercise them).
    ttl_ms: int = 0
    key_concurrency: int = 0
    rate_limit: int = 0
    rate_window_ms: int = 1000
    key_rate_limit: int = 0


@dataclass
class Lease:
    receipt: str
    generation: int
    claimed_at: int
    deadline: int
    timeout_at: int | None


@dataclass
class Settle:
    """The last settle of a lease of a job: what a repeat of it is compared with."""

    receipt: str
    op: str  # ack / nack / release / cancel / expire
    args: tuple | None
    outcome: dict


@dataclass
class MJob:
    id: str
    queue: str
    seq: int
    payload: Any
    priority: int
    run_at: int
    enqueued_at: int
    max_attempts: int
    timeout_ms: int
    unique_key: str | None
    token: str | None
    state: str = "queued"  # stored: queued / running / succeeded / dead / cancelled
    attempts: int = 0
    generation: int = 0
    lease: Lease | None = None
    settled: Settle | None = None
    finished_at: int | None = None
    result: str | None = None
    last_error: str = ""
    history: list = field(default_factory=list)  # (kind, attempt, error)


@dataclass
class MQueue:
    name: str
    policy: Policy
    totals: dict = field(default_factory=lambda: dict.fromkeys(TOTALS + TIMINGS, 0))
    tokens: dict = field(default_factory=dict)  # token -> [job id, expires_at]


def error_text(value) -> str:
    """What the engine stores for an error message (docs/reference/semantics.md §9: capped at 64 KiB)."""
    if value is None:
        return ""
    data = value.replace("\x00", "\\0").encode("utf-8", "replace")
    if len(data) > MAX_ERROR_BYTES:
        return data[: MAX_ERROR_BYTES - 16].decode("utf-8", "ignore") + "\n…[truncated]"
    return data.decode("utf-8")


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Model:
    """The contract's view of a set of queues. ``now`` is the database clock (epoch ms)."""

    def __init__(self, now: int, *, max_jobs: int, max_tokens: int):
        self.now = now
        self.max_jobs = max_jobs
        self.max_tokens = max_tokens
        self.queues: dict[str, MQueue] = {}
        self.jobs: dict[str, MJob] = {}  # every job not pruned, by id
        self.pruned: list[str] = []  # ids of pruned jobs, in the order they were pruned
        self._seq = 0

    # --- helpers ------------------------------------------------------------------------

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def by_seq(self) -> list[MJob]:
        """Every job in enqueue order."""
        return sorted(self.jobs.values(), key=lambda j: j.seq)

    def reported(self, job: MJob) -> str:
        if job.state == "queued":
            return "scheduled" if job.run_at > self.now else "ready"
        return job.state

    def queue(self, name: str) -> MQueue:
        if name not in self.queues:
            raise Refused("queue_not_found")
        return self.queues[name]

    def jobs_of(self, queue: str) -> list[MJob]:
        return [j for j in self.jobs.values() if j.queue == queue]

    def active(self, queue: str) -> int:
        return sum(1 for j in self.jobs_of(queue) if j.state in ("queued", "running"))

    def counts(self, queue: str) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        for j in self.jobs_of(queue):
            out[self.reported(j)] += 1
        return out

    def claim_order(self, queue: str, state: str) -> list[str]:
        """Ids of ``queue``'s jobs in ``state`` (ready or scheduled) in listing order (docs/reference/semantics.md §9)."""
        picked = [j for j in self.jobs_of(queue) if self.reported(j) == state]
        if state == "ready":
            picked.sort(key=lambda j: (-j.priority, j.seq))
        else:
            picked.sort(key=lambda j: (j.run_at, -j.priority, j.seq))
        return [j.id for j in picked]

    def backoff(self, pol: Policy, attempts: int) -> int:
        return min(pol.max_backoff_ms, pol.backoff_ms * 2 ** min(max(attempts - 1, 0), 62))

    def live_token(self, q: MQueue, token: str):
        entry = q.tokens.get(token)
        return entry if entry is not None and entry[1] > self.now else None

    def _add_history(self, job: MJob, kind: str, error: str) -> None:
        job.history.append((kind, job.attempts, error))
        job.history = job.history[-100:]

    # --- queues ---------------------------------------------------------------------------

    def configure(self, name: str, changes: dict):
        q = self.queues.get(name)
        pol = copy.copy(q.policy) if q else Policy()
        for k, v in changes.items():
            setattr(pol, k, v)
        if pol.max_backoff_ms < pol.backoff_ms:
            raise Refused("invalid_policy")
        if q is None:
            self.queues[name] = q = MQueue(name, pol)
        q.policy = pol
        return dict(pol.__dict__)

    # --- enqueue ----------------------------------------------------------------------------

    def enqueue(self, queue: str, item: dict) -> tuple[str, bool]:
        """One envelope (already valid). Returns ``(id, created)``; a new job gets a placeholder id."""
        q = self.queues.get(queue) or self.queues.setdefault(queue, MQueue(queue, Policy()))
        token, key = item.get("idempotency"), item.get("unique_key")
        # 1. a live token returns its original job (even on a full queue, even if pruned)
        if token is not None:
            live = self.live_token(q, token)
            if live is not None:
                q.totals["deduplicated"] += 1
                return live[0], False
            if token not in q.tokens and len(q.tokens) + 1 > self.max_tokens:
                raise Refused("queue_full")
        retention = item.get("idempotency_retention_ms") or q.policy.idempotency_retention_ms
        # 2. unique_key coalesces onto an active job holding it
        if key is not None:
            holder = next(
                (j for j in self.jobs_of(queue) if j.unique_key == key and j.state in ("queued", "running")), None
            )
            if holder is not None:
                if token is not None:
                    q.tokens[token] = [holder.id, self.now + retention]
                q.totals["deduplicated"] += 1
                return holder.id, False
        # 3. the queue-full limit
        if self.active(queue) + 1 > self.max_jobs:
            raise Refused("queue_full")
        if item.get("at") is not None:
            run_at = item["at"]
        else:
            run_at = self.now + (item.get("delay_ms") or 0)
        self._seq += 1
        job = MJob(
            id=f"{NEW}{self._seq}",
            queue=queue,
            seq=self._seq,
            payload=item["payload"],
            priority=item.get("priority") or 0,
            run_at=run_at,
            enqueued_at=self.now,
            max_attempts=item.get("max_attempts") or q.policy.max_attempts,
            timeout_ms=q.policy.timeout_ms if item.get("timeout_ms") is None else item["timeout_ms"],
            unique_key=key,
            token=token,
        )
        self.jobs[job.id] = job
        if token is not None:
            q.tokens[token] = [job.id, self.now + retention]
        q.totals["enqueued"] += 1
        return job.id, True

    def rename(self, placeholder: str, real_id: str) -> None:
        """Give a NEW job (and the tokens pointing at it) the id the real enqueue returned."""
        job = self.jobs.pop(placeholder)
        job.id = real_id
        self.jobs[real_id] = job
        for q in self.queues.values():
            for entry in q.tokens.values():
                if entry[0] == placeholder:
                    entry[0] = real_id

    # --- claims and leases ----------------------------------------------------------------------

    def expire(self, queue: str | None) -> tuple[int, int, int]:
        """Expiry handling (reaper / the reap step of a claim): leases with deadline <= now."""
        expired = timed_out = dead = 0
        for job in self.by_seq():
            lease = job.lease
            if lease is None or (queue is not None and job.queue != queue) or lease.deadline > self.now:
                continue
            timeout = lease.timeout_at is not None and lease.deadline >= lease.timeout_at
            kind = "timeout" if timeout else "expired"
            text = "timeout: the job ran past its timeout_ms" if timeout else "lease expired without ack or nack"
            outcome = self._fail(job, kind=kind, error=text, base=lease.deadline, delay=None, permanent=False)
            job.settled = Settle(lease.receipt, "expire", None, outcome)
            job.lease = None
            q = self.queues[job.queue]
            q.totals["timed_out" if timeout else "expired"] += 1
            timed_out += timeout
            expired += not timeout
            dead += outcome["state"] == "dead"
        return expired, timed_out, dead

    def _fail(self, job: MJob, *, kind: str, error: str, base: int, delay, permanent: bool) -> dict:
        q = self.queues[job.queue]
        self._add_history(job, kind, error)
        job.last_error = error
        if permanent or job.attempts >= job.max_attempts:
            job.state = "dead"
            job.finished_at = self.now
            q.totals["dead"] += 1
            return {"state": "dead", "run_at": None}
        wait = self.backoff(q.policy, job.attempts) if delay is None else delay
        job.state = "queued"
        job.run_at = base + wait
        return {"state": "scheduled" if job.run_at > self.now else "ready", "run_at": job.run_at}

    def claim(self, queue: str, count: int, visibility_ms: int | None) -> list[dict]:
        """Claimed jobs (without receipts): the test attaches the real receipts with :meth:`leased`."""
        q = self.queue(queue)
        self.expire(queue)
        eligible = [j for j in self.jobs_of(queue) if self.reported(j) == "ready"]
        eligible.sort(key=lambda j: (-j.priority, j.seq))
        n = count
        if q.policy.concurrency > 0:
            running = sum(1 for j in self.jobs_of(queue) if j.lease is not None)
            n = max(0, min(count, q.policy.concurrency - running))
        vis = visibility_ms or q.policy.visibility_ms
        out = []
        for job in eligible[:n]:
            job.attempts += 1
            job.generation += 1
            job.state = "running"
            timeout_at = self.now + job.timeout_ms if job.timeout_ms else None
            deadline = self.now + vis if timeout_at is None else min(self.now + vis, timeout_at)
            job.lease = Lease("", job.generation, self.now, deadline, timeout_at)
            q.totals["claimed"] += 1
            q.totals["wait_ms_sum"] += max(0, self.now - max(job.enqueued_at, job.run_at))
            q.totals["wait_count"] += 1
            out.append(
                {
                    "id": job.id, "payload": job.payload, "deadline": deadline, "attempts": job.attempts,
                    "max_attempts": job.max_attempts, "priority": job.priority, "enqueued_at": job.enqueued_at,
                    "claimed_at": self.now, "generation": job.generation,
                }
            )  # fmt: skip
        return out

    def leased(self, job_id: str, receipt: str) -> None:
        self.jobs[job_id].lease.receipt = receipt

    def _presented(self, queue: str, receipt: str, op: str, args: tuple | None):
        """The job whose live lease ``receipt`` is, or the replay answer; else :class:`Refused`."""
        self.queue(queue)
        for job in self.jobs_of(queue):
            if job.lease is not None and job.lease.receipt == receipt:
                if job.lease.deadline <= self.now:
                    raise Refused("invalid_receipt")  # at or after the deadline the lease has expired
                return job, None
        for job in self.jobs_of(queue):
            s = job.settled
            if s is not None and s.receipt == receipt:
                if s.op == "cancel":
                    raise Refused("cancelled")
                if op == s.op and args is not None and args == s.args:
                    return job, (job.id, s.outcome["state"], s.outcome["run_at"], True)
                raise Refused("invalid_receipt")
        raise Refused("invalid_receipt")

    def ack(self, queue: str, receipt: str, result):
        text = None if result is None else compact(result)
        args = (text,)
        job, replay = self._presented(queue, receipt, "ack", args)
        if replay:
            return replay
        q = self.queues[queue]
        q.totals["acked"] += 1
        q.totals["run_ms_sum"] += max(0, self.now - job.lease.claimed_at)
        q.totals["run_count"] += 1
        job.settled = Settle(receipt, "ack", args, {"state": "succeeded", "run_at": None})
        job.lease = None
        job.state = "succeeded"
        job.result = text
        job.finished_at = self.now
        return (job.id, "succeeded", None, False)

    def nack(self, queue: str, receipt: str, delay_ms, error, permanent: bool):
        message = error_text(error)
        args = (delay_ms, message, bool(permanent))
        job, replay = self._presented(queue, receipt, "nack", args)
        if replay:
            return replay
        self.queues[queue].totals["nacked"] += 1
        outcome = self._fail(job, kind="nack", error=message, base=self.now, delay=delay_ms, permanent=permanent)
        job.settled = Settle(receipt, "nack", args, outcome)
        job.lease = None
        return (job.id, outcome["state"], outcome["run_at"], False)

    def release(self, queue: str, receipt: str, error):
        message = error_text(error) or "released"
        args = (message,)
        job, replay = self._presented(queue, receipt, "release", args)
        if replay:
            return replay
        self.queues[queue].totals["released"] += 1
        self._add_history(job, "release", message)
        job.last_error = message
        job.attempts = max(0, job.attempts - 1)
        job.state = "queued"
        job.run_at = self.now
        outcome = {"state": "ready", "run_at": self.now}
        job.settled = Settle(receipt, "release", args, outcome)
        job.lease = None
        return (job.id, "ready", self.now, False)

    def extend(self, queue: str, receipt: str, visibility_ms: int) -> int:
        job, _ = self._presented(queue, receipt, "extend", None)
        deadline = self.now + visibility_ms
        if job.lease.timeout_at is not None:
            deadline = min(deadline, job.lease.timeout_at)
        job.lease.deadline = deadline
        return deadline

    # --- repair and inspection --------------------------------------------------------------------

    def _job(self, queue: str, job_id: str) -> MJob:
        self.queue(queue)
        job = self.jobs.get(job_id)
        if job is None or job.queue != queue:
            raise Refused("job_not_found")
        return job

    def info(self, job: MJob) -> tuple:
        return (job.id, self.reported(job), job.attempts)

    def retry(self, queue: str, job_id: str):
        job = self._job(queue, job_id)
        if job.state != "dead":
            raise Refused("invalid_state")
        if job.unique_key is not None and any(
            j.unique_key == job.unique_key and j.state in ("queued", "running") for j in self.jobs_of(queue)
        ):
            raise Refused("invalid_state")
        job.state = "queued"
        job.attempts = 0
        job.run_at = self.now
        job.finished_at = None
        self.queues[queue].totals["retried"] += 1
        return self.info(job)

    def requeue(self, queue: str, job_id: str):
        job = self._job(queue, job_id)
        if job.state != "queued":
            raise Refused("invalid_state")
        job.run_at = min(job.run_at, self.now)
        return self.info(job)

    def cancel(self, queue: str, job_id: str):
        job = self._job(queue, job_id)
        if job.state in ("succeeded", "cancelled"):
            raise Refused("invalid_state")
        if job.lease is not None:
            job.settled = Settle(job.lease.receipt, "cancel", None, {"state": "cancelled", "run_at": None})
            job.lease = None
        self._add_history(job, "cancel", "cancelled")
        job.state = "cancelled"
        job.finished_at = self.now
        self.queues[queue].totals["cancelled"] += 1
        return self.info(job)

    def get(self, queue: str, job_id: str):
        return self.info(self._job(queue, job_id))

    # --- maintenance --------------------------------------------------------------------------------

    def reap(self, queue: str | None):
        if queue is not None:
            self.queue(queue)
        return self.expire(queue)

    def prune(self, retention_ms: int):
        gone = [
            j.id for j in self.by_seq()
            if j.state in ("succeeded", "cancelled") and j.finished_at <= self.now - retention_ms
        ]  # fmt: skip
        for job_id in gone:
            del self.jobs[job_id]
            self.pruned.append(job_id)
        tokens = 0
        for q in self.queues.values():
            for token in [t for t, (_, exp) in q.tokens.items() if exp <= self.now]:
                del q.tokens[token]
                tokens += 1
        return (len(gone), tokens, 0)  # no queue has a ttl_ms here: none is deleted
