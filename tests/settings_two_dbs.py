"""Settings of the two-database tests: ``default`` and ``queue`` are different databases, ``FQ_DATABASE = "queue"``.

The tests of ``tests/two_dbs/`` run with these settings in a pytest child
started by ``tests/test_separate_database.py`` (``make test`` runs it on every
leg); the ``fq_worker`` children of those tests use them too.

* PostgreSQL: two test databases, ``<FQ_TEST_PG_TEST_NAME>_2db_default`` and
  ``…_2db_queue``.
* SQLite: two files (WAL, ``IMMEDIATE``, busy timeout, as ``tests.settings``).

A child process is pointed at the parent's databases with
``FQ_CHILD_DB_NAME`` (``default``) and ``FQ_CHILD_QUEUE_DB_NAME`` (``queue``).
The admin and the REST API are installed, with ``django_fq.routers.FqRouter``.
"""

import copy
import os
import tempfile

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _BASE
from tests.settings import DB
from tests.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [
    *_APPS,
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
FQ_DATABASE = "queue"
DATABASE_ROUTERS = ["django_fq.routers.FqRouter"]
ROOT_URLCONF = "tests.two_dbs.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
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
]

_default = copy.deepcopy(_BASE["default"])
_queue = copy.deepcopy(_BASE["default"])
if DB == "postgres":
    _base = os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq")
    _default["TEST"] = {"NAME": f"{_base}_2db_default"}
    _queue["NAME"] = f"{_default['NAME']}_queue"
    _queue["TEST"] = {"NAME": f"{_base}_2db_queue"}
else:
    _dir = os.environ.get("FQ_TEST_SQLITE_DIR") or tempfile.gettempdir()
    for _alias, _conf in (("default", _default), ("queue", _queue)):
        _conf["NAME"] = os.path.join(_dir, f"fq-test-2db-{os.getpid()}-{_alias}.sqlite3")
        _conf["TEST"] = {"NAME": _conf["NAME"]}
for _env, _conf in (("FQ_CHILD_DB_NAME", _default), ("FQ_CHILD_QUEUE_DB_NAME", _queue)):
    if os.environ.get(_env):
        _conf["NAME"] = os.environ[_env]
        _conf["TEST"] = {"NAME": os.environ[_env]}
DATABASES = {"default": _default, "queue": _queue}
