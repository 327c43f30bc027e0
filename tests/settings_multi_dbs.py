"""Settings of the queues-over-several-databases tests (``FQ_QUEUE_DATABASES``): three aliases that hold queues.

* ``default``: the application's tables and the queues no pattern matches (``FQ_DATABASE``);
* ``second``: a second database of this leg's engine (PostgreSQL, MariaDB, or a SQLite file),
  queues ``two:*`` and ``t2.*``;
* ``lite``: a SQLite file whatever the leg, queues ``lite:*``.

On the PostgreSQL leg that is two PostgreSQL databases and one SQLite file. The tests of
``tests/multi_dbs/`` run with these settings in a pytest child started by
``tests/test_queues_over_databases.py`` (``make test`` runs it on every leg); the
``fq_worker`` children of those tests use them too, pointed at the parent's databases with
``FQ_CHILD_DB_NAME`` (``default``), ``FQ_CHILD_SECOND_DB_NAME`` and ``FQ_CHILD_LITE_DB_NAME``
(and, for a test that makes ``second`` unreachable, ``FQ_CHILD_SECOND_PORT``: its server's port,
``FQ_CHILD_SECOND_TIMEOUT``: its SQLite busy timeout).
"""

import copy
import os
import tempfile

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _BASE
from tests.settings import DB

# The admin, sessions and templates as the two-database suite installs them.
from tests.settings_two_dbs import INSTALLED_APPS, MIDDLEWARE, TEMPLATES  # noqa: F401

FQ_DATABASE = "default"
FQ_QUEUE_DATABASES = [("two:*", "second"), ("t2.*", "second"), ("lite:*", "lite")]
# The worker test's handlers: the recording handler of tests.testapp on a queue of each alias.
FQ_HANDLERS = {"t2.ok": "tests.testapp.fq_handlers.record", "lite:ok": "tests.testapp.fq_handlers.record"}
DATABASE_ROUTERS = ["django_fq.routers.FqRouter"]
ROOT_URLCONF = "tests.multi_dbs.urls"
FQ_METRICS_TOKEN = "multi-dbs-metrics-token"
_dir = os.environ.get("FQ_TEST_SQLITE_DIR") or tempfile.gettempdir()


def _sqlite(alias: str) -> dict:
    name = os.path.join(_dir, f"fq-test-multi-{os.getpid()}-{alias}.sqlite3")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": name},
    }


_default = copy.deepcopy(_BASE["default"])
if DB in ("postgres", "mariadb"):
    _base = os.environ.get("FQ_TEST_PG_TEST_NAME", "test_fq")
    _second = copy.deepcopy(_default)
    _default["TEST"] = {**_default.get("TEST", {}), "NAME": f"{_base}_multi_default"}
    _second["NAME"] = f"{_default['NAME']}_second"
    _second["TEST"] = {**_second.get("TEST", {}), "NAME": f"{_base}_multi_second"}
else:
    _default, _second = _sqlite("default"), _sqlite("second")
_lite = _sqlite("lite")
for _env, _conf in (
    ("FQ_CHILD_DB_NAME", _default),
    ("FQ_CHILD_SECOND_DB_NAME", _second),
    ("FQ_CHILD_LITE_DB_NAME", _lite),
):
    if os.environ.get(_env):
        _conf["NAME"] = os.environ[_env]
        _conf["TEST"] = {**_conf.get("TEST", {}), "NAME": os.environ[_env]}
# A worker test points "second" elsewhere to make its database unreachable: another port on
# loopback (a server engine; the test's gate in front of the real one) or another file name.
if os.environ.get("FQ_CHILD_SECOND_PORT") and DB in ("postgres", "mariadb"):
    _second["HOST"], _second["PORT"] = "127.0.0.1", os.environ["FQ_CHILD_SECOND_PORT"]
if os.environ.get("FQ_CHILD_SECOND_TIMEOUT") and DB == "sqlite":  # its busy timeout (s): a lock fails fast
    _second["OPTIONS"]["timeout"] = float(os.environ["FQ_CHILD_SECOND_TIMEOUT"])
DATABASES = {"default": _default, "second": _second, "lite": _lite}

# A worker registry test beats often (django_fq.worker.presence).
if os.environ.get("FQ_CHILD_WORKER_HEARTBEAT_MS"):
    FQ_WORKER_HEARTBEAT_MS = int(os.environ["FQ_CHILD_WORKER_HEARTBEAT_MS"])
