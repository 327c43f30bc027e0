"""``manage.py fq workers``: the worker registry on the command line (docs/reference/cli.md)."""

from __future__ import annotations

import pytest

import django_fq

from .test_cli import fails, fq, ok
from .worker_rows import add_worker

pytestmark = pytest.mark.django_db


def test_workers_json_lists_live_and_gone_rows_with_every_field():
    add_worker("a:1:x", queues=("w:q", "w:r"), pid=11, running=2)
    add_worker("b:2:y", host="host-b", pid=22, gone=True)
    rows = ok("workers")
    assert [(r["worker_id"], r["state"]) for r in rows] == [("a:1:x", "live"), ("b:2:y", "gone")]
    first = rows[0]
    assert set(first) == {
        "worker_id", "host", "pid", "queues", "concurrency", "running", "pool", "version", "started_at",
        "heartbeat_at", "heartbeat_ms", "age_ms", "state", "database",
    }  # fmt: skip
    assert (first["pid"], first["queues"], first["running"], first["concurrency"]) == (11, ["w:q", "w:r"], 2, 4)
    assert first["version"] == django_fq.__version__ and first["database"] == "default"
    assert first["started_at"] <= first["heartbeat_at"]
    assert "receipt" not in str(rows)
    assert [r["worker_id"] for r in ok("workers", "--state", "gone")] == ["b:2:y"]
    assert [r["worker_id"] for r in ok("workers", "--queue", "w:r")] == ["a:1:x"]


def test_workers_table_marks_gone_workers():
    add_worker("a:1:x", pid=11)
    add_worker("b:2:y", host="host-b", pid=22, gone=True)
    run = fq("workers")
    assert run.code == 0, run.err
    head, live, gone = run.out.splitlines()
    assert head.split()[:3] == ["WORKER", "HOST", "PID"] and "STATE" in head
    assert live.split()[:3] == ["a:1:x", "host-a", "11"] and live.rstrip().endswith("live")
    assert gone.split()[0] == "b:2:y" and gone.rstrip().endswith("gone")
    assert [line.split()[0] for line in fq("workers", "--state", "live").out.splitlines()[1:]] == ["a:1:x"]
    assert fq("workers", "--queue", "nobody:serves").out.strip() == "no workers"


def test_bad_options_are_clear_errors():
    run = fq("workers", "--state", "dead", "--json")
    assert run.code == 2 and "--state" in run.err and "Traceback" not in run.err
    err = fails("workers", "--queue", "bad queue!", code="invalid_queue_name", field="--queue")
    assert "Queue names" in err["message"]
    run = fq("workers", "--queue", "bad\x00q")
    assert run.code == 1 and run.err.startswith("fq workers: error:") and "(--queue)" in run.err
