"""Schema-driven fuzzing of the API with schemathesis: no input makes it answer 500.

Every operation of the served OpenAPI schema gets generated requests — valid
ones (positive mode, which must also get documented status codes and bodies
that match the schema) and invalid ones (negative mode) — sent through
Django's WSGI handler in the test's transaction, as an authenticated
superuser. The fast tier runs a few deterministic examples per operation; the
``slow`` tier many random ones.

Long polls are shortened (``wait_ms``/``timeout_ms`` capped at 20 ms) so a
generated 20-second wait does not stall the run.
"""

from __future__ import annotations

import base64

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, reject
from hypothesis import settings as hsettings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from django_fq import services

from .conftest import make_user

pytestmark = pytest.mark.django_db

POSITIVE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
NEGATIVE_CHECKS = [not_a_server_error]
LONG_POLL_CAP_MS = 20


@pytest.fixture
def wsgi_app():
    """Django's WSGI handler, without closing the test's connection at the end of each request."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _cap_waits(case) -> None:
    for container in (case.body, case.query):
        if isinstance(container, dict):
            for key in ("wait_ms", "timeout_ms"):
                if isinstance(container.get(key), int) and not isinstance(container[key], bool):
                    container[key] = min(container[key], LONG_POLL_CAP_MS)


def fuzz(app, *, examples: int, derandomize: bool) -> int:
    """Fuzz every operation in both modes; return the number of requests sent."""
    make_user(superuser=True, password="pw")
    from django.contrib.auth.models import User

    name = User.objects.get(is_superuser=True).username
    auth = {"Authorization": "Basic " + base64.b64encode(f"{name}:pw".encode()).decode()}
    services.enqueue("fuzz", {"seed": True})  # something to claim, list and settle
    schema = schemathesis.openapi.from_wsgi("/api/fq/schema/?format=json", app, headers=auth)
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            checks = POSITIVE_CHECKS if mode == GenerationMode.POSITIVE else NEGATIVE_CHECKS

            @hsettings(
                max_examples=examples,
                deadline=None,
                derandomize=derandomize,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                nonlocal sent
                _cap_waits(case)
                try:
                    response = case.call(headers=auth)
                except ValueError as exc:
                    # The client could not build this URL (urllib reads a generated path as a bracketed
                    # host, in requests' cookie handling): nothing reached the API. Any other error is raised.
                    if "Invalid IPv6 URL" not in str(exc):
                        raise
                    reject()
                sent += 1
                case.validate_response(response, checks=checks)  # noqa: B023 - run() is called in this iteration

            run()
    return sent


def test_fuzz_the_schema_fast(wsgi_app):
    assert fuzz(wsgi_app, examples=3, derandomize=True) > 50


@pytest.mark.slow
def test_fuzz_the_schema_many_examples(wsgi_app):
    assert fuzz(wsgi_app, examples=60, derandomize=False) > 1000
