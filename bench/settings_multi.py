"""Settings of ``bench/multi_db_drain.py``: ``bench.settings`` on PostgreSQL with a second database alias.

* ``FQ_BENCH_PG_NAME`` (``default``) and ``FQ_BENCH_PG_NAME2`` (``second``): two databases;
* ``FQ_BENCH_SPLIT=1``: queues ``b:*`` live on ``second`` (``FQ_QUEUE_DATABASES``); otherwise
  every queue is on ``default`` and ``second`` is left unused.

The queues ``a:q`` and ``b:q`` run the benchmark app's no-op handler.
"""

import os

os.environ.setdefault("FQ_BENCH_DB", "postgres")

from bench.settings import *  # noqa: F403
from bench.settings import DATABASES as _BASE

DATABASES = {
    "default": dict(_BASE["default"]),
    "second": {**_BASE["default"], "NAME": os.environ.get("FQ_BENCH_PG_NAME2", "fq_bench_multi_b")},
}
DATABASE_ROUTERS = ["django_fq.routers.FqRouter"]
if os.environ.get("FQ_BENCH_SPLIT") == "1":
    FQ_QUEUE_DATABASES = {"b:*": "second"}
FQ_HANDLERS = {"a:q": "bench.benchapp.fq_handlers.noop", "b:q": "bench.benchapp.fq_handlers.noop"}
