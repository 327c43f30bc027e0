"""Helpers of the admin tests: jobs in a given state, URLs, logged-in clients."""

from __future__ import annotations

import re

from django.test import Client
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import Job, Queue


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def claim_one(queue: str, **kwargs):
    jobs = fq.claim(queue, **kwargs)
    assert len(jobs) == 1, jobs
    return jobs[0]


def make(queue: str, state: str, payload=None, **options) -> str:
    """A job of ``queue`` in reported ``state``; returns its id. Leaves no other job ready."""
    payload = {"state": state} if payload is None else payload
    if state == "scheduled":
        return fq.enqueue(queue, payload, delay_ms=3_600_000, **options).id
    job_id = fq.enqueue(queue, payload, **options).id
    if state == "ready":
        return job_id
    if state == "cancelled":
        fq.cancel(queue, job_id)
        return job_id
    job = claim_one(queue, worker="worker-7")
    assert job.id == job_id
    if state == "succeeded":
        fq.ack(queue, job.receipt, result={"ok": state})
    elif state == "dead":
        fq.nack(queue, job.receipt, error="boom: it broke", permanent=True)
    return job_id


def seq(job_id: str) -> int:
    """The admin's object id (the internal primary key) of a job."""
    return Job.objects.values_list("seq", flat=True).get(uid=job_id)


def queue_pk(name: str) -> int:
    return Queue.objects.values_list("pk", flat=True).get(name=name)


def job_url(job_id: str, page: str = "change") -> str:
    return reverse(f"admin:django_fq_job_{page}", args=[seq(job_id)])


def changelist(model: str) -> str:
    return reverse(f"admin:django_fq_{model}_changelist")


def listed_ids(response) -> list[str]:
    """Job ids on a job changelist page, in page order."""
    return [job.uid for job in response.context["cl"].result_list]


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def text(response) -> str:
    return response.content.decode()


def squash(html: str) -> str:
    """``html`` with runs of whitespace collapsed (for matching rendered table rows)."""
    return re.sub(r"\s+", " ", html)
