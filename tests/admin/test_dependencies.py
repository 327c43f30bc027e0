"""Job admin and dependencies: the waiting filter, a job's dependencies and dependents with links, cancel of a waiting job."""

from __future__ import annotations

import pytest

from django_fq import services as fq

from .helpers import changelist, job_url, listed_ids, text

pytestmark = pytest.mark.django_db


def test_waiting_filter_and_detail_links_both_ways(root_client, queue):
    a = fq.enqueue(queue, "a").id
    b = fq.enqueue(queue, "b", depends_on=[{"id": a, "on_failure": "run"}]).id
    assert listed_ids(root_client.get(changelist("job"), {"state": "waiting"})) == [b]
    page = text(root_client.get(job_url(b)))
    assert f'href="{job_url(a)}"' in page and "on failure: run (pending)" in page
    up = text(root_client.get(job_url(a)))
    assert f'href="{job_url(b)}"' in up
    assert 'fq-state-waiting' in page


def test_a_waiting_job_can_be_cancelled_from_its_page(root_client, queue):
    a = fq.enqueue(queue, "a").id
    b = fq.enqueue(queue, "b", depends_on=[a]).id
    c = fq.enqueue(queue, "c", depends_on=[b]).id
    response = root_client.post(job_url(b, "cancel"), follow=True)
    assert response.status_code == 200
    assert fq.get(queue, b).state == "cancelled" and fq.get(queue, c).state == "cancelled"


def test_a_named_edge_shows_its_name_on_both_pages(root_client, queue):
    a = fq.enqueue(queue, "a").id
    b = fq.enqueue(queue, "b", depends_on=[{"id": a, "name": "fetch<step>"}]).id
    for page in (text(root_client.get(job_url(b))), text(root_client.get(job_url(a)))):
        assert "<code>fetch&lt;step&gt;</code>" in page
