"""``manage.py fq health`` and ``django_fq.health.check``: each condition, its exit status, bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from django.core.management import call_command

from django_fq import health
from django_fq import services as fq
from django_fq.exceptions import InvalidArgument, InvalidQueueName, PermanentFailure, QueueNotFound
from django_fq.testing import drain

pytestmark = pytest.mark.django_db

Q = "h:main"
OTHER = "h:other"


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)


def run(*argv) -> Run:
    """``manage.py fq health *argv`` in-process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("fq", "health", *[str(a) for a in argv], stdout=out, stderr=err)
    except SystemExit as exc:
        code = exc.code
    return Run(code, out.getvalue(), err.getvalue())


def checks(report) -> set[tuple[str, str, str]]:
    return {(p["check"], p["queue"], p["status"]) for p in report["problems"]}


def _refuse(job):
    raise PermanentFailure("no")


def make_dead(queue: str, n: int) -> None:
    """``n`` dead jobs on ``queue``: a handler that fails permanently, run by the test helpers' drain."""
    for _ in range(n):
        fq.enqueue(queue, {})
    report = drain(queue, handlers={queue: _refuse})
    assert len(report.dead) == n == len(report.jobs)


# --- ok ----------------------------------------------------------------------------------------------------


def test_healthy_queues_exit_0_with_one_row_each():
    fq.enqueue(Q, {})
    fq.configure(OTHER)
    r = run("--json", "--max-dead", 0, "--max-ready-age-ms", 600_000)
    assert r.code == 0, r.err
    d = r.json
    assert d["status"] == "ok" and d["exit_code"] == 0 and d["problems"] == []
    assert d["thresholds"] == {"stuck_lease_ms": 60_000, "max_dead": 0, "max_ready_age_ms": 600_000}
    rows = {q["queue"]: q for q in d["queues"]}
    assert set(rows) == {Q, OTHER}
    assert rows[Q]["stuck_leases"] == 0 and rows[Q]["dead"] == 0 and 0 <= rows[Q]["oldest_ready_age_ms"] < 600_000
    assert rows[OTHER]["oldest_ready_age_ms"] is None
    human = run()
    assert human.code == 0 and human.out.startswith("OK: 2 queue(s) checked, no problem")


def test_no_queue_at_all_is_ok():
    r = run("--json")
    assert r.code == 0 and r.json["queues"] == []


# --- stuck leases -----------------------------------------------------------------------------------------


def test_a_lease_long_past_its_deadline_and_not_reaped_is_critical(clock):
    fq.enqueue(Q, {})
    fq.claim(Q, visibility_ms=1000)
    clock.advance(30_000)  # 29 s past the deadline: below the default 60 s
    assert run().code == 0
    clock.advance(40_000)  # 69 s past it
    r = run("--json")
    assert r.code == 2
    assert checks(r.json) == {("stuck_leases", Q, "critical")}
    (problem,) = r.json["problems"]
    assert problem["value"] == 1 and problem["threshold"] == 60_000
    assert "reaper" in problem["message"]
    assert r.json["queues"][0]["stuck_for_ms"] >= 69_000
    assert run("--stuck-lease-ms", 120_000).code == 0
    human = run()
    assert human.code == 2 and human.out.startswith(f"CRITICAL: {Q}: 1 lease(s) expired more than 60000 ms ago")
    fq.reap()  # what a running reaper does
    assert run("--stuck-lease-ms", 0).code == 0


def test_a_live_lease_is_never_stuck(clock):
    fq.enqueue(Q, {})
    fq.claim(Q, visibility_ms=120_000)
    clock.advance(100_000)
    assert run("--stuck-lease-ms", 0).code == 0


# --- dead jobs ------------------------------------------------------------------------------------------------


def test_more_dead_jobs_than_max_dead_is_a_warning():
    make_dead(Q, 2)
    assert run("--max-dead", 2).code == 0
    r = run("--json", "--max-dead", 1)
    assert r.code == 1
    assert checks(r.json) == {("dead_jobs", Q, "warning")}
    assert r.json["problems"][0]["value"] == 2 and r.json["queues"][0]["dead"] == 2
    assert run("--max-dead", 1).out.startswith(f"WARNING: {Q}: 2 dead job(s), more than 1")
    assert run().code == 0  # not checked without --max-dead
    job = fq.jobs(Q, state="dead").jobs[0]
    fq.cancel(Q, job.id)
    assert run("--max-dead", 1).code == 0


# --- oldest ready job ------------------------------------------------------------------------------------------


def test_a_job_ready_for_too_long_is_critical_and_scheduled_jobs_do_not_count(clock):
    fq.enqueue(Q, {}, delay_ms=3_600_000)
    clock.advance(10_000)
    assert run("--max-ready-age-ms", 5000).code == 0  # scheduled, not ready
    fq.enqueue(Q, {})
    clock.advance(10_000)
    r = run("--json", "--max-ready-age-ms", 5000)
    assert r.code == 2
    assert checks(r.json) == {("ready_age", Q, "critical")}
    assert 10_000 <= r.json["problems"][0]["value"] < 3_600_000
    assert run("--max-ready-age-ms", 3_000_000).code == 0
    fq.claim(Q)
    assert run("--max-ready-age-ms", 0).code == 0  # claimed: nothing ready any more


def test_ready_age_counts_from_when_a_retried_job_became_eligible(clock):
    fq.configure(Q, backoff_ms=60_000, max_backoff_ms=60_000)
    fq.enqueue(Q, {})
    (job,) = fq.claim(Q)
    fq.nack(Q, job.receipt, error="later")  # eligible again in 60 s
    clock.advance(70_000)  # enqueued 70 s ago, eligible for 10 s
    r = run("--json", "--max-ready-age-ms", 30_000)
    assert r.code == 0, r.out
    assert 10_000 <= r.json["queues"][0]["oldest_ready_age_ms"] < 30_000


# --- several problems, one queue -----------------------------------------------------------------------------


def test_critical_wins_over_warning_and_every_problem_is_listed(clock):
    make_dead(Q, 1)
    fq.enqueue(OTHER, {})
    clock.advance(20_000)
    r = run("--json", "--max-dead", 0, "--max-ready-age-ms", 1000)
    assert r.code == 2 and r.json["status"] == "critical"
    assert checks(r.json) == {("dead_jobs", Q, "warning"), ("ready_age", OTHER, "critical")}
    assert [p["status"] for p in r.json["problems"]] == ["critical", "warning"]
    human = run("--max-dead", 0, "--max-ready-age-ms", 1000).out.splitlines()
    assert human[0].startswith(f"CRITICAL: {OTHER}: the oldest ready job has waited")
    assert human[1] == f"WARNING: {Q}: 1 dead job(s), more than 0"


def test_one_queue_only_checks_that_queue(clock):
    make_dead(Q, 1)
    fq.enqueue(OTHER, {})
    clock.advance(20_000)
    r = run(Q, "--json", "--max-ready-age-ms", 1000)
    assert r.code == 0 and [q["queue"] for q in r.json["queues"]] == [Q]
    r = run(OTHER, "--json", "--max-dead", 0, "--max-ready-age-ms", 1000)
    assert r.code == 2 and checks(r.json) == {("ready_age", OTHER, "critical")}


# --- bad input: exit 3 (unknown), the field named, nothing changed ---------------------------------------


@pytest.mark.parametrize(
    "argv, field, option",
    [
        (["--max-dead", -1], "max_dead", "--max-dead"),
        (["--stuck-lease-ms", -5], "stuck_lease_ms", "--stuck-lease-ms"),
        (["--max-ready-age-ms", -1], "max_ready_age_ms", "--max-ready-age-ms"),
        (["--max-ready-age-ms", 31 * 86_400_000], "max_ready_age_ms", "--max-ready-age-ms"),
        (["h:nosuch"], "queue", "QUEUE"),
        (["bad name!"], "queue", "QUEUE"),
    ],
)
def test_bad_input_exits_3_naming_the_field(argv, field, option):
    fq.enqueue(Q, {})
    r = run(*argv, "--json")
    assert r.code == 3 and r.out == ""
    assert json.loads(r.err)["field"] == field
    r = run(*argv)
    assert r.code == 3
    assert r.err.startswith("fq health: error: ") and r.err.rstrip().endswith(f"({option})")
    assert "Traceback" not in r.err


def test_a_malformed_command_line_exits_3_too(capsys):
    r = run("--max-dead", "lots")
    assert r.code == 3
    err = capsys.readouterr().err
    assert "--max-dead" in err and "invalid int value" in err


def test_python_api_names_the_field():
    fq.configure(Q)
    with pytest.raises(InvalidArgument) as exc:
        health.check(max_dead=-1)
    assert exc.value.field == "max_dead"
    with pytest.raises(InvalidArgument) as exc:
        health.check(stuck_lease_ms="60000")
    assert exc.value.field == "stuck_lease_ms"
    with pytest.raises(InvalidArgument) as exc:
        health.check(max_ready_age_ms=True)
    assert exc.value.field == "max_ready_age_ms"
    with pytest.raises(QueueNotFound) as exc:
        health.check("h:nosuch")
    assert exc.value.field == "queue"
    with pytest.raises(InvalidQueueName):
        health.check("")
    assert [q.name for q in fq.queues()] == [Q]  # nothing created


@pytest.mark.django_db(transaction=True)
def test_exit_statuses_of_the_real_command_line(clock):
    """``python -m django fq health`` in a child process on this test's database (0 and 1: in-process tests)."""
    from tests.worker.helpers import ROOT, child_env

    def cli(*argv) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "django", "fq", "health", *argv],
            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    fq.enqueue(Q, {})
    clock.advance(10_000)
    done = cli("--max-ready-age-ms", "1000")
    assert done.returncode == 2 and done.stdout.startswith("CRITICAL: ")
    bad = cli("--max-dead", "x")
    assert bad.returncode == 3 and "invalid int value" in bad.stderr


def test_a_database_error_is_unknown_not_a_traceback(monkeypatch):
    from django.db import OperationalError

    def broken(queue, stuck_lease_ms):
        raise OperationalError("could not connect to server: Connection refused\nIs the server running?")

    monkeypatch.setattr(health, "_read", broken)
    r = run()
    assert r.code == 3
    assert r.err.strip() == "fq health: error: database error: could not connect to server: Connection refused"
    r = run("--json")
    assert r.code == 3 and json.loads(r.err)["message"].startswith("database error: could not connect")
