"""The chaos scenarios at CI size (slow tier): each must keep every invariant and report no problem.

CI sizes (both database legs of ``make test-slow`` together stay around five
minutes; a MariaDB leg runs the kill storm, stress and the restart): a 20 s
kill storm (from the first claim) fed in batches of 500 jobs, stress 20 s,
database restart 20 s, one partition round, SQLite busy writer 1,000 jobs.
``FQ_CHAOS_JOBS`` and
``FQ_CHAOS_SECONDS`` scale them up for a longer local run; ``make chaos``
runs the full sizes (20,000 jobs, 2 minutes) on a fresh database.
Each test prints its summary line (``pytest -s`` shows it).
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

from . import flows, invariants, netns, scenarios

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JOBS = int(os.environ.get("FQ_CHAOS_JOBS", "1000"))
STORM_BATCH = int(os.environ.get("FQ_CHAOS_STORM_BATCH", "500"))
SECONDS = float(os.environ.get("FQ_CHAOS_SECONDS", "20"))
BATCH_MEMBERS = int(os.environ.get("FQ_CHAOS_BATCH_MEMBERS", "1000"))


@pytest.fixture
def out(tmp_path):
    yield tmp_path
    try:
        invariants.uninstall(connection)
    except Exception:
        connection.close()
        invariants.uninstall(connection)


def _passed(outcome: scenarios.Outcome) -> None:
    print(outcome.line())
    assert outcome.ok, outcome.describe()
    assert outcome.report.lost == 0 and outcome.report.overlaps == 0


def test_kill_storm_loses_nothing_and_keeps_every_invariant(out):
    outcome = scenarios.kill_storm(out, jobs=STORM_BATCH, workers=4, minutes=SECONDS / 60)
    _passed(outcome)
    r = outcome.report
    assert r.jobs == r.succeeded >= STORM_BATCH
    assert outcome.kills >= 3 and outcome.restarts == outcome.kills
    assert r.unrecorded_runs + r.duplicates > 0  # the kills did land mid-lease


def test_stress_no_database_error_reaches_a_caller(out):
    outcome = scenarios.stress(out, seconds=SECONDS)
    _passed(outcome)
    r = outcome.report
    assert r.jobs > 100 and r.succeeded > 0 and r.pruned > 0 and r.extends > 0
    assert outcome.notes["fq_errors"].get("invalid_receipt", 0) > 0  # late acks of abandoned/short leases were refused


@pytest.mark.postgres_only
def test_postgres_restarted_twice_producers_and_workers_recover(out):
    if scenarios._pg_cluster() is None:
        pytest.skip("needs a Debian-style PostgreSQL cluster (pg_ctlcluster)")
    outcome = scenarios.db_restart(out, seconds=SECONDS, restarts=2)
    _passed(outcome)
    assert outcome.restarts == 2
    assert outcome.report.jobs > 0 and outcome.notes["worker_db_errors"] >= 2  # every worker saw the outage


@pytest.mark.mysql_only
def test_mariadb_restarted_twice_producers_and_workers_recover(out):
    if not scenarios._mariadb_service():
        pytest.skip("needs a way to restart the local MariaDB server (service mariadb, or mariadbd as root)")
    outcome = scenarios.db_restart(out, seconds=SECONDS, restarts=2)
    _passed(outcome)
    assert outcome.restarts == 2
    assert outcome.report.jobs > 0 and outcome.notes["worker_db_errors"] >= 2  # every worker saw the outage


@pytest.mark.postgres_only
def test_partitioned_worker_is_refused_and_carries_on(out):
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    outcome = scenarios.partition(out, lease_ms=2000, rounds=1, followups=20)
    _passed(outcome)
    assert outcome.notes["stale_acks_refused"] == 1
    assert outcome.report.zombie_overlaps >= 1  # J2 ran on past its lease, and was told
    assert outcome.report.duplicates >= 2  # J1 and J2 each ran twice, the first run's outcome refused


@pytest.mark.sqlite_only
def test_sqlite_busy_writer_never_sees_locked_database(out):
    outcome = scenarios.sqlite_writer(out, jobs=JOBS, workers=4)
    _passed(outcome)
    assert outcome.report.succeeded == JOBS
    assert outcome.notes["writer_transactions"] > 10


def test_workflow_kill_storm_runs_every_step_after_its_dependencies_and_the_callback_once(out):
    """Issue 16: a 2,000-step workflow (chain, fan-out 500, 500 two-parent steps, fan-in, 99 chains, group callback)."""
    outcome = flows.workflow_storm(out, workers=4)
    _passed(outcome)
    r = outcome.report
    assert outcome.notes["steps"] == 2000 and r.jobs == r.succeeded == 2000
    assert outcome.kills >= 3 and outcome.restarts == outcome.kills
    assert r.unrecorded_runs + r.duplicates > 0  # the kills did land mid-run


def test_batch_kill_storm_fires_the_callback_once_with_the_real_counts(out):
    """Issue 16: a batch of 1,000 members added in 4 calls; some go dead, some are cancelled, killed workers ack."""
    outcome = flows.batch_storm(out, members=BATCH_MEMBERS, workers=4)
    _passed(outcome)
    n = outcome.notes
    assert n["members"] == BATCH_MEMBERS and n["succeeded"] > 0 and n["dead"] > 0 and n["cancelled"] > 0
    assert n["retried"] > 0 and n["calls"] == 4
    assert outcome.kills >= 3 and outcome.restarts == outcome.kills
    assert outcome.report.unrecorded_runs + outcome.report.duplicates > 0
