"""The admin's page-load budget: its pages with 1,000,000 jobs in the table on PostgreSQL (docs/performance.md).

    PYTHONPATH=. .venv/bin/python bench/admin_pages.py [--jobs 1000000] [--reuse] [--n 20] [--budget-ms 300]

**Seeding** (skipped with ``--reuse`` when the database already holds the
jobs): a database of its own (``--db-name``, default ``fq_bench_admin``),
dropped and migrated, then ``--jobs`` jobs in six queues of unequal size,
enqueued round-robin in rounds of 10,000 through
:func:`django_fq.services.enqueue_many` (batches of 500 or more go through
``COPY`` on PostgreSQL, the fastest path django-fq has). Payloads hold a
``user_id``, metadata a tenant tag (and ``vip`` on every 25th job).

The jobs then get their life stories by **one direct UPDATE** (documented
here because no service writes a week of history in minutes): enqueue times
spread over the last 7 days by ``seq``, and states from a hash of ``seq``:
of the newest 3 % (30,000) 70 % queued (ready), 1 % running, the rest
succeeded; of the older ones 1 % dead (a last error and a 3-entry error
history), 1.7 % cancelled, 0.5 % scheduled (``run_at`` up to 16 hours ahead),
0.2 % waiting, the rest succeeded, 2 % of those after a failed attempt.
Every job that ran names a worker. Then ``VACUUM FULL``, ``VACUUM`` and ``ANALYZE``: the
table as a long-running one looks after autovacuum (visibility map set),
without the UPDATE's dead row versions.

**Timing**: Django's test client, logged in as a superuser, asks for each
page of :data:`PAGES` (the dashboard, the job list, each filter of
``django_fq/admin/search.py``, the list's own filters): one *cold* request
on a new database connection (Django's and PostgreSQL's per-connection
caches empty; the table itself is in PostgreSQL's and the OS's caches after
seeding, as on a live server), then ``--n`` *warm* ones, median and p95. A
page whose warm p95 is over ``--budget-ms`` is asked once more with every
SQL statement timed, and the ``EXPLAIN (ANALYZE, BUFFERS)`` of its slowest
statements is printed. The warm requests also sum their statements' time
(*SQL*): the rest is Python (the view, the template), which a loaded machine
slows most. Run it on an idle machine for absolute numbers; the
load average is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Queues and their share of the jobs (per round of 10,000).
QUEUES = {"emails": 4000, "billing": 2000, "reports": 1500, "webhooks": 1200, "thumbnails": 800, "search-index": 500}
ROUND = sum(QUEUES.values())
#: Jobs per enqueue_many call (well past the COPY threshold of 500).
CHUNK = 2000
WEEK_MS = 7 * 24 * 3600 * 1000
#: The newest jobs (3 %, 30,000 of 1,000,000): the backlog and the running ones are among them.
RECENT_SHARE = 0.03


def setup(db_name: str, *, fresh: bool) -> None:
    """Point the bench settings (with the admin) at ``db_name``; drop, create and migrate it when ``fresh``."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_admin"
    os.environ["FQ_BENCH_DB"] = "postgres"
    os.environ["FQ_BENCH_PG_NAME"] = db_name
    sys.path.insert(0, REPO)
    from bench import pgdb

    if fresh:
        pgdb.drop(db_name)
        pgdb.psql(f'CREATE DATABASE "{db_name}"')
    import django

    django.setup()
    if fresh:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def job_count() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('django_fq_job') IS NOT NULL")
        if not cur.fetchone()[0]:
            return 0
        cur.execute("SELECT count(*) FROM django_fq_job")
        return cur.fetchone()[0]


def seed(n_jobs: int) -> None:
    """Enqueue ``n_jobs`` jobs (enqueue_many, COPY), give them a week of history (one UPDATE), VACUUM FULL, ANALYZE."""
    from django.db import connection

    from django_fq import services as fq

    for name in QUEUES:
        fq.configure(name, max_attempts=5)
    t0 = time.perf_counter()
    k = 0
    rounds = -(-n_jobs // ROUND)
    for r in range(rounds):
        for name, share in QUEUES.items():
            left = min(share, n_jobs - k)
            while left > 0:
                size = min(CHUNK, left)
                items = []
                for i in range(k, k + size):
                    tags = [f"tenant-{i % 40}"] + (["vip"] if i % 25 == 0 else [])
                    items.append(
                        {
                            "payload": {"user_id": i % 100_000, "kind": name, "n": i},
                            "metadata": {"tags": tags, "source": "api" if i % 3 else "cron"},
                        }
                    )
                fq.enqueue_many(name, items)
                k += size
                left -= size
        if r % 10 == 9:
            print(f"  enqueued {k:,} jobs ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"enqueued {k:,} jobs in {time.perf_counter() - t0:.1f} s (enqueue_many, COPY)", flush=True)

    t1 = time.perf_counter()
    history = (
        "jsonb_build_array(jsonb_build_object('at', t - 60000, 'attempt', 1, 'kind', 'nack', 'worker', w,"
        " 'error', 'TimeoutError: upstream took longer than 30 s'))"
    )
    dead_error = (
        "'smtplib.SMTPServerDisconnected: Connection unexpectedly closed (mx' || (s.r %% 5) || '.example.net)' || chr(10) ||"
        " '  File \"app/mail.py\", line 42, in send' || chr(10) || '    conn.sendmail(frm, to, body)'"
    )
    with connection.cursor() as cur:
        cur.execute("SELECT max(seq), (extract(epoch from clock_timestamp()) * 1000)::bigint FROM django_fq_job")
        top, now = cur.fetchone()
        cur.execute(
            f"""
            UPDATE django_fq_job j SET
                state = s.state,
                enqueued_at = s.t,
                run_at = CASE WHEN s.kind = 'scheduled' THEN %(now)s + s.r * 60000 ELSE s.t END,
                claimed_at = CASE WHEN s.ran THEN s.t + 40 + s.r END,
                changed_at = CASE WHEN s.ran THEN s.t + 90 + 3 * s.r ELSE s.t END,
                finished_at = CASE WHEN s.state IN ('succeeded', 'dead', 'cancelled') THEN s.t + 90 + 3 * s.r END,
                attempts = CASE WHEN s.kind = 'dead' THEN 5 WHEN s.kind = 'retried' THEN 2 WHEN s.ran THEN 1 ELSE 0 END,
                generation = CASE WHEN s.kind = 'dead' THEN 5 WHEN s.kind = 'retried' THEN 2 WHEN s.ran THEN 1 ELSE 0 END,
                worker = CASE WHEN s.ran THEN s.w ELSE '' END,
                waiting_on = CASE WHEN s.state = 'waiting' THEN 1 ELSE 0 END,
                last_error = CASE WHEN s.kind = 'dead' THEN {dead_error}
                    WHEN s.kind = 'retried' THEN 'TimeoutError: upstream took longer than 30 s' ELSE '' END,
                errors = CASE WHEN s.kind = 'dead' THEN
                        (SELECT jsonb_agg(jsonb_build_object('at', s.t - 60000 * (4 - a), 'attempt', a, 'kind', 'nack',
                            'worker', s.w, 'error', {dead_error})) FROM generate_series(1, 5) a)
                    WHEN s.kind = 'retried' THEN (SELECT {history} FROM (SELECT s.t AS t, s.w AS w) x)
                    ELSE '[]'::jsonb END
            FROM (
                SELECT seq, st.state, st.kind, h.r, h.t, st.state NOT IN ('queued', 'waiting') AS ran,
                    'web-' || (seq %% 8) || ':' || (4000 + seq %% 97) AS w
                FROM django_fq_job,
                    LATERAL (SELECT ((seq * 7919) %% 1000)::int AS r,
                        %(now)s - (%(top)s - seq) * %(span)s / %(n)s AS t) h,
                    LATERAL (SELECT CASE
                        WHEN seq > %(top)s - %(recent)s THEN CASE WHEN h.r < 700 THEN 'queued' WHEN h.r < 710 THEN 'running'
                            ELSE 'succeeded' END
                        WHEN h.r < 10 THEN 'dead' WHEN h.r < 27 THEN 'cancelled' WHEN h.r < 32 THEN 'queued'
                        WHEN h.r < 34 THEN 'waiting' ELSE 'succeeded' END AS state,
                        CASE WHEN seq <= %(top)s - %(recent)s AND h.r < 10 THEN 'dead'
                            WHEN seq <= %(top)s - %(recent)s AND h.r >= 27 AND h.r < 32 THEN 'scheduled'
                            WHEN h.r >= 34 AND h.r < 54 AND seq <= %(top)s - %(recent)s THEN 'retried'
                            ELSE '' END AS kind) st
            ) s
            WHERE j.seq = s.seq
            """,
            {"now": now, "top": top, "span": WEEK_MS, "n": max(k, 1), "recent": int(k * RECENT_SHARE)},
        )
        # The counters as the workers would have kept them: acks, failed attempts, times.
        cur.execute(
            """
            UPDATE django_fq_counter c SET acked = x.acked, nacked = x.nacked, dead = x.dead, cancelled = x.cancelled,
                claimed = x.acked + x.nacked, wait_ms_sum = x.acked * 40, wait_count = x.acked,
                run_ms_sum = x.acked * 50, run_count = x.acked, active = x.active
            FROM (SELECT queue_id, count(*) FILTER (WHERE state = 'succeeded') AS acked,
                    sum(greatest(attempts - 1, 0)) + count(*) FILTER (WHERE state = 'dead') AS nacked,
                    count(*) FILTER (WHERE state = 'dead') AS dead,
                    count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
                    count(*) FILTER (WHERE state IN ('queued', 'held', 'running')) AS active
                  FROM django_fq_job GROUP BY queue_id) x
            WHERE c.id = (SELECT min(id) FROM django_fq_counter WHERE queue_id = x.queue_id)
            """
        )
    print(f"history written by one UPDATE in {time.perf_counter() - t1:.1f} s", flush=True)
    t2 = time.perf_counter()
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("VACUUM FULL django_fq_job")
        # VACUUM FULL leaves the visibility map empty: the plain VACUUM sets it, as autovacuum
        # does for a live table's settled pages, so index-only scans are as possible as in production.
        cur.execute("VACUUM (ANALYZE) django_fq_job")
        cur.execute("ANALYZE")
    print(f"VACUUM FULL + ANALYZE in {time.perf_counter() - t2:.1f} s", flush=True)


def distribution() -> str:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT q.name, j.state, count(*) FROM django_fq_job j JOIN django_fq_queue q ON q.id = j.queue_id"
            " GROUP BY 1, 2 ORDER BY 1, 2"
        )
        rows = cur.fetchall()
        cur.execute("SELECT pg_size_pretty(pg_total_relation_size('django_fq_job'))")
        size = cur.fetchone()[0]
    by_state: dict[str, int] = {}
    for _, state, n in rows:
        by_state[state] = by_state.get(state, 0) + n
    by_queue: dict[str, int] = {}
    for name, _, n in rows:
        by_queue[name] = by_queue.get(name, 0) + n
    return (
        f"jobs by state: {json.dumps(by_state)}\njobs by queue: {json.dumps(by_queue)}\n"
        f"django_fq_job with its indexes: {size}"
    )


def samples() -> dict:
    """Values the searches ask for, read from the seeded table."""
    from django.db import connection

    from django_fq.models import Job

    with connection.cursor() as cur:
        cur.execute("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint")
        now = cur.fetchone()[0]
    middle = Job.objects.order_by("seq").values_list("seq", flat=True)[:1].get() + job_count() // 2
    job = Job.objects.filter(state="succeeded", seq__gte=middle).order_by("seq").values("uid", "seq")[:1].get()
    worker = (
        Job.objects.filter(state="running", queue__name="emails").values_list("worker", flat=True).first()
        or "web-1:4001"
    )
    three_days = now - 3 * 24 * 3600 * 1000
    return {
        "uid": job["uid"],
        "seq": job["seq"],
        "worker": worker,
        "hour_ago": now - 3600 * 1000,
        "window_from": three_days,
        "window_to": three_days + 3600 * 1000,
        "day_ago": now - 24 * 3600 * 1000,
        "five_days_ago": now - 5 * 24 * 3600 * 1000,
        "emails_id": dict(Job.objects.values_list("queue__name", "queue_id").distinct())["emails"],
    }


def pages(s: dict) -> list[tuple[str, str]]:
    """(label, URL) of every page timed: the dashboard, the lists, and each search filter of search.py."""
    jobs = "/admin/django_fq/job/"
    q = "fq-queue"
    return [
        ("admin index", "/admin/"),
        ("app index", "/admin/django_fq/"),
        ("dashboard", "/admin/django_fq/queue/dashboard/"),
        ("dashboard, one queue", "/admin/django_fq/queue/dashboard/?queue=emails"),
        ("queue list", "/admin/django_fq/queue/"),
        ("queue page", f"/admin/django_fq/queue/{s['emails_id']}/change/"),
        ("job list (first page)", jobs),
        ("job page", f"{jobs}{s['seq']}/change/"),
        ("search: id", f"{jobs}?fq-id={s['uid']}"),
        ("search: queue", f"{jobs}?{q}=emails"),
        ("search: small queue", f"{jobs}?{q}=search-index"),
        ("search: state dead", f"{jobs}?fq-state=dead"),
        ("search: state ready", f"{jobs}?fq-state=ready"),
        ("search: state succeeded", f"{jobs}?fq-state=succeeded"),
        ("search: queue + succeeded", f"{jobs}?{q}=emails&fq-state=succeeded"),
        ("search: queue + dead", f"{jobs}?{q}=emails&fq-state=dead"),
        ("search: queue + scheduled", f"{jobs}?{q}=emails&fq-state=scheduled"),
        ("search: worker", f"{jobs}?{q}=emails&fq-state=running&fq-worker={s['worker']}"),
        ("search: error text (dead)", f"{jobs}?{q}=emails&fq-state=dead&fq-error=Disconnected"),
        ("search: error text (succeeded)", f"{jobs}?{q}=emails&fq-state=succeeded&fq-error=upstream"),
        ("search: payload contains", f"{jobs}?{q}=emails&fq-state=succeeded&fq-payload=%7B%22user_id%22%3A4242%7D"),
        (
            "search: metadata contains",
            f"{jobs}?{q}=billing&fq-state=succeeded&fq-metadata=%7B%22tags%22%3A%5B%22vip%22%5D%7D",
        ),
        ("search: tag", f"{jobs}?{q}=billing&fq-state=succeeded&fq-tag=vip"),
        ("search: enqueued in the last hour", f"{jobs}?fq-enqueued_from={s['hour_ago']}"),
        (
            "search: enqueued before 5 days ago",
            f"{jobs}?fq-enqueued_to={s['five_days_ago']}&{q}=emails&fq-state=succeeded",
        ),
        (
            "search: finished in a 1 h window",
            f"{jobs}?fq-finished_from={s['window_from']}&fq-finished_to={s['window_to']}",
        ),
        ("search: finished in the last day", f"{jobs}?fq-finished_from={s['day_ago']}"),
        ("list filter: state", f"{jobs}?state=dead"),
        ("list filter: queue", f"{jobs}?queue__id__exact={s['emails_id']}"),
        ("list filter: tag", f"{jobs}?tag=vip"),
    ]


def pctl(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def _timer(spent: list[float]):
    """An execute wrapper adding each statement's time (ms) to ``spent[0]``."""

    def timed(execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent[0] += (time.perf_counter() - t0) * 1000

    return timed


def time_pages(todo: list[tuple[str, str]], n: int) -> list[dict]:
    """Cold (new connection) and ``n`` warm requests of each page (total and SQL time); each must answer 200."""
    from django.contrib.auth.models import User
    from django.db import connection, connections
    from django.test import Client

    user = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
        "bench-admin", "bench@example.com", "bench-only-pw"
    )
    client = Client()
    client.force_login(user)
    out = []
    for label, url in todo:
        connections.close_all()
        t0 = time.perf_counter()
        response = client.get(url)
        cold = (time.perf_counter() - t0) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{label}: {url} answered {response.status_code}")
        body = response.content.decode()
        if 'class="errornote"' in body or "errorlist" in body:
            raise SystemExit(f"{label}: {url} shows a form error")
        warm, sql = [], []
        for _ in range(n):
            spent = [0.0]
            t0 = time.perf_counter()
            with connection.execute_wrapper(_timer(spent)):
                client.get(url)
            warm.append((time.perf_counter() - t0) * 1000)
            sql.append(spent[0])
        out.append(
            {
                "page": label,
                "url": url,
                "cold_ms": cold,
                "median_ms": statistics.median(warm),
                "p95_ms": pctl(warm, 95),
                "sql_median_ms": statistics.median(sql),
            }
        )
        print(
            f"{label:38s} cold {cold:7.1f}  median {out[-1]['median_ms']:7.1f}  p95 {out[-1]['p95_ms']:7.1f}"
            f"  SQL median {out[-1]['sql_median_ms']:6.1f} ms",
            flush=True,
        )
    return out


def explain_slowest(url: str, *, top: int = 3) -> str:
    """The page at ``url`` once more with every statement timed; EXPLAIN (ANALYZE, BUFFERS) of the ``top`` slowest."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username="bench-admin"))
    seen: list[tuple[float, str, object]] = []

    def timed(execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            seen.append(((time.perf_counter() - t0) * 1000, sql, params))

    with connection.execute_wrapper(timed):
        client.get(url)
    from django_fq import storage

    lines = []
    reads = [x for x in seen if x[1].lstrip().upper().startswith("SELECT")]
    for ms, sql, params in sorted(reads, key=lambda x: -x[0])[:top]:
        with storage.for_connection(connection).page_reads(connection), connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)  # as the page runs it (no JIT)
            plan = "\n".join(r[0] for r in cur.fetchall())
        lines.append(f"-- {ms:.1f} ms: {sql[:600]}\n{plan}")
    return "\n\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db-name", default="fq_bench_admin")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--reuse", action="store_true", help="keep the database when it already holds --jobs jobs")
    ap.add_argument("--n", type=int, default=20, help="warm requests per page")
    ap.add_argument("--budget-ms", type=float, default=300.0)
    ap.add_argument("--only", default="", help="time only the pages whose label contains this text")
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument(
        "--jit",
        choices=("server", "off"),
        default="server",
        help="PostgreSQL's JIT for this database: the server's setting (default; on unless configured) or off",
    )
    ap.add_argument("--explain", action="store_true", help="print the EXPLAIN of every timed page, not only those over")
    args = ap.parse_args(argv)

    reuse = False
    if args.reuse:
        setup(args.db_name, fresh=False)
        try:
            reuse = job_count() >= args.jobs
        except Exception:  # noqa: BLE001 - no such database yet: seed it
            reuse = False
        if not reuse:
            print("--reuse: no seeded database of that size; seeding", flush=True)
            from django.db import connections

            connections.close_all()
            from bench import pgdb

            pgdb.drop(args.db_name)
            pgdb.psql(f'CREATE DATABASE "{args.db_name}"')
            from django.core.management import call_command

            call_command("migrate", verbosity=0, interactive=False)
    else:
        setup(args.db_name, fresh=True)
    if not reuse:
        seed(args.jobs)
    from bench import pgdb

    pgdb.psql(f'ALTER DATABASE "{args.db_name}" ' + ("SET jit = off" if args.jit == "off" else "RESET jit"))
    print(distribution(), flush=True)
    print(f"JIT: {args.jit}", flush=True)
    print(f"load average before timing: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    todo = [(label, url) for label, url in pages(samples()) if args.only in label]
    results = time_pages(todo, args.n)
    load = os.getloadavg()
    print(f"load average after timing: {' '.join(f'{x:.2f}' for x in load)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "load": load, "jit": args.jit}, fh, indent=1)
    over = [r for r in results if r["p95_ms"] > args.budget_ms]
    for r in results if args.explain else over:
        print(f"\n=== {r['page']} (p95 {r['p95_ms']:.0f} ms)\n{explain_slowest(r['url'])}")
    print(f"\n{len(results) - len(over)} of {len(results)} pages within {args.budget_ms:.0f} ms (warm p95)")


if __name__ == "__main__":
    main()
