"""Backup and restore (``django_fq.backup``, ``manage.py fq export`` / ``fq import``) on the test database.

Each test builds the data of :mod:`tests.backup.scenario` through the public
API, exports it, and restores it into the same database after deleting the
queues (the cross-database round trips are in ``test_cross_db.py``).
"""

from __future__ import annotations

import io
import json
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connections

from django_fq import backup, db, wakeup
from django_fq import services as fq
from django_fq.exceptions import InvalidBackup, InvalidReceipt, QueueNotFound
from django_fq.models import IdempotencyToken, Job, Lease, Queue
from django_fq.services._base import counter_sums

from .scenario import EMPTY, MAIN, OTHER, comparable, dump, expected_after_restore, populate

pytestmark = pytest.mark.django_db


def export_text(queues=None) -> str:
    out = io.StringIO()
    backup.export_jsonl(out, queues)
    return out.getvalue()


def restore(text: str, **kwargs) -> backup.ImportSummary:
    return backup.import_jsonl(io.StringIO(text), **kwargs)


def wipe() -> None:
    for info in fq.queues():
        fq.delete_queue(info.name)


def lines_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def job_line(text: str, uid: str) -> tuple[int, dict]:
    """(1-based line number, object) of the job line of ``uid``."""
    for n, obj in enumerate(lines_of(text), 1):
        if obj.get("type") == "job" and obj["id"] == uid:
            return n, obj
    raise AssertionError(uid)


def replace_line(text: str, n: int, obj_or_text) -> str:
    lines = text.splitlines()
    lines[n - 1] = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    return "\n".join(lines) + "\n"


# --- round trip -----------------------------------------------------------------------------------


def test_restore_reproduces_every_queue_job_and_token():
    populate()
    source = dump()
    text = export_text()
    wipe()
    assert Job.objects.count() == 0

    summary = restore(text)
    exported_at = lines_of(text)[0]["exported_at"]

    assert (summary.queues_created, summary.jobs_created, summary.tokens_created) == (
        3,
        len(source["jobs"]),
        len(source["tokens"]),
    )
    assert summary.queues_skipped == summary.jobs_skipped == summary.tokens_skipped == 0
    assert comparable(dump()) == comparable(expected_after_restore(source, exported_at))


def test_export_file_shape_and_what_it_leaves_out():
    ids = populate()
    lease = Lease.objects.get(job__uid=ids["running"])
    text = export_text()
    rows = lines_of(text)

    header = rows[0]
    assert header["format"] == "django-fq" and header["version"] == 1
    assert isinstance(header["exported_at"], int) and header["database"] == db.connection().vendor
    assert [r["name"] for r in rows if r.get("type") == "queue"] == sorted([MAIN, OTHER, EMPTY])
    assert text.isascii()  # non-ASCII payloads are escaped, so any encoding reads the file

    _, running = job_line(text, ids["running"])
    # A running job goes out as a release at export time would leave it: its attempt given back.
    assert running["state"] == "ready" and running["attempts"] == 0 and running["worker"] == "w-3"
    assert running["generation"] == 1 and running["last_error"] == backup.RUNNING_NOTE
    assert running["errors"] == [
        {"at": header["exported_at"], "attempt": 1, "kind": "release", "error": backup.RUNNING_NOTE, "worker": "w-3"}
    ]
    # No lease, receipt or settle record travels: neither the receipt's secret nor any hash of it.
    secret = ids["running_receipt"].rsplit(".", 1)[1]
    assert secret not in text and lease.receipt_hash not in text
    assert "receipt" not in text and "settled" not in text
    # depends_on is written only for a job that has dependencies (tests/services/test_dependencies.py),
    # batch only for a member of a batch (tests/backup/test_batches.py)
    assert {k for r in rows if r.get("type") == "job" for k in r} == set(backup._JOB_KEYS) - {"depends_on", "batch"}

    _, done = job_line(text, ids["succeeded"])
    assert done["state"] == "succeeded" and done["result"] == {"ok": True, "ü": [1.25, None]}
    _, dead = job_line(text, ids["dead"])
    assert dead["state"] == "dead" and dead["errors"][-1]["error"].endswith("boom ✗")
    _, scheduled = job_line(text, ids["scheduled"])
    assert scheduled["state"] == "scheduled" and scheduled["payload"] is None
    tokens = {r["token"]: r for r in rows if r.get("type") == "token"}
    assert tokens["tok-live"]["job_id"] == ids["tokened"]
    assert tokens["tok-live"]["expires_at"] - tokens["tok-live"]["created_at"] == 900_000


def test_running_job_comes_back_ready_and_old_receipt_is_dead():
    ids = populate()
    assert fq.ack(MAIN, ids["succeeded_receipt"], result={"ok": True, "ü": [1.25, None]}).replay
    text = export_text([MAIN])
    wipe()
    restore(text)

    # No settle record travels: a repeat of the ack is no longer answered as a replay.
    with pytest.raises(InvalidReceipt):
        fq.ack(MAIN, ids["succeeded_receipt"], result={"ok": True, "ü": [1.25, None]})

    info = fq.get(MAIN, ids["running"])
    assert info.state == "ready" and info.attempts == 0 and info.lease_deadline is None
    with pytest.raises(InvalidReceipt):
        fq.ack(MAIN, ids["running_receipt"])
    # It runs again: the interrupted attempt was given back, so its next claim is attempt 1 again,
    # under a new lease generation.
    claimed = {c.id: c for c in fq.claim(MAIN, count=10)}
    assert claimed[ids["running"]].attempts == 1
    assert fq.ack(MAIN, claimed[ids["running"]].receipt).state == "succeeded"


def test_restored_jobs_keep_their_claim_order():
    fq.configure("bk:order")
    made = [fq.enqueue("bk:order", {"i": i}, priority=i % 2).id for i in range(12)]
    text = export_text(["bk:order"])
    wipe()
    restore(text)
    got = [c.id for c in fq.claim("bk:order", count=100)]
    assert got == [u for i, u in enumerate(made) if i % 2] + [u for i, u in enumerate(made) if not i % 2]


def test_concurrency_keys_and_the_key_limit_round_trip():
    """Keys travel with their jobs; held and running keyed jobs come back waiting, admitted again up to the limit."""
    q = "bk:keys"
    fq.configure(q, key_concurrency=1)
    made = [fq.enqueue(q, {"i": i}, concurrency_key="k" if i < 3 else "j").id for i in range(4)]
    running = fq.claim(q, count=10)
    assert [c.id for c in running] == [made[0], made[3]]
    text = export_text([q])
    assert job_line(text, made[1])[1]["concurrency_key"] == "k"
    wipe()
    restore(text)
    assert fq.policy(q).key_concurrency == 1
    assert fq.get(q, made[2]).concurrency_key == "k"
    # The running jobs came back ready, first in their keys' order: one of each key is claimable.
    assert [c.id for c in fq.claim(q, count=10)] == [made[0], made[3]]
    assert fq.claim(q, count=10) == []


def test_many_batches_round_trip_in_order():
    """More rows than one insert statement (200) and one existence check (500) take; order and tokens intact."""
    n = 1234
    fq.enqueue_many(
        "bk:many", [{"payload": {"i": i}, "idempotency": f"t{i}" if i % 3 == 0 else None} for i in range(n)]
    )
    before = dump()
    text = export_text(["bk:many"])
    wipe()
    summary = restore(text)
    assert (summary.jobs_created, summary.tokens_created) == (n, len(range(0, n, 3)))
    assert comparable(dump()) == comparable(before)
    assert [c.payload["i"] for c in fq.claim("bk:many", count=1000)] == list(range(1000))
    again = restore(text)
    assert (again.jobs_created, again.jobs_skipped, again.tokens_skipped) == (0, n, len(range(0, n, 3)))


# --- idempotent re-import -------------------------------------------------------------------------


def test_reimport_skips_everything_and_changes_nothing():
    populate()
    text = export_text()
    wipe()
    first = restore(text)
    after_first = dump()

    second = restore(text)

    assert (second.queues_created, second.jobs_created, second.tokens_created) == (0, 0, 0)
    assert (second.queues_skipped, second.jobs_skipped, second.tokens_skipped) == (
        first.queues_created,
        first.jobs_created,
        first.tokens_created,
    )
    assert dump() == after_first  # counters and totals included: nothing was added twice


def test_import_into_the_source_database_is_a_no_op():
    ids = populate()
    before = dump()
    summary = restore(export_text())
    assert summary.jobs_created == 0 and summary.jobs_skipped == len(before["jobs"])
    assert dump() == before
    assert fq.get(MAIN, ids["running"]).state == "running"  # an existing job is never overwritten


# --- tokens ---------------------------------------------------------------------------------------


def test_tokens_keep_their_expiry_and_still_deduplicate(clock):
    ids = populate()
    tokens_before = {t.token: (t.job_uid, t.created_at, t.expires_at) for t in IdempotencyToken.objects.all()}
    text = export_text()
    wipe()
    restore(text)

    assert {t.token: (t.job_uid, t.created_at, t.expires_at) for t in IdempotencyToken.objects.all()} == tokens_before
    again = fq.enqueue(MAIN, {"different": True}, idempotency="tok-live")
    assert again.id == ids["tokened"] and again.created is False
    # The token of a dead job still points at it, across the restore.
    assert fq.enqueue(MAIN, {}, idempotency="tok-dead").id == ids["dead"]
    # It expires by time only: past its retention the same token makes a new job.
    clock.advance(900_001)
    later = fq.enqueue(MAIN, {"different": True}, idempotency="tok-live")
    assert later.created is True and later.id != ids["tokened"]


# --- counters and stats ---------------------------------------------------------------------------


def _check_counters(queue: str) -> None:
    """The queue-full counters agree with the rows: active = scheduled+ready+running, token_rows = tokens."""
    row = Queue.objects.get(name=queue)
    sums = counter_sums(db.connection(), row.id, ("active", "token_rows"))
    assert sums["active"] == Job.objects.filter(queue=row, state__in=["queued", "running"]).count()
    assert sums["token_rows"] == IdempotencyToken.objects.filter(queue=row).count()


def test_stats_match_after_import():
    populate()
    before = {name: fq.stats(name) for name in (MAIN, OTHER, EMPTY)}
    text = export_text()
    wipe()
    restore(text)
    for name, st in before.items():
        after = fq.stats(name)
        assert after.totals == st.totals
        assert (after.wait_ms_sum, after.wait_count, after.run_ms_sum, after.run_count) == (
            st.wait_ms_sum,
            st.wait_count,
            st.run_ms_sum,
            st.run_count,
        )
        expected = dict(st.counts, ready=st.counts["ready"] + st.counts["running"], running=0)
        assert after.counts == expected
        _check_counters(name)


def test_import_into_an_existing_queue_keeps_its_policy_and_totals_and_adds_the_rows():
    populate()
    text = export_text([OTHER])
    fq.delete_queue(OTHER)
    fq.configure(OTHER, max_attempts=9)
    mine = fq.enqueue(OTHER, {"mine": True}).id
    totals_before = fq.stats(OTHER).totals

    summary = restore(text)

    assert summary.queues_skipped == 1 and summary.jobs_created == 2 and summary.tokens_created == 1
    assert fq.policy(OTHER).max_attempts == 9
    assert fq.stats(OTHER).totals == totals_before  # the file's totals belong to a queue we did not create
    assert fq.stats(OTHER).counts["ready"] == 3
    assert fq.get(OTHER, mine).state == "ready"
    _check_counters(OTHER)


def test_queue_limits_apply_to_the_import(settings):
    populate()
    text = export_text([MAIN])
    wipe()
    settings.FQ_MAX_JOBS_PER_QUEUE = 3
    with pytest.raises(InvalidBackup) as err:
        restore(text)
    assert err.value.line == 2 and err.value.field == "name"
    assert "FQ_MAX_JOBS_PER_QUEUE" in err.value.message
    assert Job.objects.count() == 0 and not fq.queues()


# --- bad files ------------------------------------------------------------------------------------


def _bad_files(text: str, ids: dict):
    """``(id, bad text, line, field, words in the message)`` — each a valid export with one line spoiled."""
    rows = lines_of(text)
    n_keyed, keyed = job_line(text, ids["keyed"])
    n_ready, ready = job_line(text, ids["ready"])
    last_job = max(n for n, r in enumerate(rows, 1) if r.get("type") == "job")
    n_token = next(n for n, r in enumerate(rows, 1) if r.get("type") == "token")
    n_main = next(n for n, r in enumerate(rows, 1) if r.get("name") == MAIN)
    header = rows[0]
    yield (
        "priority-not-int",
        replace_line(text, last_job, {**rows[last_job - 1], "priority": "high"}),
        last_job,
        "priority",
        "must be an integer, not a string",
    )
    yield "priority-too-big", replace_line(text, n_ready, {**ready, "priority": 2**31}), n_ready, "priority", "between"
    yield "not-json", replace_line(text, last_job, '{"type": "job", '), last_job, None, "not valid JSON"
    yield (
        "nan",
        replace_line(text, n_ready, json.dumps(ready).replace('"f": 1.5', '"f": NaN')),
        n_ready,
        None,
        "NaN is not allowed",
    )
    yield "nul", replace_line(text, n_ready, {**ready, "payload": {"x": "a\u0000b"}}), n_ready, "payload", "NUL"
    yield "unknown-field", replace_line(text, n_keyed, {**keyed, "colour": "red"}), n_keyed, "colour", "unknown field"
    yield (
        "missing-payload",
        replace_line(text, n_keyed, {k: v for k, v in keyed.items() if k != "payload"}),
        n_keyed,
        "payload",
        "is required",
    )
    yield (
        "running-state",
        replace_line(text, n_keyed, {**keyed, "state": "running"}),
        n_keyed,
        "state",
        "running jobs are exported as ready",
    )
    yield "bad-id", replace_line(text, n_keyed, {**keyed, "id": "XYZ"}), n_keyed, "id", "32 lowercase hexadecimal"
    yield (
        "duplicate-id",
        replace_line(text, last_job, {**rows[last_job - 1], "id": ids["keyed"]}),
        last_job,
        "id",
        f"line {n_keyed}",
    )
    yield (
        "undeclared-queue",
        replace_line(text, n_keyed, {**keyed, "queue": "bk:nowhere"}),
        n_keyed,
        "queue",
        "not declared",
    )
    yield (
        "bad-type",
        replace_line(text, n_keyed, {**keyed, "type": "lease"}),
        n_keyed,
        "type",
        '"queue", "job", "token"',
    )
    yield (
        "policy",
        replace_line(text, n_main, {**rows[n_main - 1], "policy": {"max_attempts": 0}}),
        n_main,
        "policy.max_attempts",
        "between 1 and 1000",
    )
    yield (
        "backoff",
        replace_line(text, n_main, {**rows[n_main - 1], "policy": {"backoff_ms": 10, "max_backoff_ms": 5}}),
        n_main,
        "policy.max_backoff_ms",
        "at least",
    )
    yield (
        "totals",
        replace_line(text, n_main, {**rows[n_main - 1], "totals": {"acked": -1}}),
        n_main,
        "totals.acked",
        "between",
    )
    yield (
        "token-expiry",
        replace_line(text, n_token, {**rows[n_token - 1], "expires_at": rows[n_token - 1]["created_at"] - 1}),
        n_token,
        "expires_at",
        "before created_at",
    )
    yield "format", replace_line(text, 1, {**header, "format": "other"}), 1, "format", "header"
    yield "version", replace_line(text, 1, {**header, "version": 2}), 1, "version", "newer"
    yield "no-header", "\n".join(text.splitlines()[1:]) + "\n", 1, "format", "header"
    yield "empty", "", 1, None, "empty"


def test_bad_lines_are_rejected_by_number_and_field_and_nothing_changes():
    ids = populate()
    text = export_text()
    fq.delete_queue(MAIN)  # the file's MAIN lines would be created; OTHER and EMPTY skipped
    before = dump()
    seen = set()
    for name, bad, line, field, words in _bad_files(text, ids):
        with pytest.raises(InvalidBackup) as err:
            restore(bad)
        exc = err.value
        assert (exc.line, exc.field) == (line, field), (name, exc.message)
        assert words in exc.message and exc.message.startswith(f"line {line}: "), (name, exc.message)
        if field:
            assert exc.message.startswith(f'line {line}: field "{field}": '), name
        assert exc.as_dict()["line"] == line and exc.code == "invalid_backup"
        assert dump() == before, name
        seen.add(name)
    assert len(seen) == 20


def test_bad_utf8_is_reported_with_its_line():
    populate()
    raw = export_text([OTHER]).encode()
    lines = raw.split(b"\n")
    lines[2] = lines[2].replace(b'"n":1', b'"n":"\xff"')
    wipe()
    with pytest.raises(InvalidBackup) as err:
        backup.import_jsonl(io.BytesIO(b"\n".join(lines)))
    assert err.value.line == 3 and "UTF-8" in err.value.message
    assert not fq.queues()


def test_unique_key_held_by_another_active_job_is_a_conflict():
    ids = populate()
    text = export_text([MAIN])
    wipe()
    fq.configure(MAIN)
    holder = fq.enqueue(MAIN, {"holder": True}, unique_key="uk-live").id
    before = dump()
    with pytest.raises(InvalidBackup) as err:
        restore(text)
    n_keyed, _ = job_line(text, ids["keyed"])
    assert (err.value.line, err.value.field) == (n_keyed, "unique_key")
    assert holder in err.value.message
    assert dump() == before


def test_a_token_naming_a_job_of_another_queue_is_rejected():
    """A token's job belongs to the token's queue (or was pruned): else an enqueue would return an id get() cannot find."""
    populate()
    text = export_text([MAIN])
    n, token = next((k, obj) for k, obj in enumerate(lines_of(text), 1) if obj.get("type") == "token")
    fq.delete_queue(MAIN)
    other = fq.enqueue(OTHER, {"mine": True}).id
    bad = replace_line(text, n, {**token, "job_id": other})
    before = dump()
    with pytest.raises(InvalidBackup) as err:
        restore(bad)
    assert (err.value.line, err.value.field) == (n, "job_id")
    assert f"job {other} belongs to queue {OTHER}, not {MAIN}" in err.value.message
    assert dump() == before
    restore(replace_line(text, n, {**token, "job_id": "f" * 32}))  # a job pruned since: the token still counts
    assert fq.enqueue(MAIN, {}, idempotency=token["token"]).id == "f" * 32


def test_job_id_existing_in_another_queue_is_rejected():
    ids = populate()
    text = export_text([OTHER])
    n, other = job_line(text, ids["other"])
    bad = replace_line(text, n, {**other, "id": ids["ready"]})  # MAIN's job, claimed for OTHER
    before = dump()
    with pytest.raises(InvalidBackup) as err:
        restore(bad)
    assert (err.value.line, err.value.field) == (n, "id") and MAIN in err.value.message
    assert dump() == before


def test_dry_run_counts_and_changes_nothing():
    populate()
    text = export_text()
    wipe()
    summary = restore(text, dry_run=True)
    assert summary.dry_run and summary.queues_created == 3 and summary.jobs_created > 10
    assert not fq.queues() and Job.objects.count() == 0 and IdempotencyToken.objects.count() == 0


def test_export_of_named_queues_and_unknown_queue():
    populate()
    rows = lines_of(export_text([OTHER]))
    assert {r.get("queue", r.get("name")) for r in rows[1:]} == {OTHER}
    with pytest.raises(QueueNotFound):
        export_text([OTHER, "bk:missing"])


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_import_wakes_idle_workers_at_commit():
    fq.configure("bk:wake")
    fq.enqueue("bk:wake", {"n": 1})
    text = export_text(["bk:wake"])
    wipe()
    listener = wakeup.listener()
    give_up = time.monotonic() + 10
    while not listener.listening and time.monotonic() < give_up:
        time.sleep(0.02)
    assert listener.listening
    mark = listener.mark()
    while listener.wait(mark, {"bk:wake"}, timeout=0.3) and time.monotonic() < give_up:
        mark = listener.mark()  # let the (re)connect's wake-everyone pass first
    restore(text)
    assert listener.wait(mark, {"bk:wake"}, timeout=10)


# --- the snapshot: a consistent read that never blocks writers ---------------------------------


@pytest.mark.django_db(transaction=True)
def test_export_is_one_snapshot_and_does_not_block_enqueues():
    """While the export is half written, another connection enqueues (and commits) at once; the file does not see it."""
    populate()
    late: dict = {}

    def enqueue_elsewhere():
        try:
            late["id"] = fq.enqueue(MAIN, {"late": True}).id
        except Exception as exc:
            late["error"] = exc
        finally:
            connections.close_all()

    class Stream(io.StringIO):
        def write(self, s):
            if self.tell() and "id" not in late and "error" not in late:
                t = threading.Thread(target=enqueue_elsewhere)
                t.start()
                t.join(30)
                assert not t.is_alive(), "the enqueue waited for the export"
            return super().write(s)

    out = Stream()
    backup.export_jsonl(out)
    assert "error" not in late, late.get("error")
    assert fq.get(MAIN, late["id"]).state == "ready"
    assert late["id"] not in out.getvalue()
    # The file holds exactly the jobs there were before the late one.
    assert sum(1 for r in lines_of(out.getvalue()) if r.get("type") == "job") == Job.objects.count() - 1


# --- command line -----------------------------------------------------------------------------------


class Tty(io.StringIO):
    def isatty(self):
        return True


def run_fq(*argv, stdin=None, stderr=None):
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    code = 0
    kwargs = {"stdin": stdin} if stdin is not None else {}
    try:
        call_command("fq", *argv, stdout=out, stderr=err, **kwargs)
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_cli_export_import_round_trip(tmp_path):
    ids = populate()
    source = dump()
    code, out, err = run_fq("export")
    assert code == 0 and out.startswith('{"format":"django-fq"') and "exported 3 queue(s)" in err
    assert "1 running" in err
    path = tmp_path / "backup.jsonl"
    code, out, err = run_fq("export", "--output", str(path), "--json")
    assert code == 0 and err == ""
    assert json.loads(out)["jobs"] == len(source["jobs"]) and json.loads(out)["running_as_ready"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["backup.jsonl"]  # no temporary file left behind
    wipe()

    code, out, err = run_fq("import", str(path), "--json")
    assert code == 0 and err == "", err
    summary = json.loads(out)
    assert summary["jobs_created"] == len(source["jobs"]) and summary["jobs_skipped"] == 0
    assert summary["tokens_created"] == len(source["tokens"]) and summary["dry_run"] is False
    exported_at = json.loads(path.read_text().splitlines()[0])["exported_at"]
    assert comparable(dump()) == comparable(expected_after_restore(source, exported_at))

    code, out, err = run_fq("import", "-", stdin=io.StringIO(path.read_text()))
    assert code == 0 and f"jobs: 0 created, {len(source['jobs'])} skipped" in out
    assert fq.get(MAIN, ids["ready"]).state == "ready"


def test_cli_import_errors_name_line_and_field(tmp_path):
    ids = populate()
    text = export_text()
    n, row = job_line(text, ids["keyed"])
    path = tmp_path / "bad.jsonl"
    path.write_text(replace_line(text, n, {**row, "priority": "high"}))
    wipe()

    code, out, err = run_fq("import", str(path))
    assert code == 1 and out == ""
    assert err.strip() == f'fq import: error: line {n}: field "priority": must be an integer, not a string'
    code, out, err = run_fq("import", str(path), "--json")
    assert code == 1 and json.loads(err) == {
        "code": "invalid_backup",
        "message": f'line {n}: field "priority": must be an integer, not a string',
        "field": "priority",
        "line": n,
    }
    code, _, err = run_fq("import", str(tmp_path / "missing.jsonl"))
    assert code == 1 and "cannot read" in err
    code, _, err = run_fq("export", "bk:missing")
    assert code == 1 and "no such queue" in err
    assert not fq.queues()


def test_cli_progress_bar_only_on_a_terminal_and_never_with_json(tmp_path):
    populate()
    path = tmp_path / "b.jsonl"
    code, _, err = run_fq("export", "-o", str(path), stderr=Tty())
    assert code == 0 and "export" in err and "row" in err  # tqdm drew on the terminal
    wipe()
    code, out, err = run_fq("import", str(path), stderr=Tty())
    assert code == 0 and "import" in err and "B" in err and "created" in out
    wipe()
    code, out, err = run_fq("import", str(path), "--json", stderr=Tty())
    assert code == 0 and err == ""
    wipe()
    code, out, err = run_fq("import", str(path))  # not a terminal
    assert code == 0 and err == ""


def test_cli_dry_run(tmp_path):
    populate()
    path = tmp_path / "b.jsonl"
    run_fq("export", "-o", str(path))
    wipe()
    code, out, _ = run_fq("import", str(path), "--dry-run")
    assert code == 0 and "dry run: nothing was changed" in out and "queues: 3 created" in out
    assert not fq.queues()


def test_metadata_and_tags_survive_a_round_trip_and_bad_metadata_is_refused_by_line():
    meta = {"tenant": "t ✓", "tags": ["eu", "x_y"]}
    job = fq.enqueue("bk:meta", {"n": 1}, metadata=meta).id
    plain = fq.enqueue("bk:meta", {"n": 2}).id
    out = io.StringIO()
    backup.export_jsonl(out)
    lines = out.getvalue().splitlines()
    rows = {r.get("id"): r for r in map(json.loads, lines)}
    assert rows[job]["metadata"] == meta and rows[plain]["metadata"] is None
    fq.delete_queue("bk:meta")
    backup.import_jsonl(lines)
    assert fq.get("bk:meta", job).metadata == meta
    assert [j.id for j in fq.jobs("bk:meta", tag="x_y").jobs] == [job]
    fq.delete_queue("bk:meta")
    bad = [
        json.dumps({**r, "metadata": {"tags": ["no spaces"]}}) if r.get("id") == job else line
        for line, r in zip(lines, map(json.loads, lines), strict=True)
    ]
    with pytest.raises(InvalidBackup) as info:
        backup.import_jsonl(bad)
    assert info.value.field == "metadata.tags[0]"
    assert info.value.line == next(i for i, r in enumerate(map(json.loads, lines), 1) if r.get("id") == job)
