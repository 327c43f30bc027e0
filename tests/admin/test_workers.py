"""The admin's Workers page (docs/admin.md "Workers"): read only, gone workers marked, who may see it, hostile URLs."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

import django_fq

from ..worker_rows import add_worker
from .helpers import client_for, text

pytestmark = pytest.mark.django_db

LIST = "/admin/django_fq/workerprocess/"


def _rows(html: str) -> list[str]:
    """The rows of the change list's result table (not the navigation sidebar's)."""
    table = re.search(r'<table id="result_list">.*?</table>', html, flags=re.S).group(0)
    return re.findall(r"<tr[^>]*>.*?</tr>", table, flags=re.S)[1:]  # the header row first


def test_superuser_sees_live_and_gone_workers_read_only(root_client):
    add_worker("host-a:11:aa", queues=("w:q", "w:r"), pid=11, running=3)
    add_worker("host-b:22:bb", host="host-b", pid=22, gone=True)
    page = root_client.get(LIST)
    assert page.status_code == 200
    html = text(page)
    rows = _rows(html)
    assert len(rows) == 2
    live, gone = rows
    assert "host-a:11:aa" in live and "fq-worker-live" in live and ">live<" in live and "w:q, w:r" in live
    assert ">3<" in live and django_fq.__version__ in live
    assert "host-b:22:bb" in gone and "fq-worker-gone" in gone and ">gone<" in gone and "fq-worker-live" not in gone
    assert "Add worker" not in html and 'name="action"' not in html  # nothing to add, change or delete
    only_gone = text(root_client.get(LIST, {"state": "gone"}))
    assert "host-b:22:bb" in only_gone and "host-a:11:aa" not in only_gone
    detail = root_client.get(f"{LIST}{_pk('host-a:11:aa')}/change/")
    assert detail.status_code == 200 and 'name="_save"' not in text(detail) and "w:q, w:r" in text(detail)


def _pk(worker_id: str) -> int:
    from django_fq.models import WorkerProcess

    return WorkerProcess.objects.get(worker_id=worker_id).pk


def test_view_only_staff_sees_the_page_others_do_not(make_user):
    add_worker("host-a:11:aa", pid=11)
    viewer = client_for(make_user("viewer", "view_workerprocess"))
    page = viewer.get(LIST)
    assert page.status_code == 200 and "host-a:11:aa" in text(page)
    assert viewer.post(f"{LIST}{_pk('host-a:11:aa')}/delete/").status_code == 403
    app = text(viewer.get(reverse("admin:app_list", args=["django_fq"])))
    assert 'id="fq-workers-link"' in app and LIST in app
    stranger = client_for(make_user("stranger", "view_queue"))
    assert stranger.get(LIST).status_code == 403
    assert 'id="fq-workers-link"' not in text(stranger.get(reverse("admin:app_list", args=["django_fq"])))


def test_the_dashboard_links_to_the_workers_page(root_client):
    html = text(root_client.get(reverse("admin:django_fq_dashboard")))
    assert 'id="fq-dashboard-workers"' in html and f'href="{LIST}"' in html


@pytest.mark.parametrize(
    "params",
    [
        {"state": "dead"},
        {"state": "live\x00"},
        {"q": "a\x00b"},
        {"o": "99"},
        {"queues__regex": ".*"},
        {"heartbeat_at__gt": "x"},
        {"pid": "99999999999999999999999"},
        {"_facets": "True"},
        {"_facets": "True", "state": "gone"},
    ],
)
def test_hostile_parameters_never_500(root_client, params):
    add_worker("host-a:11:aa", pid=11)
    page = root_client.get(LIST, params)
    assert page.status_code in (200, 302, 400), (params, page.status_code)
