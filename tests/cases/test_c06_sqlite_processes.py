"""C06 — SQLite is safe with several worker processes.

The test database is a file in WAL mode. Four child processes drain 500
jobs at once (released together after all have connected); each "handler"
inserts its job id into ``testapp.Done`` (UNIQUE job_id) and then acks.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_fq import services as fq
from tests.testapp.models import Done

JOBS = 500
BATCHES = ("1", "3", "5", "10")  # each child claims a different number of jobs at a time


@pytest.mark.sqlite_only
@pytest.mark.django_db(transaction=True)
def test_c06_four_processes_drain_500_jobs_without_locks_or_duplicates(spawn):
    queue = "c06"
    with connection.cursor() as cur:
        cur.execute("PRAGMA journal_mode")
        assert cur.fetchone()[0].lower() == "wal"
    assert connection.settings_dict["NAME"] not in ("", ":memory:")
    ids = {r.id for r in fq.enqueue_many(queue, [{"payload": {"n": i}} for i in range(JOBS)])}
    assert len(ids) == JOBS

    children = [spawn("drain", queue, batch, "60000", stdin=True) for batch in BATCHES]
    for child in children:
        child.until("ready", timeout=60)
    for child in children:
        child.send("go")
    handled = {}
    for child in children:
        handled[child.proc.pid] = child.until("done", timeout=120)["handled"]
    codes = [child.wait(timeout=60) for child in children]

    for child, code in zip(children, codes, strict=True):
        assert code == 0, child.stderr
        assert "database is locked" not in child.stderr
        assert "IntegrityError" not in child.stderr
        assert "Traceback" not in child.stderr, child.stderr

    # Each job's side effect happened exactly once, by the process that acked it.
    rows = list(Done.objects.values_list("job_id", "pid"))
    assert len(rows) == JOBS
    assert {job for job, _ in rows} == ids
    assert sum(handled.values()) == JOBS
    for pid, n in handled.items():
        assert sum(1 for _, p in rows if p == pid) == n
    assert sum(1 for n in handled.values() if n) >= 2  # the work really was shared

    stats = fq.stats(queue)
    assert stats.counts["succeeded"] == JOBS
    assert sum(stats.counts.values()) == JOBS
    assert (stats.totals["claimed"], stats.totals["acked"]) == (JOBS, JOBS)
    page = fq.jobs(queue, state="succeeded", count=1000)
    assert len(page.jobs) == JOBS and all(j.attempts == 1 for j in page.jobs)
