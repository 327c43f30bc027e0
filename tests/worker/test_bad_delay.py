"""A Snooze or RetryAfter whose ``delay_ms`` escaped its check fails the attempt with a clear error.

``Snooze(delay_ms)`` and ``RetryAfter(delay_ms)`` check their delay when made
(``InvalidDelay`` inside the handler). A handler can still raise one without it
(a subclass that skips ``__init__``) or change ``delay_ms`` afterwards; the worker
must then fail the attempt naming ``delay_ms`` — not leave the job running until
its lease expires, nor log an internal error. Handler ``t.baddelay``
(tests/testapp/fq_handlers_procpool.py), in the thread pool and in a process-pool
child of real ``fq_worker`` processes, and in an in-process worker.
"""

from __future__ import annotations

import logging

import pytest

from django_fq import services as fq
from django_fq.worker import Worker
from tests.testapp.fq_handlers_procpool import bad_delay

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.baddelay"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")
BAD = [f"{kind}:{how}" for kind in ("snooze", "retry") for how in ("missing", "negative", "text", "huge", "float")]


def _assert_failed_naming_delay(job_id: str) -> None:
    info = fq.get(Q, job_id)
    assert (info.state, info.attempts) == ("dead", 1), info
    assert "delay_ms" in info.last_error and "InvalidDelay" in info.last_error, info.last_error


@pytest.mark.parametrize("bad", BAD)
def test_in_process_worker_fails_the_attempt(bad, caplog):
    fq.configure(Q, backoff_ms=0, max_attempts=1)
    job = fq.enqueue(Q, {"bad": bad}).id
    worker = Worker([Q], handlers={Q: bad_delay}, burst=True, poll_interval_ms=10, reaper=False)
    with caplog.at_level(logging.INFO, logger="django_fq.worker"):
        stats = worker.run()
    assert (stats.failed, stats.settle_errors, stats.snoozed) == (1, 0, 0)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if m.startswith(("worker.internal_error", "job.not_settled"))], said
    _assert_failed_naming_delay(job)


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_real_workers_fail_the_attempt(workers, pool):
    fq.configure(Q, backoff_ms=0, max_attempts=1)
    jobs = [fq.enqueue(Q, {"bad": bad}).id for bad in BAD]
    w = workers(f"--queue={Q}", f"--pool={pool}", "--burst", "--concurrency=2", *FAST)
    assert w.wait(timeout=120) == 0, w.stderr
    for job in jobs:
        _assert_failed_naming_delay(job)
    assert f"0 jobs ok, {len(BAD)} failed" in w.stdout
    assert "worker.internal_error" not in w.stderr and "job.not_settled" not in w.stderr
