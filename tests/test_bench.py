"""The benchmark suite (``bench/``) still runs and still reports every number.

The slow test runs ``bench/run.py --quick`` end to end on the leg's database
(SQLite, or PostgreSQL / MariaDB when ``FQ_TEST_DB=postgres`` / ``mariadb``, in
databases of its own, dropped afterwards)
and checks the JSON: every metric present with a value, every drain complete,
the query plans captured. It makes no assertion about speed.

The fast tests cover the pieces of arithmetic the report relies on: the
percentile, the medians, and the comparison with the other queues' results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run as bench_run
from bench import suite as bench_suite

REPO = Path(__file__).resolve().parent.parent


# --- fast: the arithmetic ------------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    xs = list(range(1, 21))  # 1..20
    assert bench_suite.percentile(xs, 0.5) == 10
    assert bench_suite.percentile(xs, 0.95) == 19
    assert bench_suite.percentile(xs, 1.0) == 20
    assert bench_suite.percentile([7], 0.95) == 7
    with pytest.raises(ValueError, match="no values"):
        bench_suite.percentile([], 0.5)


def test_describe_drops_missing_values():
    assert bench_suite.describe([3, None, 1, 2]) == {"median": 2, "min": 1, "max": 3, "n": 3}
    assert bench_suite.describe([None]) == {"median": None, "min": None, "max": None, "n": 0}


def _anchor_records():
    """Records shaped like ../shared/bench/anchors/bench.py writes them (two systems, two reps)."""
    recs = []
    for rep, (p1, p2, t1) in enumerate(((400.0, 500.0, 140.0), (380.0, 520.0, 150.0))):
        recs += [
            {"rep": rep, "system": "procrastinate", "metric": "drain1", "variant": "default", "seconds": 5000 / (p1 - 20),
             "rate": p1 - 20, "steady_rate": p1, "ok": True, "mem": [{"time_v_maxrss_kb": 56 * 1024}]},
            {"rep": rep, "system": "procrastinate", "metric": "drain2", "variant": "default", "seconds": 5000 / p2,
             "rate": p2 - 30, "steady_rate": p2, "ok": True, "mem": []},
            {"rep": rep, "system": "tasksdb", "metric": "drain1", "variant": "persist", "seconds": 5000 / t1,
             "rate": t1, "steady_rate": t1 + 10, "ok": True, "mem": []},
            {"rep": rep, "system": "procrastinate", "metric": "enqueue_single", "variant": "default", "n": 5000,
             "seconds": 2.0, "rate": 2500.0},
            {"rep": rep, "system": "tasksdb", "metric": "enqueue_single", "variant": "persist", "n": 5000,
             "seconds": 2.5, "rate": 2000.0},
            {"rep": rep, "system": "procrastinate", "metric": "latency", "variant": "default", "median": 0.007,
             "samples": [0.007]},
            {"rep": rep, "system": "tasksdb", "metric": "latency", "variant": "min", "median": 0.015, "samples": [0.015]},
        ]
    return recs


def test_anchor_ratios_compare_with_the_best_other_queue(tmp_path):
    with open(tmp_path / "raw.jsonl", "w") as f:
        for rec in _anchor_records():
            f.write(json.dumps(rec) + "\n")
    anchors = bench_run.read_anchors(str(tmp_path))
    proc = anchors["summary"]["procrastinate"]
    assert proc["drain1_steady_default"]["median"] == 390.0
    assert proc["drain2_steady_default"]["median"] == 510.0
    assert proc["latency_default_ms"]["median"] == pytest.approx(7.0)
    assert proc["rss_mib"]["median"] == 56
    assert anchors["incomplete_runs"] == []

    ours = {
        "postgres": {
            "summary": {
                "drain1_steady": {"median": 4500.0},
                "drain2_steady": {"median": 6000.0},
                "drain1_observed_steady": {"median": 5000.0},
                "enqueue_single_rate": {"median": 2400.0},
                "enqueue_bulk_rate": {"median": 60000.0},
                "latency_median_ms": {"median": 2.0},
            }
        }
    }
    ratios = bench_run.anchor_ratios(ours, anchors)
    assert ratios["drain1_steady_vs_best"] == pytest.approx(4500 / 390)
    assert ratios["drain2_steady_vs_best"] == pytest.approx(6000 / 510)
    # docs/reference/semantics.md §9: against the best steady rate of any other queue, 2 workers included.
    assert ratios["drain_steady_vs_best_any"] == pytest.approx(4500 / 510)
    assert ratios["drain_steady_vs_best_any_against"]["system"] == "procrastinate"
    assert ratios["enqueue_single_vs_best"] == pytest.approx(2400 / 2500)
    assert ratios["enqueue_bulk_vs_best"] is None  # no anchor recorded a bulk enqueue
    assert ratios["latency_speedup_vs_best"] == pytest.approx(7.0 / 2.0)

    checks = {c["target"]: c["met"] for c in bench_run.targets(ours, ratios)}
    assert checks["drain 1 process steady ≥ 4,000 jobs/s"] is True
    assert checks["drain steady ≥ 10× the best other queue's steady rate"] is False  # 8.8×
    assert checks["enqueue one at a time ≥ 0.9× the other queues"] is True
    assert checks["bulk enqueue ≥ 50,000 jobs/s"] is True


def test_anchor_ratios_need_a_postgres_run():
    ratios = bench_run.anchor_ratios({"sqlite": {"summary": {}}}, {"summary": {}})
    assert "no PostgreSQL run" in ratios["note"]


def test_missing_anchors_harness_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_run, "ANCHORS", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="anchors harness was not found"):
        bench_run.anchors_run_sh()
    rc = None
    try:
        bench_run.main(["--with-anchors", "--db", "sqlite", "--out", str(tmp_path / "out")])
    except SystemExit as exc:
        rc = exc.code
    assert rc is not None and "not found" in str(rc)
    assert not (tmp_path / "out").exists()  # failed before measuring anything


# --- slow: the whole quick run ---------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_reports_every_metric(tmp_path):
    leg = os.environ.get("FQ_TEST_DB")
    db = leg if leg in ("postgres", "mariadb") else "sqlite"
    pg_name = f"fq_bench_smoke_{os.getpid()}"
    cmd = [sys.executable, "bench/run.py", "--quick", "--db", db, "--out", str(tmp_path), "--pg-name", pg_name]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    finally:
        if db == "postgres":
            bench_suite.drop_pg_databases(pg_name)
        elif db == "mariadb":
            bench_suite.drop_mysql_databases(pg_name)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["failures"] == {}
    result = data["results"][db]
    summary = result["summary"]
    for metric in bench_suite.METRICS:
        stat = summary.get(metric)
        assert stat is not None and stat["n"] >= 1, f"{metric} missing: {stat}"
        assert isinstance(stat["median"], (int, float)) and stat["median"] > 0, f"{metric}: {stat}"

    runs = result["runs"]
    drains = [r for r in runs if r["metric"] in ("drain1", "drain2")]
    assert sorted(r["metric"] for r in drains) == ["drain1", "drain2"]
    for r in drains:
        assert r["ok"] and r["succeeded"] == result["params"]["n"] == 2000
        assert all(m["exit"] == 0 for m in r["mem"])
    assert [r["workers"] for r in drains] == [1, 2]
    latency = [r for r in runs if r["metric"] == "latency" and r["variant"] == "default"]
    assert len(latency) == 1 and latency[0]["k"] == len(latency[0]["samples_s"]) >= 20
    if db != "postgres":  # no cross-process wakeup: measured with a 10 ms poll interval too
        assert summary["latency_poll10_median_ms"]["n"] == 1
    claims = {r["scenario"]: r for r in runs if r["metric"] == "claim"}
    assert claims["ready_large"]["ready"] == 100_000 and claims["finished_large"]["finished"] == 100_000

    # The plans of the claim's statements, for every scenario.
    for scenario in ("ready_small", "ready_large", "finished_large"):
        for count in ("claim1", "claim100"):
            plans = result["explain"][scenario][count]
            assert any("django_fq_job" in s["sql"] and s["plan"] for s in plans["statements"])
    env = result["environment"]
    assert len(env["loadavg_start"]) == 3 and len(env["loadavg_end"]) == 3
    assert all("loadavg" in r for r in runs)
    text = (tmp_path / "summary.md").read_text()
    assert "drain, 1 worker process, steady" in text and "claim(100)" in text


@pytest.mark.slow
@pytest.mark.postgres_only
def test_pickup_floor_prints_its_figures_and_leaves_no_database():
    proc = subprocess.run(
        [sys.executable, "bench/pickup_floor.py", "--k", "3"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("bare LISTEN/NOTIFY queue, 3 samples (ms): median ")
    figures = [float(word.rstrip(",")) for line in lines for word in line.split() if word.rstrip(",").replace(".", "", 1).isdigit()]
    assert len(figures) == 5 and all(f > 0 for f in figures[1:]), proc.stdout  # k, median, p95, enqueue call, db clock
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = 'fq_bench_floor'").fetchone()[0] == 0


def _pg_database_exists(name: str) -> bool:
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as admin:
        return admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name]).fetchone()[0] > 0


@pytest.mark.slow
@pytest.mark.postgres_only
def test_sql_ceiling_explains_the_start_and_the_end_of_a_long_drain(tmp_path):
    out = tmp_path / "ceiling.json"
    name = "fq_test_ceiling_at_n"
    proc = subprocess.run(
        [sys.executable, "bench/sql_ceiling.py", "--n", "300", "--batches", "50", "--explain-jobs", "100",
         "--explain-at-n", "600", "--pg-name", name, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    at_n = [r for r in json.loads(out.read_text())["results"] if "at_n" in r]
    assert len(at_n) == 1 and at_n[0]["batch"] == 50 and at_n[0]["at_n"] == 600
    for end in ("first", "last"):
        part = at_n[0][end]
        assert part["jobs"] >= 100, part["jobs"]  # each explained stretch claimed and acked its jobs
        for statement in ("claim", "ack"):
            totals = part[statement]["all"]
            assert totals["WAL Records"] > 1 and totals["Shared Hit Blocks"] > 1, (end, statement, totals)
        assert len(part["plans"]) == 2  # one claim plan and one ack plan kept for reading
    assert "N=600: unexplained middle" in proc.stdout
    assert not _pg_database_exists(name)


@pytest.mark.slow
@pytest.mark.postgres_only
def test_drain_n_reports_the_drain_by_tenths_and_leaves_no_database(tmp_path):
    out = tmp_path / "drain.json"
    name = "fq_test_drain_n"
    proc = subprocess.run(
        [sys.executable, "bench/drain_n.py", "--n", "2000", "--pg-name", name, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["record"]["ok"] and result["record"]["succeeded"] == 2000
    assert len(result["jobs_by_tenth"]) == 10 and sum(result["jobs_by_tenth"]) == 2000
    last = result["samples"][-1]
    assert last["tables"]["django_fq_job"]["upd"] == 4000  # a claim and an ack per job
    assert last["heap_pages"]["job"] > 0 and "fq_job_claim" in last["index_pages"]
    assert set(result["server_cpu_us_per_job"]) == {"observer", "worker"}  # sampled every second: ~0 for so short a drain
    if os.access("/usr/bin/time", os.X_OK):
        assert result["worker_cpu_us_per_job"] > 0
    assert not _pg_database_exists(name)
