"""The Tasks backend without a worker: enqueue, validation, options, transactions, results per job state.

Job states are produced with the service verbs directly (claim, ack, nack,
cancel, release, reap), so each status mapping is checked against a job in
exactly that state. ``tests/tasks/test_running.py`` runs tasks through the worker.
"""

from __future__ import annotations

import datetime as dt
import math
import secrets

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from django_fq import services as fq
from django_fq.exceptions import InvalidJson, JobNotFound, QueueNotFound
from django_fq.tasks import (
    FqBackend,
    FqTask,
    InvalidTask,
    InvalidTaskBackend,
    LeaseExpired,
    TaskCancelled,
    TaskFailed,
    TaskResultDoesNotExist,
    TaskResultStatus,
    TaskTimedOut,
    task,
    task_backends,
)
from django_fq.tasks.backend import to_datetime
from django_fq.tasks.history import exception_note
from tests.tasks import sample

pytestmark = pytest.mark.django_db

Q, LOW, OC = "tk.default", "tk.low", "tkc.default"


def ms(value: dt.datetime) -> int:
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


def job_count(queue: str) -> int:
    try:
        return sum(fq.stats(queue).counts.values())
    except QueueNotFound:
        return 0


# --- the backend and its task class ------------------------------------------------------------


def test_backend_declares_what_it_supports(backend):
    assert isinstance(backend, FqBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority
    assert backend.task_class is FqTask
    assert isinstance(sample.add, FqTask)
    assert backend.fq_queues == {"default": Q, "low": LOW}


def test_enqueue_stores_one_fq_job_carrying_the_task(backend):
    result = sample.add.enqueue(2, b=3)

    job = fq.get(Q, result.id)
    assert job.payload == {
        "v": 1,
        "task": "tests.tasks.sample.add",
        "backend": "default",
        "queue_name": "default",
        "priority": 0,
        "run_after": None,
        "takes_context": False,
        "args": [2],
        "kwargs": {"b": 3},
    }
    assert job.state == "ready"
    assert job.max_attempts == 4  # the backend-wide OPTIONS default
    assert result.status == TaskResultStatus.READY
    assert result.task is sample.add
    assert result.backend == "default"
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert result.enqueued_at == to_datetime(job.enqueued_at)
    assert timezone.is_aware(result.enqueued_at)
    assert result.started_at is result.finished_at is result.last_attempted_at is None
    assert result.errors == [] and result.worker_ids == []
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_queue_name_picks_the_fq_queue(backend):
    result = sample.add_low.enqueue(1, 1)

    assert fq.get(LOW, result.id).payload["queue_name"] == "low"
    fq.configure(Q)
    with pytest.raises(JobNotFound):
        fq.get(Q, result.id)
    assert backend.get_result(result.id).task.queue_name == "low"


def test_arguments_are_normalised_to_json_and_anything_else_is_refused(backend):
    result = sample.add.enqueue((1, 2), k=(3,))
    assert fq.get(Q, result.id).payload["args"] == [[1, 2]]
    assert fq.get(Q, result.id).payload["kwargs"] == {"k": [3]}
    before = job_count(Q)

    with pytest.raises(TypeError):
        sample.add.enqueue(object(), 1)
    with pytest.raises(InvalidJson):
        sample.add.enqueue(math.nan, 1)

    assert job_count(Q) == before


def test_django_priority_is_the_fq_priority_and_orders_claims(backend):
    ids = {p: sample.add.using(priority=p).enqueue(p, 0).id for p in (0, -100, 100, 7)}

    assert {p: fq.get(Q, i).priority for p, i in ids.items()} == {0: 0, -100: -100, 100: 100, 7: 7}
    claimed = fq.claim(Q, count=10)
    assert [c.id for c in claimed] == [ids[100], ids[7], ids[0], ids[-100]]


def test_run_after_defers_the_job_until_then(backend, clock):
    when = (timezone.now() + dt.timedelta(hours=1)).replace(microsecond=123000)
    result = sample.add.using(run_after=when).enqueue(1, 1)

    job = fq.get(Q, result.id)
    assert job.run_at == ms(when)
    assert job.state == "scheduled"
    assert result.status == TaskResultStatus.READY
    assert backend.get_result(result.id).task.run_after == when
    assert fq.claim(Q) == []

    clock.advance(3_600_000 + 60_000)
    assert [c.id for c in fq.claim(Q)] == [result.id]


# --- validation ----------------------------------------------------------------------------------


def test_invalid_tasks_raise_djangos_invalid_task(backend):
    def local(x):
        return x

    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        sample.add.using(queue_name="nope")
    with pytest.raises(InvalidTask, match="priority"):
        sample.add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        sample.add.using(run_after=dt.datetime(2030, 1, 1))
    with pytest.raises(InvalidTask, match="module level"):
        task(local)
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(sample.not_a_task)
    with pytest.raises(InvalidTask, match="max_attempts"):
        sample.add.using(max_attempts=0)
    with pytest.raises(InvalidTask, match="timeout_ms"):
        sample.add.using(timeout_ms=-1)
    with pytest.raises(InvalidTask, match="unique_key"):
        sample.add.using(unique_key=5)
    with pytest.raises(TypeError, match="retries"):
        sample.add.using(retries=3)
    assert job_count(Q) == 0


def test_keys_that_cannot_be_made_from_the_arguments_raise_invalid_task(backend):
    with pytest.raises(InvalidTask, match="template"):
        sample.add.using(unique_key="x-{9}").enqueue(1, 2)
    with pytest.raises(InvalidTask, match="must be a string"):
        sample.add.using(idempotency=lambda *a, **k: 5).enqueue(1, 2)
    with pytest.raises(InvalidTask, match="255"):
        sample.add.using(idempotency="t" * 300).enqueue(1, 2)
    assert job_count(Q) == 0


@pytest.mark.parametrize(
    "params, message",
    [
        ({"QUEUES": []}, "QUEUES must name at least one queue"),
        ({"QUEUES": ["has space"]}, "not a valid fq queue name"),
        ({"QUEUES": ["default"], "OPTIONS": {"retries": 3}}, "unknown OPTIONS key 'retries'"),
        ({"QUEUES": ["default"], "OPTIONS": {"max_attempts": 0}}, "max_attempts"),
        ({"QUEUES": ["default"], "OPTIONS": {"idempotency_retention_ms": 0}}, "idempotency_retention_ms"),
        ({"QUEUES": ["default"], "OPTIONS": {"tasks": {"a.b": {"retries": 1}}}}, "unknown option 'retries'"),
        ({"QUEUES": ["default"], "OPTIONS": {"tasks": ["a.b"]}}, "must map task paths"),
        ({"QUEUES": ["default"], "OPTIONS": {"enqueue_on_commit": 3}}, "enqueue_on_commit"),
        ({"QUEUES": ["default"], "OPTIONS": {"queue_prefix": 7}}, "queue_prefix"),
    ],
)
def test_bad_backend_settings_raise_invalid_task_backend(params, message):
    with pytest.raises(InvalidTaskBackend, match=message):
        FqBackend("broken", {"BACKEND": "django_fq.tasks.FqBackend", **params})


def test_a_bad_backend_is_reported_through_djangos_backend_handler(settings):
    settings.TASKS = {"default": {"BACKEND": "django_fq.tasks.FqBackend", "QUEUES": []}}
    with pytest.raises(InvalidTaskBackend, match="QUEUES"):
        task_backends["default"]


# --- per-task options ----------------------------------------------------------------------------


def test_options_of_the_task_class_reach_the_job(backend):
    first = sample.optioned.enqueue(7)

    job = fq.get(Q, first.id)
    assert (job.max_attempts, job.timeout_ms, job.unique_key) == (3, 5_000, "uk-7")
    assert sample.optioned.enqueue(7).id == first.id  # coalesced while active
    other = sample.optioned.enqueue(8)
    assert other.id != first.id and fq.get(Q, other.id).unique_key == "uk-8"


def test_a_concurrency_key_template_reaches_the_job_and_is_validated(backend):
    fq.configure(Q, key_concurrency=1)
    first = sample.add.using(concurrency_key="customer-{0}").enqueue(42, 1)
    second = sample.add.using(concurrency_key="customer-{0}").enqueue(42, 2)
    assert fq.get(Q, first.id).concurrency_key == "customer-42"
    assert [j.id for j in fq.claim(Q, count=5)] == [first.id]  # one of the key at a time
    assert fq.get(Q, second.id).state == "ready"
    with pytest.raises(InvalidTask, match="concurrency_key"):
        sample.add.using(concurrency_key="k" * 201).enqueue(1, 2)


def test_options_keyed_by_task_path_in_backend_options_reach_the_job(backend):
    configured = fq.get(Q, sample.configured.enqueue(5).id)
    plain = fq.get(Q, sample.add.enqueue(1, 1).id)

    assert (configured.max_attempts, configured.unique_key, configured.timeout_ms) == (2, "cfg-5", 60_000)
    assert (plain.max_attempts, plain.unique_key, plain.timeout_ms) == (4, None, 0)


def test_option_precedence_backend_then_task_path_then_task_class():
    backend = FqBackend(
        "precedence",
        {
            "QUEUES": ["default"],
            "OPTIONS": {
                "queue_prefix": "tk.",
                "max_attempts": 9,
                "timeout_ms": 1_000,
                "tasks": {"tests.tasks.sample.overrides_configured": {"max_attempts": 2, "unique_key": "o-{0}"}},
            },
        },
    )
    assert backend.options_for(sample.overrides_configured) == {"max_attempts": 7, "timeout_ms": 1_000, "unique_key": "o-{0}"}
    assert backend.options_for(sample.add) == {"max_attempts": 9, "timeout_ms": 1_000}
    assert backend.options_for(sample.add.using(timeout_ms=5)) == {"max_attempts": 9, "timeout_ms": 5}


def test_using_sets_an_idempotency_token_for_one_call(backend, signals):
    first = sample.add.using(idempotency="add-once").enqueue(1, 2)
    again = sample.add.using(idempotency="add-once").enqueue(5, 5)

    assert again.id == first.id
    assert again.args == [1, 2]  # the original job, not the repeat's arguments
    assert fq.get(Q, first.id).idempotency == "add-once"
    assert [s[0] for s in signals] == ["enqueued"]  # no signal for the coalesced repeat


def test_a_callable_key_receives_the_task_arguments(backend):
    a = sample.per_user.enqueue(42, note="a")
    b = sample.per_user.enqueue(42, note="b")
    c = sample.per_user.enqueue(user_id=43)

    assert a.id == b.id != c.id
    assert fq.get(Q, a.id).unique_key == "user-42"
    assert fq.get(Q, c.id).unique_key == "user-43"


# --- transactions ---------------------------------------------------------------------------------


def test_enqueue_is_part_of_the_callers_transaction(backend):
    with pytest.raises(RuntimeError), transaction.atomic():
        result = sample.add.enqueue(1, 1)
        assert backend.get_result(result.id).status == TaskResultStatus.READY
        raise RuntimeError("roll back")

    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result.id)
    assert job_count(Q) == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_writes_the_job_when_the_transaction_commits(signals):
    oncommit = task_backends["oncommit"]
    add = sample.add.using(backend="oncommit")

    with transaction.atomic():
        result = add.enqueue(4, 4)
        provisional = result.id
        assert job_count(OC) == 0
        with pytest.raises(TaskResultDoesNotExist):
            oncommit.get_result(provisional)
        assert signals == []

    assert result.id != provisional
    job = fq.get(OC, result.id)
    assert job.payload["args"] == [4, 4] and job.payload["backend"] == "oncommit"
    assert result.enqueued_at == to_datetime(job.enqueued_at)
    assert oncommit.get_result(provisional).id == result.id  # the provisional id still resolves
    assert oncommit.get_result(result.id).status == TaskResultStatus.READY
    assert [(s[0], s[1]) for s in signals] == [("enqueued", result.id)]


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_rolled_back_writes_nothing(signals):
    add = sample.add.using(backend="oncommit")

    with pytest.raises(RuntimeError), transaction.atomic():
        result = add.enqueue(1, 1)
        raise RuntimeError("roll back")

    assert job_count(OC) == 0
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["oncommit"].get_result(result.id)
    assert result.enqueued_at is None
    assert signals == []


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_outside_a_transaction_writes_at_once():
    result = sample.add.using(backend="oncommit").enqueue(2, 2)

    assert fq.get(OC, result.id).state == "ready"
    assert result.status == TaskResultStatus.READY


# --- results: the status of every job state ------------------------------------------------------


def test_ready_and_scheduled_jobs_are_ready(backend):
    ready = sample.add.enqueue(1, 1)
    later = sample.add.using(run_after=timezone.now() + dt.timedelta(minutes=5)).enqueue(1, 1)

    for result in (backend.get_result(ready.id), backend.get_result(later.id)):
        assert result.status == TaskResultStatus.READY
        assert not result.is_finished
        assert result.worker_ids == [] and result.errors == []


def test_a_running_job_is_running_with_its_start_and_worker(backend):
    result = sample.add.enqueue(1, 1)
    claimed = fq.claim(Q, worker="w-1")[0]

    running = backend.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.started_at == running.last_attempted_at == to_datetime(claimed.claimed_at)
    assert running.finished_at is None
    assert running.worker_ids == ["w-1"] and running.attempts == 1


def test_a_succeeded_job_is_successful_with_its_return_value(backend):
    result = sample.add.enqueue(1, 1)
    claimed = fq.claim(Q, worker="w-1")[0]
    fq.ack(Q, claimed.receipt, result={"sum": 2})

    done = backend.get_result(result.id)
    job = fq.get(Q, result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"sum": 2}
    assert done.finished_at == to_datetime(job.finished_at)
    assert done.started_at == to_datetime(claimed.claimed_at) <= done.finished_at
    assert done.worker_ids == ["w-1"] and done.errors == []
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"sum": 2}


def _runner_error(exc_path: str, message: str) -> str:
    """An error text shaped like the worker's for a task exception carrying the runner's note."""
    name = exc_path.rsplit(".", 1)[1]
    return (
        f"{name}: {message}\n\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
        f"{exc_path}: {message}\n{exception_note(exc_path)}\n"
    )


def test_a_job_waiting_to_retry_is_ready_and_lists_the_failed_attempt(backend):
    fq.configure(Q, backoff_ms=60_000)
    result = sample.add.enqueue(1, 1)
    claimed = fq.claim(Q, worker="w-1")[0]
    fq.nack(Q, claimed.receipt, error=_runner_error("tests.tasks.sample.Boom", "first try"))

    retrying = backend.get_result(result.id)
    assert fq.get(Q, result.id).state == "scheduled"
    assert retrying.status == TaskResultStatus.READY
    assert retrying.finished_at is None
    assert retrying.worker_ids == ["w-1"]
    [error] = retrying.errors
    assert error.exception_class_path == "tests.tasks.sample.Boom"
    assert error.exception_class is sample.Boom
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert "tests.tasks.sample.Boom: first try" in error.traceback
    assert "[django-fq]" not in error.traceback


def test_a_dead_job_is_failed_with_every_attempt(backend):
    fq.configure(Q, backoff_ms=0)
    result = sample.explode.enqueue("x")  # max_attempts=3
    texts = [_runner_error("tests.tasks.sample.Boom", "one"), "KeyError: 'k'\n\nTraceback...", "plain words"]
    for n, text in enumerate(texts, start=1):
        claimed = fq.claim(Q, worker=f"w-{n}")[0]
        fq.nack(Q, claimed.receipt, error=text)

    dead = backend.get_result(result.id)
    job = fq.get(Q, result.id)
    assert job.state == "dead"
    assert dead.status == TaskResultStatus.FAILED and dead.is_finished
    assert dead.finished_at == to_datetime(job.changed_at)
    assert dead.worker_ids == ["w-1", "w-2", "w-3"] and dead.attempts == 3
    assert [e.exception_class_path for e in dead.errors] == [
        "tests.tasks.sample.Boom",
        "builtins.KeyError",  # no note: the class named at the head, when it is a builtin
        "django_fq.tasks.errors.TaskFailed",  # no class to be found
    ]
    assert dead.errors[2].exception_class is TaskFailed
    with pytest.raises(ValueError, match="failed"):
        _ = dead.return_value


def test_a_cancelled_job_is_failed_with_the_cancel_as_an_error(backend):
    queued = sample.add.enqueue(1, 1)
    fq.cancel(Q, queued.id)
    running = sample.add.enqueue(2, 2)
    fq.claim(Q, worker="w-9")
    fq.cancel(Q, running.id)

    cancelled = backend.get_result(queued.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in cancelled.errors] == [TaskCancelled]
    assert cancelled.worker_ids == []  # never ran
    assert cancelled.finished_at == to_datetime(fq.get(Q, queued.id).finished_at)

    cut_short = backend.get_result(running.id)
    assert cut_short.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in cut_short.errors] == [TaskCancelled]
    assert cut_short.worker_ids == ["w-9"]  # the attempt the cancel ended


def test_expired_leases_and_timeouts_are_errors_of_their_own(backend, clock):
    expired = sample.add.enqueue(1, 1)
    fq.claim(Q, worker="w-1", visibility_ms=1_000)
    timed = sample.add.using(timeout_ms=1_000).enqueue(2, 2)
    fq.claim(Q, worker="w-2")
    clock.advance(2_000)
    fq.reap()

    lost = backend.get_result(expired.id)
    assert lost.status == TaskResultStatus.READY
    assert [e.exception_class for e in lost.errors] == [LeaseExpired]
    assert lost.worker_ids == ["w-1"]
    slow = backend.get_result(timed.id)
    assert [e.exception_class for e in slow.errors] == [TaskTimedOut]
    assert slow.worker_ids == ["w-2"]


def test_a_released_attempt_is_no_attempt(backend):
    result = sample.add.enqueue(1, 1)
    fq.release(Q, fq.claim(Q, worker="w-1")[0].receipt, error="shutdown")

    back = backend.get_result(result.id)
    assert back.status == TaskResultStatus.READY
    assert back.worker_ids == [] and back.errors == []


# --- get_result ----------------------------------------------------------------------------------


def test_unknown_ids_raise_task_result_does_not_exist(backend):
    plain_job = fq.enqueue(Q, {"not": "a task"}).id
    elsewhere = sample.add.using(backend="oncommit").enqueue(1, 1)  # no transaction: written at once

    for bad in (secrets.token_hex(16), "", "x" * 300, plain_job, elsewhere.id):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(12345)


def test_a_tasks_get_result_checks_the_task(backend):
    from django_fq.tasks import _compat

    mismatch = pytest.importorskip(f"{_compat.FRAMEWORK}.exceptions").TaskResultMismatch
    result = sample.add.enqueue(1, 1)

    assert sample.add.get_result(result.id).id == result.id
    with pytest.raises(mismatch):
        sample.add_low.get_result(result.id)


def test_async_variants(backend):
    result = async_to_sync(sample.add.aenqueue)(3, 4)

    fetched = async_to_sync(backend.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.READY and fetched.args == [3, 4]
    assert async_to_sync(sample.add.aget_result)(result.id).id == result.id
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend.aget_result)(secrets.token_hex(16))


def test_task_enqueued_fires_once_per_new_job(backend, signals):
    result = sample.add.enqueue(1, 1)

    assert [(s[0], s[1], s[2]) for s in signals] == [("enqueued", result.id, "READY")]
    assert signals[0][4] is FqBackend


# --- a worker may claim the job before enqueue() returns ----------------------------------------


@pytest.fixture
def claim_right_after_enqueue(monkeypatch):
    """Every ``services.enqueue`` is followed at once by a worker's claim of the job, as a racing worker would."""
    import django_fq.services

    real = django_fq.services.enqueue
    claimed: list[str] = []

    def enqueue_then_claim(queue, payload, **options):
        created = real(queue, payload, **options)
        claimed.extend(job.id for job in fq.claim(queue, worker="racer"))
        return created

    monkeypatch.setattr(django_fq.services, "enqueue", enqueue_then_claim)
    return claimed


def test_enqueue_returns_ready_even_when_a_worker_claimed_the_job_at_once(backend, signals, claim_right_after_enqueue):
    result = sample.add.enqueue(1, 2)

    assert claim_right_after_enqueue == [result.id]
    assert fq.get(Q, result.id).state == "running"  # the worker has it already
    assert result.status == TaskResultStatus.READY  # as docs/tasks.md says: what the enqueue did
    assert result.started_at is None and result.worker_ids == []
    assert result.enqueued_at == to_datetime(fq.get(Q, result.id).enqueued_at)
    assert [(s[0], s[1], s[2]) for s in signals] == [("enqueued", result.id, "READY")]


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_stays_ready_when_a_worker_claims_at_commit(signals, claim_right_after_enqueue):
    with transaction.atomic():
        result = sample.add.using(backend="oncommit").enqueue(3, 4)

    assert claim_right_after_enqueue == [result.id]
    assert fq.get(OC, result.id).state == "running"
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == to_datetime(fq.get(OC, result.id).enqueued_at)
    assert [(s[0], s[1], s[2]) for s in signals] == [("enqueued", result.id, "READY")]


def test_enqueue_reads_nothing_back(backend):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    sample.add.enqueue(0, 0)  # the queue exists now (and is known to this process)
    fq.enqueue(Q, {"warm": 1})
    with CaptureQueriesContext(connection) as plain:
        fq.enqueue(Q, {"n": 1})
    with CaptureQueriesContext(connection) as through_tasks:
        sample.add.enqueue(1, 1)

    assert len(through_tasks) == len(plain)


def test_a_task_job_waiting_for_a_dependency_is_ready(backend):
    """A job of a task enqueued with depends_on (the services' option) has not started: READY (docs/tasks.md)."""
    first = sample.add.enqueue(1, 2)
    payload = fq.get(Q, first.id).payload
    waiting = fq.enqueue(Q, payload, depends_on=[first.id]).id
    assert fq.get(Q, waiting).state == "waiting"
    result = backend.get_result(waiting)
    assert result.status == TaskResultStatus.READY
    assert result.started_at is None
