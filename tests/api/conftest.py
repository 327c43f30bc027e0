"""Fixtures of the REST API tests: the API mounted at ``/api/fq/``, users holding capabilities.

Every response of :class:`Client` is checked against the API's OpenAPI schema
(status documented, body matching), see :mod:`tests.api.schema_check`.
"""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from rest_framework.test import APIClient

from .schema_check import check_response

_names = itertools.count()


@pytest.fixture(autouse=True)
def api_settings(settings):
    """The API at ``/api/fq/`` (the test settings have no URL conf of their own)."""
    settings.ROOT_URLCONF = "tests.api.urls"


class Client(APIClient):
    """DRF's test client, JSON by default, checking each response against the schema.

    A write without a body still says ``Content-Type: application/json``, as the
    API requires of every write (docs/security.md, "Cross-site requests cannot write").
    """

    default_format = "json"

    def post(self, path, data=None, format=None, content_type=None, **kwargs):
        return super().post(path, data, format, _json_if_bodiless(data, content_type), **kwargs)

    def put(self, path, data=None, format=None, content_type=None, **kwargs):
        return super().put(path, data, format, _json_if_bodiless(data, content_type), **kwargs)

    def patch(self, path, data=None, format=None, content_type=None, **kwargs):
        return super().patch(path, data, format, _json_if_bodiless(data, content_type), **kwargs)

    def delete(self, path, data=None, format=None, content_type=None, **kwargs):
        return super().delete(path, data, format, _json_if_bodiless(data, content_type), **kwargs)

    def request(self, **kwargs):
        response = super().request(**kwargs)
        check_response(response)
        return response


def _json_if_bodiless(data, content_type):
    return "application/json" if data is None and content_type is None else content_type


def url(name: str, *args) -> str:
    """The path of API endpoint ``name`` (``fq_api`` namespace)."""
    return reverse(f"fq_api:{name}", args=args)


def make_user(*capabilities: str, superuser: bool = False, password: str = "pw") -> User:
    """A user holding the django-fq permissions ``capabilities`` (``produce``/``consume``/``manage``)."""
    name = f"user{next(_names)}"
    if superuser:
        user = User.objects.create_superuser(name, f"{name}@example.com", password)
    else:
        user = User.objects.create_user(name, f"{name}@example.com", password)
    perms = Permission.objects.filter(content_type__app_label="django_fq", codename__in=capabilities)
    assert perms.count() == len(set(capabilities)), "django-fq permissions missing from the database"
    user.user_permissions.add(*perms)
    return User.objects.get(pk=user.pk)  # a fresh instance: no stale permission cache


def client_as(*capabilities: str, superuser: bool = False) -> Client:
    """A client authenticated (forced) as a new user holding ``capabilities``."""
    client = Client()
    client.force_authenticate(make_user(*capabilities, superuser=superuser))
    return client


@pytest.fixture
def api(db) -> Client:
    """A client holding all three capabilities (produce, consume, manage)."""
    return client_as("produce", "consume", "manage")


@pytest.fixture(scope="session")
def _static_url_for_live_server():
    """The live server's static-files wrapper needs a ``STATIC_URL``; the test settings have none."""
    from django.test.utils import override_settings

    with override_settings(STATIC_URL="/static/"):
        yield


@pytest.fixture(scope="session")
def live_server(_static_url_for_live_server, live_server):
    """pytest-django's live server, started with ``STATIC_URL`` set."""
    return live_server
