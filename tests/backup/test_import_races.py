"""An import racing with another import or a producer: the rows committed meanwhile are skipped (or named
as a conflict), never a traceback.

On PostgreSQL an import's existence checks cannot see another transaction's uncommitted rows; its INSERT
then waits for that transaction and fails on a unique index once it commits. The import owns its
transaction, so it rolls back and runs again, reading the input a second time from where it kept it.
"""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.db import IntegrityError, connections, transaction

from django_fq import backup
from django_fq import services as fq
from django_fq.exceptions import InvalidBackup
from django_fq.models import IdempotencyToken, Job

from .test_backup import _check_counters, export_text, restore, run_fq

pytestmark = pytest.mark.django_db

Q = "bk:race"


def exported_queue(n: int = 5, **first) -> str:
    """Export a fresh queue ``Q`` of ``n`` ready jobs (the first with ``first`` options), then empty ``Q``."""
    fq.configure(Q)
    for i in range(n):
        fq.enqueue(Q, {"i": i}, **(first if i == 0 else {}))
    text = export_text([Q])
    fq.delete_queue(Q)
    fq.configure(Q)  # the queue exists: nothing serialises the import on creating it
    return text


def while_uncommitted(work, then, *, seconds: float = 1.5):
    """Run ``work()`` in another thread's transaction, then ``then()`` here while that transaction is still open.

    The other transaction commits ``seconds`` after ``work()`` returned, so
    ``then()`` meets its rows uncommitted. Returns what ``then()`` returned;
    fails the test if ``work()`` raised.
    """
    done, failures = threading.Event(), []

    def run():
        try:
            with transaction.atomic():
                work()
                done.set()
                time.sleep(seconds)
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)
            done.set()
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    try:
        assert done.wait(30)
        result = then()
    finally:
        t.join(30)
    assert not failures, failures
    return result


# --- real concurrent transactions (PostgreSQL) ---------------------------------------------------------


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_second_import_at_the_same_time_skips_what_the_first_committed(tmp_path):
    """Two imports of one file into an existing queue (an operator retrying an import that looked stuck):
    the second waits for the first's rows, then skips them all."""
    text = exported_queue(unique_key="k0", idempotency="t0")
    path = tmp_path / "backup.jsonl"
    path.write_text(text)
    code, out, err = while_uncommitted(lambda: restore(text), lambda: run_fq("import", str(path)))
    assert (code, err) == (0, ""), err
    assert "jobs: 0 created, 5 skipped; tokens: 0 created, 1 skipped" in out
    assert fq.stats(Q).counts["ready"] == 5
    _check_counters(Q)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_second_import_from_stdin_reads_the_pipe_once(tmp_path):
    """The retry reads the input again: from stdin, which cannot be read twice, it uses its own copy."""
    text = exported_queue(n=700)  # more than one batch: the first INSERT of the retry comes after a flush

    class Pipe(io.BytesIO):
        def seekable(self):
            return False

    code, out, err = while_uncommitted(lambda: restore(text), lambda: run_fq("import", "-", stdin=Pipe(text.encode())))
    assert (code, err) == (0, ""), err
    assert "jobs: 0 created, 700 skipped" in out
    assert fq.stats(Q).counts["ready"] == 700
    _check_counters(Q)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_producer_taking_the_unique_key_meanwhile_is_a_named_conflict(tmp_path):
    text = exported_queue(unique_key="k0")
    path = tmp_path / "backup.jsonl"
    path.write_text(text)
    holder = {}
    code, out, err = while_uncommitted(
        lambda: holder.update(id=fq.enqueue(Q, {"mine": 1}, unique_key="k0").id), lambda: run_fq("import", str(path))
    )
    assert code == 1 and out == "", out
    assert err.startswith('fq import: error: line 3: field "unique_key": ') and holder["id"] in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert [j.uid for j in Job.objects.all()] == [holder["id"]]  # nothing of the file was written
    _check_counters(Q)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_producer_taking_the_token_meanwhile_keeps_it(tmp_path):
    text = exported_queue(n=2, idempotency="t0")
    holder = {}
    summary = while_uncommitted(lambda: holder.update(id=fq.enqueue(Q, {"mine": 1}, idempotency="t0").id), lambda: restore(text))
    assert (summary.jobs_created, summary.tokens_created, summary.tokens_skipped) == (2, 0, 1)
    assert IdempotencyToken.objects.get(token="t0").job_uid == holder["id"]
    assert fq.enqueue(Q, {}, idempotency="t0").id == holder["id"]
    _check_counters(Q)


# --- the retry itself (any database; the import must own its transaction: transaction=True) -------------


def failing_inserts(monkeypatch, times: int) -> list:
    """Make the first ``times`` row inserts of an import fail as a concurrent commit would."""
    calls = []
    real = backup._insert

    def insert(table, columns, rows, **kwargs):
        calls.append(len(rows))
        if len(calls) <= times:
            raise IntegrityError('duplicate key value violates unique constraint "fq_job_uid"')
        return real(table, columns, rows, **kwargs)

    monkeypatch.setattr(backup, "_insert", insert)
    return calls


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("source", ["seekable", "generator", "pipe"])
def test_the_import_runs_again_from_the_start_of_its_input(monkeypatch, source):
    text = exported_queue(n=1234, idempotency="t0")
    lines = {
        "seekable": lambda: io.StringIO(text),
        "generator": lambda: (line for line in text.encode().splitlines(keepends=True)),
        "pipe": lambda: type("Pipe", (io.BytesIO,), {"seekable": lambda self: False})(text.encode()),
    }[source]()
    calls = failing_inserts(monkeypatch, 2)
    sizes = []
    progress = type("Bar", (), {"update": lambda self, n: sizes.append(n)})()

    summary = backup.import_jsonl(lines, progress=progress)

    assert len(calls) > 2
    assert (summary.lines, summary.jobs_created, summary.tokens_created) == (len(text.splitlines()), 1234, 1)
    assert sum(sizes) == len(text.encode()) or sum(sizes) == len(text)  # every line counted once
    assert [j["payload"] for j in Job.objects.order_by("seq").values("payload")] == [
        f'{{"i":{i}}}' for i in range(1234)
    ]
    _check_counters(Q)


@pytest.mark.django_db(transaction=True)
def test_a_conflict_that_does_not_go_away_is_one_clear_error(monkeypatch, tmp_path):
    text = exported_queue()
    path = tmp_path / "backup.jsonl"
    path.write_text(text)
    calls = failing_inserts(monkeypatch, 10**6)
    code, out, err = run_fq("import", str(path))
    assert code == 1 and out == ""
    assert err.startswith("fq import: error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "concurrent writes got in the way" in err and "nothing was imported" in err
    assert len(calls) == backup.IMPORT_TRIES
    assert Job.objects.count() == 0
    code, _, err = run_fq("import", str(path), "--json")
    assert code == 1 and '"code": "import_conflict"' in err


def test_inside_the_callers_transaction_the_conflict_propagates(monkeypatch):
    """The caller owns the transaction: django-fq does not retry it (docs/reference/semantics.md §9)."""
    text = exported_queue()
    calls = failing_inserts(monkeypatch, 1)
    with pytest.raises(IntegrityError), transaction.atomic():
        restore(text)
    assert len(calls) == 1


@pytest.mark.django_db(transaction=True)
def test_a_bad_line_after_a_retry_is_still_reported_by_number(monkeypatch):
    text = exported_queue(n=600)
    lines = text.splitlines()
    lines[-1] = lines[-1].replace('"priority":0', '"priority":"x"')
    failing_inserts(monkeypatch, 1)
    with pytest.raises(InvalidBackup) as err:
        restore("\n".join(lines) + "\n")
    assert (err.value.line, err.value.field) == (len(lines), "priority")
    assert Job.objects.count() == 0
