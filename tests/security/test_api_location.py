"""POST to the enqueue route without its trailing slash: the Location header names the new job (from a security review)."""

from __future__ import annotations

import pytest

from tests.api.conftest import client_as, url

pytestmark = pytest.mark.django_db

Q = "review:slash"


def test_location_of_an_enqueue_without_the_slash_names_the_new_job(settings):
    """POST …/jobs (no slash) answers 201 with Location f"{request.path}{id}/" = …/jobs<id>/: a path that
    names no job (404), so a client that follows Location gets nothing."""
    settings.ROOT_URLCONF = "tests.api.urls"
    api = client_as("produce", "manage")
    r = api.post(url("jobs", Q).rstrip("/"), {"payload": {"n": 1}})
    assert r.status_code == 201
    job = r.json()["id"]

    assert r["Location"] == url("job", Q, job)
    assert api.get(r["Location"]).status_code == 200
