"""Handler middleware in real ``fq_worker`` processes (``tests.middleware.worker_settings``).

The child's middleware and handler append one JSON line per step to the file
named by the payload's ``"trail"``; the tests read it after the burst worker ends.
"""

from __future__ import annotations

import json

import pytest

from django_fq import services as fq
from tests.worker.helpers import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"DJANGO_SETTINGS_MODULE": "tests.middleware.worker_settings"}
FAST = ("--burst", "--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def trail(path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def run_burst(*queues: str) -> WorkerProc:
    proc = WorkerProc(*FAST, *(f"--queue={q}" for q in queues), env=ENV)
    try:
        assert proc.wait(timeout=60) == 0, proc.stderr
    finally:
        proc.kill()
    return proc


def test_global_then_per_handler_middleware_around_the_handler_with_its_metadata(tmp_path):
    path = str(tmp_path / "trail.jsonl")
    meta = {"tenant": "acme", "tags": ["eu"]}
    job = fq.enqueue("t.mw", {"trail": path}, metadata=meta).id
    plain = fq.enqueue("t.mw.plain", {"trail": path}).id
    run_burst("t.mw", "t.mw.plain")
    steps = trail(path)
    of_job = [s["mw"] for s in steps if s["id"] == job]
    assert of_job == ["outer:before", "per_handler", "handler", "outer:after"]
    assert [s["mw"] for s in steps if s["id"] == plain] == ["outer:before", "handler", "outer:after"]
    assert all(s["metadata"] == meta for s in steps if s["id"] == job)
    assert all(s["metadata"] == {} for s in steps if s["id"] == plain)
    assert fq.get("t.mw", job).result == {"metadata": meta}
    assert fq.get("t.mw.plain", plain).state == "succeeded"


def test_a_middleware_snooze_gives_the_attempt_back_and_the_job_runs_again(tmp_path):
    path = str(tmp_path / "trail.jsonl")
    job = fq.enqueue("t.mw", {"trail": path}, metadata={"snooze_ms": 0}).id
    proc = run_burst("t.mw")
    steps = [(s["mw"], s["attempt"]) for s in trail(path) if s["id"] == job]
    assert steps == [
        ("outer:before", 1), ("snooze", 1), ("outer:after", 1),
        ("outer:before", 1), ("per_handler", 1), ("handler", 1), ("outer:after", 1),
    ]  # fmt: skip
    info = fq.get("t.mw", job)
    assert info.state == "succeeded" and info.attempts == 1
    assert [e["kind"] for e in info.errors] == ["snooze"]
    assert "job.snoozed" in proc.stderr


def test_a_middleware_retry_after_replaces_the_queues_backoff(tmp_path):
    fq.configure("t.mw", backoff_ms=3_600_000)  # the backoff would keep the job away for an hour
    path = str(tmp_path / "trail.jsonl")
    job = fq.enqueue("t.mw", {"trail": path, "fail_first": True}).id
    run_burst("t.mw")
    steps = [(s["mw"], s["attempt"]) for s in trail(path) if s["id"] == job]
    assert ("retry", 1) in steps and ("handler", 2) in steps
    info = fq.get("t.mw", job)
    assert info.state == "succeeded" and info.attempts == 2
    assert info.errors[0]["kind"] == "nack" and "retrying: first attempt fails" in info.errors[0]["error"]


def test_a_worker_with_middleware_that_does_not_import_refuses_to_start():
    job = fq.enqueue("t.mw", {}).id
    proc = WorkerProc(*FAST, "--queue=t.mw", env={"DJANGO_SETTINGS_MODULE": "tests.middleware.broken_settings"})
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code != 0
    assert "FQ_HANDLER_MIDDLEWARE[1]" in proc.stderr and "no_such_middleware" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert fq.get("t.mw", job).state == "ready"
