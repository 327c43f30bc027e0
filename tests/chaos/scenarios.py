"""The chaos scenarios. Each is bounded in time, uses loopback only, stops by itself and ends with the checker.

Every scenario function runs against the database Django is connected to
(the pytest test database, or the fresh database of ``python -m
tests.chaos.run``), writes its child processes' logs under ``out``, and
returns an :class:`Outcome`: the invariant :class:`~tests.chaos.invariants.Report`,
the faults injected, anything else that went wrong (``problems``), and the
one summary line. Nothing is asserted here; the tests and the runner decide.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import Error as DbError
from django.db import connection, connections, transaction

from django_fq import services as fq
from django_fq.exceptions import QueueNotFound

from . import failover as _failover
from . import invariants, procs
from .netns import Partition, unavailable

WORK = "chaos.work"
PART = "chaos.part"
STRESS = ("chaos.stress", "chaos.stress.limited")
FAST = ("--poll-interval=10", "--max-poll-interval=100", "--reaper-interval=200", "--grace=10")


@dataclass
class Outcome:
    """The result of one scenario run."""

    scenario: str
    report: invariants.Report
    took_s: float = 0.0
    kills: int = 0
    restarts: int = 0
    problems: list[str] = field(default_factory=list)
    notes: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.problems

    def line(self) -> str:
        """``chaos <scenario>: jobs=N succeeded=.. dead=.. kills=K restarts=R duplicates_in_expired_leases=D overlaps=0 lost=0 (took Xs)``."""
        r = self.report
        return (
            f"chaos {self.scenario}: jobs={r.jobs} succeeded={r.succeeded} dead={r.dead} kills={self.kills} "
            f"restarts={self.restarts} duplicates_in_expired_leases={r.duplicates} overlaps={r.overlaps} "
            f"lost={r.lost} (took {self.took_s:.0f}s)"
        )

    def describe(self) -> str:
        """The summary line, the notes, every problem and the checker's violations (for a failure message)."""
        parts = [self.line(), f"notes: {json.dumps(self.notes, default=str)}"]
        parts += [f"problem: {p}" for p in self.problems[:40]]
        if not self.report.ok:
            parts.append(self.report.describe())
        return "\n".join(parts)


def _log(progress, text: str) -> None:
    if progress:
        progress(text)


def _fresh(queues) -> None:
    """Delete the scenario's queues if an earlier run left them, so the audit sees every job from the start."""
    for name in queues:
        try:
            fq.delete_queue(name)
        except QueueNotFound:
            pass


def _safe_stats(queue: str):
    """``fq.stats``, or ``None`` while the database is unreachable (the connection is reset for the next try)."""
    try:
        return fq.stats(queue)
    except DbError:
        connections.close_all()
        return None


def _active(queues) -> int | None:
    total = 0
    for q in queues:
        s = _safe_stats(q)
        if s is None:
            return None
        total += s.counts["scheduled"] + s.counts["ready"] + s.counts["running"]
    return total


def _wait_drained(queues, timeout_s: float, progress=None, label: str = "") -> bool:
    give_up = time.monotonic() + timeout_s
    last = 0.0
    while time.monotonic() < give_up:
        left = _active(queues)
        if left == 0:
            return True
        if progress and time.monotonic() - last > 5:
            last = time.monotonic()
            _log(progress, f"{label}: {left} jobs still to finish")
        time.sleep(0.25)
    return False


def _kill_and_replace(victim: procs.Proc, live: list, everyone: list, start, outcome: Outcome) -> None:
    """Kill ``victim`` (``kill -9``), start a worker in its place, and count both on ``outcome``."""
    live.remove(victim)
    victim.kill()
    outcome.kills += 1
    fresh = start()
    live.append(fresh)
    everyone.append(fresh)
    outcome.restarts += 1


def _stop_all(workers: list[procs.Proc], problems: list[str], timeout: float = 60.0) -> None:
    """SIGTERM every live process (once it handles it); a non-zero exit is a problem (it should drain and exit 0)."""
    for w in workers:
        try:
            w.wait_ready(timeout)
        except AssertionError as exc:
            problems.append(str(exc))
        w.signal()
    for w in workers:
        try:
            code = w.wait(timeout)
        except subprocess.TimeoutExpired:
            w.kill()
            code = "timeout"
        if code != 0:
            problems.append(f"{w.name} pid {w.pid} exited {code} after SIGTERM; log tail:\n{w.text()[-1500:]}")


# --- kill storm ------------------------------------------------------------------------------------------


def kill_storm(
    out: Path,
    *,
    jobs: int = 20_000,
    workers: int = 4,
    minutes: float | None = None,
    concurrency: int = 4,
    visibility_ms: int = 2000,
    kill_every_s: tuple[float, float] = (1.0, 2.0),
    seed: int = 1,
    timeout_s: float | None = None,
    progress=None,
) -> Outcome:
    """``workers`` fq_worker processes drain ``jobs`` jobs while one of them is ``kill -9``-ed every 1–2 s.

    The victim is drawn among the workers that have claimed jobs already (a
    process still importing Django holds nothing worth killing), and is
    replaced at once by a new process. Jobs sleep 0–5 ms
    and record their run. With ``minutes`` the storm goes on that long from
    the first claim (a feeder keeps the queue stocked with batches of ``jobs``); otherwise it
    stops when every job succeeded. The survivors then get SIGTERM and must
    exit 0. Checked: every invariant with ``drained=True``.
    """
    rng = random.Random(seed)
    started = time.monotonic()
    _fresh([WORK])
    invariants.install()
    fq.configure(WORK, max_attempts=1000, backoff_ms=0, visibility_ms=visibility_ms)
    outcome = Outcome("kill-storm", invariants.Report([WORK]))

    def enqueue(n: int) -> None:
        for i in range(0, n, 1000):
            fq.enqueue_many(WORK, [{"payload": {"sleep_ms": rng.choice((0, 0, 0, 1, 2, 5))}} for _ in range(min(1000, n - i))])

    enqueue(jobs)
    total = jobs
    logs = out / "kill-storm"
    n_started = 0

    def start() -> procs.Proc:
        nonlocal n_started
        n_started += 1
        extra = ("--prefetch=4",) if n_started % 2 else ()
        return procs.worker(WORK, logs / f"worker-{n_started:03d}.log", f"--concurrency={concurrency}",
                            f"--visibility={visibility_ms}", *extra, *FAST, env={"FQ_CHAOS_TAG": f"w{n_started}"})

    live = [start() for _ in range(workers)]
    everyone = list(live)
    soak_until = None  # the storm's clock starts when the first worker claims (start-up can take seconds)
    # Generous: on a busy 2-core machine a replacement worker needs many seconds to start.
    hard_stop = started + (timeout_s or max(900.0, jobs / 2.0) + (minutes or 0) * 60)
    last_note = 0.0
    def soaking() -> bool:
        return bool(minutes) and (soak_until is None or time.monotonic() < soak_until)

    def top_up() -> None:
        """While soaking, keep at least half a batch queued, so a kill finds the workers busy."""
        nonlocal total
        stats = fq.stats(WORK)
        if stats.counts["ready"] + stats.counts["scheduled"] < jobs // 2:
            enqueue(jobs)
            total += jobs

    try:
        while time.monotonic() < hard_stop:
            # Between kills, look at the queue every 0.1 s: on a quiet machine four workers
            # drain half a batch well within the 1-2 s between kills.
            wake = time.monotonic() + rng.uniform(*kill_every_s)
            while (left := wake - time.monotonic()) > 0:
                time.sleep(min(0.1, left))
                if soaking():
                    top_up()
            working = _working_pids()
            if minutes and soak_until is None and working:
                soak_until = time.monotonic() + minutes * 60
            if soaking():
                top_up()
            elif fq.stats(WORK).counts["succeeded"] >= total:
                break
            # A worker still starting up (seconds on a busy machine) holds nothing: kill one that works.
            ready = [w for w in live if w.pid in working]
            if not ready:
                continue
            _kill_and_replace(ready[rng.randrange(len(ready))], live, everyone, start, outcome)
            if progress and time.monotonic() - last_note > 5:
                last_note = time.monotonic()
                _log(progress, f"kill-storm: {fq.stats(WORK).counts['succeeded']}/{total} succeeded, {outcome.kills} kills")
        drained = _wait_drained([WORK], max(60.0, hard_stop - time.monotonic()), progress, "kill-storm")
        if not drained:
            outcome.problems.append("the queue was not drained in time")
    finally:
        _stop_all(live, outcome.problems)
        for w in everyone:
            if w.alive():
                w.kill()
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(everyone)]
    outcome.report = invariants.check([WORK], visibility_ms=visibility_ms, drained=True)
    outcome.notes = {"workers": workers, "concurrency": concurrency, "visibility_ms": visibility_ms, "processes": len(everyone)}
    if outcome.kills == 0:
        outcome.problems.append("no worker was killed: the storm finished before its first kill (use more jobs)")
    outcome.took_s = time.monotonic() - started
    return outcome


def _working_pids(lease_table: str = "fqchaos_lease") -> set[int]:
    """Pids of the worker processes that hold a lease row of ``lease_table`` (the pid is in the lease's worker id).

    ``fqchaos_lease`` (the chaos log: every process that has claimed a job) by default;
    ``django_fq_lease``: the processes holding a live lease now.
    """
    if lease_table not in ("fqchaos_lease", "django_fq_lease"):
        raise ValueError(lease_table)
    with connection.cursor() as cur:
        cur.execute(f"SELECT DISTINCT worker FROM {lease_table}")
        pids = set()
        for (worker,) in cur.fetchall():
            parts = worker.split(":")
            if len(parts) >= 3 and parts[-2].isdigit():
                pids.add(int(parts[-2]))
        return pids


# --- database restart ------------------------------------------------------------------------------------------


def _pg_cluster() -> tuple[str, str] | None:
    if not shutil.which("pg_ctlcluster") or not os.path.isdir("/etc/postgresql"):
        return None
    return sorted(os.listdir("/etc/postgresql"))[-1], "main"


def restart_postgres() -> None:
    """``pg_ctlcluster --skip-systemctl-redirect <version> main restart``; waits until it accepts connections."""
    cluster = _pg_cluster()
    if cluster is None:
        raise RuntimeError("no Debian-style PostgreSQL cluster (pg_ctlcluster) to restart")
    done = subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", cluster[0], cluster[1], "restart"],
                          capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"pg_ctlcluster restart failed: {done.stderr.strip()}")
    for _ in range(120):
        if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]).returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError("PostgreSQL did not accept connections 60 s after its restart")


#: The Debian init script reaches the server with this file's account; without it, it can neither stop nor ping it.
DEBIAN_CNF = "/etc/mysql/debian.cnf"
MARIADBD = "/usr/sbin/mariadbd"


def _mariadb_admin(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    admin = shutil.which("mariadb-admin") or shutil.which("mysqladmin") or "mysqladmin"
    return subprocess.run([admin, "-h", "127.0.0.1", "-P", "3306", "-u", "root", "--connect-timeout=2", *args],
                          capture_output=True, text=True, timeout=timeout)


def _mariadb_service() -> bool:
    """True when the local MariaDB server can be restarted: by its service, or stopped and started directly."""
    if shutil.which("service") and os.path.exists("/etc/init.d/mariadb") and os.path.exists(DEBIAN_CNF):
        return True
    return os.access(MARIADBD, os.X_OK) and os.geteuid() == 0


def restart_mariadb() -> None:
    """Restart the local MariaDB server (every session on it ends); waits until it accepts connections.

    ``service mariadb restart`` where the init script can administer the server
    (it needs ``/etc/mysql/debian.cnf``). Where it cannot (a server started by
    hand, as in the development container), the same two steps directly: a
    clean ``mariadb-admin shutdown`` (root over TCP), then ``mariadbd`` started
    again in a session of its own, with the server's own configuration.
    Raises RuntimeError when either step fails or the server does not answer
    60 s later. A ``max_allowed_packet`` raised at run time (``SET GLOBAL``, as
    .ci/run does for the 32 MiB payload tests) is set again afterwards: a
    restart would otherwise give the tests that follow the configured value.
    """
    packet = _max_allowed_packet()
    if shutil.which("service") and os.path.exists("/etc/init.d/mariadb") and os.path.exists(DEBIAN_CNF):
        done = subprocess.run(["service", "mariadb", "restart"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"service mariadb restart failed: {(done.stderr or done.stdout).strip()[-500:]}")
    else:
        if not os.access(MARIADBD, os.X_OK):
            raise RuntimeError(f"no {DEBIAN_CNF} for the init script and no {MARIADBD} to start")
        down = _mariadb_admin("shutdown", timeout=300)  # returns once the server has stopped
        if down.returncode != 0:
            raise RuntimeError(f"mariadb-admin shutdown failed: {down.stderr.strip()}")
        for _ in range(120):
            if _mariadb_admin("ping").returncode != 0:
                break
            time.sleep(0.5)
        subprocess.Popen([MARIADBD], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    for _ in range(120):
        if _mariadb_admin("ping").returncode == 0:
            if packet is not None and _max_allowed_packet() != packet:
                _mysql_root(f"SET GLOBAL max_allowed_packet = {packet}")
            return
        time.sleep(0.5)
    raise RuntimeError("MariaDB did not accept connections 60 s after its restart")


def _mysql_root(sql: str) -> subprocess.CompletedProcess:
    client = shutil.which("mariadb") or shutil.which("mysql") or "mysql"
    return subprocess.run([client, "-h", "127.0.0.1", "-P", "3306", "-u", "root", "--connect-timeout=2", "-N", "-e", sql],
                          capture_output=True, text=True, timeout=60)


def _max_allowed_packet() -> int | None:
    """The server's global ``max_allowed_packet`` in bytes (``None`` when it cannot be read)."""
    done = _mysql_root("SELECT @@GLOBAL.max_allowed_packet")
    try:
        return int(done.stdout.strip()) if done.returncode == 0 else None
    except ValueError:
        return None


def _restarter():
    """``(name, restart function)`` for the database Django is connected to; RuntimeError when it cannot be restarted."""
    vendor = connection.vendor
    if vendor == "postgresql":
        if _pg_cluster() is None:
            raise RuntimeError("no Debian-style PostgreSQL cluster (pg_ctlcluster) to restart")
        return "PostgreSQL", restart_postgres
    if vendor == "mysql":
        if not _mariadb_service():
            raise RuntimeError("no way to restart the local MariaDB server (service mariadb, or mariadbd as root)")
        return "MariaDB", restart_mariadb
    raise RuntimeError("the database restart scenario needs a database server (PostgreSQL or MariaDB)")


def db_restart(
    out: Path,
    *,
    seconds: float = 30.0,
    restarts: int = 2,
    workers: int = 2,
    producers: int = 2,
    concurrency: int = 4,
    visibility_ms: int = 3000,
    progress=None,
) -> Outcome:
    """Producers and workers run while the database server is restarted ``restarts`` times; all recover by themselves.

    Producers (separate processes) enqueue one job at a time, each with its
    own idempotency token, and repeat a token after a database error until it
    goes through. ``seconds`` count from the moment every worker serves and
    every producer has enqueued; the restarts are spread over their first 80 %.
    Checked: every invariant, every producer's token is exactly one job, every
    worker saw the outage and reconnected, and no worker process died.
    PostgreSQL is restarted with ``pg_ctlcluster``, MariaDB with ``service mariadb restart``.
    """
    server, restart = _restarter()
    started = time.monotonic()
    _fresh([WORK])
    invariants.install()
    fq.configure(WORK, max_attempts=1000, backoff_ms=0, visibility_ms=visibility_ms)
    outcome = Outcome("db-restart", invariants.Report([WORK]))
    logs = out / "db-restart"
    pool = [
        procs.worker(WORK, logs / f"worker-{n}.log", f"--concurrency={concurrency}", f"--visibility={visibility_ms}", *FAST,
                     env={"FQ_CHAOS_TAG": f"w{n}"})
        for n in range(workers)
    ]
    makers = [
        procs.actor("producer", logs / f"producer-{n}.log", f"--queues={WORK}", f"--seconds={seconds + 600}",
                    f"--stop-file={logs / 'producers.stop'}", "--sequential",
                    "--retry-db-errors", f"--name=p{n}-", "--pace-ms=2", f"--out={logs / f'producer-{n}.json'}")
        for n in range(producers)
    ]
    stop_file = logs / "producers.stop"
    try:
        # The clock starts once every worker serves and every producer has enqueued (start-up takes seconds).
        for w in pool:
            w.wait_ready(120)
        _wait(lambda: all(_read_jsonl(logs / f"producer-{n}.json.jsonl") for n in range(producers)), 120,
              "every producer to enqueue")
        ready_at = time.monotonic()
        for k in range(restarts):
            at = ready_at + seconds * 0.8 * (k + 1) / (restarts + 0.5)
            time.sleep(max(0.0, at - time.monotonic()))
            _log(progress, f"db-restart: restarting {server} ({k + 1}/{restarts})")
            connections.close_all()
            try:
                restart()
            except RuntimeError as exc:  # the scenario could run, but the restart itself failed: a failure
                outcome.problems.append(f"restarting {server} failed: {exc}")
                break
            connections.close_all()
            outcome.restarts += 1
        time.sleep(max(0.0, ready_at + seconds - time.monotonic()))
        stop_file.write_text("stop")
        for m in makers:
            code = m.wait(300)
            if code != 0:
                outcome.problems.append(f"producer pid {m.pid} exited {code}:\n{m.text()[-1500:]}")
        if not _wait_drained([WORK], 300, progress, "db-restart"):
            outcome.problems.append("the queue was not drained in time")
        for w in pool:
            if not w.alive():
                outcome.problems.append(f"worker pid {w.pid} died (exit {w.proc.returncode}):\n{w.text()[-1500:]}")
            elif not w.count(r"worker\.db_error "):
                outcome.problems.append(f"worker pid {w.pid} never saw the outage")
            elif not w.count(r"worker\.reconnected "):
                outcome.problems.append(f"worker pid {w.pid} never logged that it reconnected")
    except (TimeoutError, AssertionError) as exc:
        outcome.problems.append(str(exc))
    finally:
        stop_file.write_text("stop")
        _stop_all([w for w in pool if w.alive()], outcome.problems)
        for p in makers + pool:
            if p.alive():
                p.kill()
    records, survived = [], 0
    for n in range(producers):
        records += _read_jsonl(logs / f"producer-{n}.json.jsonl")
        summary = _read_json(logs / f"producer-{n}.json")
        survived += summary.get("db_errors_survived", 0)
        if summary.get("unexpected_count"):
            outcome.problems += [f"producer {n}: {u}" for u in summary["unexpected"]]
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(pool + makers)]
    connections.close_all()
    outcome.report = invariants.check([WORK], visibility_ms=visibility_ms, drained=True, producers=records)
    tokens = {r["token"] for r in records}
    uids = {r["id"] for r in records}
    if len(tokens) != len(uids) or outcome.report.jobs != len(uids):
        outcome.problems.append(f"{len(tokens)} tokens enqueued, {len(uids)} job ids returned, {outcome.report.jobs} jobs inserted")
    outcome.notes = {"enqueues": len(records), "producer_db_errors_survived": survived,
                     "handler_runs_failed_by_the_outage": outcome.report.failed_runs,
                     "worker_db_errors": sum(w.count(r"worker\.db_error ") for w in pool)}
    outcome.took_s = time.monotonic() - started
    return outcome


def _read_jsonl(path: Path) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# --- network partition ----------------------------------------------------------------------------------------


def _wait(predicate, timeout: float, what: str):
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def partition(out: Path, *, lease_ms: int = 2000, cut_s: float | None = None, rounds: int = 1, followups: int = 20,
              progress=None) -> Outcome:
    """A worker in its own network namespace is cut off mid-job for longer than its lease.

    Per round: worker A (namespace) claims J1 and J2 and has extended their
    leases at least once; the link is cut; J1's handler returns at once, so
    its ack leaves over the dead link; J2's handler keeps running. Worker B
    (host, started after the cut) takes both jobs once their leases expired
    and acks them. After ``cut_s`` (default 3 leases) the link comes back:
    A's ack of J1 must be refused as stale, and so must its heartbeat's
    extend of J2 (sent during the cut, it lands after the heal); J2's handler
    must have been told its lease was lost, and A must carry on: B stops,
    ``followups`` new jobs are all run and acked by A.
    """
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    if connection.vendor != "postgresql":
        raise RuntimeError("the partition scenario needs PostgreSQL (SQLite is a local file)")
    cut_s = cut_s or 3 * lease_ms / 1000
    started = time.monotonic()
    _fresh([PART])
    invariants.install()
    fq.configure(PART, max_attempts=20, backoff_ms=0, visibility_ms=lease_ms)
    outcome = Outcome("partition", invariants.Report([PART]))
    logs = out / "partition"
    logs.mkdir(parents=True, exist_ok=True)
    events = logs / "events.jsonl"
    refusals = {"ack": 0, "extend": 0}
    worker_args = ("--concurrency=2", f"--visibility={lease_ms}", *FAST)
    with Partition() as net:
        env = {"FQ_TEST_PG_HOST": net.host, "FQ_TEST_PG_PORT": str(net.port), "FQ_CHAOS_TAG": "A"}
        a = procs.worker(PART, logs / "worker-A.log", *worker_args, prefix=net.prefix, env=env, name="worker A (namespace)")
        everyone = [a]
        try:
            # Warm A up: its runner, completer and heartbeat threads all hold a connection before any cut.
            warm = [r.id for r in fq.enqueue_many(PART, [{"payload": {"mode": "warm"}} for _ in range(4)])]
            _wait(lambda: all(fq.get(PART, i).state == "succeeded" for i in warm), 60, "worker A to run its first jobs")
            for k in range(rounds):
                cut, heal = logs / f"cut-{k}", logs / f"heal-{k}"
                j1 = fq.enqueue(PART, {"mode": "ack_into_cut", "cut": str(cut), "events": str(events)}).id
                j2 = fq.enqueue(PART, {"mode": "hold", "heal": str(heal), "events": str(events)}).id

                def started_in_a(job_id):
                    return any(e["ev"] == "start" and e["id"] == job_id and e["tag"] == "A" for e in _read_jsonl(events))

                _wait(lambda j1=j1, j2=j2: started_in_a(j1) and started_in_a(j2), 60, "worker A to start J1 and J2")
                _wait(lambda j2=j2: _extended(j2), 30, "worker A's heartbeat to extend J2 once")
                net.cut()
                cut_at = time.monotonic()
                cut.write_text("cut")
                _log(progress, f"partition round {k + 1}: link down")
                b = procs.worker(PART, logs / f"worker-B-{k}.log", *worker_args, env={"FQ_CHAOS_TAG": f"B{k}"}, name=f"worker B{k}")
                everyone.append(b)
                _wait(lambda j1=j1, j2=j2: fq.get(PART, j1).state == fq.get(PART, j2).state == "succeeded", 60, "worker B to finish J1 and J2")
                time.sleep(max(0.0, cut_at + cut_s - time.monotonic()))
                net.heal()
                heal.write_text("heal")
                _log(progress, f"partition round {k + 1}: link up after {time.monotonic() - cut_at:.1f}s")
                ack_refused = _wait(lambda j1=j1: a.count(rf"job\.not_settled .*job={j1}.*code=invalid_receipt"), 90,
                                    "worker A's stale ack of J1 to be refused")
                refusals["ack"] += ack_refused
                _wait(lambda j2=j2: any(e["ev"] == "end" and e["id"] == j2 and e["tag"] == "A" for e in _read_jsonl(events)), 60,
                      "J2's handler in worker A to end")
                # A's heartbeat sent an extend of J2 during the cut (it beats several times per lease); the
                # call hung on the dead link and reaches the database after the heal, past J2's deadline.
                refusals["extend"] += _wait(lambda j2=j2: a.count(rf"job\.lease_lost .*job={j2}.*reason=invalid_receipt"), 60,
                                            "worker A's stale extend of J2 to be refused")
                ends = [e for e in _read_jsonl(events) if e["ev"] == "end" and e["id"] == j2 and e["tag"] == "A"]
                if not ends or not ends[-1]["lost"]:
                    outcome.problems.append(f"J2's handler in worker A was not told its lease was lost: {ends}")
                if b.stop(60) != 0:
                    outcome.problems.append(f"worker B{k} did not exit 0 after SIGTERM:\n{b.text()[-1500:]}")
                more = [r.id for r in fq.enqueue_many(PART, [{"payload": {"mode": "after"}} for _ in range(followups)])]
                _wait(lambda more=more: all(fq.get(PART, i).state == "succeeded" for i in more), 120, "worker A to run the follow-up jobs")
                by = _run_pids(more)
                if set(by) != {a.pid} or sum(by.values()) != followups:
                    outcome.problems.append(f"follow-up jobs were run by pids {by}, expected all by worker A ({a.pid})")
            if not a.alive():
                outcome.problems.append(f"worker A died:\n{a.text()[-1500:]}")
        except TimeoutError as exc:
            outcome.problems.append(str(exc))
        finally:
            _stop_all([p for p in everyone if p.alive()], outcome.problems)
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(everyone)]
    outcome.report = invariants.check([PART], visibility_ms=lease_ms, drained=True)
    for verb in ("ack", "extend"):
        if refusals[verb] < rounds:
            outcome.problems.append(f"worker A's stale {verb} was refused {refusals[verb]} times in {rounds} rounds")
    outcome.notes = {"rounds": rounds, "cut_s": cut_s, "lease_ms": lease_ms, "stale_acks_refused": refusals["ack"],
                     "stale_extends_refused": refusals["extend"], "zombie_runs_told": outcome.report.zombie_overlaps,
                     "forwarded_connections": net.forwarder.connections if net.forwarder else 0}
    outcome.took_s = time.monotonic() - started
    return outcome


def _extended(job_id: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM fqchaos_extend e JOIN fqchaos_job j ON j.seq = e.job_seq WHERE j.uid = %s", [job_id])
        return cur.fetchone()[0] > 0


def _run_pids(job_ids: list[str]) -> dict[int, int]:
    marks = ", ".join(["%s"] * len(job_ids))
    with connection.cursor() as cur:
        cur.execute(f"SELECT pid, COUNT(*) FROM fqchaos_run WHERE job_uid IN ({marks}) GROUP BY pid", job_ids)
        return dict(cur.fetchall())


# --- stress -------------------------------------------------------------------------------------------------------


def stress(
    out: Path,
    *,
    seconds: float = 120.0,
    producers: int = 8,
    consumers: int = 4,
    reapers: int = 2,
    extend_ms: int = 1500,
    seed: int = 1,
    progress=None,
) -> Outcome:
    """Producers, consumers, reapers and a prune loop race on two queues (one with a concurrency limit).

    Producers (``producers`` threads in two processes) share one space of
    idempotency tokens and one of unique keys; consumers (two processes)
    claim with short leases and ack, nack, extend, release or abandon;
    reapers and a pruner (retention 0–500 ms) loop. Afterwards the leftovers
    are drained (claimed and acked) so nothing stays pending. Checked: no
    exception other than django-fq's own errors reached any caller (no
    deadlock, serialization failure or "database is locked"), and every
    invariant, including one job per token.
    """
    started = time.monotonic()
    _fresh(STRESS)
    invariants.install()
    for q in STRESS:
        fq.configure(q, max_attempts=3, backoff_ms=5, max_backoff_ms=50, visibility_ms=1000,
                     concurrency=3 if q.endswith("limited") else 0)
    outcome = Outcome("stress", invariants.Report(list(STRESS)))
    logs = out / "stress"
    qs = ",".join(STRESS)
    common = (f"--queues={qs}", f"--seconds={seconds}", f"--extend-ms={extend_ms}")
    plan = []
    half = max(1, producers // 2)
    plan += [("producer", n, half if n == 0 else producers - half) for n in range(2 if producers > 1 else 1)]
    chalf = max(1, consumers // 2)
    plan += [("consumer", n, chalf if n == 0 else consumers - chalf) for n in range(2 if consumers > 1 else 1)]
    plan += [("reaper", 0, reapers), ("pruner", 0, 1)]
    actors = []
    for role, n, threads in plan:
        if threads <= 0:
            continue
        path = logs / f"{role}-{n}.json"
        actors.append((role, n, path, procs.actor(role, logs / f"{role}-{n}.log", *common, f"--threads={threads}",
                                                  f"--seed={seed * 10 + n}", f"--out={path}")))
    everyone = [p for *_, p in actors]
    try:
        give_up = time.monotonic() + seconds + 120
        for role, n, _path, proc in actors:
            try:
                code = proc.wait(max(1.0, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = "timeout"
            if code != 0:
                outcome.problems.append(f"{role} {n} exited {code}:\n{proc.text()[-1500:]}")
    finally:
        for p in everyone:
            if p.alive():
                p.kill()
    records, ops, errors = [], {}, {}
    for role, n, path, _proc in actors:
        summary = _read_json(path)
        for k, v in summary.get("ops", {}).items():
            ops[k] = ops.get(k, 0) + v
        for k, v in summary.get("errors", {}).items():
            errors[k] = errors.get(k, 0) + v
        if summary.get("unexpected_count"):
            outcome.problems.append(f"{role} {n}: {summary['unexpected_count']} unexpected errors reached the caller")
            outcome.problems += [f"{role} {n}: {u}" for u in summary["unexpected"][:5]]
        if role == "producer":
            records += _read_jsonl(Path(str(path) + ".jsonl"))
    _log(progress, f"stress: actors done ({ops.get('ack', 0)} acks); draining what is left")
    drained = _drain(STRESS, timeout_s=120)
    if not drained:
        outcome.problems.append("the leftovers were not drained in time")
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(everyone)]
    outcome.report = invariants.check(list(STRESS), visibility_ms=extend_ms, drained=True, producers=records)
    outcome.notes = {"ops": ops, "fq_errors": errors, "enqueue_results": len(records)}
    for needed in ("enqueue", "enqueue_many", "claim", "ack", "nack", "extend", "release", "abandon", "reap", "prune"):
        if not ops.get(needed):
            outcome.problems.append(f"no {needed} happened: the stress did not exercise it")
    outcome.took_s = time.monotonic() - started
    return outcome


def _drain(queues, timeout_s: float) -> bool:
    """Claim and ack (recording each run) until nothing is scheduled, ready or running in ``queues``."""
    give_up = time.monotonic() + timeout_s
    pid = os.getpid()
    while time.monotonic() < give_up:
        if _active(queues) == 0:
            return True
        fq.reap()
        got = 0
        for q in queues:
            jobs = fq.claim(q, count=200, visibility_ms=60_000, worker="chaos-drain")
            if not jobs:
                continue
            started = invariants.now_ms()
            invariants.record_runs([(j.id, j.claimed_at, j.attempts, started, j.deadline) for j in jobs], tag="drain", pid=pid)
            fq.ack_many(q, [(j.receipt, {"drained": True}) for j in jobs])
            got += len(jobs)
        if not got:
            time.sleep(0.05)
    return False


# --- SQLite with a busy writer -----------------------------------------------------------------------------------


def sqlite_writer(out: Path, *, jobs: int = 3000, workers: int = 4, concurrency: int = 2, minutes: float | None = None,
                  hold_ms: float = 5.0, progress=None) -> Outcome:
    """4 worker processes drain ``jobs`` jobs on SQLite while a thread of the app writes its own table in a loop.

    The writer holds each of its write transactions ``hold_ms`` and rests as
    long between them, so the workers keep meeting a locked database. Checked:
    no "database is locked" (or any other error) reached the writer or any
    worker log, and every invariant. With ``minutes`` more batches are fed
    until that time is up.
    """
    if connection.vendor != "sqlite":
        raise RuntimeError("the SQLite scenario needs SQLite")
    started = time.monotonic()
    _fresh([WORK])
    invariants.install()
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS fqchaos_writer")
        cur.execute("CREATE TABLE fqchaos_writer (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL, touched INTEGER NOT NULL)")
    fq.configure(WORK, max_attempts=1000, backoff_ms=0, visibility_ms=5000)
    outcome = Outcome("sqlite-writer", invariants.Report([WORK]))
    logs = out / "sqlite-writer"
    fq.enqueue_many(WORK, [{"payload": {"sleep_ms": 0}} for _ in range(jobs)])
    total = jobs
    stop = threading.Event()
    writer = {"transactions": 0, "errors": []}

    def write_loop():
        n = 0
        try:
            while not stop.is_set():
                try:
                    with transaction.atomic(), connection.cursor() as cur:
                        cur.execute("INSERT INTO fqchaos_writer (n, touched) VALUES (%s, 0)", [n])
                        time.sleep(hold_ms / 1000)
                        cur.execute("UPDATE fqchaos_writer SET touched = touched + 1 WHERE id = (SELECT MAX(id) FROM fqchaos_writer)")
                    writer["transactions"] += 1
                except Exception as exc:
                    writer["errors"].append(f"{type(exc).__name__}: {exc}")
                n += 1
                time.sleep(hold_ms / 1000)
        finally:
            connections.close_all()

    thread = threading.Thread(target=write_loop, name="chaos-writer", daemon=True)
    thread.start()
    pool = [
        procs.worker(WORK, logs / f"worker-{n}.log", f"--concurrency={concurrency}", "--visibility=5000", *FAST,
                     env={"FQ_CHAOS_TAG": f"w{n}"})
        for n in range(workers)
    ]
    try:
        soak_until = started + minutes * 60 if minutes else None
        while soak_until is not None and time.monotonic() < soak_until:
            time.sleep(1)
            s = fq.stats(WORK)
            if s.counts["ready"] < jobs // 2:
                fq.enqueue_many(WORK, [{"payload": {"sleep_ms": 0}} for _ in range(jobs)])
                total += jobs
        if not _wait_drained([WORK], max(120.0, total / 10), progress, "sqlite-writer"):
            outcome.problems.append("the queue was not drained in time")
    finally:
        stop.set()
        thread.join(60)
        _stop_all([w for w in pool if w.alive()], outcome.problems)
    outcome.problems += [f"the app's writer failed: {e}" for e in writer["errors"][:20]]
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(pool)]
    if writer["transactions"] == 0:
        outcome.problems.append("the writer never committed")
    outcome.report = invariants.check([WORK], visibility_ms=5000, drained=True)
    outcome.notes = {"writer_transactions": writer["transactions"], "writer_errors": len(writer["errors"])}
    outcome.took_s = time.monotonic() - started
    return outcome


SCENARIOS = {
    "kill-storm": kill_storm,
    "db-restart": db_restart,
    "partition": partition,
    "stress": stress,
    "sqlite-writer": sqlite_writer,
    # Its own PostgreSQL (a Patroni cluster it starts), whatever the database this process is on.
    "patroni-failover": lambda out, **kw: _failover.scenario(out, **kw),
}


def cleanup_logs(out: Path) -> None:
    """Remove the log files of a passing run (pytest keeps failing runs' logs in its tmp dir)."""
    for path in glob.glob(str(out / "**" / "*.log"), recursive=True):
        os.remove(path)
