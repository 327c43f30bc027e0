"""The job admin shows progress reports: a column of the list and a section of the job page."""

from __future__ import annotations

import pytest

from django_fq import services as fq

from .helpers import changelist, claim_one, job_url, text

pytestmark = pytest.mark.django_db


def test_the_list_and_the_job_page_show_the_last_report(root_client, queue):
    job_id = fq.enqueue(queue, {}).id
    idle = fq.enqueue(queue, {}, priority=-1).id  # claimed after job_id, never reports
    job = claim_one(queue)
    assert job.id == job_id
    claim_one(queue)
    page = text(root_client.get(job_url(job_id)))
    assert "Progress" in page and "Last report" in page
    fq.report_progress(queue, job.receipt, 42.5, "rows <425> of 1000")
    listing = text(root_client.get(changelist("job"), {"state": "running"}))
    assert '<progress max="100" value="42.5">42.5%</progress> 42.5%' in listing
    assert "rows &lt;425&gt; of 1000" in listing and "<425>" not in listing  # the message is escaped
    assert listing.count("<progress ") == 1  # the job that reported nothing shows none
    page = text(root_client.get(job_url(job_id)))
    assert '<progress max="100" value="42.5">' in page and "rows &lt;425&gt; of 1000" in page
    assert str(fq.get(queue, job_id).progress_at) in page  # "reported at", by the database clock
    assert "<progress " not in text(root_client.get(job_url(idle)))
    # A finished job keeps showing how far it got.
    fq.report_progress(queue, job.receipt, 100, "done")
    fq.ack(queue, job.receipt)
    page = text(root_client.get(job_url(job_id)))
    assert '<progress max="100" value="100">' in page and "done" in page


def test_a_long_message_is_cut_in_the_list_and_whole_on_the_page(root_client, queue):
    fq.enqueue(queue, {})
    job = claim_one(queue)
    message = "m" * 150 + "QQ-TAIL"
    fq.report_progress(queue, job.receipt, 3, message)
    listing = text(root_client.get(changelist("job")))
    assert "m" * 40 + "…" in listing and "QQ-TAIL" not in listing
    assert message in text(root_client.get(job_url(job.id)))
