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


def _deep_wide(levels: int, items: int):
    value: object = [0] * items
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_deep_wide_payload_is_shown_cut_without_building_its_whole_indented_text(root_client, queue):
    """docs/admin.md, "Jobs": a 1 MiB payload nesting 64 levels is ~68 MB indented; the page stops at the cut."""
    import tracemalloc

    from django_fq.admin import display

    payload = _deep_wide(MAX_JSON_DEPTH, 500_000)  # 1 MB as compact JSON, the default payload limit
    tracemalloc.start()
    try:
        text = display.pretty_json(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * display.MAX_SHOWN_CHARS  # a few MB at most, not the 68 MB of the whole text
    assert len(text) < display.MAX_SHOWN_CHARS + 200 and text.endswith("characters are shown]")
    job = fq.enqueue(queue, payload).id
    page = root_client.get(reverse("admin:django_fq_job_change", args=[seq(job)]))
    assert page.status_code == 200 and len(page.content) < 3 * display.MAX_SHOWN_CHARS
    assert "characters are shown]" in page.content.decode()


def test_a_small_payload_is_shown_whole():
    from django_fq.admin import display

    assert display.pretty_json({"a": [1, {"b": None}]}) == '{\n  "a": [\n    1,\n    {\n      "b": null\n    }\n  ]\n}'
