"""No admin page ever shows a receipt, a receipt's hash or the digest of a settle (docs/reference/semantics.md §5)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.models import IdempotencyToken, Job, Lease

from .helpers import changelist, claim_one, job_url, make, queue_pk, seq, text

pytestmark = pytest.mark.django_db


def _secrets_of(receipts: list[str]) -> set[str]:
    """Every receipt, its secret part, and every hash or digest stored about a lease."""
    found = set(receipts) | {r.rsplit(".", 1)[1] for r in receipts}
    found |= set(Lease.objects.values_list("receipt_hash", flat=True))
    for settled_hash, settled_args in Job.objects.values_list("settled_hash", "settled_args"):
        found |= {v for v in (settled_hash, settled_args) if v}
    assert all(len(s) >= 20 for s in found)  # long enough that a match cannot be chance
    return found


def test_no_page_shows_a_receipt_or_its_hash(root_client, queue):
    receipts = []
    fq.enqueue(queue, {"n": 1}, idempotency="tok-a")
    running = claim_one(queue, worker="w-run")  # live lease: Lease.receipt_hash
    receipts.append(running.receipt)
    acked_id = fq.enqueue(queue, {"n": 2}).id
    acked = claim_one(queue)
    fq.ack(queue, acked.receipt, result={"done": True})  # settled_hash + settled_args
    receipts.append(acked.receipt)
    nacked_id = fq.enqueue(queue, {"n": 3}, unique_key="u-1").id
    nacked = claim_one(queue)
    fq.nack(queue, nacked.receipt, error="failed once", delay_ms=0)
    receipts.append(nacked.receipt)
    released = claim_one(queue)  # the nacked job again
    fq.release(queue, released.receipt, error="shutting down")
    receipts.append(released.receipt)
    cancelled_id = fq.enqueue(queue, {"n": 4}).id
    cancelled = claim_one(queue)
    fq.cancel(queue, cancelled_id)  # cancel of a running job records the lease's hash
    receipts.append(cancelled.receipt)
    make(queue, "dead")

    secrets = _secrets_of(receipts)
    assert len(secrets) >= 11
    assert Job.objects.filter(uid=acked_id, settled_args__isnull=False).exists()

    urls = [
        changelist("job"),
        changelist("job") + "?state=running",
        changelist("lease"),
        changelist("idempotencytoken"),
        changelist("queue"),
        reverse("admin:django_fq_queue_change", args=[queue_pk(queue)]),
        reverse("admin:django_fq_queue_delete", args=[queue_pk(queue)]),
        reverse("admin:django_fq_dashboard"),
        reverse("admin:django_fq_lease_change", args=[seq(running.id)]),
        reverse("admin:django_fq_idempotencytoken_change", args=[IdempotencyToken.objects.get().pk]),
        changelist("lease") + f"?q={running.id}",
    ]
    for job in Job.objects.all():
        urls += [job_url(job.uid), job_url(job.uid, "history")]
    # The live updates' JSON (every job's row) and the confirmation of deleting a finished job.
    every = ",".join(str(s) for s in Job.objects.values_list("seq", flat=True))
    urls += [
        reverse("admin:django_fq_dashboard_live"),
        reverse("admin:django_fq_job_live") + f"?live_rows={every}&live_since=0",
        reverse("admin:django_fq_job_delete_finished", args=[seq(acked_id)]),
    ]
    pages = 0
    for url in urls:
        response = root_client.get(url)
        assert response.status_code == 200, url
        html = text(response)
        leaked = [s for s in secrets if s in html]
        assert not leaked, f"{url} shows a receipt or a hash"
        assert "receipt_hash" not in html and "settled_hash" not in html and "settled_args" not in html
        pages += 1
    assert pages == len(urls) and {acked_id, nacked_id, cancelled_id} <= set(Job.objects.values_list("uid", flat=True))


def test_lease_and_token_admins_are_read_only(root_client, queue):
    fq.enqueue(queue, {"n": 1}, idempotency="tok-b")
    claimed = claim_one(queue, worker="w-9")
    lease_url = reverse("admin:django_fq_lease_change", args=[seq(claimed.id)])
    response = root_client.get(lease_url)
    assert response.status_code == 200
    assert not response.context["has_change_permission"] and not response.context["has_delete_permission"]
    html = text(response)
    assert "w-9" in html and claimed.id in html
    assert root_client.post(lease_url, {"worker": "x"}).status_code == 403
    assert root_client.get(reverse("admin:django_fq_lease_add")).status_code == 403
    assert root_client.post(reverse("admin:django_fq_lease_delete", args=[seq(claimed.id)]), {"post": "yes"}).status_code == 403
    token = IdempotencyToken.objects.get()
    token_url = reverse("admin:django_fq_idempotencytoken_change", args=[token.pk])
    assert root_client.post(token_url, {"token": "x"}).status_code == 403
    assert root_client.post(reverse("admin:django_fq_idempotencytoken_delete", args=[token.pk]), {"post": "yes"}).status_code == 403
    assert Lease.objects.filter(job__uid=claimed.id, worker="w-9").exists()
    assert IdempotencyToken.objects.filter(token="tok-b").exists()


def test_token_list_links_to_its_job_and_shows_whether_it_still_deduplicates(root_client, queue, clock):
    job_id = fq.enqueue(queue, {"n": 1}, idempotency="tok-c", idempotency_retention_ms=60_000).id
    response = root_client.get(changelist("idempotencytoken"), {"q": "tok-c"})
    [row] = response.context["cl"].result_list
    assert row.is_live and row.job_seq == seq(job_id)
    assert f'href="{job_url(job_id)}"' in text(response)
    clock.advance(60_000)
    [row] = root_client.get(changelist("idempotencytoken"), {"q": "tok-c"}).context["cl"].result_list
    assert not row.is_live
    assert root_client.get(changelist("idempotencytoken"), {"q": "tok"}).context["cl"].result_count == 0
