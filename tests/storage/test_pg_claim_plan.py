"""PostgreSQL: the claim reads ready jobs through the claim index, never finished rows in seq order.

With the claim floor low (a queue whose floor was never raised, or one lowered
to an old job that went back with a backoff), an ``at_floor`` band written as
``priority = p AND seq >= s ORDER BY seq`` let the planner take the primary key
in seq order and filter: every finished job between the floor and the first
ready one was read (docs/explanation/storage.md#the-claim-floor). The plans are
read with ``auto_explain`` (JSON, at NOTICE level) on the test's own connection.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_fq import services as fq
from django_fq.models import ClaimFloor, Queue

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

QUEUE = "tests:plan"
FINISHED = 20000
#: Rows a job scan of one claim may filter out: the finished ones would be thousands.
MOST_FILTERED = 50
READY = 2000


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _job_scans_of_claims(statement) -> list[dict]:
    """Run ``statement()`` with auto_explain on; the job-table scans of the claim statements it ran."""
    notices: list[str] = []
    raw = connection.connection
    raw.add_notice_handler(lambda d: notices.append(d.message_primary))
    with connection.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_analyze = on", "log_format = json", "log_level = notice"):
            cur.execute(f"SET auto_explain.{setting}")
    try:
        statement()
    finally:
        with connection.cursor() as cur:
            cur.execute("SET auto_explain.log_min_duration = -1")
    scans = []
    for text in notices:
        doc = json.loads(text[text.index("{") :])
        if "AS at_floor" not in doc["Query Text"]:
            continue
        scans += [n for n in _nodes(doc["Plan"]) if n.get("Relation Name") == "django_fq_job" and "Index Name" in n]
    assert scans, "no claim statement was explained"
    return scans


@pytest.fixture
def backlog():
    """FINISHED succeeded jobs, then READY ready ones, statistics fresh; the queue's id.

    The planner takes ready rows to be spread evenly over seq, so a walk of the
    primary key in seq order looks as if it found one soon; they all come last.
    """
    fq.enqueue_many(QUEUE, [{"payload": i} for i in range(FINISHED)])
    with connection.cursor() as cur:
        cur.execute("UPDATE django_fq_job SET state = 'succeeded', finished_at = 1")
    fq.enqueue_many(QUEUE, [{"payload": f"r{i}"} for i in range(READY)])
    with connection.cursor() as cur:
        cur.execute("ANALYZE django_fq_job")
    return Queue.objects.get(name=QUEUE).id


def _check(scans: list[dict]) -> None:
    for scan in scans:
        assert scan.get("Rows Removed by Filter", 0) <= MOST_FILTERED, scan
        if scan["Actual Loops"] and scan.get("Index Cond", "").startswith("(seq >="):
            pytest.fail(f"a band read the primary key in seq order: {scan}")


def test_a_queue_without_a_floor_row_claims_through_the_claim_index(backlog):
    ClaimFloor.objects.filter(queue_id=backlog).delete()
    got = []
    _check(_job_scans_of_claims(lambda: got.extend(fq.claim(QUEUE, count=2))))
    assert [j.payload for j in got] == ["r0", "r1"]


def test_a_floor_lowered_to_an_old_job_in_backoff_reads_no_finished_row(backlog):
    # The floor at the first job's seq (as a nack with a backoff of that job leaves it), and that
    # job not due: the ready jobs come after FINISHED finished rows in seq order.
    with connection.cursor() as cur:
        cur.execute("SELECT MIN(seq) FROM django_fq_job WHERE queue_id = %s", [backlog])
        (first,) = cur.fetchone()
        cur.execute(
            "UPDATE django_fq_job SET state = 'queued', run_at = run_at + 3600000, finished_at = NULL WHERE seq = %s",
            [first],
        )
    ClaimFloor.objects.update_or_create(queue_id=backlog, defaults={"priority": 0, "seq": first, "lease_from": 0})
    got = []
    _check(_job_scans_of_claims(lambda: got.extend(fq.claim(QUEUE, count=2))))
    assert [j.payload for j in got] == ["r0", "r1"]  # the second batch's first two; the delayed job waits
