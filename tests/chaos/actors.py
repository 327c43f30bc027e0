"""Stress actors: ``python -m tests.chaos.actors ROLE [options]`` (run by the chaos scenarios).

Roles (each runs ``--threads`` threads for ``--seconds``, then writes a JSON
summary to ``--out`` and, for producers, one JSON line per enqueue result to
``--out`` + ``.jsonl``):

* ``producer`` — enqueues, one at a time and in bulk, with idempotency tokens
  and unique keys drawn from spaces shared by every producer (so they
  overlap), random priorities and short delays. ``--sequential`` instead
  enqueues token ``<name>-<n>`` for n = 0, 1, … and, with
  ``--retry-db-errors``, repeats the same token after a database error until
  it goes through (how an application survives a database restart).
* ``consumer`` — claims with short leases and acks (single or batched),
  nacks, extends then acks, releases, abandons its jobs, or acks a 300 ms
  lease only after sleeping past its deadline; records each run
  (:func:`tests.chaos.invariants.record_run`) before settling it.
* ``reaper`` — ``reap()`` in a loop; ``pruner`` — ``prune()`` with tiny retentions.

Errors of django-fq (``FqError``: an ack that came too late, …) are counted
by code; any other exception reaching the caller (a deadlock or
serialization error, "database is locked") is recorded as *unexpected*: the
scenario fails on it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import threading
import time
import traceback


def _parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.chaos.actors")
    p.add_argument("role", choices=["producer", "consumer", "reaper", "pruner"])
    p.add_argument("--queues", required=True, help="comma-separated queue names")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="p")
    p.add_argument("--tokens", type=int, default=3000, help="size of the shared token space")
    p.add_argument("--keys", type=int, default=40, help="size of the shared unique-key space")
    p.add_argument("--sequential", action="store_true")
    p.add_argument("--retry-db-errors", action="store_true")
    p.add_argument("--stop-file", help="a sequential producer also stops as soon as this file exists")
    p.add_argument("--pace-ms", type=float, default=0.0, help="pause between two enqueues of a sequential producer")
    p.add_argument("--backlog", type=int, default=300, help="producers pause while more jobs than this are ready")
    p.add_argument("--extend-ms", type=int, default=1500, help="visibility of every extend (the checker needs it)")
    return p.parse_args(argv)


class Tally:
    """Thread-safe counts of operations, FqError codes and unexpected exceptions."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops = collections.Counter()
        self.errors = collections.Counter()
        self.unexpected: list[str] = []
        self.unexpected_count = 0
        self.db_errors_survived = 0

    def op(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.ops[name] += n

    def error(self, exc: BaseException) -> None:
        from django_fq.exceptions import FqError

        with self.lock:
            if isinstance(exc, FqError):
                self.errors[exc.code] += 1
            else:
                self.unexpected_count += 1
                if len(self.unexpected) < 50:
                    self.unexpected.append(f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")


def _producer(args, n: int, stop_at: float, tally: Tally, out) -> None:
    from django_fq import services as fq

    rng = random.Random(args.seed * 1000 + n)
    queues = args.queues.split(",")

    def write(queue, results, tokens):
        lines = "".join(
            json.dumps({"queue": queue, "id": r.id, "created": r.created, "token": t}) + "\n" for r, t in zip(results, tokens, strict=True)
        )
        with tally.lock:
            out.write(lines)

    def token():
        return f"tok-{rng.randrange(args.tokens)}" if rng.random() < 0.5 else None

    def key():
        return f"key-{rng.randrange(args.keys)}" if rng.random() < 0.3 else None

    backlog_checked, backlog = 0.0, 0
    while time.monotonic() < stop_at:
        queue = rng.choice(queues)
        if time.monotonic() - backlog_checked > 0.5:
            # Keep the consumers in the race: past --backlog pending jobs, producers slow down.
            backlog_checked = time.monotonic()
            try:
                backlog = sum(fq.stats(q).counts["ready"] for q in queues)
            except Exception as exc:
                tally.error(exc)
        if backlog > args.backlog:
            time.sleep(0.05)
            tally.op("paused")
            continue
        try:
            if rng.random() < 0.6:
                tok = token()
                r = fq.enqueue(queue, {"n": rng.random()}, idempotency=tok, unique_key=key(), priority=rng.randint(-1, 1),
                               delay_ms=rng.choice([None, None, None, 0, 20, 150]), idempotency_retention_ms=3_600_000)
                write(queue, [r], [tok])
                tally.op("enqueue")
            else:
                items = []
                for _ in range(rng.randint(2, 20)):
                    item = {"payload": {"n": rng.random()}, "priority": rng.randint(-1, 1), "idempotency_retention_ms": 3_600_000}
                    if (tok := token()) is not None:
                        item["idempotency"] = tok
                    if (k := key()) is not None:
                        item["unique_key"] = k
                    items.append(item)
                results = fq.enqueue_many(queue, items)
                write(queue, results, [i.get("idempotency") for i in items])
                tally.op("enqueue_many")
                tally.op("enqueue_many_items", len(items))
        except Exception as exc:
            tally.error(exc)


def _sequential_producer(args, n: int, stop_at: float, tally: Tally, out) -> None:
    from django.db import connections

    from django_fq import services as fq
    from django_fq.worker import is_db_error

    queue = args.queues.split(",")[0]
    i = 0
    while time.monotonic() < stop_at and not (args.stop_file and os.path.exists(args.stop_file)):
        tok = f"{args.name}{n}-{i}"
        while True:
            try:
                r = fq.enqueue(queue, {"token": tok}, idempotency=tok, idempotency_retention_ms=3_600_000)
                break
            except Exception as exc:
                if not (args.retry_db_errors and is_db_error(exc)):
                    tally.error(exc)
                    r = None
                    break
                with tally.lock:
                    tally.db_errors_survived += 1
                try:
                    connections.close_all()
                except Exception:
                    pass
                time.sleep(0.2)
        if r is not None:
            with tally.lock:
                # "at": when the enqueue returned (epoch ms), for the failover scenario's recovery times.
                out.write(json.dumps({"queue": queue, "id": r.id, "created": r.created, "token": tok,
                                      "at": int(time.time() * 1000)}) + "\n")
                out.flush()
            tally.op("enqueue")
        i += 1
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000)


def _consumer(args, n: int, stop_at: float, tally: Tally, out) -> None:
    from django_fq import services as fq
    from django_fq.exceptions import FqError

    from . import invariants

    rng = random.Random(args.seed * 1000 + 500 + n)
    queues = args.queues.split(",")
    pid = os.getpid()
    while time.monotonic() < stop_at:
        queue = rng.choice(queues)
        try:
            jobs = fq.claim(queue, count=rng.randint(1, 8), visibility_ms=rng.choice([300, 1500, 3000]), worker=f"consumer-{pid}-{n}")
        except Exception as exc:
            tally.error(exc)
            continue
        tally.op("claim")
        if not jobs:
            time.sleep(0.005)
            continue
        acks = []
        for job in jobs:
            action = rng.choices(["ack", "nack", "extend", "release", "abandon", "late"], [55, 10, 10, 10, 10, 5])[0]
            try:
                if action == "release":
                    fq.release(queue, job.receipt)
                    tally.op("release")
                    continue
                deadline = job.deadline
                if action == "extend":
                    deadline = fq.extend(queue, job.receipt, visibility_ms=args.extend_ms)
                    tally.op("extend")
                started = invariants.now_ms()
                if action == "late" and job.deadline - job.claimed_at <= 300:
                    time.sleep((job.deadline - job.claimed_at) / 1000 + 0.05)  # past the deadline: the ack must be refused
                    tally.op("late")
                elif rng.random() < 0.2:
                    time.sleep(rng.uniform(0, 0.02))
                invariants.record_run(job.id, job.claimed_at, job.attempts, started, lambda end, d=deadline: end >= d,
                                      tag=f"consumer-{n}", pid=pid)
                if action == "nack":
                    fq.nack(queue, job.receipt, error="stress", delay_ms=rng.choice([None, 0, 5]), permanent=rng.random() < 0.05)
                    tally.op("nack")
                elif action == "abandon":
                    tally.op("abandon")
                else:
                    acks.append((job.receipt, {"by": pid}))
            except FqError as exc:
                tally.error(exc)
            except Exception as exc:
                tally.error(exc)
        if not acks:
            continue
        try:
            if len(acks) > 1 and rng.random() < 0.5:
                for outcome in fq.ack_many(queue, acks):
                    if isinstance(outcome, FqError):
                        tally.error(outcome)
                    else:
                        tally.op("ack")
            else:
                for receipt, result in acks:
                    try:
                        fq.ack(queue, receipt, result=result)
                        tally.op("ack")
                    except FqError as exc:
                        tally.error(exc)
        except Exception as exc:
            tally.error(exc)


def _reaper(args, n: int, stop_at: float, tally: Tally, out) -> None:
    from django_fq import services as fq

    rng = random.Random(args.seed * 1000 + 900 + n)
    while time.monotonic() < stop_at:
        try:
            r = fq.reap()
            tally.op("reap")
            tally.op("reaped", r.expired + r.timed_out)
        except Exception as exc:
            tally.error(exc)
        time.sleep(rng.uniform(0, 0.02))


def _pruner(args, n: int, stop_at: float, tally: Tally, out) -> None:
    from django_fq import services as fq

    rng = random.Random(args.seed * 1000 + 950 + n)
    while time.monotonic() < stop_at:
        try:
            r = fq.prune(retention_ms=rng.choice([0, 50, 500]))
            tally.op("prune")
            tally.op("pruned_jobs", r.jobs)
        except Exception as exc:
            tally.error(exc)
        time.sleep(rng.uniform(0.05, 0.2))


def main(argv=None) -> int:
    args = _parse(argv)
    import django

    django.setup()
    from django.db import connections

    role = {"producer": _sequential_producer if args.sequential else _producer, "consumer": _consumer,
            "reaper": _reaper, "pruner": _pruner}[args.role]
    tally = Tally()
    stop_at = time.monotonic() + args.seconds

    def run(n):
        try:
            role(args, n, stop_at, tally, out)
        except BaseException as exc:
            tally.error(exc)
        finally:
            connections.close_all()

    with open(args.out + ".jsonl", "w", encoding="utf-8") as out:
        threads = [threading.Thread(target=run, args=(n,), name=f"{args.role}-{n}") for n in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    summary = {
        "role": args.role,
        "pid": os.getpid(),
        "ops": dict(tally.ops),
        "errors": dict(tally.errors),
        "unexpected": tally.unexpected,
        "unexpected_count": tally.unexpected_count,
        "db_errors_survived": tally.db_errors_survived,
    }
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(summary, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
