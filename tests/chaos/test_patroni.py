"""Failover on Patroni (slow tier): workers and producers on libpq multi-host settings survive a failed primary.

The cluster (:mod:`tests.chaos.patroni`: etcd and two PostgreSQL 15 nodes,
primary and synchronous standby, on 127.0.0.1) is started for the module and
torn down afterwards, also when the test fails. The scenario
(:mod:`tests.chaos.failover`) runs in a process of its own whose Django
settings reach the cluster the way docs/scaling.md ("High availability")
says: ``HOST "127.0.0.1,127.0.0.1"``, ``PORT "5433,5434"``,
``OPTIONS {"target_session_attrs": "read-write"}``. It does not use the
leg's own PostgreSQL server; it runs on the PostgreSQL legs only so that one
leg of the slow tier runs it.
"""

from __future__ import annotations

import json

import pytest

from . import failover, patroni

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]


def test_failover_kill_and_switchover_lose_nothing_and_everyone_reconnects(tmp_path):
    reason = patroni.unavailable()
    if reason:
        pytest.skip(reason)
    outcome = failover.scenario(tmp_path, faults="kill,switchover", sync_settle=True)
    print(outcome.line())
    figures = outcome.notes.get("figures", [])
    for fig in figures:
        print(json.dumps(fig))
    assert outcome.ok, outcome.describe()
    assert outcome.report.lost == 0 and outcome.report.overlaps == 0
    kill, switch = figures[1], figures[2]
    assert kill["fault"] == "kill" and switch["fault"] == "switchover"
    for fig in (kill, switch):
        assert fig["new_primary"] != fig["old_primary"]
        assert fig["workers_first_lease_s"] <= failover.RECOVERY_BOUND_S
        assert fig["producers_first_enqueue_s"] <= failover.RECOVERY_BOUND_S
        assert fig["listen_on_new_primary_s"] <= failover.RECOVERY_BOUND_S
        assert fig["wake_pickup_ms"] < 5000  # the worker on chaos.wake polls every 60 s
    assert outcome.notes["acks_logged"] > 0 and outcome.notes["enqueues"] > 0
