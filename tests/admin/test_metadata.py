"""The admin shows job metadata and tags, and filters the job list by tag (case-sensitive, with the other filters)."""

from __future__ import annotations

import json

from django_fq import services as fq

from .helpers import changelist, job_url, listed_ids, queue_pk, text


def test_the_job_page_shows_metadata_and_tags_escaped(root_client, queue):
    job = fq.enqueue(queue, {"n": 1}, metadata={"tenant": "<acme>", "tags": ["eu:west", "vip"]}).id
    html = text(root_client.get(job_url(job)))
    assert '<span class="fq-tag">eu:west</span>' in html and '<span class="fq-tag">vip</span>' in html
    shown = json.dumps({"tenant": "<acme>", "tags": ["eu:west", "vip"]}, indent=2)
    assert shown.replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;") in html
    assert "<acme>" not in html


def test_the_list_shows_tags_and_filters_by_tag(root_client, queue):
    vip = fq.enqueue(queue, {}, metadata={"tags": ["vip"]}).id
    both = fq.enqueue(queue, {}, metadata={"tags": ["vip", "eu"]}).id
    fq.enqueue(queue, {}, metadata={"tags": ["VIP", "vip_"]})
    fq.enqueue(queue, {})
    other = fq.enqueue("adm:other", {}, metadata={"tags": ["vip"]}).id
    response = root_client.get(changelist("job"))
    assert '<span class="fq-tag">eu</span>' in text(response)
    assert set(listed_ids(root_client.get(changelist("job"), {"tag": "vip"}))) == {vip, both, other}
    narrowed = root_client.get(changelist("job"), {"tag": "vip", "queue__id__exact": queue_pk(queue), "state": "ready"})
    assert set(listed_ids(narrowed)) == {vip, both}
    assert listed_ids(root_client.get(changelist("job"), {"tag": "v_p"})) == []
    bad = root_client.get(changelist("job"), {"tag": "no spaces'<"})
    assert bad.status_code == 200 and listed_ids(bad) == []
    assert "no spaces'<" not in text(bad)
