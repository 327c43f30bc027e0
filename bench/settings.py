"""Django settings of the benchmark processes (the driver's Django side and every worker).

The database is chosen by environment variables, which ``bench/suite.py`` sets
for itself and passes on to the ``fq_worker`` processes it starts:

* ``FQ_BENCH_DB``: ``postgres``, ``sqlite`` or ``mariadb``;
* ``FQ_BENCH_PG_NAME`` (default ``fq_bench_suite``), ``FQ_BENCH_PG_HOST``
  (``127.0.0.1``), ``FQ_BENCH_PG_PORT`` (``5432``), ``FQ_BENCH_PG_USER``
  (``postgres``);
* ``FQ_BENCH_MYSQL_NAME`` (default ``fq_bench_suite``), ``FQ_BENCH_MYSQL_HOST``
  (``127.0.0.1``), ``FQ_BENCH_MYSQL_PORT`` (``3306``), ``FQ_BENCH_MYSQL_USER``
  (``root``, no password): MariaDB 10.6+ / MySQL 8.0+;
* ``FQ_BENCH_PG_POOLER`` (``transaction``: ``FQ_BENCH_PG_PORT`` is a
  transaction-pooling PgBouncer; prepared statements off, LISTEN on a direct
  alias to ``FQ_BENCH_PG_DIRECT_PORT``, default ``5432``);
* ``FQ_BENCH_SQLITE_PATH``: the SQLite file (the suite makes a fresh one in a
  temporary directory);
* ``FQ_BENCH_CLAIM_DBS``: the databases of the claim-latency scenarios (aliases
  ``claim_<scenario>``), set by the suite for itself only.

Everything else is Django's defaults (``DEBUG = False``, ``CONN_MAX_AGE = 0``),
like the settings the other queues are measured with in
``../shared/bench/anchors/``.
"""

import os
import tempfile

DB = os.environ.get("FQ_BENCH_DB", "sqlite")
SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_fq",
    "bench.benchapp",
]

if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("FQ_BENCH_PG_NAME", "fq_bench_suite"),
            "USER": os.environ.get("FQ_BENCH_PG_USER", "postgres"),
            "HOST": os.environ.get("FQ_BENCH_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("FQ_BENCH_PG_PORT", "5432"),
        }
    }
elif DB == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("FQ_BENCH_SQLITE_PATH")
            or os.path.join(tempfile.gettempdir(), "fq-bench.sqlite3"),
            # The configuration docs/quickstart.md recommends for worker processes.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
elif DB == "mariadb":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": os.environ.get("FQ_BENCH_MYSQL_NAME", "fq_bench_suite"),
            "USER": os.environ.get("FQ_BENCH_MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("FQ_BENCH_MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("FQ_BENCH_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("FQ_BENCH_MYSQL_PORT", "3306"),
            # Django's default isolation on this backend (READ COMMITTED), written out; the test settings use it too.
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
        }
    }
else:
    raise RuntimeError(f"FQ_BENCH_DB must be 'postgres', 'sqlite' or 'mariadb', not {DB!r}")

# Through a transaction-pooling PgBouncer (FQ_BENCH_PG_PORT its port, FQ_BENCH_PG_POOLER=transaction):
# the settings docs/scaling.md gives for it, the wakeup listener on a direct alias to
# FQ_BENCH_PG_DIRECT_PORT (default 5432).
if DB == "postgres" and os.environ.get("FQ_BENCH_PG_POOLER") == "transaction":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"]["OPTIONS"] = {"prepare_threshold": None}
    DATABASES["direct"] = {k: v for k, v in DATABASES["default"].items() if k not in ("OPTIONS", "DISABLE_SERVER_SIDE_CURSORS")}
    DATABASES["direct"]["PORT"] = os.environ.get("FQ_BENCH_PG_DIRECT_PORT", "5432")
    FQ_LISTEN_DATABASE = "direct"

# The claim-latency scenarios each get a database of their own, like "default" but
# for the name: FQ_BENCH_CLAIM_DBS="ready_small=NAME,ready_large=NAME,...".
for _item in filter(None, os.environ.get("FQ_BENCH_CLAIM_DBS", "").split(",")):
    _scenario, _name = _item.split("=", 1)
    DATABASES[f"claim_{_scenario}"] = {**DATABASES["default"], "NAME": _name}

LOGGING_CONFIG = None

# The worker registry's heartbeat (django_fq.worker.presence): ``FQ_BENCH_WORKER_HEARTBEAT_MS=0`` runs the
# workers without a registry row, as before issue 19, for an A/B of its cost (docs/performance.md).
if os.environ.get("FQ_BENCH_WORKER_HEARTBEAT_MS"):
    FQ_WORKER_HEARTBEAT_MS = int(os.environ["FQ_BENCH_WORKER_HEARTBEAT_MS"])
