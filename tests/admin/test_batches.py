"""Batch admin: the list with progress bars and the detail with its counts, callback and member links."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_fq import batches
from django_fq import services as fq
from django_fq.models import Batch

from .helpers import changelist, job_url, text

pytestmark = pytest.mark.django_db


def test_list_and_detail_render_with_progress_and_links(root_client, queue):
    b = batches.create(queue, callback={"queue": "adm:reports", "payload": "r"})
    ids = [r.id for r in batches.add(b.id, [{"payload": i} for i in range(4)])]
    job = fq.claim(queue)[0]
    fq.ack(queue, job.receipt)
    listed = root_client.get(changelist("batch"))
    assert listed.status_code == 200
    page = text(listed)
    assert b.id in page and '<progress class="fq-progress" value="1" max="4">' in page and "1/4 (25.0%)" in page
    detail = root_client.get(reverse("admin:django_fq_batch_change", args=[Batch.objects.get(uid=b.id).pk]))
    assert detail.status_code == 200
    page = text(detail)
    for i in ids:
        assert f'href="{job_url(i)}"' in page
    assert "fq-state-succeeded" in page and "(not yet)" in page
    batches.seal(b.id)
    for j in fq.claim(queue, count=3):
        fq.ack(queue, j.receipt)
    page = text(root_client.get(reverse("admin:django_fq_batch_change", args=[Batch.objects.get(uid=b.id).pk])))
    assert f'href="{job_url(batches.get(b.id).callback_job)}"' in page and "4/4 (100.0%)" in page
    assert root_client.get(changelist("batch"), {"state": "finished"}).status_code == 200
    assert root_client.get(changelist("batch"), {"q": b.id}).status_code == 200


def test_the_batch_admin_is_read_only(root_client, queue):
    b = batches.create(queue)
    pk = Batch.objects.get(uid=b.id).pk
    assert root_client.get(reverse("admin:django_fq_batch_add")).status_code == 403
    r = root_client.post(reverse("admin:django_fq_batch_change", args=[pk]), {"state": "finished"})
    assert r.status_code == 403 and batches.get(b.id).state == "open"
