"""``fq_workers{state}``: the worker registry in the exporter (docs/admin.md "Workers")."""

from __future__ import annotations

import pytest
from django.test import Client

from ..worker_rows import add_worker
from .helpers import samples, value

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-metrics-token-for-tests"


@pytest.fixture(autouse=True)
def _urls(settings):
    settings.ROOT_URLCONF = "tests.metrics.urls"
    settings.FQ_METRICS_TOKEN = TOKEN


def scrape() -> dict:
    response = Client().get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    return samples(response.content.decode())


def test_live_and_gone_workers_are_counted():
    found = scrape()
    assert value(found, "fq_workers", state="live") == 0 and value(found, "fq_workers", state="gone") == 0
    add_worker("a:1:x", pid=1)
    add_worker("b:2:y", pid=2)
    add_worker("c:3:z", pid=3, gone=True)
    found = scrape()
    assert value(found, "fq_workers", state="live") == 2
    assert value(found, "fq_workers", state="gone") == 1
