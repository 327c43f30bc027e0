"""The ``manage.py fq`` command line: every subcommand, its ``--json`` shapes, its errors and exit codes.

Most tests run the command in-process through :func:`fq`, which captures
stdout, stderr and the exit status. One test runs the real ``manage.py``-style
entry point in a child process to check exit codes end to end.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_fq import db, services
from django_fq.types import STATE_NAMES, TIMING_NAMES, TOTAL_NAMES

pytestmark = pytest.mark.django_db

Q = "cli:test"
#: Any instant the database reports must be an epoch-ms value after 2020-01-01.
EPOCH_2020_MS = 1_577_836_800_000
CLAIM_KEYS = {"id", "payload", "receipt", "deadline", "attempts", "enqueued_at"}
SETTLE_KEYS = {"id", "state", "run_at", "replay"}


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)

    @property
    def err_json(self):
        return json.loads(self.err)


def fq(*argv, stdin: str | None = None) -> Run:
    """Run ``manage.py fq *argv`` in-process; return its exit code, stdout and stderr.

    Domain errors exit through ``SystemExit(1)``; argparse usage errors surface
    from ``call_command`` as ``CommandError`` and are reported here as exit 2,
    the status the real command line gives them.
    """
    out, err = io.StringIO(), io.StringIO()
    extra = {} if stdin is None else {"stdin": io.StringIO(stdin)}
    code = 0
    try:
        call_command("fq", *[str(a) for a in argv], stdout=out, stderr=err, **extra)
    except SystemExit as exc:
        code = exc.code
    except CommandError as exc:
        err.write(str(exc))
        code = 2
    return Run(code, out.getvalue(), err.getvalue())


def ok(*argv, stdin: str | None = None):
    """Run with ``--json``, insist on success, return the parsed stdout."""
    run = fq(*argv, "--json", stdin=stdin)
    assert run.code == 0, run.err
    assert run.err == ""
    return run.json


def fails(*argv, code: str, field: str | None = None, stdin: str | None = None) -> dict:
    """Run with ``--json``, insist on exit 1 with the error ``code`` (and ``field``) as JSON on stderr."""
    run = fq(*argv, "--json", stdin=stdin)
    assert run.code == 1, (run.out, run.err)
    assert run.out == ""
    assert "Traceback" not in run.err
    err = run.err_json
    assert err["code"] == code, err
    if field is not None:
        assert err["field"] == field, err
    return err


def queue_names() -> list[str]:
    return [q.name for q in services.queues()]


def make_queue(name: str) -> None:
    """Create ``name`` with the default policy (``config`` without options only reads)."""
    ok("config", name, "--concurrency", 0)


def claim_one(queue: str = Q, *extra) -> dict:
    jobs = ok("claim", queue, *extra)
    assert len(jobs) == 1
    return jobs[0]


# --- config, queues, delete ----------------------------------------------------------------


def test_config_of_missing_queue_exits_1_and_does_not_create_it():
    run = fq("config", Q)
    assert run.code == 1
    assert run.out == ""
    assert "no such queue" in run.err and "Traceback" not in run.err
    fails("config", Q, code="queue_not_found", field="queue")
    assert Q not in queue_names()


def test_config_sets_every_option_and_prints_the_policy():
    got = ok(
        "config", Q,
        "--concurrency", 4, "--max-attempts", 3, "--backoff", 1000, "--max-backoff", 60000,
        "--visibility", 45000, "--idempotency-retention", 7000, "--timeout", 9000, "--key-concurrency", 2, "--ttl", 86400000,
        "--rate-limit", 20, "--rate-window", 2000, "--key-rate-limit", 3,
    )  # fmt: skip
    expected = {
        "queue": Q, "concurrency": 4, "max_attempts": 3, "backoff_ms": 1000, "max_backoff_ms": 60000,
        "visibility_ms": 45000, "idempotency_retention_ms": 7000, "timeout_ms": 9000, "key_concurrency": 2, "ttl_ms": 86400000,
        "rate_limit": 20, "rate_window_ms": 2000, "key_rate_limit": 3,
    }  # fmt: skip
    assert got == expected
    assert ok("config", Q) == expected
    pol = services.policy(Q)
    assert (pol.concurrency, pol.max_attempts, pol.visibility_ms, pol.timeout_ms) == (4, 3, 45000, 9000)
    human = fq("config", Q)
    assert human.code == 0 and "max_backoff_ms" in human.out and "60000" in human.out


def test_config_rejects_out_of_range_values_and_changes_nothing():
    fails("config", Q, "--concurrency", -1, code="invalid_policy", field="concurrency")
    assert Q not in queue_names()  # checked before the queue is created
    ok("config", Q, "--backoff", 1000)
    fails("config", Q, "--max-backoff", 10, code="invalid_policy", field="max_backoff_ms")
    fails("config", Q, "--visibility", 0, code="invalid_policy", field="visibility_ms")
    assert services.policy(Q).max_backoff_ms == 3_600_000
    assert services.policy(Q).visibility_ms == 30_000
    human = fq("config", Q, "--max-attempts", 0)
    assert human.code == 1 and "--max-attempts" in human.err


def test_config_bad_integer_names_the_option():
    run = fq("config", Q, "--concurrency", "many")
    assert run.code == 2
    assert "--concurrency" in run.err
    assert Q not in queue_names()


def test_invalid_queue_name_is_refused():
    fails("enqueue", "bad name!", "{}", code="invalid_queue_name", field="queue")
    assert queue_names() == []


def test_queues_lists_policy_and_counts():
    assert ok("queues") == []
    assert fq("queues").out.strip() == "no queues"
    ok("config", "cli:b", "--concurrency", 2)
    ok("enqueue", "cli:a", "1")
    ok("enqueue", "cli:a", "2", "--delay", 60000)
    rows = ok("queues")
    assert [r["name"] for r in rows] == ["cli:a", "cli:b"]
    a, b = rows
    assert set(a) == {"name", "policy", "counts", "created_at", "paused", "paused_at"}
    assert (a["paused"], a["paused_at"]) == (False, None)
    assert a["counts"] == {"waiting": 0, "scheduled": 1, "ready": 1, "running": 0, "succeeded": 0, "dead": 0, "cancelled": 0}
    assert b["counts"] == dict.fromkeys(STATE_NAMES, 0)
    assert b["policy"]["concurrency"] == 2
    assert a["created_at"] > EPOCH_2020_MS
    human = fq("queues").out
    assert "cli:a" in human and "READY" in human


def test_pause_and_resume_with_json_and_in_words():
    ok("enqueue", Q, "1")
    first = ok("pause", Q)
    assert set(first) == {"queue", "paused", "paused_at", "changed"}
    assert (first["queue"], first["paused"], first["changed"]) == (Q, True, True)
    assert first["paused_at"] > EPOCH_2020_MS
    assert ok("claim", Q) == []  # the claim refuses
    again = ok("pause", Q)
    assert again == {**first, "changed": False}  # no error, the first instant kept
    assert "already paused" in fq("pause", Q).out

    st = ok("stats", Q)
    assert (st["paused"], st["paused_at"]) == (True, first["paused_at"])
    assert "paused since" in fq("stats", Q).out
    [row] = ok("queues")
    assert (row["paused"], row["paused_at"]) == (True, first["paused_at"])
    human = fq("queues").out.splitlines()
    assert human[0].split()[-1] == "PAUSED" and human[1].split()[-1] == "yes"

    assert ok("resume", Q) == {"queue": Q, "paused": False, "paused_at": None, "changed": True}
    assert ok("resume", Q)["changed"] is False
    assert fq("resume", Q).out.strip() == f"queue not paused: {Q}"
    assert len(ok("claim", Q)) == 1
    assert fq("queues").out.splitlines()[1].split()[-1] == "no"

    for verb in ("pause", "resume"):
        fails(verb, "cli:none", code="queue_not_found", field="queue")
        fails(verb, "bad name!", code="invalid_queue_name", field="queue")
    assert "cli:none" not in queue_names()


def test_delete_removes_the_queue_and_a_second_delete_fails():
    ok("enqueue", Q, '{"x": 1}')
    assert ok("delete", Q) == {"queue": Q, "deleted": True}
    assert Q not in queue_names()
    fails("delete", Q, code="queue_not_found")
    fails("stats", Q, code="queue_not_found")


# --- enqueue -------------------------------------------------------------------------------


def test_enqueue_prints_id_and_created_1_then_0_for_a_duplicate():
    first = ok("enqueue", Q, '{"job": "print", "id": 1}', "--idempotency", "print-1")
    assert set(first) == {"id", "created"}
    assert first["created"] == 1 and isinstance(first["created"], int) and first["created"] is not True
    again = ok("enqueue", Q, '{"job": "print", "id": 2}', "--idempotency", "print-1")
    assert again == {"id": first["id"], "created": 0}
    assert ok("get", Q, first["id"])["payload"] == {"job": "print", "id": 1}  # first payload kept
    stats = ok("stats", Q)
    assert stats["counts"]["ready"] == 1
    assert stats["totals"]["enqueued"] == 1 and stats["totals"]["deduplicated"] == 1
    human = fq("enqueue", Q, "{}", "--idempotency", "print-1")
    assert human.code == 0 and first["id"] in human.out and "duplicate" in human.out


def test_enqueue_unique_key_coalesces_while_active():
    first = ok("enqueue", Q, "1", "--unique-key", "k")
    assert ok("enqueue", Q, "2", "--unique-key", "k") == {"id": first["id"], "created": 0}
    job = claim_one()
    ok("ack", Q, job["receipt"])
    third = ok("enqueue", Q, "3", "--unique-key", "k")
    assert third["created"] == 1 and third["id"] != first["id"]


def test_enqueue_options_reach_the_job():
    made = ok(
        "enqueue", Q, '{"a": [1, "é"]}', "--priority", -7, "--delay", 60000, "--max-attempts", 4,
        "--timeout", 1500, "--idempotency-retention", 5000, "--idempotency", "tok", "--unique-key", "uk",
    )  # fmt: skip
    job = ok("get", Q, made["id"])
    assert job["state"] == "scheduled"
    assert job["payload"] == {"a": [1, "é"]}
    assert job["priority"] == -7 and job["max_attempts"] == 4 and job["timeout_ms"] == 1500
    assert job["run_at"] - job["enqueued_at"] == 60000
    assert job["idempotency"] == "tok" and job["unique_key"] == "uk"
    assert job["enqueued_at"] > EPOCH_2020_MS  # epoch milliseconds from the database clock


def test_enqueue_concurrency_key_and_the_key_limit():
    ok("config", Q, "--key-concurrency", 1)
    first = ok("enqueue", Q, "1", "--concurrency-key", "customer-42")
    second = ok("enqueue", Q, "2", "--concurrency-key", "customer-42")
    assert ok("get", Q, first["id"])["concurrency_key"] == "customer-42"
    assert "customer-42" in fq("get", Q, second["id"]).out
    claimed = ok("claim", Q, "--count", 10)
    assert [j["id"] for j in claimed] == [first["id"]]  # one of the key at a time
    ok("ack", Q, claimed[0]["receipt"])
    assert [j["id"] for j in ok("claim", Q, "--count", 10)] == [second["id"]]


def test_a_bad_concurrency_key_names_the_option_and_creates_nothing():
    fails("enqueue", Q, "1", "--concurrency-key", "x" * 201, code="invalid", field="concurrency_key")
    assert Q not in queue_names()
    fails("config", Q, "--key-concurrency", 100_001, code="invalid_policy", field="key_concurrency")


def test_enqueue_at_sets_run_at():
    probe = ok("enqueue", Q, "0")
    enqueued_at = ok("get", Q, probe["id"])["enqueued_at"]
    at = enqueued_at + 3_600_000
    made = ok("enqueue", Q, "1", "--at", at)
    job = ok("get", Q, made["id"])
    assert job["run_at"] == at and job["state"] == "scheduled"


def test_enqueue_payload_from_stdin():
    made = ok("enqueue", Q, "-", stdin='{"from": "stdin"}\n')
    assert ok("get", Q, made["id"])["payload"] == {"from": "stdin"}


def test_enqueue_bad_json_payload_names_the_field_and_creates_nothing():
    err = fails("enqueue", Q, '{"a": ', code="invalid_json", field="payload")
    assert "payload" in err["message"]
    fails("enqueue", Q, "NaN", code="invalid_json", field="payload")
    fails("enqueue", Q, '{"a": Infinity}', code="invalid_json", field="payload")
    human = fq("enqueue", Q, "not json")
    assert human.code == 1 and "payload" in human.err and "Traceback" not in human.err
    assert Q not in queue_names()


def test_enqueue_payload_too_large(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 100
    make_queue(Q)
    err = fails("enqueue", Q, json.dumps({"x": "y" * 200}), code="payload_too_large", field="payload")
    assert err["limit"] == 100
    ok("enqueue", Q, json.dumps({"x": "y" * 50}))  # under the limit is fine
    assert ok("stats", Q)["counts"]["ready"] == 1


def test_enqueue_negative_delay_is_refused():
    fails("enqueue", Q, "1", "--delay", -5, code="invalid_delay", field="delay_ms")
    human = fq("enqueue", Q, "1", "--delay", -5)
    assert human.code == 1 and "--delay" in human.err
    assert Q not in queue_names()


def test_enqueue_delay_with_at_is_refused():
    fails("enqueue", Q, "1", "--delay", 5, "--at", 1_900_000_000_000, code="delay_and_at")
    assert Q not in queue_names()


def test_enqueue_bad_integer_option_names_it():
    for option in ("--priority", "--delay", "--at", "--max-attempts", "--timeout", "--idempotency-retention"):
        run = fq("enqueue", Q, "1", option, "1.5")
        assert run.code == 2, option
        assert option in run.err
    assert Q not in queue_names()


def test_enqueue_option_out_of_range():
    fails("enqueue", Q, "1", "--priority", 2**31, code="invalid", field="priority")
    fails("enqueue", Q, "1", "--max-attempts", 0, code="invalid", field="max_attempts")
    assert Q not in queue_names()


# --- enqueue-many --------------------------------------------------------------------------


def test_enqueue_many_from_a_json_array_file(tmp_path):
    src = tmp_path / "batch.json"
    src.write_text(
        json.dumps(
            [
                {"payload": {"n": 1}, "idempotency": "a"},
                {"payload": {"n": 2}, "priority": 5},
                {"payload": {"n": 3}, "idempotency": "a"},  # coalesces onto the first
            ]
        )
    )
    rows = ok("enqueue-many", Q, str(src))
    assert [r["created"] for r in rows] == [1, 1, 0]
    assert rows[2]["id"] == rows[0]["id"]
    assert ok("stats", Q)["counts"]["ready"] == 2
    assert [j["payload"] for j in ok("claim", Q, "--count", 10)] == [{"n": 2}, {"n": 1}]


def test_enqueue_many_from_json_lines_on_stdin():
    text = '{"payload": 1}\n\n{"payload": [2], "delay_ms": 60000}\n{"payload": "3", "unique_key": "u"}\n'
    rows = ok("enqueue-many", Q, "-", stdin=text)
    assert [r["created"] for r in rows] == [1, 1, 1]
    counts = ok("stats", Q)["counts"]
    assert counts["ready"] == 2 and counts["scheduled"] == 1
    human = fq("enqueue-many", Q, "-", stdin='{"payload": 4}\n{"payload": 5, "unique_key": "u"}\n')
    assert human.code == 0 and "1 created, 1 duplicate" in human.out


def test_enqueue_many_is_all_or_nothing_and_names_the_bad_item(tmp_path):
    fails("enqueue-many", Q, "-", code="invalid_delay", field="items[1].delay_ms",
          stdin='[{"payload": 1}, {"payload": 2, "delay_ms": -1}]')  # fmt: skip
    fails("enqueue-many", Q, "-", code="invalid", field="items[0].payload", stdin='[{"nopayload": 1}]')
    err = fails("enqueue-many", Q, "-", code="invalid_json", stdin='{"payload": 1}\n{"payload": \n')
    assert err["field"] == "line 2"
    fails("enqueue-many", Q, str(tmp_path / "missing.json"), code="invalid", field="source")
    fails("enqueue-many", Q, "-", code="invalid_json", field="source", stdin="42")
    assert Q not in queue_names()


# --- claim, ack, nack, release, extend ------------------------------------------------------


def test_claim_json_shape_and_payload_is_the_json_value():
    made = ok("enqueue", Q, '{"a": [1, 2], "b": null}')
    jobs = ok("claim", Q, "--visibility", 5000, "--worker", "w-1")
    assert len(jobs) == 1
    job = jobs[0]
    assert set(job) == CLAIM_KEYS
    assert job["id"] == made["id"]
    assert job["payload"] == {"a": [1, 2], "b": None}
    assert job["attempts"] == 1
    assert isinstance(job["receipt"], str) and len(job["receipt"]) > 20
    info = ok("get", Q, made["id"])
    assert info["state"] == "running" and info["worker"] == "w-1"
    assert job["deadline"] == info["lease_deadline"] == info["claimed_at"] + 5000
    assert job["enqueued_at"] == info["enqueued_at"] > EPOCH_2020_MS


def test_claim_count_takes_jobs_in_claim_order():
    ids = [ok("enqueue", Q, str(n))["id"] for n in range(3)]
    top = ok("enqueue", Q, '"top"', "--priority", 9)["id"]
    jobs = ok("claim", Q, "--count", 3)
    assert [j["id"] for j in jobs] == [top, ids[0], ids[1]]


def test_claim_nothing_eligible_is_an_empty_list():
    make_queue(Q)
    assert ok("claim", Q) == []
    assert ok("claim", Q, "--wait", 30) == []
    run = fq("claim", Q)
    assert run.code == 0 and run.out.strip() == "no eligible job"


def test_claim_human_output_includes_the_receipt():
    ok("enqueue", Q, '{"k": "v"}')
    run = fq("claim", Q)
    assert run.code == 0
    receipt_line = [line for line in run.out.splitlines() if line.strip().startswith("receipt")]
    assert len(receipt_line) == 1
    receipt = receipt_line[0].split()[-1]
    assert ok("ack", Q, receipt)["state"] == "succeeded"


def test_claim_count_out_of_range():
    ok("enqueue", Q, "1")
    fails("claim", Q, "--count", 1001, code="count_out_of_range", field="count")
    fails("claim", Q, "--count", 0, code="count_out_of_range", field="count")
    human = fq("claim", Q, "--count", 1001)
    assert human.code == 1 and "--count" in human.err
    assert ok("stats", Q)["counts"]["ready"] == 1
    assert len(ok("claim", Q, "--count", 1000)) == 1


def test_claim_visibility_out_of_range():
    ok("enqueue", Q, "1")
    fails("claim", Q, "--visibility", 0, code="visibility_out_of_range", field="visibility_ms")
    fails("claim", Q, "--visibility", 86_400_001, code="visibility_out_of_range", field="visibility_ms")
    assert ok("stats", Q)["counts"] == {**dict.fromkeys(STATE_NAMES, 0), "ready": 1}
    job = claim_one(Q, "--visibility", 86_400_000)
    assert job["deadline"] == ok("get", Q, job["id"])["claimed_at"] + 86_400_000


def test_claim_missing_queue_and_bad_wait():
    fails("claim", Q, code="queue_not_found", field="queue")
    assert Q not in queue_names()
    make_queue(Q)
    fails("claim", Q, "--wait", 20_001, code="invalid", field="wait_ms")
    run = fq("claim", Q, "--count", "ten")
    assert run.code == 2 and "--count" in run.err


def test_ack_stores_the_result_and_a_repeat_is_a_replay():
    made = ok("enqueue", Q, "1")
    job = claim_one()
    first = ok("ack", Q, job["receipt"], "--result", '{"sent": true}')
    assert first == {"id": made["id"], "state": "succeeded", "run_at": None, "replay": False}
    again = ok("ack", Q, job["receipt"], "--result", '{"sent": true}')
    assert again == {**first, "replay": True}
    info = ok("get", Q, made["id"])
    assert info["state"] == "succeeded" and info["result"] == {"sent": True}
    assert ok("stats", Q)["totals"]["acked"] == 1
    human = fq("ack", Q, job["receipt"], "--result", '{"sent": true}')
    assert human.code == 0 and "succeeded" in human.out
    # Not the very same settle (another result): the receipt is spent (docs/reference/semantics.md §9).
    fails("ack", Q, job["receipt"], code="invalid_receipt", field="receipt")
    assert ok("get", Q, made["id"])["result"] == {"sent": True}


def test_ack_bad_result_json_changes_nothing(settings):
    ok("enqueue", Q, "1")
    job = claim_one()
    fails("ack", Q, job["receipt"], "--result", "{nope", code="invalid_json", field="result")
    settings.FQ_MAX_PAYLOAD_BYTES = 10
    fails("ack", Q, job["receipt"], "--result", json.dumps("x" * 20), code="payload_too_large", field="result")
    assert ok("get", Q, job["id"])["state"] == "running"
    assert ok("ack", Q, job["receipt"])["replay"] is False


def test_nack_with_delay_and_error_then_permanent():
    made = ok("enqueue", Q, "1")
    job = claim_one()
    res = ok("nack", Q, job["receipt"], "--delay", 60000, "--error", "boom")
    assert set(res) == SETTLE_KEYS
    assert res["id"] == made["id"] and res["state"] == "scheduled" and res["replay"] is False
    info = ok("get", Q, made["id"])
    assert info["state"] == "scheduled" and info["last_error"] == "boom"
    assert res["run_at"] == info["run_at"]
    assert [e["error"] for e in info["errors"]] == ["boom"]
    ok("enqueue", Q, "2")
    second = claim_one()
    res = ok("nack", Q, second["receipt"], "--permanent", "--error", "bad input")
    assert res["state"] == "dead" and res["run_at"] is None
    human = fq("nack", Q, second["receipt"], "--permanent", "--error", "bad input")
    assert human.code == 0 and "dead" in human.out


def test_nack_negative_or_too_long_delay_is_refused():
    ok("enqueue", Q, "1")
    job = claim_one()
    fails("nack", Q, job["receipt"], "--delay", -1, code="invalid_delay", field="delay_ms")
    fails("nack", Q, job["receipt"], "--delay", 30 * 86_400_000 + 1, code="invalid_delay", field="delay_ms")
    assert ok("get", Q, job["id"])["state"] == "running"
    assert ok("nack", Q, job["receipt"], "--delay", 0)["state"] == "ready"


def test_release_gives_the_attempt_back():
    made = ok("enqueue", Q, "1")
    job = claim_one()
    res = ok("release", Q, job["receipt"], "--error", "shutting down")
    assert res["id"] == made["id"] and res["state"] == "ready" and res["replay"] is False
    info = ok("get", Q, made["id"])
    assert info["state"] == "ready" and info["attempts"] == 0 and info["last_error"] == "shutting down"
    assert ok("stats", Q)["totals"]["released"] == 1


def test_extend_moves_the_deadline():
    ok("enqueue", Q, "1")
    job = claim_one(Q, "--visibility", 1000)
    got = ok("extend", Q, job["receipt"], "--visibility", 600_000)
    assert set(got) == {"deadline"}
    info = ok("get", Q, job["id"])
    assert got["deadline"] == info["lease_deadline"]
    assert got["deadline"] >= job["deadline"] - 1000 + 600_000
    fails("extend", Q, job["receipt"], "--visibility", 0, code="visibility_out_of_range", field="visibility_ms")
    fails("extend", Q, job["receipt"], "--visibility", 86_400_001, code="visibility_out_of_range")
    assert ok("get", Q, job["id"])["lease_deadline"] == got["deadline"]
    run = fq("extend", Q, job["receipt"])  # --visibility is required
    assert run.code == 2 and "--visibility" in run.err
    human = fq("extend", Q, job["receipt"], "--visibility", 1000)
    assert human.code == 0 and human.out.startswith("deadline ")


def test_invalid_receipt_is_refused_by_every_settle_and_changes_nothing():
    ok("enqueue", Q, "1")
    job = claim_one()
    forged = job["receipt"][:-4] + ("AAAA" if not job["receipt"].endswith("AAAA") else "BBBB")
    for receipt in ("nope", forged):
        for argv in (("ack",), ("nack",), ("release",), ("extend", "--visibility", 1000)):
            args = (argv[0], Q, receipt, *argv[1:])
            err = fails(*args, code="invalid_receipt", field="receipt")
            assert receipt not in json.dumps(err)
            human = fq(*args)
            assert human.code == 1 and "receipt" in human.err and receipt not in human.err
    info = ok("get", Q, job["id"])
    assert info["state"] == "running" and info["lease_deadline"] == job["deadline"]
    fails("ack", "cli:other", job["receipt"], code="queue_not_found")
    make_queue("cli:other")
    fails("ack", "cli:other", job["receipt"], code="invalid_receipt")  # a receipt of another queue
    assert ok("ack", Q, job["receipt"])["state"] == "succeeded"


# --- get, jobs, stats -------------------------------------------------------------------------


def test_get_json_shape():
    made = ok("enqueue", Q, '{"p": 1}', "--idempotency", "t1")
    info = ok("get", Q, made["id"])
    for key in ("id", "queue", "state", "priority", "run_at", "enqueued_at", "changed_at", "attempts",
                "max_attempts", "payload", "result", "errors", "last_error", "lease_deadline"):  # fmt: skip
        assert key in info, key
    assert info["state"] == "ready" and info["state"] in STATE_NAMES
    assert info["queue"] == Q and info["payload"] == {"p": 1} and info["result"] is None and info["errors"] == []
    assert info["enqueued_at"] > EPOCH_2020_MS
    human = fq("get", Q, made["id"])
    assert human.code == 0 and made["id"] in human.out and '{"p": 1}' in human.out


def test_times_are_epoch_milliseconds_of_the_database_clock():
    """Instants printed by the CLI agree with the database clock read on its own (within a minute)."""
    made = ok("enqueue", Q, "1")
    before = db.db_now_ms()
    info = ok("get", Q, made["id"])
    assert abs(info["enqueued_at"] - before) < 60_000, (info["enqueued_at"], before)
    assert info["run_at"] == info["enqueued_at"]


def test_get_unknown_job_or_queue():
    make_queue(Q)
    fails("get", Q, "0" * 32, code="job_not_found", field="job_id")
    made = ok("enqueue", "cli:other", "1")
    fails("get", Q, made["id"], code="job_not_found")  # a job of another queue
    fails("get", "cli:missing", made["id"], code="queue_not_found")


def test_jobs_pages_with_a_cursor_and_no_payloads():
    ids = [ok("enqueue", Q, json.dumps({"n": n}))["id"] for n in range(3)]
    page = ok("jobs", Q, "--state", "ready", "--count", 2)
    assert set(page) == {"jobs", "next_cursor"}
    assert [j["id"] for j in page["jobs"]] == ids[:2]
    for j in page["jobs"]:
        assert "payload" not in j and "result" not in j and "errors" not in j
        assert j["state"] == "ready"
    assert isinstance(page["next_cursor"], str)
    rest = ok("jobs", Q, "--state", "ready", "--count", 2, "--cursor", page["next_cursor"])
    assert [j["id"] for j in rest["jobs"]] == ids[2:] and rest["next_cursor"] is None
    assert ok("jobs", Q, "--state", "running")["jobs"] == []
    assert len(ok("jobs", Q)["jobs"]) == 3
    human = fq("jobs", Q, "--count", 2)
    assert human.code == 0 and "--cursor" in human.out and ids[2] in human.out


def test_jobs_cursor_0_is_the_first_page():
    """Users of FQ.JOBS and Redis SCAN start with cursor 0 (docs/reference/cli.md, fq jobs)."""
    ids = [ok("enqueue", Q, json.dumps({"n": n}))["id"] for n in range(3)]
    first = ok("jobs", Q, "--state", "ready", "--count", 2)
    assert ok("jobs", Q, "--state", "ready", "--count", 2, "--cursor", "0") == first
    assert [j["id"] for j in first["jobs"]] == ids[:2]
    assert ok("jobs", Q, "--cursor", "0") == ok("jobs", Q)


def test_jobs_bad_arguments():
    make_queue(Q)
    fails("jobs", Q, "--cursor", "garbage!", code="invalid_cursor", field="cursor")
    fails("jobs", Q, "--count", 1001, code="count_out_of_range", field="count")
    run = fq("jobs", Q, "--state", "queued")
    assert run.code == 2 and "--state" in run.err
    fails("jobs", "cli:missing", code="queue_not_found")


def test_stats_json_shape():
    ok("enqueue", Q, "1")
    ok("enqueue", Q, "2", "--delay", 60000)
    job = claim_one()
    ok("ack", Q, job["receipt"])
    st = ok("stats", Q)
    assert set(st) == {"queue", "counts", "totals", *TIMING_NAMES, "paused", "paused_at"}
    assert (st["paused"], st["paused_at"]) == (False, None)
    assert st["queue"] == Q
    assert st["counts"] == {"waiting": 0, "scheduled": 1, "ready": 0, "running": 0, "succeeded": 1, "dead": 0, "cancelled": 0}
    assert set(TOTAL_NAMES) <= set(st["totals"])
    assert st["totals"]["enqueued"] == 2 and st["totals"]["claimed"] == 1 and st["totals"]["acked"] == 1
    assert st["wait_count"] == 1 and st["run_count"] == 1
    assert st["wait_ms_sum"] >= 0 and st["run_ms_sum"] >= 0
    human = fq("stats", Q)
    assert human.code == 0 and "succeeded" in human.out and "totals" in human.out


def test_receipts_appear_only_in_claim_output():
    ok("enqueue", Q, '{"secret": false}')
    ok("enqueue", Q, "2")
    job = claim_one()
    receipt = job["receipt"]
    secret = receipt.rsplit(".", 1)[-1]
    outputs = []
    for argv in (("get", Q, job["id"]), ("jobs", Q), ("jobs", Q, "--state", "running"), ("stats", Q), ("queues",)):
        for extra in ((), ("--json",)):
            run = fq(*argv, *extra)
            assert run.code == 0, run.err
            outputs.append(run.out + run.err)
    other = claim_one()
    for argv in (("ack", Q, receipt), ("nack", Q, other["receipt"], "--error", "x")):
        run = fq(*argv)
        outputs.append(run.out + run.err)
    for text in outputs:
        assert receipt not in text and secret not in text
        assert other["receipt"] not in text


# --- retry, cancel, wait --------------------------------------------------------------------


def test_retry_a_dead_job():
    made = ok("enqueue", Q, "1")
    job = claim_one()
    ok("nack", Q, job["receipt"], "--permanent")
    info = ok("retry", Q, made["id"])
    assert info["state"] == "ready" and info["attempts"] == 0 and info["payload"] == 1
    err = fails("retry", Q, made["id"], code="invalid_state", field="job_id")
    assert err["state"] == "ready"  # the reported state name (docs/reference/semantics.md §3), not the stored one
    assert "ready" in err["message"]
    fails("ack", Q, job["receipt"], code="invalid_receipt")  # the old receipt stays invalid


def test_cancel_ready_then_a_succeeded_job_is_a_state_error():
    made = ok("enqueue", Q, "1")
    assert ok("cancel", Q, made["id"])["state"] == "cancelled"
    fails("cancel", Q, made["id"], code="invalid_state", field="job_id")
    done = ok("enqueue", Q, "2")
    job = claim_one()
    ok("ack", Q, job["receipt"])
    err = fails("cancel", Q, done["id"], code="invalid_state", field="job_id")
    assert err["state"] == "succeeded"
    human = fq("cancel", Q, done["id"])
    assert human.code == 1 and "succeeded" in human.err
    assert ok("get", Q, done["id"])["state"] == "succeeded"


def test_cancel_a_running_job_voids_its_receipt():
    made = ok("enqueue", Q, "1")
    job = claim_one()
    assert ok("cancel", Q, made["id"])["state"] == "cancelled"
    fails("ack", Q, job["receipt"], code="cancelled", field="receipt")


def test_wait_returns_a_finished_job_or_times_out():
    made = ok("enqueue", Q, "1")
    err = fails("wait", Q, made["id"], "--timeout", 20, code="wait_timeout")
    assert err["state"] == "ready"
    job = claim_one()
    ok("ack", Q, job["receipt"], "--result", "[1]")
    info = ok("wait", Q, made["id"], "--timeout", 0)
    assert info["state"] == "succeeded" and info["result"] == [1]
    fails("wait", Q, "f" * 32, code="job_not_found")


# --- reap, prune --------------------------------------------------------------------------------


def test_reap_expires_leases_past_their_deadline(clock):
    ok("config", Q, "--backoff", 0)
    made = ok("enqueue", Q, "1")
    claim_one(Q, "--visibility", 1000)
    assert ok("reap", Q) == {"expired": 0, "timed_out": 0, "dead": 0}
    clock.advance(1000)  # exactly at the deadline the lease has expired
    assert ok("reap") == {"expired": 1, "timed_out": 0, "dead": 0}
    info = ok("get", Q, made["id"])
    assert info["state"] == "ready" and info["attempts"] == 1
    fails("reap", "cli:missing", code="queue_not_found")
    assert fq("reap").out.startswith("expired 0")


def test_prune_removes_finished_jobs_past_retention(clock):
    made = ok("enqueue", Q, "1")
    kept = ok("enqueue", Q, "2")
    ok("ack", Q, claim_one()["receipt"])
    assert ok("prune", "--retention", 60_000) == {"jobs": 0, "tokens": 0, "queues": 0, "workers": 0, "history": 0}
    clock.advance(60_001)
    assert ok("prune", "--retention", 60_000)["jobs"] == 1
    fails("get", Q, made["id"], code="job_not_found")
    assert ok("get", Q, kept["id"])["state"] == "ready"
    assert "pruned 0 job(s)" in fq("prune").out


# --- usage ---------------------------------------------------------------------------------------


def test_json_flag_before_the_operation():
    make_queue(Q)
    for argv in (("--json", "stats", Q), ("stats", Q, "--json"), ("--json", "stats", "--json", Q)):
        run = fq(*argv)
        assert run.code == 0 and json.loads(run.out)["queue"] == Q
    assert not fq("stats", Q).out.startswith("{")


def test_negative_number_payload_is_a_payload():
    made = ok("enqueue", Q, "-1")
    assert ok("get", Q, made["id"])["payload"] == -1


def test_usage_errors():
    assert fq().code == 2  # an operation is required
    assert fq("frobnicate").code == 2
    run = fq("get", Q)  # JOB_ID missing
    assert run.code == 2 and "JOB_ID" in run.err


@pytest.mark.django_db(transaction=True)
def test_real_command_line_exit_codes(tmp_path):
    """``python -m django fq …`` in a child process: exit 0 / 1 / 2, errors on stderr, no traceback."""
    name = connection.settings_dict["NAME"]  # the test database (a file on SQLite)
    (tmp_path / "cli_settings.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa: F403
            DATABASES = {{"default": {{**DATABASES["default"], "NAME": {name!r}}}}}  # noqa: F405
            """
        )
    )
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
        "DJANGO_SETTINGS_MODULE": "cli_settings",
    }

    def cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "django", "fq", *map(str, argv)],
            env=env, cwd=root, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    missing = cli("config", Q, "--json")
    assert missing.returncode == 1, missing.stderr
    assert json.loads(missing.stderr)["code"] == "queue_not_found"
    assert missing.stdout == "" and "Traceback" not in missing.stderr
    assert Q not in queue_names()

    made = cli("enqueue", Q, '{"via": "cli"}', "--json")
    assert made.returncode == 0, made.stderr
    job_id = json.loads(made.stdout)["id"]
    assert services.get(Q, job_id).payload == {"via": "cli"}

    # Django's own options after the operation: --settings takes effect (the environment names
    # no usable settings here), the others are accepted.
    later = subprocess.run(
        [sys.executable, "-m", "django", "fq", "get", Q, job_id, "--json", "--settings=cli_settings", "-v", "0", "--traceback"],
        env={**env, "DJANGO_SETTINGS_MODULE": "no_such_settings"}, cwd=root, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert later.returncode == 0, later.stderr
    assert json.loads(later.stdout)["payload"] == {"via": "cli"}

    usage = cli("claim", Q, "--count", "abc")
    assert usage.returncode == 2
    assert "--count" in usage.stderr and "Traceback" not in usage.stderr


def test_requeue_makes_a_scheduled_job_ready():
    made = ok("enqueue", Q, "1", "--delay", "3600000")
    assert ok("get", Q, made["id"])["state"] == "scheduled"
    assert ok("requeue", Q, made["id"])["state"] == "ready"
    claim_one()
    fails("requeue", Q, made["id"], code="invalid_state", field="job_id")


@pytest.mark.django_db(transaction=True)
def test_a_database_error_as_json_has_the_documented_keys():
    """docs/reference/cli.md: with --json an error is the error's object, {"code", "message", "field"}.

    Found by trying the product as a new user: before ``migrate``, ``fq enqueue x '{}' --json``
    printed ``{"code": "error", "message": "database error: ..."}``, with no ``field``, while
    every other error object (the CLI's and the REST API's) carries it, ``null`` when no field
    is to blame.
    """
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ALTER TABLE django_fq_queue RENAME TO django_fq_queue_away")
    try:
        run = fq("enqueue", "q", "{}", "--json")
        assert run.code == 1
        error = run.err_json
        assert "migrate" in error["message"]
        assert set(error) == {"code", "message", "field"}
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE django_fq_queue_away RENAME TO django_fq_queue")


@pytest.mark.django_db(transaction=True)
def test_missing_tables_give_a_one_line_error_with_a_hint():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ALTER TABLE django_fq_queue RENAME TO django_fq_queue_away")
    try:
        run = fq("enqueue", "q", "{}")
        assert run.code == 1 and "Traceback" not in run.err
        assert "database error" in run.err and "migrate" in run.err
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE django_fq_queue_away RENAME TO django_fq_queue")


# --- rate limits and snoozes (docs/reference/semantics.md §9 "Rate limits") -----------------------


def test_config_refuses_a_bad_rate_limit_by_its_option_and_writes_nothing():
    ok("config", Q, "--rate-limit", 5)
    err = fails("config", Q, "--rate-limit", 1_000_001, code="invalid_policy", field="rate_limit")
    assert "--rate-limit" in err["message"] or "rate_limit" in err["message"]
    fails("config", Q, "--rate-window", 0, code="invalid_policy", field="rate_window_ms")
    assert services.policy(Q).rate_limit == 5 and services.policy(Q).rate_window_ms == 1000


def test_config_refuses_a_bad_key_rate_limit_by_its_option_and_writes_nothing():
    ok("config", Q, "--key-rate-limit", 5)
    err = fails("config", Q, "--key-rate-limit", -1, code="invalid_policy", field="key_rate_limit")
    assert "--key-rate-limit" in err["message"] or "key_rate_limit" in err["message"]
    fails("config", Q, "--key-rate-limit", 1_000_001, code="invalid_policy", field="key_rate_limit")
    assert services.policy(Q).key_rate_limit == 5


def test_claim_says_when_the_rate_limit_lets_the_next_job_through():
    services.configure(Q, rate_limit=1, rate_window_ms=60_000)
    services.enqueue(Q, {"n": 1})
    services.enqueue(Q, {"n": 2})
    assert len(ok("claim", Q, "--count", 2)) == 1  # --json: still the list of jobs
    run = fq("claim", Q)
    assert run.code == 0 and "rate limit reached: the next job may be claimed in" in run.out


def test_get_shows_the_snooze_count():
    job = services.enqueue(Q, {"n": 1}).id
    receipt = ok("claim", Q)[0]["receipt"]
    ok("release", Q, receipt, "--delay-ms", 0)
    assert ok("get", Q, job)["snoozes"] == 1
    assert "snoozes" in fq("get", Q, job).out
