"""Settings of the example project, read from the environment with django-environ.

Every value has a default that is fine for a local demo, so a fresh clone runs
with no configuration at all:

``DATABASE_URL``
    Defaults to a SQLite file ``var/db.sqlite3`` next to ``manage.py``.
    Any SQLite URL gets the options django-fq needs on SQLite (WAL journal,
    ``IMMEDIATE`` transactions, a 20 s busy timeout), so several worker
    processes can share the file safely. A PostgreSQL URL
    (``postgres://user@host:5432/name``) is used as given. A MariaDB/MySQL
    URL (``mysql://root@127.0.0.1:3306/fqdemo``) gets a ``utf8mb4``
    connection, unless its own options say otherwise.
``SECRET_KEY``
    A fixed, clearly insecure demo key unless set.
``DEBUG``
    ``False`` unless set (``DEBUG=1``).
``ALLOWED_HOSTS``
    Comma-separated; defaults to local addresses.
``FQ_LOG_LEVEL``
    Level of the ``django_fq`` loggers on the console (default ``INFO``).

Emails go to files under ``var/emails`` (Django's file-based backend), so a
separate worker process really "sends" something you can look at.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="insecure-demo-key-change-me-for-anything-real")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_fq",
    "example_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------

#: What django-fq needs from SQLite: WAL so readers never block the writer,
#: ``BEGIN IMMEDIATE`` so a claim takes the write lock before it reads (no
#: lock upgrade deadlocks between worker processes), and a busy timeout so a
#: process waits for the lock instead of failing at once.
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
#: MariaDB/MySQL: Django's driver connects with the 3-byte ``utf8`` unless told, which
#: rejects emoji and other 4-byte characters in payloads, tokens and keys.
MYSQL_OPTIONS = {"charset": "utf8mb4"}

for _db in DATABASES.values():
    if _db.get("ENGINE") == "django.db.backends.sqlite3":
        _db["OPTIONS"] = {**SQLITE_OPTIONS, **_db.get("OPTIONS", {})}
    elif _db.get("ENGINE") == "django.db.backends.mysql":
        _db["OPTIONS"] = {**MYSQL_OPTIONS, **_db.get("OPTIONS", {})}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- i18n, static -----------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- email: written to files, one message after the other -------------------

EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = VAR_DIR / "emails"
DEFAULT_FROM_EMAIL = "welcome@example.com"

# --- Django Tasks on django-fq -----------------------------------------------
#
# ``@task`` functions (example_project/demo/tasks.py) are stored as django-fq
# jobs on the fq queue "tasks:default" and run by ``manage.py fq_worker``.
# Django 6.x has the Tasks framework built in; on Django 5.2 install the
# backport with ``pip install "django-fq[tasks]"``. See docs/tasks.md.

TASKS = {
    "default": {
        "BACKEND": "django_fq.tasks.FqBackend",
        "QUEUES": ["default"],
        "OPTIONS": {
            "queue_prefix": "tasks:",
            "tasks": {
                "example_project.demo.tasks.tally_signups": {"max_attempts": 3, "unique_key": "signups-{0}"},
            },
        },
    },
}

# --- logging: show the worker's INFO lines on the console -------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "loggers": {
        "django_fq": {
            "handlers": ["console"],
            "level": env.str("FQ_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
    },
}
