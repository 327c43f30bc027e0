"""Tasks run by the real worker: in-process (``Worker(burst=True)``, threads with their own
connections) and as ``python -m django fq_worker --burst`` child processes.

The in-process worker finds the Tasks handler in the registry, where creating
the backend put it; the child processes find it through the worker's own
handler autodiscovery (``django_fq.fq_handlers``), with ``TASKS`` from
``tests/tasks/worker_settings.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_fq import handlers
from django_fq import services as fq
from django_fq.tasks import (
    FRAMEWORK,
    FqBackend,
    InvalidTaskBackend,
    TaskResultStatus,
    run_task,
    task_backends,
)
from django_fq.tasks.runner import register_backend, register_configured
from django_fq.worker import Worker
from tests.tasks import sample
from tests.testapp.models import Done

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
Q, LOW, OC = "tk.default", "tk.low", "tkc.default"
WORKER_ID = "tasks-test-worker"


def drain(*queues: str, **kwargs):
    """Run an in-process worker on ``queues`` until nothing is eligible; return its stats."""
    kwargs.setdefault("concurrency", 1)
    worker = Worker(list(queues or (Q, LOW)), burst=True, poll_interval_ms=10, reaper=False, worker_id=WORKER_ID, **kwargs)
    return worker.run()


# --- success ------------------------------------------------------------------------------------


def test_the_worker_runs_a_task_and_its_result_is_successful(backend):
    result = sample.add.enqueue(2, 3)

    stats = drain()

    assert stats.ok == 1
    done = backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert fq.get(Q, result.id).result == 5
    assert done.worker_ids == [WORKER_ID]
    assert done.errors == []
    assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_an_async_task_function_is_awaited(backend):
    result = sample.async_mul.enqueue(6, 7)

    drain()

    assert backend.get_result(result.id).return_value == 42


def test_a_task_taking_context_sees_itself_running(backend):
    result = sample.look_at_self.enqueue()

    drain()

    assert backend.get_result(result.id).return_value == {"status": "RUNNING", "attempt": 1, "id": result.id}


# --- failures and retries -----------------------------------------------------------------------


def test_every_failed_attempt_is_an_error_with_its_class_path_and_traceback(backend):
    fq.configure(Q, backoff_ms=0)
    result = sample.explode.enqueue("kaboom")  # max_attempts=3 on the task class

    stats = drain()

    assert stats.failed == 3
    failed = backend.get_result(result.id)
    assert fq.get(Q, result.id).state == "dead"
    assert failed.status == TaskResultStatus.FAILED
    assert failed.worker_ids == [WORKER_ID] * 3
    assert len(failed.errors) == 3
    for error in failed.errors:
        assert error.exception_class_path == "tests.tasks.sample.Boom"
        assert error.exception_class is sample.Boom
        assert "raise Boom(message)" in error.traceback
        assert error.traceback.rstrip().endswith("tests.tasks.sample.Boom: kaboom")
        assert "[django-fq]" not in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value


def test_retries_apply_and_the_context_counts_the_attempts(backend):
    fq.configure(Q, backoff_ms=0)
    result = sample.flaky.enqueue(3)

    drain()

    done = backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"attempt": 3, "worker_ids": [WORKER_ID] * 3}
    assert [e.exception_class_path for e in done.errors] == ["builtins.ValueError"] * 2
    assert "not yet (attempt 1)" in done.errors[0].traceback
    assert done.attempts == 3


def test_backoff_keeps_a_failed_task_ready_until_its_retry(backend, clock):
    fq.configure(Q, backoff_ms=60_000)
    result = sample.explode.enqueue("later")

    drain()
    waiting = backend.get_result(result.id)
    assert fq.get(Q, result.id).state == "scheduled"
    assert waiting.status == TaskResultStatus.READY and len(waiting.errors) == 1

    clock.advance(61_000)
    drain()
    assert len(backend.get_result(result.id).errors) == 2


def test_a_manual_retry_restarts_the_attempt_count_but_keeps_the_history(backend):
    result = sample.flaky.using(max_attempts=1).enqueue(2)  # fails on attempt 1
    drain()
    assert backend.get_result(result.id).status == TaskResultStatus.FAILED

    fq.retry(Q, result.id)
    retried = backend.get_result(result.id)
    assert retried.status == TaskResultStatus.READY
    assert len(retried.errors) == 1 and retried.worker_ids == [WORKER_ID]

    drain()
    again = backend.get_result(result.id)
    assert again.status == TaskResultStatus.FAILED
    assert len(again.errors) == 2 and again.worker_ids == [WORKER_ID] * 2  # both lives
    assert "not yet (attempt 1)" in again.errors[1].traceback  # the context's attempt is the job's: 1 again


def test_permanent_failure_fails_the_task_at_once(backend):
    result = sample.give_up.enqueue()

    drain()

    failed = backend.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["django_fq.exceptions.PermanentFailure"]
    assert fq.get(Q, result.id).attempts == 1


def test_a_return_value_that_is_not_json_fails_the_attempt(backend):
    fq.configure(Q, backoff_ms=0)
    result = sample.unstorable.enqueue()

    drain()

    failed = backend.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert {e.exception_class_path for e in failed.errors} == {"builtins.TypeError"}


def test_a_job_that_is_not_a_task_dies_on_a_tasks_queue(backend):
    job = fq.enqueue(Q, {"x": 1}).id

    drain()

    info = fq.get(Q, job)
    assert info.state == "dead"
    assert info.last_error.startswith("PermanentFailure: ")


# --- order, deferral, signals, transactions ----------------------------------------------------


def test_the_worker_runs_higher_priority_tasks_first(backend):
    ids = {p: sample.record.using(priority=p).enqueue(str(p)).id for p in (-10, 0, 100, 50)}

    drain()

    ran = list(Done.objects.order_by("id").values_list("job_id", flat=True))
    assert ran == [ids[100], ids[50], ids[0], ids[-10]]


def test_a_deferred_task_runs_only_once_run_after_has_passed(backend, clock):
    result = sample.record.using(run_after=timezone.now() + dt.timedelta(minutes=10)).enqueue("later")

    assert drain().ok == 0
    assert backend.get_result(result.id).status == TaskResultStatus.READY

    clock.advance(11 * 60_000)
    assert drain().ok == 1
    assert backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_signals_fire_for_enqueue_start_and_finish(backend, signals):
    fq.configure(Q, backoff_ms=0)
    ok = sample.add.enqueue(1, 1)
    bad = sample.explode.enqueue("x")

    drain()

    def of(result_id):
        return [(name, status, attempt) for name, rid, status, attempt, _ in signals if rid == result_id]

    assert of(ok.id) == [("enqueued", "READY", 0), ("started", "RUNNING", 1), ("finished", "SUCCESSFUL", 1)]
    assert of(bad.id) == [
        ("enqueued", "READY", 0),
        ("started", "RUNNING", 1),
        ("finished", "READY", 1),  # will be retried
        ("started", "RUNNING", 2),
        ("finished", "READY", 2),
        ("started", "RUNNING", 3),
        ("finished", "FAILED", 3),  # the last attempt
    ]
    assert {sender for *_, sender in signals} == {FqBackend}


def test_a_failing_finished_receiver_does_not_change_the_outcome(backend):
    from django_fq.tasks import _compat

    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    _compat.task_finished.connect(broken, weak=False)
    try:
        result = sample.add.enqueue(1, 2)
        drain()
    finally:
        _compat.task_finished.disconnect(broken)

    assert backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_enqueued_on_commit_runs_after_the_commit():
    with transaction.atomic():
        result = sample.record.using(backend="oncommit").enqueue("committed")
        assert OC not in {q.name for q in fq.queues()}  # nothing written yet

    assert drain(OC).ok == 1
    done = task_backends["oncommit"].get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value["label"] == "committed"


def test_a_rolled_back_enqueue_never_runs(backend):
    with pytest.raises(RuntimeError), transaction.atomic():
        sample.record.enqueue("rolled back")
        raise RuntimeError("roll back")

    assert drain().ok == 0
    assert not Done.objects.exists()


# --- handler registration -----------------------------------------------------------------------


def test_the_backends_queues_are_registered_for_the_worker(backend):
    assert set(register_configured()) == {Q, LOW, OC}
    assert {q: handlers.get(q) for q in (Q, LOW, OC)} == {Q: run_task, LOW: run_task, OC: run_task}


def test_a_queue_with_another_handler_is_refused(monkeypatch):
    monkeypatch.setattr(handlers, "_registry", dict(handlers.registered()))

    @handlers.handler("tk.taken")
    def other(job):
        return None

    clash = FqBackend("clash", {"QUEUES": ["taken"], "OPTIONS": {"queue_prefix": "tk."}})  # lenient: skipped
    assert handlers.get("tk.taken") is other
    with pytest.raises(InvalidTaskBackend, match="already has the handler"):
        register_backend(clash)


def test_fq_handlers_looks_for_fq_backends_only(settings):
    from django_fq import fq_handlers

    assert fq_handlers._uses_fq_tasks()
    immediate = f"{FRAMEWORK}.backends.immediate.ImmediateBackend"
    settings.TASKS = {"default": {"BACKEND": immediate}}
    assert not fq_handlers._uses_fq_tasks()


def test_the_framework_is_djangos_own_from_django_6():
    import django

    assert ("django.tasks" if django.VERSION >= (6, 0) else "django_tasks") == FRAMEWORK


# --- the fq_worker command in a child process ---------------------------------------------------


def run_fq_worker(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.tasks.worker_settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        FQ_CHILD_DB_NAME=str(connection.settings_dict["NAME"]),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "django", "fq_worker", "--burst", "--poll-interval", "10", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def test_fq_worker_runs_tasks_found_by_autodiscovery(backend):
    fq.configure(Q, backoff_ms=0)
    recorded = sample.record.enqueue("child")
    exploded = sample.explode.enqueue("in the child")
    awaited = sample.async_mul.enqueue(3, 5)
    low = sample.add_low.enqueue(20, 22)

    proc = run_fq_worker("--queue", Q, "--queue", LOW, "--worker-id", "child-worker")

    assert "3 jobs ok, 3 failed" in proc.stdout
    done = backend.get_result(recorded.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value["pid"] != os.getpid()  # ran in the child
    assert Done.objects.get(job_id=recorded.id).pid == done.return_value["pid"]
    assert done.worker_ids == ["child-worker"]
    failed = backend.get_result(exploded.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [sample.Boom] * 3
    assert backend.get_result(awaited.id).return_value == 15
    assert backend.get_result(low.id).return_value == 42


# --- async @task functions: awaited on the worker's event loop ----------------------------------


def test_an_async_task_is_awaited_on_the_workers_event_loop_not_a_thread_per_job(backend):
    results = [sample.where_am_i.enqueue(f"in-process {n}") for n in range(3)]
    synced = sample.add.enqueue(1, 2)

    stats = drain(concurrency=2)

    assert stats.ok == 4
    for n, result in enumerate(results):
        done = backend.get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL
        expected = {"label": f"in-process {n}", "thread": "fq-asyncio", "loop": True, "job": result.id, "attempt": 1}
        assert done.return_value == expected
        assert Done.objects.filter(job_id=result.id).exists()
    assert backend.get_result(synced.id).return_value == 3  # a sync task of the same queue ran on a thread


def test_fq_worker_awaits_async_tasks_on_its_event_loop(backend):
    awaited = sample.where_am_i.enqueue("child")

    proc = run_fq_worker("--queue", Q, "--worker-id", "child-worker")

    assert "1 jobs ok" in proc.stdout
    done = backend.get_result(awaited.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value["thread"] == "fq-asyncio" and done.return_value["job"] == awaited.id
    assert Done.objects.get(job_id=awaited.id).pid != os.getpid()


def test_sync_only_middleware_sends_async_tasks_to_the_runner_threads(backend, settings, caplog):
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.outer"]  # no async form: it cannot wrap arun_task
    result = sample.where_am_i.enqueue("through async_to_sync")

    with caplog.at_level("WARNING", logger="django_fq.worker"):
        stats = drain()

    assert stats.ok == 1
    done = backend.get_result(result.id).return_value
    assert done["thread"] != "fq-asyncio" and done["label"] == "through async_to_sync"
    assert any("worker.async_off" in r.getMessage() and Q in r.getMessage() for r in caplog.records)
