"""C17 in the admin: a stored job whose payload or result nests too deep to show still has its page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_fq import services as fq
from django_fq.validation import MAX_JSON_DEPTH, UNREADABLE_KEY

from ..cases.test_c17_poison_payload import nested_text, store_raw
from .helpers import seq

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 500, 3000])
def test_c17_admin_job_page_shows_a_stand_in_for_a_row_too_deep(root_client, queue, levels):
    job = fq.enqueue(queue, {"n": 1}).id
    store_raw(job, nested_text(levels))
    store_raw(job, nested_text(levels), column="result")
    page = root_client.get(reverse("admin:django_fq_job_change", args=[seq(job)]))
    assert page.status_code == 200
    text = page.content.decode()
    assert UNREADABLE_KEY in text and f"payload nests deeper than {MAX_JSON_DEPTH} levels" in text
    assert f"result nests deeper than {MAX_JSON_DEPTH} levels" in text
    assert root_client.get(reverse("admin:django_fq_job_changelist")).status_code == 200
    response = root_client.post(reverse("admin:django_fq_job_cancel", args=[seq(job)]), follow=True)
    assert response.status_code == 200 and fq.get(queue, job).state == "cancelled"
