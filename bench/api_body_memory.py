"""Peak memory of one REST bulk enqueue, for the table in docs/rest-api.md ("Limits and errors").

Usage, from the repository root (one case per process, so that peak RSS is the request's)::

    FQ_TEST_DB=sqlite python bench/api_body_memory.py CASE [trace]

``CASE`` is 0-4 (see ``cases``); with ``trace`` the request runs under
``tracemalloc`` and its peak is printed, without it only the growth of
``ru_maxrss`` (tracemalloc's own bookkeeping would inflate it).
"""

import os
import resource
import sys
import time
import tracemalloc

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
sys.path.insert(0, ".")
django.setup()
from django.contrib.auth.models import User  # noqa: E402 - after django.setup()
from django.db import connection  # noqa: E402
from django.test.utils import override_settings, setup_test_environment  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

setup_test_environment()
connection.creation.create_test_db(verbosity=0)
u = User.objects.create_superuser("m", "m@x", "pw")
c = APIClient()
c.force_authenticate(u)


def bulk(payload: str, n: int = 1000) -> bytes:
    return ('{"jobs":[' + ",".join(['{"payload":' + payload + "}"] * n) + "]}").encode()


cases = {
    "1000 envelopes of 497 empty objects (999,001 values)": lambda: bulk("[" + ",".join(["{}"] * 497) + "]"),
    "1000 envelopes of 33,500-byte strings (32 MiB)": lambda: bulk('"' + "x" * 33_500 + '"'),
    "1000 envelopes of 996 small ints (999,001 values)": lambda: bulk("[" + ",".join(["7"] * 996) + "]"),
    "1000 envelopes of 996 distinct floats (999,001 values)": lambda: bulk(
        "[" + ",".join(str(i + 0.5) for i in range(996)) + "]"
    ),
    "ten million empty objects (refused)": lambda: b'{"jobs":[' + b",".join([b"{}"] * 10_000_000) + b"]}",
}
which = sys.argv[1]
name = list(cases)[int(which)]
raw = cases[name]()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with override_settings(ROOT_URLCONF="tests.api.urls"):
    trace = len(sys.argv) > 2
    if trace:
        tracemalloc.start()
    t = time.perf_counter()
    r = c.generic("POST", f"/api/fq/queues/mem{which}/jobs/bulk/", raw, content_type="application/json")
    el = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    if trace:
        tracemalloc.stop()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(
    f"{name}: body {len(raw) / 2**20:.1f} MiB, status {r.status_code}, tracemalloc peak {peak / 2**20:.0f} MiB, max RSS growth {(rss1 - rss0) / 1024:.0f} MiB, {el:.1f} s"
)
connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)
