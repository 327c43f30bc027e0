"""The first worker, ``manage.py fq_worker``, run for real in a child process.

Each test enqueues through the Python API in the test process, runs
``python -m django fq_worker …`` as a subprocess pointed at the same test
database (``tests.worker_settings`` reads ``FQ_CHILD_DB_NAME``), and checks
what the handlers (``tests/testapp/fq_handlers.py``) and the worker left in
the database. Handlers write ``Done`` rows, unique per job, so a job that ran
twice fails loudly.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt
from django_fq.worker import JobContext, ReceiptMaskingFilter
from tests.testapp.models import Done
from tests.worker.helpers import child_env

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)

#: Fast defaults for every run: poll and reap often.
FAST = ["--poll-interval", "10", "--reaper-interval", "10"]


def run_worker(*args: str, clock_offset_ms: int = 0, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``fq_worker`` with ``args`` in a child process on this test's database; return the finished process."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.worker_settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        FQ_CHILD_DB_NAME=str(connection.settings_dict["NAME"]),
        FQ_CHILD_CLOCK_OFFSET_MS=str(clock_offset_ms),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", "fq_worker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Assert the worker exited 0 (showing its output otherwise)."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def done_ids() -> set[str]:
    return set(Done.objects.values_list("job_id", flat=True))


# --- draining, results, failures ---------------------------------------------------------------


@pytest.mark.every_django  # the worker's smoke test on every Django version
def test_burst_drains_all_jobs_and_stores_results():
    ids = [fq.enqueue("t.ok", {"n": n}).id for n in range(6)]

    proc = ok(run_worker("--burst", "--queue", "t.ok", *FAST))

    assert done_ids() == set(ids)
    assert Done.objects.exclude(pid=os.getpid()).count() == 6  # run by the child, not by us
    for n, job_id in enumerate(ids):
        job = fq.get("t.ok", job_id)
        assert job.state == "succeeded"
        assert job.attempts == 1
        assert job.result == {"job": job_id, "n": n, "attempt": 1}
        assert job.finished_at is not None
    stats = fq.stats("t.ok")
    assert stats.counts["succeeded"] == 6
    assert stats.counts["ready"] == stats.counts["running"] == 0
    assert stats.totals["acked"] == 6
    assert "6 jobs ok, 0 failed" in proc.stdout


def test_raising_handler_nacks_with_error_and_traceback():
    fq.configure("t.fail", backoff_ms=60_000, max_attempts=5)
    job_id = fq.enqueue("t.fail", {"x": 1}).id

    proc = ok(run_worker("--burst", "--queue", "t.fail", *FAST))

    job = fq.get("t.fail", job_id)
    # Burst does not wait for the retry, which is a minute away.
    assert job.state == "scheduled"
    assert job.attempts == 1
    assert job.result is None
    assert job.last_error.startswith("RuntimeError: boom on attempt 1")
    assert "Traceback (most recent call last)" in job.last_error
    assert "fq_handlers.py" in job.last_error
    assert [e["kind"] for e in job.errors] == ["nack"]
    assert job.errors[0]["error"] == job.last_error
    assert job.run_at >= job.changed_at + 60_000 - 1
    assert "0 jobs ok, 1 failed" in proc.stdout


def test_a_burst_summary_counts_timed_out_jobs_apart():
    """A new user saw "0 jobs ok, 0 failed, 2 not settled" for jobs that had run past their timeout."""
    fq.configure("t.slow", backoff_ms=0, max_attempts=2)
    job_id = fq.enqueue("t.slow", {"sleep_ms": 1500}, timeout_ms=300).id

    proc = ok(run_worker("--burst", "--queue", "t.slow", *FAST))

    job = fq.get("t.slow", job_id)
    assert (job.state, job.attempts) == ("dead", 2)
    assert [e["kind"] for e in job.errors] == ["timeout", "timeout"]
    assert "fq_worker: 0 jobs ok, 0 failed, 2 timed out\n" in proc.stdout
    assert "not settled" not in proc.stdout


def test_max_attempts_reached_makes_the_job_dead():
    fq.configure("t.fail", backoff_ms=0, max_attempts=3)
    job_id = fq.enqueue("t.fail", {}).id

    proc = ok(run_worker("--burst", "--queue", "t.fail", *FAST))

    job = fq.get("t.fail", job_id)
    assert job.state == "dead"
    assert job.attempts == 3
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]
    assert "boom on attempt 3" in job.last_error
    assert fq.stats("t.fail").totals["dead"] == 1
    assert "0 jobs ok, 3 failed" in proc.stdout


def test_permanent_failure_is_dead_at_once():
    fq.configure("t.perm", backoff_ms=0, max_attempts=10)
    job_id = fq.enqueue("t.perm", {}).id

    ok(run_worker("--burst", "--queue", "t.perm", *FAST))

    job = fq.get("t.perm", job_id)
    assert job.state == "dead"
    assert job.attempts == 1
    assert job.last_error.startswith("PermanentFailure: this job can never succeed")
    assert "Traceback" in job.last_error


def test_result_that_is_not_json_is_a_failed_attempt():
    fq.configure("t.badresult", backoff_ms=60_000)
    job_id = fq.enqueue("t.badresult", {}).id

    proc = ok(run_worker("--burst", "--queue", "t.badresult", *FAST))

    job = fq.get("t.badresult", job_id)
    assert job.state == "scheduled"
    assert job.attempts == 1
    assert job.result is None
    assert "return value cannot be stored" in job.last_error
    assert "0 jobs ok, 1 failed" in proc.stdout


def test_handler_gets_a_context_without_the_receipt():
    job_id = fq.enqueue("t.inspect", {"k": "v"}).id

    ok(run_worker("--burst", "--queue", "t.inspect", *FAST))

    seen = fq.get("t.inspect", job_id).result
    assert seen["id"] == job_id
    assert seen["queue"] == "t.inspect"
    assert seen["payload"] == {"k": "v"}
    assert seen["attempts"] == 1
    assert seen["max_attempts"] == 25
    assert seen["deadline"] > seen["enqueued_at"]
    assert "receipt" not in seen["attrs"]
    assert "fq1." not in seen["repr"]
    assert not any("fq1." in v for v in seen["values"])


def test_context_times_are_epoch_ms_of_the_database_clock():
    """The context's enqueued_at/deadline are epoch milliseconds (docs/reference/semantics.md §9 "Time": times are epoch ms, DB clock)."""
    before = int(time.time() * 1000)
    job_id = fq.enqueue("t.inspect", {}).id

    ok(run_worker("--burst", "--queue", "t.inspect", "--visibility", "60000", *FAST))

    seen = fq.get("t.inspect", job_id).result
    after = int(time.time() * 1000)
    # Same host, so the database clock is within a minute of ours.
    assert before - 60_000 <= seen["enqueued_at"] <= after + 60_000
    assert seen["enqueued_at"] + 60_000 <= seen["deadline"] <= after + 120_000


# --- which queues, and how long --------------------------------------------------------------------


def test_queue_option_limits_the_queues_served():
    mine = [fq.enqueue("t.other", {"n": n}).id for n in range(2)]
    theirs = [fq.enqueue("t.ok", {"n": n}).id for n in range(2)]

    ok(run_worker("--burst", "--queue", "t.other", *FAST))

    assert done_ids() == set(mine)
    assert {fq.get("t.ok", i).state for i in theirs} == {"ready"}
    assert fq.stats("t.ok").totals["claimed"] == 0

    # Without --queue the worker serves every queue with a handler.
    ok(run_worker("--burst", *FAST))
    assert done_ids() == set(mine + theirs)


def test_queue_without_handler_is_an_error():
    job_id = fq.enqueue("t.nohandler", {}).id

    proc = run_worker("--burst", "--queue", "t.ok", "--queue", "t.nohandler", *FAST)

    assert proc.returncode == 1
    assert "no handler" in proc.stderr and "t.nohandler" in proc.stderr
    assert fq.get("t.nohandler", job_id).state == "ready"

    bad = run_worker("--burst", "--queue", "not a queue!", *FAST)
    assert bad.returncode == 1
    assert "invalid queue name" in bad.stderr


def test_max_jobs_stops_a_non_burst_worker():
    ids = [fq.enqueue("t.ok", {"n": n}).id for n in range(5)]

    proc = ok(run_worker("--max-jobs", "2", "--queue", "t.ok", *FAST))

    assert done_ids() == set(ids[:2])
    assert [fq.get("t.ok", i).state for i in ids] == ["succeeded"] * 2 + ["ready"] * 3
    assert "2 jobs ok, 0 failed" in proc.stdout


# --- the reaper and refused settles ------------------------------------------------------------------


def test_reaper_expires_a_lease_whose_holder_vanished():
    fq.configure("t.lost", backoff_ms=0)
    job_id = fq.enqueue("t.lost", {}).id
    (claimed,) = fq.claim("t.lost", visibility_ms=100, worker="vanished")
    # The child sees the database clock 5 s ahead: that lease is long expired there.

    # Control: without the reaper nobody touches a queue the worker does not serve.
    ok(run_worker("--burst", "--queue", "t.other", "--no-reaper", *FAST, clock_offset_ms=5_000))
    assert fq.get("t.lost", job_id).state == "running"

    proc = ok(run_worker("--burst", "--queue", "t.other", *FAST, clock_offset_ms=5_000))

    job = fq.get("t.lost", job_id)
    assert job.state in ("ready", "scheduled")
    assert job.lease_deadline is None
    assert job.attempts == 1
    assert [e["kind"] for e in job.errors] == ["expired"]
    assert fq.stats("t.lost").totals["expired"] == 1
    with pytest.raises(InvalidReceipt):
        fq.ack("t.lost", claimed.receipt)
    assert "reaper.pass expired=1 timed_out=0 dead=0" in proc.stderr


def test_heartbeat_keeps_a_job_running_past_its_visibility():
    """A 400 ms lease and a 1 s handler: heartbeats extend the lease, the job is acked on its first run."""
    fq.configure("t.slow", backoff_ms=60_000)
    slow = fq.enqueue("t.slow", {"sleep_ms": 1000}).id
    others = [fq.enqueue("t.ok", {"n": n}).id for n in range(2)]

    proc = ok(run_worker("--burst", "--queue", "t.slow", "--queue", "t.ok", "--visibility", "400", *FAST))

    assert done_ids() == {slow, *others}
    assert {fq.get("t.ok", i).state for i in others} == {"succeeded"}
    job = fq.get("t.slow", slow)
    assert job.state == "succeeded"
    assert job.result == {"slept": True}
    assert job.attempts == 1
    assert job.errors == []
    assert fq.stats("t.slow").totals["expired"] == 0
    assert "3 jobs ok, 0 failed" in proc.stdout


def test_job_cancelled_while_running_is_logged_and_the_loop_goes_on():
    gone = fq.enqueue("t.cancelself", {}).id
    others = [fq.enqueue("t.ok", {"n": n}).id for n in range(2)]

    proc = ok(run_worker("--burst", "--queue", "t.cancelself", "--queue", "t.ok", *FAST))

    assert fq.get("t.cancelself", gone).state == "cancelled"
    assert {fq.get("t.ok", i).state for i in others} == {"succeeded"}
    assert f"job.cancelled job={gone} queue=t.cancelself" in proc.stderr
    assert "2 jobs ok, 0 failed, 1 not settled" in proc.stdout


# --- logs ------------------------------------------------------------------------------------------------


def test_worker_logs_name_jobs_but_never_receipts_or_payloads():
    fq.configure("t.fail", backoff_ms=60_000)
    secret_payload = {"secret": "payload-marker-7f3a"}
    ids = {
        "t.ok": fq.enqueue("t.ok", {"n": 1, **secret_payload}).id,
        "t.fail": fq.enqueue("t.fail", secret_payload).id,
        "t.perm": fq.enqueue("t.perm", secret_payload).id,
        "t.badresult": fq.enqueue("t.badresult", secret_payload).id,
        "t.cancelself": fq.enqueue("t.cancelself", secret_payload).id,
    }

    proc = ok(run_worker("--burst", *(f"--queue={q}" for q in ids), *FAST, "-v", "2"))

    output = proc.stdout + proc.stderr
    assert "fq1." not in output
    assert "payload-marker-7f3a" not in output
    assert "worker.start worker=" in proc.stderr and "worker.stop worker=" in proc.stderr
    for queue, job_id in ids.items():
        assert job_id in proc.stderr, queue
    assert f"job.acked job={ids['t.ok']} queue=t.ok attempt=1/25 ms=" in proc.stderr
    assert f"job.nacked job={ids['t.fail']} queue=t.fail attempt=1/25 ms=" in proc.stderr
    assert f"job.nacked job={ids['t.perm']} queue=t.perm attempt=1/25 ms=" in proc.stderr
    assert "permanent=true state=dead" in proc.stderr
    assert "worker.claim worker=" in proc.stderr
    assert "1 jobs ok, 3 failed, 1 not settled" in proc.stdout


# --- in-process pieces -----------------------------------------------------------------------------------


def test_receipt_masking_filter_masks_receipt_shaped_text():
    record = logging.LogRecord("django_fq.worker", logging.INFO, __file__, 1, "leaked %s", ("fq1." + "a" * 32 + ".3.sEcReT_-x",), None)
    assert ReceiptMaskingFilter().filter(record)
    assert record.getMessage() == "leaked fq1.[masked]"


def test_job_context_repr_and_slots():
    ctx = JobContext(id="a" * 32, queue="q", payload={"p": 1}, attempts=2, max_attempts=5, deadline=10, enqueued_at=1)
    assert repr(ctx) == f"JobContext(id='{'a' * 32}', queue='q', attempt=2/5)"
    with pytest.raises(AttributeError):
        ctx.receipt = "fq1.x"  # no place to keep one


def test_a_broken_handler_setting_is_a_clear_error(tmp_path):
    """A wrong FQ_HANDLERS path stops the worker with one line naming the setting, not a traceback."""
    settings_file = tmp_path / "broken_handlers_settings.py"
    settings_file.write_text("from tests.worker_settings import *\nFQ_HANDLERS = {'x.y': 'nowhere.at.all'}\n")
    root = Path(__file__).resolve().parents[1]
    # On this test's database: Django 6.x's checks connect on MariaDB, where the settings' default one is absent.
    env = {**child_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
           "DJANGO_SETTINGS_MODULE": "broken_handlers_settings"}
    proc = subprocess.run([sys.executable, "-m", "django", "fq_worker", "--burst"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "cannot load the job handlers" in proc.stderr and "FQ_HANDLERS" in proc.stderr
    assert "Traceback" not in proc.stderr
