"""The helpers from Django's own test classes (``TestCase``, ``TransactionTestCase``), as the how-to shows them."""

from __future__ import annotations

from django.db import transaction
from django.test import TestCase, TransactionTestCase

from django_fq import services as fq
from django_fq.testing import assert_enqueued, assert_not_enqueued, drain, inline, worker_thread
from tests.testapp.models import Done

from .handlers import OK


class SignupTests(TestCase):
    """One transaction per test, rolled back at the end: drain, and inline mode through captured commit callbacks."""

    def test_drain_runs_the_job_and_the_assertions_see_it(self):
        job = fq.enqueue(OK, {"n": 1}).id
        assert_enqueued(OK, {"n": 1})

        report = drain(OK)

        assert [j.id for j in report.succeeded] == [job]
        assert_not_enqueued(OK)
        assert Done.objects.filter(job_id=job).exists()

    def test_inline_runs_at_the_captured_commit(self):
        with inline(), self.captureOnCommitCallbacks(execute=True):
            job = fq.enqueue(OK, {"n": 2}).id
        assert fq.get(OK, job).state == "succeeded"


class WorkerTests(TransactionTestCase):
    """Committed data: a real worker on a thread serves the queue."""

    def test_a_worker_thread_runs_a_committed_job(self):
        with worker_thread([OK]) as worker:
            with transaction.atomic():
                job = fq.enqueue(OK, {"n": 3}).id
            assert worker.wait(OK, job).result == {"n": 3, "attempt": 1, "current": True}
