"""PostgreSQL: the statements run for every job are prepared, unless OPTIONS["prepare_threshold"] says otherwise."""

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
