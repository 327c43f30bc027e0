"""Fixtures of the admin tests.

``tests/settings.py`` is the settings of the whole suite and does not install
the admin. For the tests of this package, :func:`_admin_installed` adds
``django.contrib.admin`` (with sessions, messages, static files), the admin's
middleware and templates and a URLconf, migrates the added apps into the test
database once, and when the package is done migrates them back out and
restores the settings, so the rest of the suite runs as before (on PostgreSQL
a leftover ``django_admin_log`` table would block the flush of ``auth_user``).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.test.utils import override_settings

from django_fq import services as fq

ADMIN_APPS = [
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
#: Added apps that own tables (migrated in, and back out at the end).
MIGRATED = ("sessions", "admin")

@pytest.fixture(scope="package", autouse=True)
def _admin_installed(django_db_setup, django_db_blocker):
    from django.conf import settings

    missing = [a for a in ADMIN_APPS if a not in settings.INSTALLED_APPS]
    override = override_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, *missing],
        ROOT_URLCONF="tests.admin.urls",
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        STATIC_URL="/static/",
    )
    override.enable()
    to_migrate = [label for label in MIGRATED if f"django.contrib.{label}" in missing]
    try:
        with django_db_blocker.unblock():
            for label in to_migrate:
                call_command("migrate", label, verbosity=0, interactive=False)
        yield
    finally:
        with django_db_blocker.unblock():
            for label in reversed(to_migrate):
                call_command("migrate", label, "zero", verbosity=0, interactive=False)
        override.disable()


def _user(username: str, *codenames: str, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser(username, f"{username}@example.com", "pw")
    user = User.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="django_fq", codename__in=codenames)
    assert perms.count() == len(codenames), codenames
    user.user_permissions.set(perms)
    return user


@pytest.fixture
def make_user(db):
    """``make_user(name, *codenames, superuser=False)``: a staff user with exactly these django_fq permissions."""
    return _user


@pytest.fixture
def root_client(db) -> Client:
    """A client logged in as a superuser."""
    client = Client()
    client.force_login(_user("root", superuser=True))
    return client


@pytest.fixture
def queue(db):
    """A configured queue; returns its name."""
    fq.configure("adm:q", max_attempts=3)
    return "adm:q"
