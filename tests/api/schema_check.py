"""Checking responses against the API's own OpenAPI schema (jsonschema, no network).

:func:`check_response` finds the operation a Django test response answered
(by its URL route and method) and asserts that its status code is documented
and its JSON body matches the documented schema. The API test client runs it
on every response, so every test doubles as a check of the schema.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import threading

import jsonschema
from django.urls import resolve

MOUNT = "/api/fq"
_lock = threading.Lock()
_schema: dict = {}


def openapi() -> dict:
    """The schema of the API mounted at ``/api/fq`` (built once per process, whichever thread asks first)."""
    from django_fq.api.schema import build_schema

    with _lock:
        if not _schema:
            _schema.update(json.loads(json.dumps(build_schema(MOUNT))))
        return _schema


def _to_json_schema(node):
    """OpenAPI 3.0 schema → JSON Schema (draft 7): ``nullable`` becomes a null alternative."""
    if isinstance(node, list):
        return [_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items() if k not in ("nullable", "readOnly", "writeOnly")}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@functools.lru_cache(maxsize=1)
def _components() -> dict:
    return _to_json_schema(copy.deepcopy(openapi().get("components", {})))


def operation_of(path_info: str, method: str) -> tuple[str, dict] | None:
    """``(openapi_path, operation)`` answering ``method path_info``, or None if undocumented."""
    match = resolve(path_info)
    route = "/" + match.route
    if not route.startswith(MOUNT + "/"):
        return None
    path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route[len(MOUNT) :])
    op = openapi()["paths"].get(path, {}).get(method.lower())
    return (path, op) if op is not None else None


def check_response(response) -> None:
    """Assert that ``response`` (a Django test response) is what the schema documents."""
    environ = response.request
    found = operation_of(environ["PATH_INFO"], environ["REQUEST_METHOD"])
    if found is None:
        return
    path, op = found
    status = str(response.status_code)
    documented = op.get("responses", {})
    assert status in documented, f"{environ['REQUEST_METHOD']} {path}: status {status} is not documented"
    content = documented[status].get("content", {})
    if not content:
        return
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    schema = next(iter(content.values()))["schema"]
    root = {**_to_json_schema(schema), "components": _components()}
    body = json.loads(response.content)
    errors = sorted(jsonschema.Draft7Validator(root).iter_errors(body), key=lambda e: list(e.path))
    assert not errors, f"{environ['REQUEST_METHOD']} {path} {status}: {errors[0].message} at {list(errors[0].path)}"
