"""Numbers and texts an import takes must keep working afterwards: no counter that overflows on the next
claim or enqueue, no attempt past ``max_attempts``, and the error history within the engine's caps.

Hand-written files here (``HEADER``, ``queue_line``, ``job_line``) hold the fewest keys an import needs.
"""

from __future__ import annotations

import io
import json

import pytest

from django_fq import backup, validation
from django_fq import services as fq
from django_fq.exceptions import InvalidBackup
from django_fq.models import Job

from .test_backup import export_text, lines_of, restore, wipe

pytestmark = pytest.mark.django_db

Q = "bk:bounds"
UID = "a" * 32
HEADER = {"format": "django-fq", "version": 1}
SAFE = 2**53 - 1  # the import's bound for generation, counts and instants


def queue_line(**fields) -> dict:
    return {"type": "queue", "name": Q, **fields}


def job_line(uid: str = UID, **fields) -> dict:
    row = {
        "type": "job", "queue": Q, "id": uid, "state": "ready", "priority": 0, "run_at": 0, "enqueued_at": 0,
        "attempts": 0, "max_attempts": 5, "payload": {"n": 1},
    }  # fmt: skip
    row.update(fields)
    return row


def file_of(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def refused(text: str) -> InvalidBackup:
    with pytest.raises(InvalidBackup) as err:
        restore(text)
    assert not fq.queues() and Job.objects.count() == 0  # nothing changed
    return err.value


# --- counters that would overflow one step later -----------------------------------------------------


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("attempts", 2**31 - 1, "between 0 and 5"),  # INTEGER: the next claim's attempts + 1 overflowed
        ("attempts", 6, "between 0 and 5"),  # past this line's max_attempts
        ("attempts", -1, "between 0 and 5"),
        ("generation", 2**63 - 1, f"between 0 and {SAFE}"),  # BIGINT: generation + 1 overflowed (SQLite: a REAL)
        ("generation", SAFE + 1, f"between 0 and {SAFE}"),
        ("run_at", 2**63 - 1, f"between 0 and {SAFE}"),
        ("enqueued_at", SAFE + 1, f"between 0 and {SAFE}"),
    ],
)
def test_job_numbers_past_their_bounds_are_refused_by_line_and_field(field, value, words):
    exc = refused(file_of(HEADER, queue_line(), job_line(**{field: value})))
    assert (exc.line, exc.field) == (3, field), exc.message
    assert words in exc.message
    if field == "attempts":
        assert "max_attempts" in exc.message


def test_job_numbers_at_their_bounds_still_claim_and_ack():
    restore(file_of(HEADER, queue_line(), job_line(generation=SAFE, attempts=4, max_attempts=5)))
    (claimed,) = fq.claim(Q)
    assert (claimed.id, claimed.attempts, claimed.max_attempts) == (UID, 5, 5)
    assert fq.ack(Q, claimed.receipt).state == "succeeded"
    assert Job.objects.get(uid=UID).generation == SAFE + 1


@pytest.mark.parametrize(
    "total, value",
    [("enqueued", 2**63 - 1), ("claimed", SAFE + 1), ("wait_count", SAFE + 1), ("run_ms_sum", 2**62 + 1)],
)
def test_queue_totals_that_could_overflow_are_refused(total, value):
    exc = refused(file_of(HEADER, queue_line(totals={total: value})))
    assert (exc.line, exc.field) == (2, f"totals.{total}"), exc.message


def test_queue_totals_at_their_bounds_still_take_enqueues():
    restore(file_of(HEADER, queue_line(totals={"enqueued": SAFE, "wait_ms_sum": 2**62})))
    assert fq.enqueue(Q, {"after": "import"}).created
    (claimed,) = fq.claim(Q)
    fq.ack(Q, claimed.receipt)
    st = fq.stats(Q)
    assert st.totals["enqueued"] == SAFE + 1 and st.wait_ms_sum >= 2**62 and st.wait_count == 1


# --- a job running on its last attempt --------------------------------------------------------------------


def test_a_job_running_on_its_last_attempt_is_restored_with_that_attempt_given_back():
    """Exported while running, a job is given its attempt back as ``release`` does, so after a restore
    it still has its last attempt, and never runs past ``max_attempts``."""
    fq.configure(Q)
    uid = fq.enqueue(Q, {"n": 1}, max_attempts=1).id
    (_claimed,) = fq.claim(Q, worker="w-9")
    text = export_text([Q])
    (row,) = [r for r in lines_of(text) if r.get("type") == "job"]
    header = lines_of(text)[0]
    assert (row["state"], row["attempts"], row["max_attempts"], row["generation"]) == ("ready", 0, 1, 1)
    assert row["errors"] == [
        {"at": header["exported_at"], "attempt": 1, "kind": "release", "error": backup.RUNNING_NOTE, "worker": "w-9"}
    ]
    assert row["last_error"] == backup.RUNNING_NOTE and row["worker"] == "w-9"
    wipe()

    restore(text)

    info = fq.get(Q, uid)
    assert (info.state, info.attempts) == ("ready", 0)
    (again,) = fq.claim(Q)
    assert (again.attempts, again.max_attempts) == (1, 1)  # attempt 1/1, not 2/1
    fq.nack(Q, again.receipt, error="boom")
    assert fq.get(Q, uid).state == "dead"


def test_a_ready_job_with_every_attempt_used_gets_its_last_one_back():
    """An older export wrote a job running on its last attempt as ready with attempts = max_attempts;
    it is imported with max_attempts - 1, so its next claim is its last attempt."""
    restore(file_of(HEADER, queue_line(), job_line(attempts=5, max_attempts=5)))
    assert fq.get(Q, UID).attempts == 4
    (claimed,) = fq.claim(Q)
    assert claimed.attempts == 5
    fq.nack(Q, claimed.receipt)
    assert fq.get(Q, UID).state == "dead"


def test_finished_jobs_keep_attempts_up_to_max_attempts():
    restore(
        file_of(
            HEADER,
            queue_line(),
            job_line("b" * 32, state="dead", attempts=5, max_attempts=5),
            job_line("c" * 32, state="succeeded", attempts=5, max_attempts=5, result=1),
        )
    )
    assert [fq.get(Q, u).attempts for u in ("b" * 32, "c" * 32)] == [5, 5]


# --- the error history: the engine's caps --------------------------------------------------------------------


def test_error_history_is_cut_to_the_engine_caps():
    """The newest 100 entries are kept, each ``error`` text and ``last_error`` cut to 64 KiB as a nack cuts."""
    big = "é" * 40_000  # 80,000 bytes of UTF-8
    errors = [{"at": i, "attempt": 1, "kind": "nack", "error": f"e{i}", "worker": ""} for i in range(150)]
    errors[-1]["error"] = big
    restore(file_of(HEADER, queue_line(), job_line(state="dead", attempts=1, errors=errors, last_error=big)))

    info = fq.get(Q, UID)
    assert len(info.errors) == 100
    assert [e["at"] for e in info.errors] == list(range(50, 150))
    assert info.errors[-1]["error"] == validation.error_text(big)
    assert len(info.errors[-1]["error"].encode()) <= validation.MAX_ERROR_BYTES
    assert info.last_error == validation.error_text(big)
    assert info.errors[0] == errors[50]  # entries within the caps are untouched


def test_history_entries_must_be_objects_with_a_text_error():
    exc = refused(file_of(HEADER, queue_line(), job_line(errors=[{"error": 5}])))
    assert (exc.line, exc.field) == (3, "errors"), exc.message


def test_every_real_export_still_imports_within_the_bounds():
    """Bounds never refuse what the exporter writes: jobs in every state, history, totals."""
    fq.configure(Q, max_attempts=2, backoff_ms=0)
    for i in range(4):
        fq.enqueue(Q, {"i": i})
    for c in fq.claim(Q, count=2):
        fq.nack(Q, c.receipt, error="x" * 70_000)  # cut by the engine already
    for c in fq.claim(Q, count=4):
        if c.attempts == 2:
            fq.nack(Q, c.receipt)  # last attempt: dead
    text = export_text([Q])
    before = {r["id"]: r for r in lines_of(text) if r.get("type") == "job"}
    wipe()
    summary = backup.import_jsonl(io.StringIO(text))
    assert summary.jobs_created == 4
    after = {r["id"]: r for r in lines_of(export_text([Q])) if r.get("type") == "job"}
    assert {u: (r["state"], r["attempts"], r["errors"]) for u, r in after.items()} == {
        u: (r["state"], r["attempts"], r["errors"]) for u, r in before.items()
    }


# --- a row longer than one statement the server takes ------------------------------------------------


def test_a_row_past_the_servers_statement_size_is_refused_by_line_and_column(monkeypatch, settings):
    """A job whose row alone is over the store's statement budget is refused naming its line and widest column.

    MariaDB's budget comes from ``max_allowed_packet`` (W030 in docs/reference/checks.md); the other
    stores have none, so the budget is set small here for every database: the check is the import's.
    """
    from django_fq import storage
    from django_fq.db import connection

    store = type(storage.for_connection(connection()))
    monkeypatch.setattr(store, "statement_budget", lambda self, conn: 16 * 1024)
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = 0  # the payload stays in the job's row (an offloaded one is its own row)
    big = {"text": "x" * 20_000}  # ~40 KB as statement text: over 16 KiB

    err = refused(file_of(HEADER, queue_line(), job_line("b" * 32), job_line(payload=big)))

    assert err.line == 4 and err.field == "payload"
    assert "max_allowed_packet" in str(err)


def test_rows_under_the_budget_are_split_over_statements_and_all_land(monkeypatch, settings):
    from django_fq import storage
    from django_fq.db import connection

    store = type(storage.for_connection(connection()))
    monkeypatch.setattr(store, "statement_budget", lambda self, conn: 16 * 1024)
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = 0
    rows = [job_line(f"{i:032x}", payload={"text": "y" * 3000}) for i in range(12)]  # ~6 KB each: 2 per statement

    restore(file_of(HEADER, queue_line(), *rows))

    assert Job.objects.count() == 12
