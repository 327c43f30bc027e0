"""The database clock expression must give epoch milliseconds in every statement.

Django's SQLite cursor rewrites ``%s`` into ``?`` in any statement executed
with parameters, so a clock expression spelled with a literal ``%s`` (e.g.
``strftime('%s','now')``) silently loses its seconds there while still working
in parameter-less statements. These tests compare both forms and check that a
job enqueued now is reported ``ready`` with a current timestamp.
"""

import pytest
from django.db import connection

from django_fq import db
from django_fq import services as fq

MINUTE_MS = 60_000


@pytest.mark.django_db
def test_now_sql_gives_the_same_time_with_and_without_parameters():
    plain = db.db_now_ms()
    with connection.cursor() as cur:
        cur.execute(f"SELECT {db.now_sql()}, %s", [7])
        with_params, seven = cur.fetchone()
    assert seven == 7
    assert abs(int(with_params) - plain) < MINUTE_MS


@pytest.mark.django_db
def test_a_job_enqueued_now_is_ready_and_stamped_with_the_current_time():
    before = db.db_now_ms()
    result = fq.enqueue("clock-check", {"n": 1})
    after = db.db_now_ms()
    info = fq.get("clock-check", result.id)
    assert before <= info.enqueued_at <= after
    assert before <= info.run_at <= after
    assert info.state == "ready"
    assert fq.stats("clock-check").counts["ready"] == 1
