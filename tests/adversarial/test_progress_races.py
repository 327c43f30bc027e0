"""Progress writes racing the settles of the same lease, on threads with their own connections.

A progress write locks the job row, an ack or a reap locks the lease row first
(services/leases.py, "Locking rule"). Whatever the interleaving, a report is
either stored while the lease was live or refused with ``InvalidReceipt``;
no database error escapes, and no report lands on a settled job.
"""

from __future__ import annotations

import threading

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt

from .helpers import Background

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

JOBS = 30


def test_reports_racing_acks_are_stored_or_refused_never_an_error():
    q = "adv.progress.race"
    fq.configure(q)
    fq.enqueue_many(q, [{"payload": n} for n in range(JOBS)])
    claimed = fq.claim(q, count=JOBS, visibility_ms=60_000)
    assert len(claimed) == JOBS
    acked = threading.Event()
    refused: list[str] = []

    def reporter():
        # Report on every job over and over while the acks go in; stop once all are acked.
        value = 0.0
        while not acked.is_set():
            for job in claimed:
                value = (value + 1) % 100
                try:
                    fq.report_progress(q, job.receipt, value, f"at {value:g}")
                except InvalidReceipt:
                    refused.append(job.id)

    def acker():
        for job in claimed:
            fq.ack(q, job.receipt)
        acked.set()

    threads = [Background(reporter, "adv-reporter").start(), Background(reporter, "adv-reporter-2").start()]
    ack = Background(acker, "adv-acker").start().join(60)
    for t in threads:
        t.join(60)
    assert ack.error is None, ack.error
    assert all(t.error is None for t in threads), [t.error for t in threads]
    assert refused  # the reporters did run into settled leases
    # Once settled, a job's progress no longer changes: the reports after its ack were all refused.
    after = {job.id: fq.get(q, job.id) for job in claimed}
    for job in claimed:
        with pytest.raises(InvalidReceipt):
            fq.report_progress(q, job.receipt, 1, "late")
        info = fq.get(q, job.id)
        assert info.state == "succeeded"
        assert (info.progress, info.progress_message, info.progress_at) == (
            after[job.id].progress,
            after[job.id].progress_message,
            after[job.id].progress_at,
        )
        # A stored report was written while the lease was live by the database clock: after the
        # claim, before the deadline (claim + 60 s). It may be stamped a millisecond after the
        # ack's finished_at: the ack reads its clock when it starts, and a report that commits
        # before the ack does (so before the lease ends) can read a later one.
        if info.progress_at is not None:
            assert info.claimed_at <= info.progress_at < info.claimed_at + 60_000
