"""PostgreSQL: the statements run for every job are one round trip each, and prepared.

Unless OPTIONS["prepare_threshold"] says otherwise (None: never prepare).
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_fq import db
from django_fq import services as fq

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


def prepared_statements() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        return [r[0] for r in cur.fetchall()]


@pytest.mark.no_pooler("prepared statements are off behind PgBouncer 1.18 in transaction mode (docs/scaling.md)")
def test_enqueue_claim_and_ack_are_prepared_after_a_few_runs():
    fq.configure("prep")
    for i in range(db.PREPARE_THRESHOLD + 1):
        fq.enqueue("prep", {"i": i})
    for _ in range(db.PREPARE_THRESHOLD + 1):
        [job] = fq.claim("prep")
        fq.ack("prep", job.receipt)
    texts = prepared_statements()
    assert any("json_to_recordset" in t and "INSERT INTO django_fq_job" in t for t in texts), texts  # enqueue
    assert any("FOR UPDATE SKIP LOCKED" in t and "INSERT INTO django_fq_lease" in t for t in texts), texts  # claim
    assert any("DELETE FROM django_fq_lease" in t and "settled_op = 'ack'" in t for t in texts), texts  # ack
    assert fq.stats("prep").totals["acked"] == db.PREPARE_THRESHOLD + 1


def test_an_explicit_prepare_threshold_of_none_keeps_them_unprepared(monkeypatch):
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {**connection.settings_dict.get("OPTIONS", {}), "prepare_threshold": None})
    try:
        for i in range(db.PREPARE_THRESHOLD + 3):
            fq.enqueue("prep.none", {"i": i})
        assert prepared_statements() == []
    finally:
        connection.close()


def test_a_plain_enqueue_claim_and_ack_are_one_statement_each():
    from django.test.utils import CaptureQueriesContext

    fq.enqueue("trips", {"warm": True})  # creates the queue
    fq.ack("trips", fq.claim("trips")[0].receipt)
    with CaptureQueriesContext(connection) as enq:
        fq.enqueue_many("trips", [{"payload": {"i": i}} for i in range(50)])
    with CaptureQueriesContext(connection) as clm:
        jobs = fq.claim("trips", count=50)
    with CaptureQueriesContext(connection) as ack:
        fq.ack_many("trips", [(j.receipt, None) for j in jobs])
    assert (len(enq.captured_queries), len(clm.captured_queries), len(ack.captured_queries)) == (1, 1, 1)
    assert len(jobs) == 50 and fq.stats("trips").counts["succeeded"] == 51


def test_bulk_enqueue_into_a_new_queue_creates_it_then_ships_the_rows_once():
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        fq.enqueue_many("trips.new", [{"payload": {"i": i}} for i in range(1000)])
    writes = [q["sql"] for q in ctx.captured_queries if "INSERT INTO django_fq_job" in q["sql"] or q["sql"].startswith("COPY")]
    # The queue is created first, so the 1,000 rows travel (and are parsed) once: through COPY at this size.
    assert len(writes) == 1 and writes[0].startswith("COPY django_fq_job")
    assert fq.stats("trips.new").counts["ready"] == 1000


def test_a_queue_deleted_after_this_process_saw_it_is_created_again():
    from django.test.utils import CaptureQueriesContext

    fq.enqueue_many("trips.gone", [{"payload": 1}])
    fq.delete_queue("trips.gone")
    with CaptureQueriesContext(connection) as ctx:
        fq.enqueue_many("trips.gone", [{"payload": {"i": i}} for i in range(10)])
    inserts = [q["sql"] for q in ctx.captured_queries if "INSERT INTO django_fq_job" in q["sql"]]
    # The statement found no queue (and wrote nothing), then ran again after creating it.
    assert len(inserts) == 2 and all("json_to_recordset" in sql for sql in inserts)
    assert fq.stats("trips.gone").counts["ready"] == 10
