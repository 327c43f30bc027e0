"""The OpenAPI 3 schema served at ``schema/``: valid, complete, and true to the mount point."""

from __future__ import annotations

import json

import pytest
import yaml
from django.urls import reverse
from drf_spectacular.validation import validate_schema

from .conftest import client_as, url

pytestmark = pytest.mark.django_db

EXPECTED = {
    "/queues/": {"get"},
    "/queues/{queue}/": {"get", "put", "patch", "delete"},
    "/queues/{queue}/stats/": {"get"},
    "/queues/{queue}/history/": {"get"},
    "/queues/{queue}/pause/": {"post"},
    "/queues/{queue}/resume/": {"post"},
    "/queues/{queue}/jobs/": {"get", "post"},
    "/queues/{queue}/jobs/bulk/": {"post"},
    "/queues/{queue}/jobs/{job_id}/": {"get"},
    "/queues/{queue}/jobs/{job_id}/retry/": {"post"},
    "/queues/{queue}/jobs/{job_id}/cancel/": {"post"},
    "/queues/{queue}/jobs/{job_id}/wait/": {"get", "post"},
    "/queues/{queue}/jobs/{job_id}/workflow/": {"get"},
    "/queues/{queue}/jobs/{job_id}/workflow/cancel/": {"post"},
    "/queues/{queue}/batches/": {"get", "post"},
    "/queues/{queue}/batches/{batch_id}/": {"get"},
    "/queues/{queue}/batches/{batch_id}/jobs/": {"get", "post"},
    "/queues/{queue}/batches/{batch_id}/seal/": {"post"},
    "/queues/{queue}/batches/{batch_id}/cancel/": {"post"},
    "/queues/{queue}/jobs/{job_id}/upstream/": {"get"},
    "/workflows/": {"post"},
    "/workers/": {"get"},
    "/queues/{queue}/claim/": {"post"},
    "/queues/{queue}/ack/": {"post"},
    "/queues/{queue}/nack/": {"post"},
    "/queues/{queue}/release/": {"post"},
    "/queues/{queue}/extend/": {"post"},
    "/queues/{queue}/progress/": {"post"},
}


def _json_schema(client, path):
    r = client.get(path, {"format": "json"})
    assert r.status_code == 200
    assert r["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return json.loads(r.content)


def test_schema_is_valid_openapi_3_and_complete():
    doc = _json_schema(client_as("consume"), url("schema"))
    validate_schema(doc)  # drf-spectacular's validator: the OpenAPI 3.0 JSON schema
    assert doc["openapi"].startswith("3.0")
    assert doc["servers"] == [{"url": "/api/fq"}]
    methods = {p: {m for m in ops if m in ("get", "put", "patch", "delete", "post")} for p, ops in doc["paths"].items()}
    assert methods == EXPECTED
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    for name, component in doc["components"]["schemas"].items():
        if name.endswith("Request"):
            assert component["additionalProperties"] is False, name
    claimed = doc["components"]["schemas"]["ClaimedJob"]["properties"]
    assert set(claimed) == {"id", "payload", "receipt", "deadline", "attempts", "enqueued_at", "metadata"}
    for name in ("Job", "JobListed"):
        assert "receipt" not in doc["components"]["schemas"][name]["properties"]


def test_schema_yaml_is_the_same_document():
    client = client_as("manage")
    r = client.get(url("schema"))
    assert r.status_code == 200
    assert r["Content-Type"].startswith("application/vnd.oai.openapi")
    assert yaml.safe_load(r.content) == _json_schema(client, url("schema"))


def test_schema_names_the_mount_point_it_was_served_from():
    doc = _json_schema(client_as("produce"), reverse("fq_api_other:schema"))
    assert doc["servers"] == [{"url": "/other/mount"}]
    assert set(doc["paths"]) == set(EXPECTED)


def test_every_documented_error_is_the_error_object():
    doc = _json_schema(client_as("manage"), url("schema"))
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)
    error = doc["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"code", "message", "field"}
