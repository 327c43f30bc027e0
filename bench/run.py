#!/usr/bin/env python
"""django-fq benchmark suite: one command, a table on stdout, JSON on disk.

    python bench/run.py                          # PostgreSQL and SQLite, full mode (N = 20,000, 3 repetitions)
    python bench/run.py --db postgres --quick    # smoke test: N = 2,000, 1 repetition, claims at 10k/100k
    python bench/run.py --db postgres --with-anchors   # + the other Django queues, same session
    python bench/run.py --db mariadb             # MariaDB/MySQL only; --db all: PostgreSQL, SQLite and MariaDB

Run it from the repository root with the project's virtualenv (``.venv/bin/python``).
PostgreSQL: 127.0.0.1:5432, user postgres, trust auth; the database
``fq_bench_suite`` (and ``fq_bench_suite_claim_*``) are dropped and re-created (``--pg-name``).
MariaDB/MySQL: 127.0.0.1:3306, user root without a password; the same database names
(``--pg-name`` / ``--db-name``) dropped and re-created on that server.
SQLite: a fresh WAL file in a temporary directory.

Writes ``OUT/results.json`` (everything: parameters, environment and load
average, raw records of every repetition, medians, query plans, anchors,
ratios), ``OUT/summary.md`` (the tables printed here), ``OUT/<db>.json`` and
the worker logs in ``OUT/logs/``. OUT defaults to ``var/bench/<UTC time>``.

What each number means: ``docs/performance.md``. This module only drives:
the measurements are in ``bench/suite.py`` (one process per database) and
the other queues' harness is ``../shared/bench/anchors/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ANCHORS = os.path.normpath(os.path.join(REPO, "..", "shared", "bench", "anchors"))

FULL = {"n": 20_000, "reps": 3, "lat_k": 20, "claim_small": 10_000, "claim_large": 1_000_000,
        "claim1_samples": 200, "claim100_samples": 50, "pool_n": 5_000,
        "snapshot_churn": 50_000}
QUICK = {"n": 2_000, "reps": 1, "lat_k": 20, "claim_small": 10_000, "claim_large": 100_000,
         "claim1_samples": 100, "claim100_samples": 20, "pool_n": 1_000,
         "snapshot_churn": 5_000}
#: Threads per worker process (fq_worker --concurrency) for no-op jobs; see docs/performance.md.
DEFAULT_CONCURRENCY = 256

NAMES = {"tasksdb": "django-tasks-db", "procrastinate": "procrastinate", "q2": "django-q2 (ORM)"}


# --- formatting ----------------------------------------------------------------------------------


def fmt_num(x, digits=None) -> str:
    if x is None:
        return "n/a"
    if digits is None:
        digits = 0 if abs(x) >= 100 else (1 if abs(x) >= 10 else 2)
    return f"{x:,.{digits}f}"


def cell(stat, digits=None) -> str:
    if not stat or stat.get("median") is None:
        return "n/a"
    if stat["n"] > 1:
        return f"{fmt_num(stat['median'], digits)} ({fmt_num(stat['min'], digits)}–{fmt_num(stat['max'], digits)})"
    return fmt_num(stat["median"], digits)


def size_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# --- our results ---------------------------------------------------------------------------------


def rows_spec(params: dict) -> list[tuple[str, str, str, int | None]]:
    """(label, summary key, issue-5 target, digits) of each table row."""
    small, large = size_label(params["claim_small"]), size_label(params["claim_large"])
    pool_cs = [int(c) for c in str(params.get("pool_concurrency", "1,4")).split(",") if c.strip()]
    return [
        ("enqueue, one at a time, jobs/s", "enqueue_single_rate", "≥ 0.9× the other queues", None),
        ("enqueue, bulk (one enqueue_many call), jobs/s", "enqueue_bulk_rate", "≥ 50,000", None),
        ("drain, 1 worker process, steady, jobs/s", "drain1_steady", "≥ 4,000 (SQLite, MariaDB ≥ 2,000); ≥ 10× best other", None),
        ("drain, 1 worker process, wall s (spawn → last done)", "drain1_wall_s", "", 2),
        ("drain, 1 worker process, N / wall, jobs/s", "drain1_wall_rate", "", None),
        ("drain, 2 worker processes, steady, jobs/s", "drain2_steady", "> 1 process", None),
        ("drain, 2 worker processes, wall s (spawn → last done)", "drain2_wall_s", "", 2),
        ("drain, 2 worker processes, N / wall, jobs/s", "drain2_wall_rate", "", None),
        ("pickup latency, idle worker, median ms", "latency_median_ms", "≤ 3 (MariaDB: ≤ 1,000, the longest idle poll)", 1),
        ("pickup latency, idle worker, p95 ms", "latency_p95_ms", "≤ 10", 1),
        ("pickup latency, DB clock (finished_at − enqueued_at), median ms", "latency_db_median_ms", "", 1),
        ("pickup latency, DB clock, p95 ms", "latency_db_p95_ms", "", 1),
        ("pickup latency, --poll-interval 10 (SQLite, MariaDB), median ms", "latency_poll10_median_ms", "", 1),
        ("pickup latency, --poll-interval 10 (SQLite, MariaDB), p95 ms", "latency_poll10_p95_ms", "", 1),
        ("pickup latency, --poll-interval 50 (MariaDB), median ms", "latency_poll50_median_ms", "MariaDB ≤ 50 (the poll interval)", 1),
        ("pickup latency, --poll-interval 50 (MariaDB), p95 ms", "latency_poll50_p95_ms", "", 1),
        (f"claim(1) ms, {small} ready", "claim1_ready_small_ms", "", 2),
        (f"claim(1) ms, {large} ready", "claim1_ready_large_ms", "", 2),
        (f"claim(1) ms, {small} ready + {large} finished", "claim1_finished_large_ms", "", 2),
        (f"claim(1) ratio {large} / {small} ready", "claim1_ready_ratio", "≤ 1.5", 2),
        (f"claim(1) ratio with {large} finished / without", "claim1_finished_ratio", "≤ 1.5", 2),
        (f"claim(100) ms, {small} ready", "claim100_ready_small_ms", "", 2),
        (f"claim(100) ms, {large} ready", "claim100_ready_large_ms", "", 2),
        (f"claim(100) ms, {small} ready + {large} finished", "claim100_finished_large_ms", "", 2),
        (f"claim(100) ratio {large} / {small} ready", "claim100_ready_ratio", "≤ 1.5", 2),
        (f"claim(100) ratio with {large} finished / without", "claim100_finished_ratio", "≤ 1.5", 2),
        ("worker peak RSS (1-process drain), MiB", "worker_rss_mib", "≤ 80", 1),
        (f"claim(1) ms after {params.get('snapshot_churn', 50_000):,} jobs processed, no snapshot open",
         "snapshot_claim1_nosnap_ms", "", 2),
        ("claim(1) ms, the same under a REPEATABLE READ snapshot held meanwhile", "snapshot_claim1_snap_ms", "", 2),
        ("claim(1) ratio under the snapshot / without", "snapshot_claim1_ratio", "≤ 2 (issue 15)", 2),
        ("buffers of one claim(1), no snapshot", "snapshot_claim1_nosnap_buffers", "", 0),
        ("buffers of one claim(1), under the snapshot", "snapshot_claim1_snap_buffers", "", 0),
        ("buffers of one reaper pass (nothing expired), no snapshot", "snapshot_reap_nosnap_buffers", "", 0),
        ("buffers of one reaper pass (nothing expired), under the snapshot", "snapshot_reap_snap_buffers", "", 0),
        *[row for c in pool_cs for row in (
            (f"drain, --pool threads --concurrency {c}, steady, jobs/s", f"pool_threads_c{c}_steady", "", None),
            (f"drain, --pool processes --concurrency {c}, steady, jobs/s", f"pool_processes_c{c}_steady", "", None),
            (f"--pool processes --concurrency {c}: cost per job (1/rate − 1/rate of threads), ms",
             f"pool_processes_c{c}_cost_ms", "", 3),
            (f"--pool processes --concurrency {c}: spawn → first job done, ms", f"pool_processes_c{c}_startup_ms", "", 0),
        )],
        ("batch phase: one-job handler drain, steady, jobs/s", "batch_single_steady", "", None),
        ("batch phase: batch handler drain, steady, jobs/s", "batch_batch_steady", "≥ pg-boss's batch drain", None),
        ("batch phase: batch / one-job steady (per repetition)", "batch_vs_single_ratio", "", 2),
    ]


#: Every database the suite runs on, in the order of the table's columns.
DATABASES = ("postgres", "sqlite", "mariadb")
LABELS = {"postgres": "PostgreSQL", "sqlite": "SQLite", "mariadb": "MariaDB"}


def our_table(results: dict) -> str:
    dbs = [d for d in DATABASES if d in results]
    params = results[dbs[0]]["params"]
    rows = []
    for label, key, target, digits in rows_spec(params):
        values = [results[d]["summary"].get(key) for d in dbs]
        if all(not v or v.get("median") is None for v in values):
            continue  # not measured in this run (--phases, or SQLite-only rows on PostgreSQL)
        rows.append([label, *(cell(v, digits) for v in values), target])
    return table(["metric", *[LABELS[d] for d in dbs], "target (issue 5)"], rows)


def targets(results: dict, ratios: dict) -> list[dict]:
    """The issue-5 targets that a run can check, each with its measured value and verdict."""
    out = []

    def add(name, db, value, ok_fn, target):
        if value is not None:
            out.append({"target": name, "db": db, "value": value, "required": target, "met": bool(ok_fn(value))})

    def med(db, key):
        s = results.get(db, {}).get("summary", {}).get(key)
        return s.get("median") if isinstance(s, dict) else None

    if "postgres" in results:
        add("drain 1 process steady ≥ 4,000 jobs/s", "postgres", med("postgres", "drain1_steady"), lambda v: v >= 4000, 4000)
        d1, d2 = med("postgres", "drain1_steady"), med("postgres", "drain2_steady")
        if d1 and d2:
            add("drain 2 processes > 1 process", "postgres", d2 / d1, lambda v: v > 1, ">1×")
        add("pickup latency median ≤ 3 ms", "postgres", med("postgres", "latency_median_ms"), lambda v: v <= 3, 3)
        add("pickup latency p95 ≤ 10 ms", "postgres", med("postgres", "latency_p95_ms"), lambda v: v <= 10, 10)
        add("bulk enqueue ≥ 50,000 jobs/s", "postgres", med("postgres", "enqueue_bulk_rate"), lambda v: v >= 50000, 50000)
        for key in ("claim1_ready_ratio", "claim100_ready_ratio", "claim1_finished_ratio", "claim100_finished_ratio"):
            add(f"{key} ≤ 1.5", "postgres", med("postgres", key), lambda v: v <= 1.5, 1.5)
        add("worker RSS ≤ 80 MiB", "postgres", med("postgres", "worker_rss_mib"), lambda v: v <= 80, 80)
        add("claim(1) under a long snapshot ≤ 2× without (issue 15)", "postgres",
            med("postgres", "snapshot_claim1_ratio"), lambda v: v <= 2, 2)
        if ratios.get("drain_steady_vs_best_any") is not None:
            add("drain steady ≥ 10× the best other queue's steady rate", "postgres",
                ratios["drain_steady_vs_best_any"], lambda v: v >= 10, 10)
        if ratios.get("enqueue_single_vs_best") is not None:
            add("enqueue one at a time ≥ 0.9× the other queues", "postgres",
                ratios["enqueue_single_vs_best"], lambda v: v >= 0.9, 0.9)
    if "sqlite" in results:
        add("SQLite drain 1 process steady ≥ 2,000 jobs/s", "sqlite", med("sqlite", "drain1_steady"), lambda v: v >= 2000, 2000)
    if "mariadb" in results:
        add("MariaDB drain 1 process steady ≥ 2,000 jobs/s", "mariadb", med("mariadb", "drain1_steady"), lambda v: v >= 2000, 2000)
        for key in ("claim1_ready_ratio", "claim100_ready_ratio", "claim1_finished_ratio", "claim100_finished_ratio"):
            add(f"MariaDB {key} ≤ 1.5", "mariadb", med("mariadb", key), lambda v: v <= 1.5, 1.5)
        # No LISTEN/NOTIFY: a job waits for the idle worker's next poll, so the poll interval bounds the median.
        add("MariaDB pickup latency median ≤ 1,000 ms (default --max-poll-interval)", "mariadb",
            med("mariadb", "latency_median_ms"), lambda v: v <= 1000, 1000)
        # The chosen interval (docs/performance.md#mariadb-pickup-the-poll-interval-chosen): at 10 ms
        # the fixed 5-16 ms of commits, claim, hand-off and ack put the median above the interval.
        add("MariaDB pickup latency median ≤ 50 ms with --poll-interval 50", "mariadb",
            med("mariadb", "latency_poll50_median_ms"), lambda v: v <= 50, 50)
        add("MariaDB worker RSS ≤ 80 MiB", "mariadb", med("mariadb", "worker_rss_mib"), lambda v: v <= 80, 80)
    return out


def plans_text(results: dict) -> str:
    """The plans of the claim's statements on the jobs table, at the large scenarios (for docs/performance.md)."""
    out = []
    for db in DATABASES:
        explain = results.get(db, {}).get("explain") or {}
        for scenario in ("ready_large", "finished_large"):
            for count in ("claim1", "claim100"):
                found = (explain.get(scenario) or {}).get(count)
                if not found:
                    continue
                scans = found["job_table_full_scans"]
                # Round trips of one claim (savepoints excluded; the commit is one more).
                trips = len(found["statements"])
                out.append(f"\n#### {db}, {scenario}, {count}: full scans of django_fq_job: {scans or 'none'}; "
                           f"{trips} statement(s) per claim\n")
                for st in found["statements"]:
                    if "django_fq_job" not in st["sql"]:
                        continue
                    sql = st["sql"] if len(st["sql"]) <= 400 else st["sql"][:400] + " …"
                    out.append(f"```\n{sql}\n\n{st['plan']}\n```")
    return "\n".join(out)


# --- anchors (the other Django job queues) ----------------------------------------------------------


def anchors_run_sh() -> str:
    path = os.path.join(ANCHORS, "run.sh")
    if not os.path.exists(path):
        raise SystemExit(
            f"--with-anchors: the anchors harness was not found at {path}\n"
            f"(expected ../shared/bench/anchors/run.sh next to the repository root {REPO})"
        )
    return path


def run_anchors(out_dir: str) -> None:
    """Run the shared anchors harness with BENCH_OUT=out_dir (its other BENCH_* settings come from the environment)."""
    run_sh = anchors_run_sh()
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, BENCH_OUT=out_dir)
    print(f"\n== anchors: {run_sh} (BENCH_OUT={out_dir}; this takes a while)", flush=True)
    result = subprocess.run(["bash", run_sh], env=env)
    if result.returncode != 0:
        raise RuntimeError(f"the anchors harness failed (exit {result.returncode}); see {out_dir}/run.log")


def read_anchors(out_dir: str) -> dict:
    """Medians per (system, metric, variant) from the anchors' ``raw.jsonl`` (same grouping as their report.py)."""
    raw = os.path.join(out_dir, "raw.jsonl")
    if not os.path.exists(raw):
        raise SystemExit(f"no anchors results at {raw}")
    groups: dict[str, dict[str, list]] = {}
    bad = []
    with open(raw) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for r in records:
        sysname, metric, variant = r["system"], r["metric"], r.get("variant", "default")
        g = groups.setdefault(sysname, {})
        if metric == "latency":
            g.setdefault(f"latency_{variant}_ms", []).append(r["median"] * 1000)
        else:
            g.setdefault(f"{metric}_{variant}", []).append(r["rate"])
            if r.get("steady_rate"):
                g.setdefault(f"{metric}_steady_{variant}", []).append(r["steady_rate"])
            if metric.startswith("drain") and r.get("seconds"):
                g.setdefault("drain_n", []).append(round(r["rate"] * r["seconds"]))
            if metric == "drain1" and variant == "default" and r.get("mem"):
                kb = r["mem"][0].get("time_v_maxrss_kb")
                if kb:
                    g.setdefault("rss_mib", []).append(kb / 1024)
        if r.get("ok") is False:
            bad.append(f"{sysname}/{metric}/{variant}/rep{r.get('rep')}")
    summary = {
        s: {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} for k, v in g.items()}
        for s, g in groups.items()
    }
    versions = None
    vpath = os.path.join(out_dir, "versions.txt")
    if os.path.exists(vpath):
        with open(vpath) as f:
            versions = f.read().strip()
    return {"dir": out_dir, "summary": summary, "incomplete_runs": bad, "versions": versions}


def _best(anchors: dict, keys: tuple[str, ...], pick=max):
    found = [
        (stat["median"], system, key)
        for system, g in anchors["summary"].items()
        for key, stat in g.items()
        if key in keys
    ]
    return pick(found) if found else None


def anchor_ratios(results: dict, anchors: dict) -> dict:
    """Our PostgreSQL medians over the best anchor's medians (same session)."""
    if "postgres" not in results:
        return {"note": "no PostgreSQL run: the anchors run on PostgreSQL only, so no ratios"}
    ours = results["postgres"]["summary"]

    def med(key):
        return (ours.get(key) or {}).get("median")

    out: dict = {}

    def ratio(name, our_key, anchor_keys, pick=max, invert=False):
        best = _best(anchors, anchor_keys, pick)
        value = med(our_key)
        if best is None or not value:
            out[name] = None
            return
        out[name] = (best[0] / value) if invert else (value / best[0])
        out[name + "_against"] = {"system": best[1], "metric": best[2], "value": best[0], "ours": value}

    steady1 = ("drain1_steady_default", "drain1_steady_persist")
    steady2 = ("drain2_steady_default", "drain2_steady_persist")
    ratio("drain1_steady_vs_best", "drain1_steady", steady1)
    ratio("drain2_steady_vs_best", "drain2_steady", steady2)
    # docs/reference/semantics.md §9: our 1-process steady rate over the best steady rate any other queue reached (1 or 2 workers).
    ratio("drain_steady_vs_best_any", "drain1_steady", steady1 + steady2)
    # The same with our rate measured exactly like the anchors measure theirs (observer polls, 50 ms).
    ratio("drain1_observed_steady_vs_best", "drain1_observed_steady", steady1)
    ratio("drain_observed_steady_vs_best_any", "drain1_observed_steady", steady1 + steady2)
    ratio("enqueue_single_vs_best", "enqueue_single_rate", ("enqueue_single_default", "enqueue_single_persist"))
    ratio("enqueue_bulk_vs_best", "enqueue_bulk_rate", ("enqueue_bulk_default",))
    # Latency: how many times faster than the fastest other queue (> 1 = faster).
    ratio("latency_speedup_vs_best", "latency_median_ms", ("latency_default_ms", "latency_min_ms"), pick=min, invert=True)
    return out


def anchors_table(anchors: dict) -> str:
    systems = [s for s in ("tasksdb", "procrastinate", "q2") if s in anchors["summary"]]
    rows_def = [
        ("enqueue, one at a time, jobs/s", "enqueue_single_default", None),
        ("enqueue, one at a time, CONN_MAX_AGE=None, jobs/s", "enqueue_single_persist", None),
        ("enqueue, bulk API, jobs/s", "enqueue_bulk_default", None),
        ("drain, 1 worker, N / wall, jobs/s", "drain1_default", None),
        ("drain, 1 worker, steady, jobs/s", "drain1_steady_default", None),
        ("drain, 2 workers, N / wall, jobs/s", "drain2_default", None),
        ("drain, 2 workers, steady, jobs/s", "drain2_steady_default", None),
        ("drain, 1 worker, CONN_MAX_AGE=None, steady, jobs/s", "drain1_steady_persist", None),
        ("pickup latency, defaults, median ms", "latency_default_ms", 1),
        ("pickup latency, polling minimized, median ms", "latency_min_ms", 1),
        ("worker peak RSS (1-worker drain), MiB", "rss_mib", 1),
        ("drain N", "drain_n", 0),
    ]
    rows = []
    for label, key, digits in rows_def:
        rows.append([label, *(cell(anchors["summary"][s].get(key), digits) for s in systems)])
    return table(["metric (anchors, PostgreSQL)", *(NAMES.get(s, s) for s in systems)], rows)


def ratios_text(ratios: dict) -> str:
    if "note" in ratios:
        return ratios["note"]
    labels = [
        ("drain_steady_vs_best_any", "drain steady, 1 process, vs the best other queue's steady rate (1 or 2 workers)"),
        ("drain1_steady_vs_best", "drain steady, 1 process, vs best 1-worker steady"),
        ("drain2_steady_vs_best", "drain steady, 2 processes, vs best 2-worker steady"),
        ("drain_observed_steady_vs_best_any", "same as the first, our rate measured the anchors' way (observer polls)"),
        ("enqueue_single_vs_best", "enqueue one at a time vs best"),
        ("enqueue_bulk_vs_best", "bulk enqueue vs best"),
        ("latency_speedup_vs_best", "pickup latency: best other median / ours (> 1 = faster)"),
    ]
    lines = []
    for key, label in labels:
        v = ratios.get(key)
        if v is None:
            lines.append(f"- {label}: n/a")
            continue
        a = ratios[key + "_against"]
        lines.append(
            f"- {label}: **{v:.2f}×** (ours {fmt_num(a['ours'])} vs {NAMES.get(a['system'], a['system'])} "
            f"{a['metric']} {fmt_num(a['value'])})"
        )
    return "\n".join(lines)


# --- driver --------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", choices=("postgres", "sqlite", "mariadb", "both", "all"), default="both",
                   help="both: PostgreSQL and SQLite (default); all: PostgreSQL, SQLite and MariaDB")
    p.add_argument("--quick", action="store_true", help="N=2,000, 1 repetition, claims at 10k/100k (CI smoke test)")
    p.add_argument("--n", type=int, help="jobs per enqueue/drain measurement (full: 20,000)")
    p.add_argument("--reps", type=int, help="repetitions (full: 3, quick: 1)")
    p.add_argument("--lat-k", type=int, help="pickup-latency samples per repetition (default 20)")
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help=f"fq_worker --concurrency (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                   help="extra fq_worker argument for every worker, e.g. --worker-arg=-v0 (repeatable)")
    p.add_argument("--phases", default="enqueue,drain,latency,claim,pool,snapshot",
                   help="run only these phases (comma-separated: enqueue,drain,latency,claim,pool,snapshot,batch); "
                        "default all but batch")
    p.add_argument("--batch", type=int, default=500, help="batch phase: jobs per batch handler call (default 500)")
    p.add_argument("--batch-concurrency", type=int, default=1, help="batch phase: batches at once (default 1)")
    p.add_argument("--pg-name", "--db-name", dest="pg_name", default="fq_bench_suite",
                   help="PostgreSQL / MariaDB database to (re)create (default fq_bench_suite)")
    p.add_argument("--payload-bytes", type=int, default=0,
                   help="enqueue/drain phases: pad each payload to about this many bytes of JSON (default: {\"i\": i}, ~10 bytes)")
    p.add_argument("--out", help="output directory (default var/bench/<UTC time>)")
    p.add_argument("--with-anchors", action="store_true",
                   help="also run ../shared/bench/anchors/run.sh (other Django queues; ~25 min, BENCH_* env applies)")
    p.add_argument("--anchors-from", metavar="DIR", help="read an earlier anchors BENCH_OUT directory instead of running it")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    for key in ("n", "reps", "lat_k"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    if args.with_anchors and not args.anchors_from:
        anchors_run_sh()  # fail now, not after the whole run
    out = os.path.abspath(args.out or os.path.join(REPO, "var", "bench", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    dbs = {"both": ["postgres", "sqlite"], "all": list(DATABASES)}.get(args.db, [args.db])
    started = time.time()
    meta = {"command": [os.path.relpath(sys.argv[0], REPO) if sys.argv[0] else "bench/run.py", *sys.argv[1:]],
            "sizes": sizes, "concurrency": args.concurrency, "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    results, failures = {}, {}
    for db in dbs:
        path = os.path.join(out, f"{db}.json")
        cmd = [sys.executable, "-m", "bench.suite", "--db", db, "--out", path, "--logs", logs,
               "--concurrency", str(args.concurrency), "--pg-name", args.pg_name, "--phases", args.phases,
               "--payload-bytes", str(args.payload_bytes),
               "--batch", str(args.batch), "--batch-concurrency", str(args.batch_concurrency),
               *(f"--worker-arg={a}" for a in args.worker_arg)]
        for key, value in sizes.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        if args.quick:
            cmd.append("--quick")
        print(f"== {db}: {' '.join(cmd[1:])}", flush=True)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        if rc == 0 and os.path.exists(path):
            with open(path) as f:
                results[db] = json.load(f)
        else:
            failures[db] = f"bench.suite exited with {rc}"
            print(f"!! {db}: bench.suite failed (exit {rc})", file=sys.stderr, flush=True)

    anchors, ratios, anchor_error = None, {}, None
    if args.with_anchors or args.anchors_from:
        anchors_out = args.anchors_from or os.path.join(out, "anchors")
        try:
            if not args.anchors_from:
                run_anchors(anchors_out)
            anchors = read_anchors(anchors_out)
            ratios = anchor_ratios(results, anchors)
        except (RuntimeError, SystemExit) as exc:
            anchor_error = str(exc)
            print(f"!! anchors: {exc}", file=sys.stderr, flush=True)

    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["seconds"] = round(time.time() - started, 1)
    checks = targets(results, ratios) if results else []
    parts = []
    if results:
        p = results[next(iter(results))]["params"]
        parts.append(
            f"django-fq, N = {p['n']:,} no-op jobs, {p['reps']} repetition(s) (median (min–max)), "
            f"fq_worker --concurrency {p['concurrency']}, latency samples {p['lat_k']}/repetition; "
            f"load average at start {meta['loadavg_start']}, end {meta['loadavg_end']}; {os.cpu_count()} CPUs\n"
        )
        parts.append(our_table(results))
    if anchors:
        parts.append(f"\nOther Django job queues, same session ({anchors['dir']}):\n")
        parts.append(anchors_table(anchors))
        if anchors["incomplete_runs"]:
            parts.append(f"\n**anchor runs that failed their completeness check:** {', '.join(anchors['incomplete_runs'])}")
        parts.append("\nRatios (django-fq on PostgreSQL / best other queue):\n")
        parts.append(ratios_text(ratios))
    if checks:
        parts.append("\nIssue-5 targets this run can check:\n")
        parts += [f"- [{'x' if c['met'] else ' '}] {c['target']} ({c['db']}): {fmt_num(c['value'])}" for c in checks]
    for db, why in failures.items():
        parts.append(f"\n**{db}: failed** — {why}; see {logs}")
    if anchor_error:
        parts.append(f"\n**anchors: failed** — {anchor_error}")
    text = "\n".join(parts)
    print("\n" + text, flush=True)
    plans = plans_text(results)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text + "\n")
        if plans:
            f.write("\n### Query plans of the claim (statements on django_fq_job)\n" + plans + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results, "failures": failures, "anchors": anchors,
                   "anchor_error": anchor_error, "ratios": ratios, "targets": checks}, f, indent=1)
    print(f"\nwrote {out}/results.json and summary.md", flush=True)
    return 1 if failures or anchor_error else 0


if __name__ == "__main__":
    sys.exit(main())
