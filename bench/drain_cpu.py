"""Worker CPU per job of a no-op drain: user + system CPU seconds of one ``fq_worker`` process.

::

    PYTHONPATH=. .venv-dj6/bin/python bench/drain_cpu.py --base /tmp/fq-base --order base,new,new,base

Each run empties the django-fq tables, bulk-enqueues ``--n`` no-op jobs on queue ``bench``
(``services.enqueue_many``), then runs ``manage.py fq_worker --queue bench --burst
--concurrency C --no-progress`` from a checkout (``new``: this one; ``base``: the ``--base``
directory, e.g. ``git archive <commit> | tar -x -C /tmp/fq-base``) and reads the child's
``resource`` usage from ``os.wait4``: user and system CPU seconds (start-up included) and
wall seconds; the peak RSS is the worker's own ``VmHWM`` (``/proc/self/status``, read as it
ends): ``ru_maxrss`` of a child started by ``subprocess`` is at least this script's own RSS
(Linux keeps the larger high-water mark of the memory a ``vfork`` child shared with its parent
across ``exec``), so it measured the script's 20,000 enqueued payloads, not the worker. The log lines go to a file under ``--logs`` (as the suite's workers do). Wall time
is printed but is the noisy figure on a shared machine; CPU seconds per job are the one to
compare, with base and new alternated in one sitting (docs/performance.md#where-a-jobs-time-goes).

The database is ``--db-name`` on PostgreSQL (``bench.settings``), created fresh, dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", help="checkout of the base commit (needed when --order names base)")
    p.add_argument("--order", default="base,new,new,base", help="comma-separated runs: base / new")
    p.add_argument("--n", type=int, default=20000, help="jobs per drain")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--db-name", default="fq_bench_cpu")
    p.add_argument("--logs", default="/tmp/fq-drain-cpu")
    p.add_argument("--worker-arg", action="append", default=[], help="extra fq_worker argument (repeatable)")
    p.add_argument("--out", help="write the runs as JSON here")
    p.add_argument("--wrap", default="", help="command put before the worker's (e.g. a profiler); its CPU then counts too")
    return p.parse_args(argv)


def child(out_path: str, argv: list[str]) -> None:
    """Run ``manage.py fq_worker`` (``argv``) in this process; write the CPU seconds of ``Worker.run`` alone to ``out_path``.

    The drain's steady part without the start-up (imports, Django set-up, system checks), whose
    few hundred ms vary from run to run on a loaded machine as much as the effects measured.
    """
    sys.path.insert(0, os.getcwd())
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from django_fq.worker import core

    run = core.Worker.run

    def timed(self):
        started = time.process_time()
        try:
            return run(self)
        finally:
            cpu = time.process_time() - started
            with open(out_path, "w") as f:
                json.dump({"run_cpu_s": cpu, "code": os.path.dirname(core.__file__), "vmhwm_kb": _vmhwm_kb()}, f)

    core.Worker.run = timed
    execute_from_command_line(["manage.py", *argv])


def _vmhwm_kb() -> int | None:
    """This process's peak resident set so far (``VmHWM``, KiB); None where ``/proc`` has no such line."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2:])
        return 0
    args = parse_args(argv)
    order = [r.strip() for r in args.order.split(",") if r.strip()]
    if any(r not in ("base", "new") for r in order) or ("base" in order and not args.base):
        raise SystemExit("--order takes base/new; base needs --base")
    os.makedirs(args.logs, exist_ok=True)
    # Here, not at the top: the --child run imports this file with the base checkout on its path.
    from bench import pgdb

    pgdb.fresh(args.db_name)
    from django.db import connection

    from django_fq import services
    from django_fq.models import IdempotencyToken, Job, Lease, Queue, QueueCounter

    tables = ", ".join(t._meta.db_table for t in (Lease, IdempotencyToken, QueueCounter, Job, Queue))
    runs = []
    try:
        for i, which in enumerate(order):
            with connection.cursor() as cur:
                cur.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
            services.enqueue_many("bench", [{"payload": {"i": k}} for k in range(args.n)])
            connection.close()
            repo = REPO if which == "new" else os.path.abspath(args.base)
            worker_argv = ["fq_worker", "--queue", "bench", "--burst", "--concurrency", str(args.concurrency), "--no-progress",
                           *args.worker_arg]
            run_cpu_path = os.path.join(args.logs, f"run{i}_{which}.run_cpu.json")
            if os.path.exists(run_cpu_path):
                os.remove(run_cpu_path)
            cmd = [*args.wrap.split(), sys.executable, os.path.abspath(__file__), "--child", run_cpu_path, *worker_argv]
            env = dict(os.environ, PYTHONPATH=repo, PYTHONUNBUFFERED="1")
            log_path = os.path.join(args.logs, f"run{i}_{which}.log")
            with open(log_path, "w") as logf:
                t0 = time.perf_counter()
                proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=logf, stderr=subprocess.STDOUT)
                _, status, usage = os.wait4(proc.pid, 0)
                wall = time.perf_counter() - t0
            with connection.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {Job._meta.db_table} WHERE state = 'succeeded'")
                done = cur.fetchone()[0]
            connection.close()
            cpu = usage.ru_utime + usage.ru_stime
            with open(run_cpu_path) as f:
                reported = json.load(f)
            run_cpu = reported["run_cpu_s"]
            if not reported["code"].startswith(repo):
                raise SystemExit(f"run {i} ({which}) ran the worker of {reported['code']}, not {repo}")
            run = {
                "run": i, "which": which, "n": args.n, "succeeded": done, "exit": os.waitstatus_to_exitcode(status),
                "user_s": round(usage.ru_utime, 3), "sys_s": round(usage.ru_stime, 3), "cpu_s": round(cpu, 3),
                "cpu_us_per_job": round(cpu / args.n * 1e6, 1), "wall_s": round(wall, 2),
                # Worker.run alone (the drain without the process's start-up): this process's CPU only.
                "run_cpu_s": round(run_cpu, 3), "run_cpu_us_per_job": round(run_cpu / args.n * 1e6, 1),
                "max_rss_mib": round(reported["vmhwm_kb"] / 1024, 1) if reported.get("vmhwm_kb") else None,
                "loadavg": os.getloadavg(),
                "vol_ctx": usage.ru_nvcsw, "invol_ctx": usage.ru_nivcsw,
            }
            runs.append(run)
            print(json.dumps(run), flush=True)
            if done != args.n or run["exit"] != 0:
                raise SystemExit(f"run {i} ({which}): {done} of {args.n} succeeded, exit {run['exit']}; see {log_path}")
    finally:
        connection.close()
        pgdb.drop(args.db_name)
    for which in ("base", "new"):
        for field in ("cpu_us_per_job", "run_cpu_us_per_job"):
            mine = [r[field] for r in runs if r["which"] == which]
            if mine:
                print(f"{which}: {field} {mine}, mean {sum(mine) / len(mine):.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
