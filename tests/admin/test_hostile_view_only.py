"""A view-only staff user and the flow-control and workflow controls: none shown, every POST refused, nothing changed."""

from __future__ import annotations

import pytest

from django_fq import services as fq

from .helpers import client_for, job_url, queue_pk, text

pytestmark = pytest.mark.django_db

CHANGE = "/admin/django_fq/queue/{}/change/"


def test_view_only_staff_cannot_change_limits_pause_or_cancel(make_user, queue):
    fq.configure(queue, rate_limit=5, key_concurrency=2, ttl_ms=0)
    up = fq.enqueue(queue, 1).id
    down = fq.enqueue(queue, 2, depends_on=[up], concurrency_key="k").id
    before = fq.policy(queue)
    viewer = client_for(make_user("viewer", "view_queue", "view_job"))
    page = viewer.get(CHANGE.format(queue_pk(queue)))
    assert page.status_code == 200
    html = text(page)
    assert 'name="_save"' not in html
    posted = viewer.post(
        CHANGE.format(queue_pk(queue)),
        {"rate_limit": 1, "rate_window_ms": 1, "key_concurrency": 100000, "ttl_ms": 1, "concurrency": 1},
    )
    assert posted.status_code == 403
    assert fq.policy(queue) == before
    job_page = viewer.get(job_url(down))
    assert job_page.status_code == 200 and "/cancel/" not in text(job_page)
    for verb in ("cancel", "retry", "requeue"):
        assert viewer.post(job_url(up, verb)).status_code == 403
    assert fq.get(queue, up).state == "ready" and fq.get(queue, down).state == "waiting"
    assert fq.stats(queue).paused is False
