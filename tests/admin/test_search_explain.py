"""No search filter of the job list scans the whole job table on PostgreSQL (docs/admin.md "Searching jobs").

120,000 job rows are written by one ``INSERT … SELECT generate_series`` (no
service call: only their shape matters) with a skew the planner must see:
one queue holds 70 % of them, most of them succeeded. After ``ANALYZE`` the
plans of the list's page query and of its (capped) count are read with
``EXPLAIN`` for each filter: none may hold a sequential scan of
``django_fq_job``, and each names the index the docs say serves it.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import RequestFactory

from django_fq import services as fq
from django_fq.models import Job, Queue

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db]

ROWS = 120_000
QUEUES = 10


def write_table():
    for i in range(QUEUES):
        fq.configure(f"x:{i}")
    ids = dict(Queue.objects.values_list("name", "pk"))
    big, others = ids["x:0"], [ids[f"x:{i}"] for i in range(1, QUEUES)]
    with connection.cursor() as cur:
        # Queue x:0 gets 70 % of the rows, the others share the rest; states: 88 % succeeded,
        # 4 % dead, 4 % queued, 2 % cancelled, 2 % running; changed_at grows with the row.
        cur.execute(
            """
            INSERT INTO django_fq_job (uid, queue_id, state, priority, run_at, enqueued_at, changed_at, finished_at,
                attempts, max_attempts, generation, timeout_ms, payload, payload_size, last_error, errors, worker,
                progress_message, snoozes, waiting_on, has_dependents, metadata, tags)
            SELECT md5(g::text), CASE WHEN mod(g, 10) < 7 THEN %s ELSE (%s::bigint[])[1 + mod(g, 9)] END,
                s.state, 0, t, t, t + 5, CASE WHEN s.state IN ('succeeded', 'dead', 'cancelled') THEN t + 5 END,
                1, 3, 1, 0, '{"user_id": ' || mod(g, 1000) || ', "n": ' || g || '}', 30,
                CASE WHEN s.state = 'dead' THEN 'ValueError: row ' || g ELSE '' END, '[]'::jsonb,
                CASE WHEN s.state IN ('running', 'succeeded', 'dead') THEN 'w-' || mod(g, 20) ELSE '' END,
                '', 0, 0, false, '{"tags": ["t' || mod(g, 50) || '"]}', '|t' || mod(g, 50) || '|'
            FROM generate_series(1, %s) g,
                LATERAL (SELECT (1700000000000 + g * 1000)::bigint AS t) tt,
                LATERAL (SELECT CASE WHEN mod(g, 50) < 44 THEN 'succeeded' WHEN mod(g, 50) < 46 THEN 'dead'
                    WHEN mod(g, 50) < 48 THEN 'queued' WHEN mod(g, 50) < 49 THEN 'cancelled' ELSE 'running' END AS state) s
            """,
            [big, others, ROWS],
        )
        cur.execute("ANALYZE django_fq_job")
    return {"big": "x:0", "small": "x:1", "job": Job.objects.order_by("seq").values_list("uid", flat=True)[500]}


def plans(params: dict) -> tuple[str, str]:
    """EXPLAIN of the job list's page query and of its count, for the search form's ``params``."""
    from django.contrib.admin.sites import site
    from django.contrib.auth.models import User

    request = RequestFactory().get("/admin/django_fq/job/", {f"fq-{k}": v for k, v in params.items()})
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    admin = site._registry[Job]
    cl = admin.get_changelist_instance(request)
    form_errors = request._fq_search_pair[0].errors
    assert not form_errors, form_errors
    page = cl.queryset[:50].explain()
    count = cl.queryset[:10_001].values("seq").explain()
    return page, count


CASES = [
    ({"id": "JOB"}, ("fq_job_uid",)),
    ({"queue": "x:1"}, ("fq_job_state_changed", "django_fq_job_pkey")),
    ({"queue": "x:0"}, ("django_fq_job_pkey", "fq_job_state_changed")),
    # Newest first by sequence: the planner walks the primary key backward when it expects a page soon.
    ({"state": "dead"}, ("fq_job_state_changed", "django_fq_job_pkey")),
    ({"queue": "x:0", "state": "succeeded"}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "dead"}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "ready"}, ("fq_job_state_changed", "fq_job_claim", "django_fq_job_pkey")),
    ({"queue": "x:0", "state": "running", "worker": "w-3"}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "succeeded", "error": "row 1"}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "dead", "error": "row 1"}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "succeeded", "payload": '{"user_id": 42}'}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "succeeded", "metadata": '{"tags": ["t7"]}'}, ("fq_job_state_changed",)),
    ({"queue": "x:0", "state": "succeeded", "tag": "t7"}, ("fq_job_state_changed",)),
    ({"enqueued_from": str(1700000000000 + (ROWS - 500) * 1000)}, ("fq_job_state_changed",)),
    ({"finished_from": str(1700000000000 + (ROWS - 500) * 1000)}, ("fq_job_state_changed",)),
    ({"finished_from": "1700000000000", "finished_to": str(1700000000000 + 2000 * 1000)}, ("fq_job_state_changed",)),
    (
        {"queue": "x:0", "state": "succeeded", "enqueued_to": str(1700000000000 + 2000 * 1000)},
        ("fq_job_state_changed",),
    ),
]


def test_no_filter_scans_the_whole_table(db, monkeypatch):
    from django_fq.admin import search

    table = write_table()
    # A candidate bound below the big queue's share, so that the unindexed filters meet it.
    monkeypatch.setattr(search, "CANDIDATES", 5_000)
    wrong = []
    for params, indexes in CASES:
        params = {k: (table["job"] if v == "JOB" else v) for k, v in params.items()}
        page, count = plans(params)
        print(f"\n--- {params}\n{page}\n--- count\n{count}")  # pytest -s shows every plan
        for plan in (page, count):
            if "Seq Scan on django_fq_job" in plan or not any(name in plan for name in indexes):
                wrong.append(f"{params}:\n{plan}")
    assert not wrong, "\n\n".join(wrong)


def test_the_live_updates_of_every_filter_scan_no_whole_table(db, monkeypatch):
    """The job list's live view adds two queries per poll: the page's rows that still match, and the new matches.

    Both are bounded by the primary key (the rows' ids; the range above the
    newest job when the page was shown), whatever the filter (django_fq/admin/live.py).
    """
    from django.contrib.admin.sites import site
    from django.contrib.auth.models import User

    from django_fq.admin import live, search

    table = write_table()
    monkeypatch.setattr(search, "CANDIDATES", 5_000)
    top = Job.objects.order_by("-seq").values_list("seq", flat=True)[0]
    rows = list(Job.objects.order_by("-seq").values_list("seq", flat=True)[:50])
    wrong = []
    for params, _ in CASES:
        params = {k: (table["job"] if v == "JOB" else v) for k, v in params.items()}
        request = RequestFactory().get("/admin/django_fq/job/", {f"fq-{k}": v for k, v in params.items()})
        request.user = User(is_superuser=True, is_staff=True, is_active=True)
        matches = site._registry[Job].get_changelist_instance(request).queryset.order_by()
        still = matches.filter(seq__in=rows).values("seq").explain()
        new = matches.filter(seq__gt=top - 20).values("seq")[: live.NEW_CAP + 1].explain()
        print(f"\n--- {params}\n{still}\n--- new\n{new}")
        for plan in (still, new):
            if "Seq Scan on django_fq_job" in plan or not ("django_fq_job_pkey" in plan or "fq_job_uid" in plan):
                wrong.append(f"{params}:\n{plan}")
    assert not wrong, "\n\n".join(wrong)
def _seq_rows(node: dict) -> int:
    """Rows the executed sequential scans of the job table in ``node`` (an EXPLAIN ANALYZE JSON plan) read."""
    own = 0
    if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == "django_fq_job":
        own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 0)
    return own + sum(_seq_rows(child) for child in node.get("Plans", []))


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_and_the_queue_pages_read_no_whole_table(root_client):
    """Every statement of the dashboard, the queue list, a queue's page and the state filter reads a bounded part of the jobs.

    Their counts are bounded (``display.COUNT_CAP``) and each an index range
    of ``fq_job_state_changed``; the busiest queues and the all-queues
    failure scan are index ranges too (``queue_id IN (…)``). Run with
    ``EXPLAIN ANALYZE``: a sequential scan that stops after the bound (a
    state that holds most rows) is fine, one that reads the table is not.
    """
    import json

    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    write_table()
    # Committed and vacuumed, as autovacuum leaves a table in production: the rolled-back rows of
    # the tests before this one (same database) made PostgreSQL's plans of these pages differ.
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE django_fq_job")
        cur.execute("VACUUM ANALYZE django_fq_queue")
    big = Queue.objects.get(name="x:0").pk
    urls = [
        reverse("admin:django_fq_dashboard"),
        reverse("admin:django_fq_dashboard") + "?queue=x:0",
        reverse("admin:django_fq_queue_changelist"),
        reverse("admin:django_fq_queue_change", args=[big]),
        reverse("admin:django_fq_job_changelist") + "?state=dead",
    ]
    wrong = []
    for url in urls:
        with CaptureQueriesContext(connection) as seen:
            assert root_client.get(url).status_code == 200
        for query in seen.captured_queries:
            sql = query["sql"]
            if "django_fq_job" not in sql or not sql.lstrip().upper().startswith("SELECT"):
                continue
            with connection.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
                plan = cur.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            read = _seq_rows(plan[0]["Plan"])
            if read > ROWS // 5:
                wrong.append(f"{url}: {read} rows read by a sequential scan: {sql[:300]}")
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.django_db(transaction=True)
def test_a_page_reads_without_jit_and_leaves_the_session_as_it_was(root_client):
    """GET pages run in ``Store.page_reads``: ``SET LOCAL jit = off`` inside a transaction, gone after it.

    (Not in the test's own transaction: SET LOCAL lasts to the end of the outermost one.)

    On a stock server the dashboard's count query (an estimated cost past
    ``jit_optimize_above_cost``) spent seconds being compiled (docs/performance.md).
    """
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    fq.configure("x:jit")
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        before = cur.fetchone()[0]
    with CaptureQueriesContext(connection) as seen:
        assert root_client.get(reverse("admin:django_fq_dashboard")).status_code == 200
    sqls = [q["sql"] for q in seen.captured_queries]
    first_job_read = next(i for i, sql in enumerate(sqls) if "django_fq_job" in sql)
    assert "SET LOCAL jit = off" in sqls[:first_job_read]
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        assert cur.fetchone()[0] == before
