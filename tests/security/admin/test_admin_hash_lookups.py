"""The admin changelists filter by any local field given in the query string (Django allows every
lookup on a model's own fields), so a staff user who may only *view* leases or jobs can test prefixes of a
lease's receipt_hash or a job's settled_hash and read them out a digit at a time.

docs/security.md: "No admin page shows a receipt, its secret, or any digest stored about a lease."
(A digest alone settles nothing -- this is disclosure of the digest, not of a receipt.)
"""

from __future__ import annotations

import pytest
from django.test import Client

from django_fq import services as fq
from django_fq.models import Job, Lease

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path, lookup, perm, model_hash",
    [
        ("/admin/django_fq/lease/", "receipt_hash__startswith", "view_lease", lambda: Lease.objects.get().receipt_hash),
        ("/admin/django_fq/job/", "settled_hash__startswith", "view_job", lambda: Job.objects.get().settled_hash),
    ],
    ids=["lease.receipt_hash", "job.settled_hash"],
)
def test_a_viewer_cannot_filter_on_a_stored_receipt_digest(make_user, path, lookup, perm, model_hash):
    fq.enqueue("adm:oracle", {})
    [job] = fq.claim("adm:oracle")
    if "settled" in lookup:
        fq.nack("adm:oracle", job.receipt, error="x")
    digest = model_hash()
    client = Client()
    client.force_login(make_user("viewer", perm))

    right = client.get(path, {lookup: digest[:8]})
    wrong = client.get(path, {lookup: ("0" if digest[0] != "0" else "1") + digest[1:8]})

    # Refusing the lookup (400/403, or Django's "?e=1" redirect) is the safe answer; answering it differently
    # for a right and a wrong prefix reads the digest out.
    if right.status_code == 200 and wrong.status_code == 200:
        assert right.content.count(job.id.encode()) == wrong.content.count(job.id.encode()), (
            f"{path}?{lookup}=<prefix> lists the job only for the right prefix of its digest"
        )
