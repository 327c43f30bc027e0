"""C17 — One poison job cannot stop the others.

A payload nested deeper than any face can read back is refused at enqueue
(clear error naming the field); a job the worker cannot decode or run fails
alone, and the other jobs of the same claim run and settle; the worker keeps
running. The bound is ``MAX_JSON_DEPTH`` levels (docs/reference/errors.md).

Rows too deep that are already stored (written before the bound, or by raw SQL
here) stay readable and repairable on every face: a stand-in takes their place.
"""

from __future__ import annotations

import io
import json

import pytest
from django.db import connection

from django_fq import backup, services
from django_fq.exceptions import InvalidBackup, InvalidJson
from django_fq.models import Job
from django_fq.validation import MAX_JSON_DEPTH, UNREADABLE_KEY

from ..test_cli import fq as run_fq
from ..worker.helpers import WorkerProc, wait_until

pytestmark = pytest.mark.django_db

TOO_DEEP = f"nests deeper than {MAX_JSON_DEPTH} levels"
#: Past this many levels Python's decoder itself gives up (RecursionError) on the supported versions.
BEYOND_THE_DECODER = 3000


def nested(levels: int, leaf: object = 1) -> object:
    """A document of ``levels`` nested arrays and objects around ``leaf`` (``[]`` is one level)."""
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def nested_text(levels: int) -> str:
    """The compact text of :func:`nested` built as text, for depths no Python encoder reaches."""
    return "[" * levels + "1" + "]" * levels


def store_raw(job_id: str, text: str, column: str = "payload") -> None:
    """Overwrite a job's stored JSON text with raw SQL, as a row written before the bound would be."""
    table = Job._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {table} SET {column} = %s WHERE uid = %s", [text, job_id])


# --- refused at enqueue, on every face -------------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 500, 1500, BEYOND_THE_DECODER])
def test_c17_python_api_refuses_a_payload_nesting_too_deep_and_stores_nothing(levels):
    q = "c17-api"
    services.enqueue(q, {"ok": 1})
    before = services.stats(q).counts
    deep = nested(min(levels, 900))  # deeper documents cannot be built in Python without its own recursion
    with pytest.raises(InvalidJson) as caught:
        services.enqueue(q, deep)
    assert (caught.value.field, caught.value.code) == ("payload", "invalid_json")
    assert caught.value.message == f"payload {TOO_DEEP}"
    with pytest.raises(InvalidJson) as caught:
        services.enqueue_many(q, [{"payload": 1}, {"payload": deep}])
    assert caught.value.field == "items[1].payload" and TOO_DEEP in caught.value.message
    assert services.stats(q).counts == before


def test_c17_the_bound_itself_round_trips_and_results_have_the_same_bound():
    q = "c17-edge"
    edge = nested(MAX_JSON_DEPTH)
    job = services.enqueue(q, edge).id
    assert services.get(q, job).payload == edge
    [claimed] = services.claim(q, visibility_ms=60_000)
    assert claimed.payload == edge
    with pytest.raises(InvalidJson) as caught:
        services.ack(q, claimed.receipt, result=nested(MAX_JSON_DEPTH + 1))
    assert caught.value.field == "result" and caught.value.message == f"result {TOO_DEEP}"
    assert services.get(q, job).state == "running"  # the refused ack changed nothing
    assert services.ack(q, claimed.receipt, result=edge).state == "succeeded"
    assert services.get(q, job).result == edge


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, BEYOND_THE_DECODER])
def test_c17_cli_enqueue_refuses_deep_json_by_name(levels):
    run = run_fq("enqueue", "c17-cli", nested_text(levels), "--json")
    assert run.code == 1 and "Traceback" not in run.err
    error = run.err_json
    assert (error["code"], error["field"]) == ("invalid_json", "payload")
    assert TOO_DEEP in error["message"]
    lines = json.dumps({"payload": 1}) + "\n" + '{"payload":' + nested_text(levels) + "}\n"
    run = run_fq("enqueue-many", "c17-cli", "-", "--json", stdin=lines)
    assert run.code == 1 and "Traceback" not in run.err and TOO_DEEP in run.err
    assert "c17-cli" not in [q.name for q in services.queues()]


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, BEYOND_THE_DECODER])
def test_c17_import_refuses_a_deep_payload_naming_line_and_field(levels):
    services.enqueue("c17-imp", {"n": 1})
    out = io.StringIO()
    backup.export_jsonl(out)
    lines = out.getvalue().splitlines()
    n, row = next((i, json.loads(line)) for i, line in enumerate(lines) if '"type":"job"' in line)
    text = json.dumps({**row, "payload": "@"}).replace('"@"', nested_text(levels))
    lines[n] = text
    services.delete_queue("c17-imp")
    with pytest.raises(InvalidBackup) as caught:
        backup.import_jsonl(io.StringIO("\n".join(lines) + "\n"))
    err = caught.value
    assert err.line == n + 1 and "Traceback" not in err.message
    if levels == MAX_JSON_DEPTH + 1:
        assert err.field == "payload" and TOO_DEEP in err.message
    else:  # refused on the line's text, before decoding it
        assert f"nests deeper than {2 * MAX_JSON_DEPTH} levels" in err.message
    assert "c17-imp" not in [q.name for q in services.queues()]


# --- rows already too deep: every read answers, every repair works ---------------------------------


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 1500, BEYOND_THE_DECODER])
def test_c17_reads_and_repairs_survive_a_stored_row_nesting_too_deep(levels):
    q = "c17-read"
    job = services.enqueue(q, {"n": 1}).id
    store_raw(job, nested_text(levels))
    info = services.get(q, job)
    assert info.payload == {UNREADABLE_KEY: f"payload {TOO_DEEP}", "bytes": 2 * levels + 1}
    assert [j.id for j in services.jobs(q).jobs] == [job]

    run = run_fq("get", q, job, "--json")
    assert run.code == 0, run.err
    assert run.json["payload"][UNREADABLE_KEY] == f"payload {TOO_DEEP}"
    run = run_fq("get", q, job)
    assert run.code == 0 and "Traceback" not in run.err

    # cancel answers (and writes once); the job's result column too deep as well
    store_raw(job, nested_text(levels), column="result")
    cancelled = services.cancel(q, job)
    assert cancelled.state == "cancelled" and cancelled.result[UNREADABLE_KEY] == f"result {TOO_DEEP}"
    assert services.wait(q, job, timeout_ms=0).state == "cancelled"

    dead = services.enqueue(q, {"n": 2}, max_attempts=1).id
    [claimed] = services.claim(q, visibility_ms=60_000)
    services.nack(q, claimed.receipt, error="x")
    store_raw(dead, nested_text(levels))
    assert services.retry(q, dead).payload[UNREADABLE_KEY] == f"payload {TOO_DEEP}"

    # export keeps the stored text exactly; import then refuses it by line
    out = io.StringIO()
    backup.export_jsonl(out)
    assert nested_text(levels) in out.getvalue()
    run = run_fq("export")
    assert run.code == 0 and "Traceback" not in run.err


# --- the claim: a poison row fails alone -----------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, BEYOND_THE_DECODER])
def test_c17_a_claim_with_a_poison_row_hands_out_the_others_and_kills_it_alone(levels):
    q = "c17-claim"
    ids = [services.enqueue(q, {"n": i}).id for i in range(4)]
    store_raw(ids[1], nested_text(levels))
    claimed = services.claim(q, count=4, visibility_ms=60_000)
    assert [c.id for c in claimed] == [ids[0], ids[2], ids[3]]
    poison = services.get(q, ids[1])
    assert poison.state == "dead" and poison.attempts == 1
    assert poison.last_error.startswith(f"payload {TOO_DEEP}") and "dead without running" in poison.last_error
    for c in claimed:
        assert services.ack(q, c.receipt).state == "succeeded"
    assert services.stats(q).counts["dead"] == 1 and services.stats(q).counts["succeeded"] == 3


@pytest.mark.django_db(transaction=True)  # the worker is another process: it must see committed rows
def test_c17_a_real_worker_runs_the_rest_of_a_claim_with_a_poison_row_and_keeps_running():
    q = "t.ok"
    ids = [services.enqueue(q, {"n": i}).id for i in range(6)]
    store_raw(ids[2], nested_text(BEYOND_THE_DECODER))  # past the decoder's own limit
    store_raw(ids[4], nested_text(MAX_JSON_DEPTH + 1))
    worker = WorkerProc("--queue", q, "--concurrency", "8", "--poll-interval", "10", "--max-poll-interval", "50")
    try:

        def settled():
            states = {services.get(q, j).state for j in ids}
            return states <= {"succeeded", "dead"}

        wait_until(settled, timeout=60, what="every job of the claim settled")
        assert worker.alive(), worker.stderr
        assert [services.get(q, j).state for j in ids] == [
            "succeeded",
            "succeeded",
            "dead",
            "succeeded",
            "dead",
            "succeeded",
        ]
        for j in (ids[2], ids[4]):
            assert services.get(q, j).last_error.startswith(f"payload {TOO_DEEP}")
        # one claim took all six (same claim instant), the poison rows included
        assert len(set(Job.objects.filter(uid__in=ids).values_list("claimed_at", flat=True))) == 1
        # and it goes on working
        later = services.enqueue(q, {"n": 99}).id
        wait_until(lambda: services.get(q, later).state == "succeeded", timeout=60, what="a later job")
        assert worker.alive() and "Traceback" not in worker.stderr
    finally:
        worker.kill()
        worker.wait()
