"""``services.jobs.delete_finished``: prune chosen finished jobs now (docs/admin.md "Jobs"), on every database."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidState, JobNotFound
from django_fq.models import Dependency, Job, JobPayload
from django_fq.services.jobs import delete_finished

from .helpers import claim_one

pytestmark = pytest.mark.django_db


def test_deletes_succeeded_and_cancelled_jobs_with_their_bodies(q, settings):
    settings.FQ_PAYLOAD_OFFLOAD_BYTES = 64
    big = fq.enqueue(q, {"blob": "x" * 300}).id
    fq.ack(q, claim_one(q).receipt)
    gone = fq.enqueue(q, {"n": 1}).id
    fq.cancel(q, gone)
    kept = fq.enqueue(q, {"n": 2}).id
    assert JobPayload.objects.filter(job_uid=big).exists()
    totals = fq.stats(q).totals
    delete_finished(q, big)
    delete_finished(q, gone)
    assert set(Job.objects.values_list("uid", flat=True)) == {kept}
    assert not JobPayload.objects.filter(job_uid=big).exists()
    assert fq.stats(q).totals == totals  # counters unchanged: a finished job counts in none
    with pytest.raises(JobNotFound):
        delete_finished(q, gone)


@pytest.mark.parametrize("state", ["ready", "scheduled", "running", "dead"])
def test_refuses_unfinished_and_dead_jobs(q, state):
    if state == "scheduled":
        job_id = fq.enqueue(q, {"n": 1}, delay_ms=3_600_000).id
    else:
        job_id = fq.enqueue(q, {"n": 1}, max_attempts=1).id
    if state in ("running", "dead"):
        job = claim_one(q)
        if state == "dead":
            fq.nack(q, job.receipt, error="boom")
    with pytest.raises(InvalidState) as caught:
        delete_finished(q, job_id)
    assert caught.value.field == "job_id"
    assert f"this job is {state}" in caught.value.message and "cancel it first" in caught.value.message
    assert fq.get(q, job_id).state == state


def test_keeps_a_job_an_unfinished_job_waits_on(q):
    up = fq.enqueue(q, {"n": 1}).id
    down = fq.enqueue(q, {"n": 2}, depends_on=[{"id": up, "on_failure": "run"}]).id
    fq.cancel(q, up)  # the dependent runs anyway (on_failure=run): it is ready, not finished
    assert fq.get(q, down).state == "ready"
    with pytest.raises(InvalidState, match="still waits on this job"):
        delete_finished(q, up)
    fq.cancel(q, down)
    delete_finished(q, up)
    assert not Job.objects.filter(uid=up).exists()
    assert not Dependency.objects.exists()
