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
import os
import subprocess
import sys

import pytest

from tests.worker.helpers import ROOT

from . import failover, patroni

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

DB_NAME = "fq_ha"


@pytest.fixture(scope="module")
def cluster():
    reason = patroni.unavailable()
    if reason:
        pytest.skip(reason)
    c = patroni.Cluster()
    try:
        c.start()
        c.create_database(DB_NAME)
        yield c
    finally:
        c.stop()


def _run(cluster, tmp_path, *, faults: str, sync_settle: bool) -> dict:
    result = tmp_path / "result.json"
    env = {**os.environ, **patroni.Cluster.env(), "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
           "FQ_TEST_PG_NAME": DB_NAME, "FQ_CHILD_DB_NAME": DB_NAME, "FQ_CHAOS_SYNC_SETTLE": "1" if sync_settle else "0",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.chaos.failover", "--base", str(cluster.base), "--out", str(tmp_path),
                           "--result", str(result), "--faults", faults],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and result.exists(), f"scenario process failed ({done.returncode}):\n{done.stderr[-4000:]}"
    outcome = json.loads(result.read_text())
    print(outcome["line"])
    for fig in outcome["figures"]:
        print(json.dumps(fig))
    return outcome


def test_failover_kill_and_switchover_lose_nothing_and_everyone_reconnects(cluster, tmp_path):
    outcome = _run(cluster, tmp_path, faults="kill,switchover", sync_settle=True)
    assert outcome["ok"], outcome["describe"]
    assert outcome["lost"] == 0 and outcome["overlaps"] == 0
    kill, switch = outcome["figures"][1], outcome["figures"][2]
    assert kill["fault"] == "kill" and switch["fault"] == "switchover"
    for fig in (kill, switch):
        assert fig["new_primary"] != fig["old_primary"]
        assert fig["workers_first_lease_s"] <= failover.RECOVERY_BOUND_S
        assert fig["producers_first_enqueue_s"] <= failover.RECOVERY_BOUND_S
        assert fig["listen_on_new_primary_s"] <= failover.RECOVERY_BOUND_S
        assert fig["wake_pickup_ms"] < 5000  # the worker on chaos.wake polls every 60 s
    assert outcome["notes"]["acks_logged"] > 0 and outcome["notes"]["enqueues"] > 0
