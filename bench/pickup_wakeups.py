#!/usr/bin/env python
"""Thread wakeups per job of an idle ``fq_worker`` (PostgreSQL): where a pickup's hand-offs are.

    PYTHONPATH=. .venv/bin/python bench/pickup_wakeups.py [--jobs 40] [--pg-name fq_bench_wakeups]

A pickup's wall time on a loaded machine grows with every thread that must be
woken on its way (each wakeup is one more wait for a core); the count does not
depend on the load. The script starts one worker as ``bench/suite.py`` does
(``--concurrency 256``), lets it go idle, then enqueues ``--jobs`` jobs one at
a time, each after the previous one is done and a pause of 0.3-1.3 s, and
reports, per thread of the worker (by name), its context switches (voluntary:
it blocked and was woken; involuntary: preempted) per job, from
``/proc/PID/task/*/status``, and the same over an equally long idle stretch
with no job (what the threads do anyway). The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench import suite as bsuite  # noqa: E402


def threads(pid: int) -> dict:
    """``{tid: (name, voluntary, involuntary)}`` of every thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        # Python 3.11 does not name OS threads: the main thread is "main", the others by tid order.
        label = "main" if tid == str(pid) else f"{name}-{tid}"
        out[tid] = (label, int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"]))
    return out


def delta(a: dict, b: dict, n: int) -> dict:
    by_name: dict = {}
    for tid, (name, vol, inv) in b.items():
        v0, i0 = (a[tid][1], a[tid][2]) if tid in a else (0, 0)
        d = by_name.setdefault(name, [0, 0])
        d[0] += vol - v0
        d[1] += inv - i0
    return {k: (round(v[0] / n, 2), round(v[1] / n, 2)) for k, v in sorted(by_name.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--pg-name", default="fq_bench_wakeups")
    a = p.parse_args(argv)
    out = f"/tmp/pickup_wakeups_{int(time.time())}.json"
    args = bsuite.parse_args(
        [
            "--db",
            "postgres",
            "--out",
            out,
            "--logs",
            out + ".logs",
            "--reps",
            "1",
            "--pg-name",
            a.pg_name,
            "--phases",
            "latency",
        ]
    )
    info = bsuite.prepare_environment(args)
    s = bsuite.Suite(args, info)
    proc = s.start_worker(s.worker_cmd(), "wakeups")
    obs = s.observer()
    try:
        pid = s._worker_pids(proc)[-1] if s._worker_pids(proc) else proc.pid

        def wait_done(uid: str) -> None:
            give_up = time.monotonic() + 120
            while obs.one(f"SELECT state FROM {s.JOB} WHERE uid = %s", (uid,)) != ("succeeded",):
                if time.monotonic() > give_up:
                    raise RuntimeError("job not done")
                time.sleep(0.001)

        s.connection.ensure_connection()
        wait_done(s.fq.enqueue(bsuite.QUEUE, {"warmup": True}).id)
        time.sleep(1.5)
        rng = random.Random(bsuite.LATENCY_SEED)
        pauses = [rng.uniform(0.3, 1.3) for _ in range(a.jobs)]
        idle0 = threads(pid)
        time.sleep(sum(pauses))
        idle = delta(idle0, threads(pid), a.jobs)
        busy0 = threads(pid)
        for k, pause in enumerate(pauses):
            time.sleep(pause)
            wait_done(s.fq.enqueue(bsuite.QUEUE, {"k": k}).id)
        busy = delta(busy0, threads(pid), a.jobs)
    finally:
        obs.close()
        s.stop_worker(proc)
    per_job = {name: (round(busy[name][0] - idle.get(name, (0, 0))[0], 2), round(busy[name][1] - idle.get(name, (0, 0))[1], 2))
               for name in busy}  # fmt: skip
    per_job = {k: v for k, v in per_job.items() if v[0] >= 0.05 or v[1] >= 0.05}
    woken = sum(v[0] for v in per_job.values())
    print(
        json.dumps(
            {
                "jobs": a.jobs,
                "load": os.getloadavg(),
                "added_per_job (voluntary, involuntary)": per_job,
                "threads_woken_per_job": round(woken, 2),
            }
        )
    )
    s.connection.close()
    bsuite.drop_pg_databases(a.pg_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
