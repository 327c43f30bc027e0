"""Shared pieces of the CLI and REST fuzz tests: odd values, forged receipts, a snapshot of the tables."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from django_fq import services as fq

QUEUE = "fz"

#: Queue names, most of them invalid (valid ones let a command reach its later checks).
QUEUE_NAMES = [
    QUEUE, QUEUE, "nope", "", " ", f"{QUEUE}\n", f"{QUEUE}\x00", f"{QUEUE}/x", "é", "a" * 201, "a" * 5000,
    f" {QUEUE}", "\ud800", "🙂", "-", "fz%00", "..",
]  # fmt: skip
#: Integers as text: out of every range, not integers at all, or integers Python reads oddly.
INT_TEXTS = [
    "0", "-0", "1", "-1", "2", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
    "1e309", "1.5", "nan", "inf", "abc", "", " 3", "\u0663", "1_0", "0x10", "9" * 40, "2147483648",
    "86400001", "\x00", "1\x00",
]  # fmt: skip
#: Free text (tokens, keys, errors, worker ids, cursors).
TEXTS = ["t", "", "\x00", "a\x00b", "\ud800", "x" * 256, "x" * 70_000, "é" * 300, "\n", "🙂", "line1\nline2"]
#: JSON documents as text, valid and not.
JSON_TEXTS = [
    "{}", "1", '{"a":', "NaN", "Infinity", "-Infinity", "1e309", "-0", "[" * 50_000, '"\\u0000"',
    '"\\ud800"', '{"a":1,"a":2}', "1" * 5000, "", "null", "\x00", "'single'", '{"\\u0000": 1}',
    "[1,]", "true false", '"\ud800"', "1" * 4300,
]  # fmt: skip
#: Job ids: malformed, unknown, or (filled in by the world) real ones.
JOB_IDS = ["0" * 32, "ABC", "x\x00", "", "a" * 10_000, "g" * 32, "\ud800" * 32, "0" * 31 + "\n"]
#: File paths a command is pointed at that it cannot use.
BAD_PATHS = ["\x00", "/nonexistent-dir/x.jsonl", "/", "", "/proc/self/mem", "/nonexistent-dir/a\nb", "\ud800"]


@dataclass
class World:
    """A queue holding one job in each state; ``receipt`` holds the running job's live lease."""

    ids: dict[str, str]
    receipt: str

    def job_ids(self) -> list[str]:
        return [*self.ids.values(), *(i.upper() for i in self.ids.values()), *JOB_IDS]

    def receipts(self) -> list[str]:
        """The live receipt and receipts made up from it (docs/reference/semantics.md §5: none of them may settle the lease)."""
        r = self.receipt
        prefix, uid, gen, secret = r.split(".")
        other = self.ids["ready"]
        return [
            r, r[:-1], r + "x", r + "\n", r + "\x00", f" {r}", f"{prefix}.{uid}.0{gen}.{secret}",
            f"{prefix}.{uid}.{int(gen) + 1}.{secret}", f"{prefix}.{other}.{gen}.{secret}",
            f"{prefix}.{uid}.{gen}.{'A' * 43}", f"{prefix}.{uid.upper()}.{gen}.{secret}", "fq1", "", "x" * 10_000,
            f"{prefix}.{uid}.{gen}.{secret}\ud800", f"fq2.{uid}.{gen}.{secret}",
        ]  # fmt: skip


def make_world() -> World:
    """Fill queue ``fz``: ready, scheduled, running (long lease), succeeded, dead and cancelled jobs."""
    fq.configure(QUEUE, max_attempts=1)
    ids = {}
    ids["running"] = fq.enqueue(QUEUE, {"n": "running"}, priority=10).id
    ids["ready"] = fq.enqueue(QUEUE, {"n": "ready"}).id
    ids["scheduled"] = fq.enqueue(QUEUE, {"n": "scheduled"}, delay_ms=3_600_000).id
    [running] = fq.claim(QUEUE, visibility_ms=3_600_000)
    assert running.id == ids["running"]
    for state in ("succeeded", "dead"):
        ids[state] = fq.enqueue(QUEUE, {"n": state}, priority=20).id
        [job] = fq.claim(QUEUE, visibility_ms=3_600_000)
        assert job.id == ids[state]
        (fq.ack(QUEUE, job.receipt) if state == "succeeded" else fq.nack(QUEUE, job.receipt, error="x"))
    ids["cancelled"] = fq.enqueue(QUEUE, {"n": "cancelled"}).id
    fq.cancel(QUEUE, ids["cancelled"])
    fq.enqueue(QUEUE, {"n": "token"}, idempotency="tok", unique_key="key")
    return World(ids=ids, receipt=running.receipt)


def snapshot() -> dict[str, list[str]]:
    """Every row of every django-fq table, as sorted reprs: equal snapshots mean nothing changed."""
    tables = sorted(t for t in connection.introspection.table_names() if t.startswith("django_fq"))
    out = {}
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"SELECT * FROM {table}")
            out[table] = sorted(repr(row) for row in cur.fetchall())
    return out
