"""Drain and pickup latency directly and through PgBouncer, alternated in one sitting.

    bench/pgbouncer.sh [--rounds R] [--n N] [--lat-k K] [--quick]   # starts PgBouncer, runs this

Run by bench/pgbouncer.sh inside ``scripts/test-pgbouncer.sh --run``, which
started a transaction-pooling PgBouncer on 127.0.0.1:``$FQ_PGBOUNCER_PORT`` in
front of the PostgreSQL server on 127.0.0.1:5432 (and stops it afterwards).

Each round runs ``bench/run.py --db postgres --phases drain,latency --reps 1``
once directly (database ``fq_bench_direct``) and once through PgBouncer
(``fq_bench_bouncer``, with the settings docs/scaling.md gives:
``FQ_BENCH_PG_POOLER=transaction``, the worker's listener on a direct alias),
in the order direct, bouncer, then bouncer, direct in the next round, so that
a load that drifts during the sitting weighs on both sides alike. The machine is
shared: the report gives each round's ratio (bouncer / direct, same minutes)
beside the medians, and the load average before and after each run.

Reported (docs/performance.md, "Through PgBouncer"): drain of N jobs by one
worker process (steady rate, jobs/s) and by two, pickup latency (an idle worker,
an enqueue, the job recorded succeeded; median per round, p95 over every
sample of the side), and the single and bulk enqueue rates the drain phase
measures on the way. Writes ``OUT/report.md`` and ``OUT/report.json``; each
run's own output is in ``OUT/<side>-<round>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from bench.suite import percentile  # noqa: E402  (after the path fix: run as a script)

#: (label, key in bench.suite's summary, unit, digits)
METRICS = [
    ("drain, 1 process (steady)", "drain1_steady", "jobs/s", 0),
    ("drain, 2 processes (steady)", "drain2_steady", "jobs/s", 0),
    ("pickup latency, median", "latency_median_ms", "ms", 2),
    ("enqueue one at a time", "enqueue_single_rate", "jobs/s", 0),
    ("bulk enqueue", "enqueue_bulk_rate", "jobs/s", 0),
]
SIDES = ("direct", "bouncer")


def run_side(side: str, rnd: int, out: str, args, extra: list[str]) -> dict:
    """One ``bench/run.py`` run of ``side`` ("direct" or "bouncer"); returns its postgres result and load averages."""
    env = dict(os.environ)
    if side == "bouncer":
        env.update(
            FQ_BENCH_PG_POOLER="transaction",
            FQ_BENCH_PG_PORT=os.environ["FQ_PGBOUNCER_PORT"],
            FQ_BENCH_PG_DIRECT_PORT=os.environ.get("FQ_TEST_PG_DIRECT_PORT", "5432"),
        )
    else:
        for key in ("FQ_BENCH_PG_POOLER", "FQ_BENCH_PG_DIRECT_PORT"):
            env.pop(key, None)
        env["FQ_BENCH_PG_PORT"] = os.environ.get("FQ_TEST_PG_DIRECT_PORT", "5432")
    where = os.path.join(out, f"{side}-{rnd}")
    cmd = [
        sys.executable,
        "bench/run.py",
        "--db",
        "postgres",
        "--phases",
        "drain,latency",
        "--reps",
        "1",
        "--pg-name",
        f"fq_bench_{side}",
        "--out",
        where,
        *extra,
    ]
    before = [round(x, 2) for x in os.getloadavg()]
    print(f"== round {rnd}, {side}: {' '.join(cmd[1:])}  (load average {before})", flush=True)
    rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
    after = [round(x, 2) for x in os.getloadavg()]
    with open(os.path.join(where, "results.json")) as f:
        found = json.load(f)
    if rc != 0 or "postgres" not in found["results"]:
        raise SystemExit(f"round {rnd}, {side}: bench/run.py failed (exit {rc}); see {where}")
    return {"result": found["results"]["postgres"], "loadavg_before": before, "loadavg_after": after}


def value(run: dict, key: str):
    return (run["result"]["summary"].get(key) or {}).get("median")


def latency_samples_ms(run: dict) -> list[float]:
    return [
        x * 1000
        for r in run["result"]["runs"]
        if r["metric"] == "latency" and r["variant"] == "default"
        for x in r["samples_s"]
    ]


def fmt(x, digits: int) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def report(runs: dict, meta: dict) -> str:
    """The markdown table: per side the median over rounds (min–max), and the bouncer/direct ratio per round."""
    rounds = sorted({r for _, r in runs})
    lines = [
        f"N = {meta['n']:,} no-op jobs per drain, {meta['lat_k']} pickup samples per round, {len(rounds)} round(s) "
        f"alternated (direct/bouncer, then bouncer/direct); PgBouncer {meta['pgbouncer']} in transaction mode, "
        f"prepare_threshold None, the listener on a direct alias; {os.cpu_count()} CPUs; "
        f"load average {meta['loadavg_start']} at the start, {meta['loadavg_end']} at the end.",
        "",
        "| metric | direct | through PgBouncer | bouncer / direct, per round |",
        "|---|---|---|---|",
    ]

    def cell(vals, digits):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "n/a"
        return f"{fmt(statistics.median(vals), digits)} ({fmt(min(vals), digits)}–{fmt(max(vals), digits)})"

    for label, key, unit, digits in METRICS:
        per = {side: [value(runs[(side, r)], key) for r in rounds] for side in SIDES}
        ratios = [f"{b / d:.2f}" if b and d else "n/a" for d, b in zip(per["direct"], per["bouncer"], strict=True)]
        lines.append(
            f"| {label}, {unit} | {cell(per['direct'], digits)} | {cell(per['bouncer'], digits)} | "
            f"{', '.join(ratios)} |"
        )
    p95 = {side: percentile([x for r in rounds for x in latency_samples_ms(runs[(side, r)])], 0.95) for side in SIDES}
    lines.append(
        f"| pickup latency, p95 over all samples, ms | {fmt(p95['direct'], 2)} | {fmt(p95['bouncer'], 2)} | "
        f"{p95['bouncer'] / p95['direct']:.2f} (pooled) |"
    )
    lines += ["", "Load average (1, 5, 15 min) before each run:", ""]
    for r in rounds:
        lines.append(f"- round {r}: " + "; ".join(f"{side} {runs[(side, r)]['loadavg_before']}" for side in SIDES))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="direct/bouncer pairs (default 3)")
    p.add_argument("--n", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--lat-k", type=int, default=20, help="pickup samples per round and side (default 20)")
    p.add_argument("--quick", action="store_true", help="smoke test: 1 round, N = 2,000, 5 samples")
    p.add_argument("--out", help="output directory (default var/bench/pgbouncer-<UTC time>)")
    args, extra = p.parse_known_args(argv)
    if "FQ_PGBOUNCER_PORT" not in os.environ:
        raise SystemExit("run through bench/pgbouncer.sh (it starts PgBouncer and sets FQ_PGBOUNCER_PORT)")
    if args.quick:
        args.rounds, args.n, args.lat_k = 1, 2_000, 5
    out = os.path.abspath(
        args.out or os.path.join(REPO, "var", "bench", "pgbouncer-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    )
    os.makedirs(out, exist_ok=True)
    version = subprocess.run(
        [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", "--version"], capture_output=True, text=True
    ).stdout.split("\n")[0]
    meta = {
        "n": args.n,
        "lat_k": args.lat_k,
        "rounds": args.rounds,
        "pgbouncer": version.replace("PgBouncer ", ""),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    sizes = ["--n", str(args.n), "--lat-k", str(args.lat_k), *extra]
    runs = {}
    for rnd in range(1, args.rounds + 1):
        order = SIDES if rnd % 2 else SIDES[::-1]
        for side in order:
            runs[(side, rnd)] = run_side(side, rnd, out, args, sizes)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    text = report(runs, meta)
    print("\n" + text, flush=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"meta": meta, "runs": {f"{s}-{r}": v for (s, r), v in runs.items()}}, f, indent=1)
    print(f"\nbench/pgbouncer: {out}/report.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
