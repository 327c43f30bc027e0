"""Test settings. ``FQ_TEST_DB=sqlite`` (default), ``postgres`` or ``mariadb`` picks the database.

PostgreSQL: 127.0.0.1:5432, user ``postgres`` (override with ``FQ_TEST_PG_*``).
MariaDB/MySQL: 127.0.0.1:3306, user ``root`` without a password (``FQ_TEST_MYSQL_*``).
SQLite: a file database in WAL mode (several processes must share it in the
concurrency tests; ``:memory:`` cannot).
"""

import os
import tempfile
from typing import Any

DB = os.environ.get("FQ_TEST_DB", "sqlite")
SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DEBUG = False
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Cheap password hashing for every test user: Django 6.1's PBKDF2 costs about a second per
# create_user on this machine, and no test's subject is the hasher. (HTTP Basic's real cost
# is measured in docs/rest-api.md, "HTTP Basic costs CPU on every request".)
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "rest_framework.authtoken",
    "django_fq",
    "tests.testapp",
]

if DB == "postgres":
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("FQ_TEST_PG_NAME", "fq"),
            "USER": os.environ.get("FQ_TEST_PG_USER", "postgres"),
            "HOST": os.environ.get("FQ_TEST_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("FQ_TEST_PG_PORT", "5432"),
            "TEST": {"NAME": os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq")},
        }
    }
    # libpq multi-host (HA): FQ_TEST_PG_HOST="127.0.0.1,127.0.0.1" FQ_TEST_PG_PORT="5433,5434" and
    # FQ_TEST_PG_TARGET_SESSION_ATTRS=read-write reach whichever node is the primary (docs/scaling.md).
    if os.environ.get("FQ_TEST_PG_TARGET_SESSION_ATTRS"):
        DATABASES["default"]["OPTIONS"] = {
            "target_session_attrs": os.environ["FQ_TEST_PG_TARGET_SESSION_ATTRS"],
            "connect_timeout": int(os.environ.get("FQ_TEST_PG_CONNECT_TIMEOUT", "2")),
        }
    # Through a transaction-pooling PgBouncer (make test-pgbouncer): FQ_TEST_PG_PORT=6432,
    # FQ_TEST_PG_POOLER=transaction, and FQ_TEST_PG_DIRECT_PORT the server's own port for the
    # LISTEN alias, exactly as docs/scaling.md lays it out.
    if os.environ.get("FQ_TEST_PG_POOLER") == "transaction":
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None
        DATABASES["direct"] = {
            **{k: v for k, v in DATABASES["default"].items() if k not in ("OPTIONS", "DISABLE_SERVER_SIDE_CURSORS")},
            "PORT": os.environ.get("FQ_TEST_PG_DIRECT_PORT", "5432"),
            "TEST": {"MIRROR": "default"},
        }
        FQ_LISTEN_DATABASE = "direct"
elif DB == "mariadb":
    # MariaDB 10.6+ / MySQL 8.0+ through mysqlclient: 127.0.0.1:3306, user root without a password
    # (override with FQ_TEST_MYSQL_*). Django's default isolation on this backend is READ COMMITTED;
    # FQ_TEST_MYSQL_ISOLATION="repeatable read" runs the suite under InnoDB's own default.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": os.environ.get("FQ_TEST_MYSQL_NAME", "fq"),
            "USER": os.environ.get("FQ_TEST_MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("FQ_TEST_MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("FQ_TEST_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("FQ_TEST_MYSQL_PORT", "3306"),
            "OPTIONS": {
                "charset": "utf8mb4",
                "isolation_level": os.environ.get("FQ_TEST_MYSQL_ISOLATION", "read committed"),
            },
            # The test database name follows FQ_TEST_PG_TEST_NAME, so each leg (and worktree) has its own.
            "TEST": {"NAME": os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq"), "CHARSET": "utf8mb4"},
        }
    }
else:
    _dir = os.environ.get("FQ_TEST_SQLITE_DIR") or tempfile.gettempdir()
    _name = os.path.join(_dir, f"fq-test-{os.getpid()}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _name,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": _name},
        }
    }

# The test tasks live outside the installed apps; a worker runs tasks only from apps and these modules.
FQ_TASK_MODULES = ["tests.tasks.sample", "tests.security.sample_tasks"]

STATIC_URL = "/static/"
LOGGING_CONFIG = None
