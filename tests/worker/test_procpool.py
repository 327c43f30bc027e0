"""``fq_worker --pool processes``: each job in a child process, killed at its timeout (real worker processes)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from django_fq import services as fq

from .helpers import touch, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.proc"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")
PROC = ("--pool=processes", f"--queue={Q}", *FAST)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_results_exceptions_and_permanent_failures_map_like_the_thread_pool(workers, events):
    fq.configure(Q, backoff_ms=0, max_attempts=2)
    ok = fq.enqueue(Q, {"events": events.path, "result": {"a": [1, 2]}, "done": True}).id
    failed = fq.enqueue(Q, {"fail": True}).id
    perm = fq.enqueue(Q, {"perm": True}).id
    w = workers(*PROC, "--burst", "--concurrency=2")
    assert w.wait(timeout=120) == 0, w.stderr
    assert fq.get(Q, ok).state == "succeeded"
    assert fq.get(Q, ok).result == {"a": [1, 2]}
    [start] = events.of("start", ok)
    assert start["pid"] != w.pid and start["ppid"] == w.pid and start["current"] is True
    info = fq.get(Q, failed)
    assert (info.state, info.attempts) == ("dead", 2)
    assert "RuntimeError: asked to fail on attempt 2" in info.last_error and "Traceback" in info.last_error
    info = fq.get(Q, perm)
    assert (info.state, info.attempts) == ("dead", 1)
    assert "PermanentFailure: this job can never succeed" in info.last_error
    assert "1 jobs ok, 3 failed" in w.stdout


@pytest.mark.every_django  # the process pool's smoke test on every Django version
def test_no_receipt_reaches_the_child_and_the_context_is_complete(workers):
    job = fq.enqueue(Q, {"inspect": True}).id
    w = workers(*PROC, "--burst")
    assert w.wait(timeout=120) == 0, w.stderr
    info = fq.get(Q, job)
    seen = info.result
    assert info.state == "succeeded"
    assert not any("fq1." in value for value in seen["values"])
    assert "receipt" not in " ".join(seen["attrs"])
    assert seen["claimed_at"] == info.claimed_at and seen["enqueued_at"] == info.enqueued_at
    assert seen["deadline"] > seen["claimed_at"] and seen["lease_lost"] is False


@pytest.mark.parametrize("block", ["sleep", "select", "pause"])
def test_a_stuck_handler_is_killed_at_its_timeout_retried_and_dead_after_max_attempts(workers, events, block):
    fq.configure(Q, backoff_ms=0, max_attempts=2)
    job = fq.enqueue(Q, {"events": events.path, "block": block}, timeout_ms=700).id
    w = workers(*PROC, "--burst", "--soft-timeout-ms=0")
    assert w.wait(timeout=120) == 0, w.stderr
    info = fq.get(Q, job)
    assert (info.state, info.attempts) == ("dead", 2)
    assert [e["kind"] for e in info.errors] == ["timeout", "timeout"]
    starts = events.of("start", job)
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[0]["pid"] != starts[1]["pid"]  # the killed child was replaced
    assert not any(pid_alive(s["pid"]) for s in starts)
    assert w.count(rf"job.killed job={job} queue={Q} attempt=\d/2 pid=\d+ reason=timeout") == 2
    assert "0 jobs ok, 0 failed, 2 timed out" in w.stdout
    assert fq.stats(Q).totals["timed_out"] == 2


def test_a_timeout_found_by_a_heartbeat_kills_the_child_too(workers, events):
    # The lease (400 ms) is shorter than the timeout: the claim does not show the timeout, an extend does.
    fq.configure(Q, backoff_ms=60_000)
    job = fq.enqueue(Q, {"events": events.path, "block": "sleep"}, timeout_ms=1500).id
    w = workers(*PROC, "--visibility=400", "--soft-timeout-ms=500")
    [start] = events.wait_for("start", job)
    [soft] = events.wait_for("soft", job, timeout=30)
    w.wait_for(rf"job.killed job={job} .*reason=timeout", timeout=30)
    info = wait_until(lambda: (lambda i: i if i.errors else None)(fq.get(Q, job)), what="the timeout to be recorded")
    assert [e["kind"] for e in info.errors] == ["timeout"]
    assert info.errors[0]["at"] >= info.claimed_at + 1500
    assert info.state == "scheduled" and info.attempts == 1
    assert 0 < soft["remaining_ms"] <= 500
    assert not pid_alive(start["pid"])
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    w.wait_for(r"worker\.stop .* ok=0 failed=0 not_settled=1 timed_out=1 ")


@pytest.mark.parametrize("on_soft", ["block", "raise", "return"])
def test_the_soft_timeout_is_raised_in_the_handler_before_the_kill(workers, events, on_soft):
    fq.configure(Q, backoff_ms=0, max_attempts=1)
    job = fq.enqueue(Q, {"events": events.path, "block": "sleep", "on_soft": on_soft}, timeout_ms=2000).id
    w = workers(*PROC, "--burst", "--soft-timeout-ms=800")
    assert w.wait(timeout=120) == 0, w.stderr
    [start] = events.of("start", job)
    [soft] = events.of("soft", job)
    assert 0 < soft["remaining_ms"] <= 800
    assert "soft timeout" in soft["message"]
    info = fq.get(Q, job)
    if on_soft == "block":  # ignored: killed at the timeout, recorded as one
        assert info.state == "dead" and [e["kind"] for e in info.errors] == ["timeout"]
        assert w.count(rf"job.killed job={job} .*reason=timeout") == 1
        assert not pid_alive(start["pid"])
    elif on_soft == "raise":  # let out: the attempt fails at once with it
        assert info.state == "dead" and [e["kind"] for e in info.errors] == ["nack"]
        assert info.last_error.startswith("SoftTimeout: soft timeout")
        assert w.count("job.killed") == 0
    else:
        assert info.state == "succeeded" and info.result == {"stopped": "soft"}
    w.wait_for(rf"job.soft_timeout job={job} .*kill_in_ms=\d+")


def test_the_default_soft_timeout_leaves_a_short_job_half_its_time(workers, events):
    # The default (1,000 ms) is longer than half of this 1,000 ms timeout: the handler gets 500 ms first.
    fq.configure(Q, backoff_ms=0, max_attempts=1)
    job = fq.enqueue(Q, {"events": events.path, "block": "sleep"}, timeout_ms=1000).id
    w = workers(*PROC, "--burst")
    assert w.wait(timeout=120) == 0, w.stderr
    [soft] = events.of("soft", job)
    assert 0 < soft["remaining_ms"] <= 500
    assert [e["kind"] for e in fq.get(Q, job).errors] == ["timeout"]


@pytest.mark.parametrize(("crash", "how"), [("exit", "exit code 9"), ("segv", "killed by signal SIGSEGV")])
def test_a_child_that_dies_fails_the_attempt_and_is_replaced(workers, events, crash, how):
    fq.configure(Q, backoff_ms=0, max_attempts=1)
    bad = fq.enqueue(Q, {"events": events.path, "crash": crash}).id
    good = fq.enqueue(Q, {"events": events.path}, priority=-1).id
    w = workers(*PROC, "--burst", "--concurrency=1")
    assert w.wait(timeout=120) == 0, w.stderr
    info = fq.get(Q, bad)
    assert (info.state, info.attempts) == ("dead", 1)
    assert "child process" in info.last_error and info.last_error.endswith(how)
    assert fq.get(Q, good).state == "succeeded"
    [first], [second] = events.of("start", bad), events.of("start", good)
    assert first["pid"] != second["pid"]
    assert w.count(rf"job.child_died job={bad} .*exit=") == 1
    assert "1 jobs ok, 1 failed" in w.stdout


def test_concurrency_n_runs_n_jobs_at_once_in_n_children(workers, events, gate):
    fq.configure(Q, backoff_ms=0)
    jobs = [fq.enqueue(Q, {"events": events.path, "gate": str(gate), "done": True}).id for _ in range(3)]
    w = workers(*PROC, "--concurrency=3")
    starts = events.wait_for("start", n=3, timeout=60)
    assert len({s["pid"] for s in starts}) == 3
    assert {s["id"] for s in starts} == set(jobs)
    touch(gate)
    wait_until(lambda: all(fq.get(Q, j).state == "succeeded" for j in jobs), what="the three acks")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    assert not any(pid_alive(s["pid"]) for s in starts)


def test_max_jobs_per_child_recycles_the_child(workers, events):
    jobs = [fq.enqueue(Q, {"events": events.path}).id for _ in range(3)]
    w = workers(*PROC, "--burst", "--max-jobs-per-child=1")
    assert w.wait(timeout=120) == 0, w.stderr
    assert all(fq.get(Q, j).state == "succeeded" for j in jobs)
    assert len({s["pid"] for s in events.of("start")}) == 3


def test_a_cancelled_job_has_its_child_killed(workers, events):
    job = fq.enqueue(Q, {"events": events.path, "block": "sleep"}).id
    w = workers(*PROC, "--visibility=600")
    [start] = events.wait_for("start", job)
    fq.cancel(Q, job)
    w.wait_for(rf"job.killed job={job} .*reason=cancelled", timeout=30)
    wait_until(lambda: not pid_alive(start["pid"]), what="the child to end")
    assert fq.get(Q, job).state == "cancelled"
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0


def test_shutdown_lets_a_child_finish_within_grace_then_kills_and_releases(workers, events, gate):
    fq.configure(Q, backoff_ms=0)
    quick = fq.enqueue(Q, {"events": events.path, "sleep_ms": 300}).id
    stuck = fq.enqueue(Q, {"events": events.path, "block": "sleep"}).id
    w = workers(*PROC, "--concurrency=2", "--grace=1.5")
    starts = events.wait_for("start", n=2, timeout=60)
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0, w.stderr
    assert fq.get(Q, quick).state == "succeeded"
    info = fq.get(Q, stuck)
    assert (info.state, info.attempts) == ("ready", 0)  # given back, attempt not counted
    assert [(e["kind"], e["error"]) for e in info.errors] == [("release", "shutdown")]
    w.wait_for(rf"job.released job={stuck} .*reason=shutdown")
    assert not any(pid_alive(s["pid"]) for s in starts)


def test_kill_9_of_the_worker_leaves_no_child_and_loses_no_job(workers, events, gate):
    fq.configure(Q, backoff_ms=0)
    job = fq.enqueue(Q, {"events": events.path, "gate": str(gate), "done": True}).id
    w = workers(*PROC, "--visibility=800", "--concurrency=2")
    [start] = events.wait_for("start", job, timeout=60)
    idle = wait_until(lambda: [p for p in _children_of(w.pid) if p != start["pid"]], what="the idle child")
    w.kill()
    wait_until(
        lambda: not pid_alive(start["pid"]) and not any(pid_alive(p) for p in idle),
        timeout=10,
        what="the children to end with their worker",
    )
    touch(gate)
    w2 = workers(*PROC)
    wait_until(lambda: fq.get(Q, job).state == "succeeded", timeout=60, what="the job to be run again")
    assert fq.get(Q, job).attempts == 2
    w2.signal(signal.SIGTERM)
    assert w2.wait(timeout=30) == 0


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def test_an_in_process_worker_runs_its_jobs_in_children_on_the_same_database(events):
    from django_fq.worker import Worker
    from tests.testapp.fq_handlers_procpool import proc_controlled
    from tests.testapp.models import Done

    fq.configure(Q, backoff_ms=0, max_attempts=1)
    ok = fq.enqueue(Q, {"events": events.path, "done": True}).id
    failed = fq.enqueue(Q, {"fail": True}).id
    worker = Worker(
        [Q],
        handlers={Q: proc_controlled},
        pool="processes",
        concurrency=2,
        burst=True,
        poll_interval_ms=10,
        max_poll_interval_ms=50,
    )
    stats = worker.run()
    assert (stats.ok, stats.failed, stats.timed_out) == (1, 1, 0)
    [row] = Done.objects.filter(job_id=ok)
    assert row.pid != os.getpid()  # written by a child, into this test's database
    assert fq.get(Q, failed).state == "dead"
    for thread in worker.pool.threads:  # each runner stops its child and ends
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert not pid_alive(events.of("start", ok)[0]["pid"])


# --- handler middleware, metadata, Snooze and RetryAfter run in the child --------------------------

MW_ENV = {"DJANGO_SETTINGS_MODULE": "tests.middleware.worker_settings"}


def _trail(path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_middleware_runs_in_the_child_around_the_handler_with_the_jobs_metadata(workers, tmp_path):
    path = str(tmp_path / "trail.jsonl")
    meta = {"tenant": "acme", "tags": ["eu"]}
    job = fq.enqueue("t.mw", {"trail": path}, metadata=meta).id
    w = workers("--pool=processes", "--queue=t.mw", "--burst", *FAST, env=MW_ENV)
    assert w.wait(timeout=120) == 0, w.stderr
    steps = [s for s in _trail(path) if s["id"] == job]
    assert [s["mw"] for s in steps] == ["outer:before", "per_handler", "handler", "outer:after"]
    assert {s["pid"] for s in steps} != {w.pid} and len({s["pid"] for s in steps}) == 1  # one child
    assert all(s["metadata"] == meta for s in steps)
    assert fq.get("t.mw", job).result == {"metadata": meta}


def test_snooze_and_retry_after_from_the_child_settle_like_the_thread_pool(workers, tmp_path):
    fq.configure("t.mw", backoff_ms=3_600_000)  # only RetryAfter's own delay brings the retry back at once
    snoozed_path, retried_path = str(tmp_path / "snoozed.jsonl"), str(tmp_path / "retried.jsonl")
    snoozed = fq.enqueue("t.mw", {"trail": snoozed_path}, metadata={"snooze_ms": 0}).id
    retried = fq.enqueue("t.mw", {"trail": retried_path, "fail_first": True}).id
    w = workers("--pool=processes", "--queue=t.mw", "--burst", *FAST, env=MW_ENV)
    assert w.wait(timeout=120) == 0, w.stderr
    info = fq.get("t.mw", snoozed)
    assert (info.state, info.attempts) == ("succeeded", 1)
    assert [e["kind"] for e in info.errors] == ["snooze"]
    info = fq.get("t.mw", retried)
    assert (info.state, info.attempts) == ("succeeded", 2)
    assert info.errors[0]["kind"] == "nack" and "retrying: first attempt fails" in info.errors[0]["error"]
    assert "job.snoozed" in w.stderr


def test_processes_and_pool_processes_combine_each_worker_with_its_own_children(workers, events):
    ids = [fq.enqueue(Q, {"events": events.path, "sleep_ms": 50}).id for _ in range(8)]
    supervisor = workers(*PROC, "--processes=2", "--concurrency=2", "--grace=2")
    wait_until(lambda: all(fq.get(Q, i).state == "succeeded" for i in ids), timeout=90, what="the jobs")
    starts = events.of("start")
    worker_pids = {s["ppid"] for s in starts}
    assert supervisor.pid not in worker_pids and {s["pid"] for s in starts}.isdisjoint(worker_pids)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0, supervisor.stderr
    assert not any(pid_alive(s["pid"]) for s in starts)
