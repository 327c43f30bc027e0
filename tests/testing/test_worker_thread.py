"""``fq_worker`` / ``worker_thread``: a real worker on a thread of the test process, stopped and joined at the end."""

from __future__ import annotations

import threading

import pytest

from django_fq import services as fq
from django_fq.testing import worker_thread
from tests.testapp.models import Done

from .handlers import FAIL, OK

pytestmark = pytest.mark.django_db(transaction=True)


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fq-test-worker" or t.name.startswith("fq-runner-")]


def test_the_fq_worker_fixture_runs_jobs_with_its_own_threads_and_connections(fq_worker):
    running = fq_worker(OK, concurrency=2)
    jobs = [fq.enqueue(OK, {"n": n}).id for n in range(3)]

    infos = [running.wait(OK, job) for job in jobs]

    assert [i.state for i in infos] == ["succeeded"] * 3
    assert sorted(i.result["n"] for i in infos) == [0, 1, 2]
    assert Done.objects.filter(job_id__in=jobs).count() == 3
    assert running.alive and running.stats.ok == 3
    assert infos[0].worker == running.worker.worker_id


def test_worker_thread_stops_and_joins_at_the_end_of_its_block():
    fq.configure(FAIL, max_attempts=1)
    with worker_thread([OK, FAIL]) as running:
        bad = fq.enqueue(FAIL, {}).id
        assert running.wait(FAIL, bad).state == "dead"
        assert _worker_threads()
    assert not running.alive
    assert running.stats.failed == 1
    assert not [t for t in _worker_threads() if t.is_alive()]
