"""Progress reports made by handlers run by ``drain()`` and the inline mode are stored (docs/how-to/progress.md).

A worker stores a run's reports from its heartbeat thread and the last one
before the settle (RunnerPool.run_one); ``drain()`` runs jobs in the test's
thread without either, so it must store them itself.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.testing import drain

Q = "tt.progress"


def reports(job):
    job.progress(10, "first")
    job.progress(50, "half")
    job.progress(75.5, "last one")
    return {"ok": True}


def _drain_and_check():
    job = fq.enqueue(Q, {}).id
    report = drain(Q, handlers={Q: reports})
    assert [j.id for j in report.succeeded] == [job]
    info = fq.get(Q, job)
    assert (info.state, info.progress, info.progress_message) == ("succeeded", 75.5, "last one")
    assert info.progress_at is not None and info.progress_at >= info.claimed_at


@pytest.mark.django_db
def test_drain_in_the_tests_transaction_stores_the_last_report():
    _drain_and_check()


@pytest.mark.django_db(transaction=True)
def test_drain_in_autocommit_stores_the_last_report():
    _drain_and_check()
