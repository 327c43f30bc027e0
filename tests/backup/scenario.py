"""A varied data set for the backup tests, and a full dump of the rows to compare two databases.

Used in-process and by :mod:`tests.backup.child` (the SQLite side of the
cross-database round trips), so both sides build and read data the same way.
"""

from __future__ import annotations

from django_fq import backup, db
from django_fq import services as fq
from django_fq.models import IdempotencyToken, Job, Lease, Queue
from django_fq.services._base import COUNTER_NAMES, counter_sums

MAIN = "bk:main"
OTHER = "bk:other"
EMPTY = "bk:empty"

#: Payloads that must come back byte for byte: non-ASCII, floats, big ints, nesting, JSON null.
RICH = {
    "text": 'héllo ✓ \u2028 "quoted"',
    "f": 1.5,
    "e": 1e-7,
    "big": 2**62,
    "neg": -3,
    "nested": {"a": [1, None, True, {}]},
}


def populate() -> dict:
    """Build jobs in every state, tokens and policies through the public API; return the ids by role."""
    fq.configure(
        MAIN,
        concurrency=3,
        max_attempts=4,
        backoff_ms=250,
        max_backoff_ms=9000,
        visibility_ms=45_000,
        idempotency_retention_ms=600_000,
        timeout_ms=120_000,
    )
    fq.configure(EMPTY, max_attempts=7)
    ids = {}
    # One job at a time, so each claim takes exactly the job it is meant for.
    ids["succeeded"] = fq.enqueue(MAIN, {"role": "succeeded", **RICH}, unique_key="uk-done").id
    (c,) = fq.claim(MAIN, worker="w-1")
    fq.ack(MAIN, c.receipt, result={"ok": True, "ü": [1.25, None]})
    ids["succeeded_receipt"] = c.receipt
    ids["dead"] = fq.enqueue(MAIN, {"role": "dead"}, max_attempts=1, idempotency="tok-dead").id
    (c,) = fq.claim(MAIN, worker="w-2")
    fq.nack(MAIN, c.receipt, error="Traceback (most recent call last):\n  boom ✗")
    ids["retrying"] = fq.enqueue(MAIN, {"role": "retrying"}).id
    (c,) = fq.claim(MAIN)
    fq.nack(MAIN, c.receipt, delay_ms=3_600_000, error="try later")
    ids["cancelled"] = fq.enqueue(MAIN, {"role": "cancelled"}).id
    fq.cancel(MAIN, ids["cancelled"])
    ids["running"] = fq.enqueue(MAIN, {"role": "running"}, timeout_ms=60_000, metadata={"tags": ["run"]}).id
    (c,) = fq.claim(MAIN, worker="w-3")
    ids["running_receipt"] = c.receipt
    ids["released"] = fq.enqueue(MAIN, {"role": "released"}).id
    (c,) = fq.claim(MAIN)
    fq.release(MAIN, c.receipt, error="shutting down")
    # Left as they are: ready, scheduled, prioritised, keyed, tokened (and one duplicate enqueue).
    ids["ready"] = fq.enqueue(MAIN, RICH, priority=-7, metadata={"tenant": "héllo ✓", "tags": ["a:b", "x_y"], "n": 1.5}).id
    ids["scheduled"] = fq.enqueue(MAIN, None, delay_ms=2 * 3_600_000, priority=2**31 - 1).id
    ids["keyed"] = fq.enqueue(MAIN, [1, 2, 3], unique_key="uk-live").id
    ids["tokened"] = fq.enqueue(MAIN, "a string payload", idempotency="tok-live", idempotency_retention_ms=900_000).id
    assert fq.enqueue(MAIN, "ignored", idempotency="tok-live").created is False
    ids["other"] = fq.enqueue(OTHER, {"n": 1}).id
    fq.enqueue(OTHER, {"n": 2}, idempotency="tok-other")
    return ids


def dump() -> dict:
    """Every stored column that a backup carries, per queue, job and token (JSON-ready)."""
    alias = db.connection().alias
    queues, jobs, tokens = {}, {}, {}
    conn = db.connection()
    for q in Queue.objects.using(alias).order_by("name"):
        st = fq.stats(q.name)
        queues[q.name] = {
            "id": q.id,
            "created_at": q.created_at,
            "policy": {f: getattr(q, f) for f in fq.policy(q.name).__dataclass_fields__},
            "counts": st.counts,
            "totals": {**st.totals, "wait_ms_sum": st.wait_ms_sum, "wait_count": st.wait_count,
                       "run_ms_sum": st.run_ms_sum, "run_count": st.run_count},
            "counters": counter_sums(conn, q.id, COUNTER_NAMES),
        }  # fmt: skip
    names = {v["id"]: k for k, v in queues.items()}
    skip = {"seq", "settled_hash", "settled_op", "settled_args", "settled_outcome"}
    columns = [f.attname for f in Job._meta.concrete_fields if f.name not in skip]
    for row in Job.objects.using(alias).order_by("seq").values(*columns):
        row["queue"] = names[row.pop("queue_id")]
        row["errors"] = list(row["errors"] or [])
        jobs[row["uid"]] = row
    for t in IdempotencyToken.objects.using(alias).order_by("id"):
        tokens[f"{names[t.queue_id]}|{t.token}"] = {
            "job_uid": t.job_uid,
            "created_at": t.created_at,
            "expires_at": t.expires_at,
        }
    return {
        "queues": queues,
        "jobs": jobs,
        "job_order": list(jobs),
        "tokens": tokens,
        "leases": Lease.objects.using(alias).count(),
    }


def expected_after_restore(source: dict, exported_at: int) -> dict:
    """What a restore of ``source`` (exported at ``exported_at``, epoch ms) must look like.

    No leases; running jobs are ready, their attempt given back as a release at
    ``exported_at`` would (attempts - 1, a ``release`` history entry, that last
    error); the rest identical.
    """
    out = {"queues": {}, "jobs": {}, "tokens": source["tokens"], "leases": 0, "job_order": source["job_order"]}
    for name, q in source["queues"].items():
        counts = dict(q["counts"])
        counts["ready"] += counts["running"]
        counts["running"] = 0
        out["queues"][name] = {**q, "counts": counts}
    for uid, job in source["jobs"].items():
        if job["state"] == "running":
            entry = {
                "at": exported_at,
                "attempt": job["attempts"],
                "kind": "release",
                "error": backup.RUNNING_NOTE,
                "worker": job["worker"],
            }
            job = {
                **job,
                "state": "queued",
                "attempts": job["attempts"] - 1,
                "last_error": backup.RUNNING_NOTE,
                "errors": [*job["errors"], entry][-100:],
            }
        out["jobs"][uid] = job
    return out


def comparable(d: dict) -> dict:
    """``d`` without what may differ between two databases (row ids)."""
    return {**d, "queues": {k: {kk: vv for kk, vv in v.items() if kk != "id"} for k, v in d["queues"].items()}}
