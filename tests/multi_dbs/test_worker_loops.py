"""One ``fq_worker`` process, one claim loop and reaper thread per database alias: a database down or hung, each alias's wakeup and poll.

Run with ``tests.settings_multi_dbs`` (see ``tests/test_queues_over_databases.py``). Each test
starts a real worker process on the parent's three databases and waits for what it says
(its log lines) and for what it did (the job rows, read with plain SQL on each alias).
docs/how-to/queues-over-databases.md "Workers".
"""

from __future__ import annotations

import re
import socket
import threading

import pytest
from django.db import connections, transaction

from django_fq import db as fq_db
from django_fq import routing, scheduler
from django_fq import services as fq
from django_fq.models import QueueMinute
from django_fq.services import history
from django_fq.worker import Worker
from tests.chaos.netns import Forwarder
from tests.multi_dbs.test_multi_dbs import ALIASES, job_rows
from tests.worker.helpers import WorkerProc, wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=ALIASES)


def child_env(**extra: str) -> dict:
    """The environment of a worker child on this test's three databases."""
    return {
        "DJANGO_SETTINGS_MODULE": "tests.settings_multi_dbs",
        "FQ_CHILD_SECOND_DB_NAME": str(connections["second"].settings_dict["NAME"]),
        "FQ_CHILD_LITE_DB_NAME": str(connections["lite"].settings_dict["NAME"]),
        **extra,
    }


def states(alias: str, uids: list[str]) -> list[str]:
    """The state of each job of ``uids`` on ``alias`` (``"-"`` for a missing row)."""
    return [(job_rows(alias, uid) or [("", "-")])[0][1] for uid in uids]


def in_thread(fn):
    """``fn()`` called on a thread of its own (its own connections, closed after), its answer returned."""
    out = []

    def run():
        try:
            out.append(fn())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert out, "the call on another thread failed"
    return out[0]


class _Silent:
    """A TCP port on loopback that accepts connections and never answers (a server that hangs)."""

    def __init__(self, port: int):
        self.server = socket.create_server(("127.0.0.1", port))
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="gate-silent", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._held.append(client)

    def close(self) -> None:
        """Stop accepting and cut the held connections (their clients then read an end of stream)."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes its accept(), which holds the port
        except OSError:
            pass
        self.server.close()
        with self._lock:
            held, self._held = self._held, []
        for client in held:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            client.close()


class Gate:
    """A TCP port on loopback in front of a database server, forwarding while open (tests/chaos's forwarder).

    :meth:`shut` makes the server look gone (connections cut, new ones refused); :meth:`hang`
    makes it look hung (connections cut, new ones accepted and never answered); :meth:`open`
    forwards again, on the same port.
    """

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self._forwarder: Forwarder | None = Forwarder(("127.0.0.1", 0), self.upstream)
        self._silent: _Silent | None = None
        self.port = self._forwarder.address[1]

    def _bind(self, make) -> None:
        """``make()`` a listener on this gate's port, once the old listening socket let go of it."""

        def bound() -> bool:
            try:
                make()
            except OSError:
                return False  # EADDRINUSE until the old accept thread let go of the port
            return True

        wait_until(bound, timeout=30, what=f"port {self.port} free again")

    def open(self) -> None:
        """Forward again, on the same port (a hang's held connections are cut first)."""
        self._unhang()

        def forward() -> None:
            self._forwarder = Forwarder(("127.0.0.1", self.port), self.upstream)

        self._bind(forward)

    def shut(self) -> None:
        """Cut every forwarded connection and refuse new ones (the server is gone, as far as a client can tell)."""
        self._unhang()
        if self._forwarder is not None:
            try:
                self._forwarder.server.shutdown(socket.SHUT_RDWR)  # wakes its accept(), which holds the port
            except OSError:
                pass
            self._forwarder.close()
            self._forwarder = None

    def hang(self) -> None:
        """Cut every forwarded connection, then accept new ones and never answer (a server that hangs)."""
        self.shut()

        def silent() -> None:
            self._silent = _Silent(self.port)

        self._bind(silent)

    def _unhang(self) -> None:
        if self._silent is not None:
            self._silent.close()
            self._silent = None


def second_outage() -> tuple[bool, Gate | None, dict]:
    """How a test takes database "second" away from a worker child: ``(on_sqlite, gate, env)``.

    SQLite: the test's open transaction on "second" holds the file's write lock, and the child's
    busy timeout there is 1 s, so each of its statements on "second" fails "database is locked".
    A server: the child reaches it through a :class:`Gate` on loopback, which the test shuts (or
    makes hang).
    """
    if connections["second"].vendor == "sqlite":
        return True, None, child_env(FQ_CHILD_SECOND_TIMEOUT="1")
    second = connections["second"].settings_dict
    gate = Gate(second["HOST"] or "127.0.0.1", int(second["PORT"]))
    return False, gate, child_env(FQ_CHILD_SECOND_PORT=str(gate.port))


def test_a_database_that_is_down_stops_only_its_own_loop_which_reconnects_by_itself():
    on_sqlite, gate, env = second_outage()
    proc = WorkerProc("--queue", "t.ok", "--queue", "t2.ok", "--queue", "lite:ok", "--concurrency", "4", env=env)
    outage, held = transaction.atomic(using="second"), False
    try:
        start = proc.wait_for(r"worker\.start ", timeout=120)
        assert "claim_loops=3" in start, start
        warm = fq.enqueue("t2.ok", {"n": -1}).id  # the worker's connection to "second" is made
        wait_until(lambda: states("second", [warm]) == ["succeeded"], timeout=120, what="second reached")
        if on_sqlite:
            outage.__enter__()
            held = True
        else:
            gate.shut()
        stuck = [fq.enqueue("t2.ok", {"n": i}).id for i in range(3)]  # the test's own connection
        proc.wait_for(r"worker\.db_error .*step=claim .*database=second", timeout=120)
        # The other databases' jobs, enqueued while "second" is down, are claimed and done.
        # (From another thread: this one's open transaction on "second" would refuse them.)
        done = in_thread(
            lambda: {
                a: [fq.enqueue(q, {"n": i}).id for i in range(3)] for a, q in (("default", "t.ok"), ("lite", "lite:ok"))
            }
        )
        for alias, uids in done.items():
            wait_until(
                lambda a=alias, u=uids: states(a, u) == ["succeeded"] * 3, timeout=120, what=f"{alias}'s jobs done"
            )
        assert states("second", stuck) == ["queued"] * 3
        errors = [line for line in proc.lines if "worker.db_error" in line and "step=claim" in line]
        assert errors and all("database=second" in line for line in errors), errors
        pauses = [float(re.search(r"retry_in_s=([0-9.]+)", line).group(1)) for line in errors]
        assert pauses[0] == 0.25 and pauses == sorted(pauses), pauses  # its own backoff, growing
        # The database comes back: its loop reconnects by itself and claims its jobs.
        if on_sqlite:
            held = False
            outage.__exit__(None, None, None)
        else:
            gate.open()
        proc.wait_for(r"worker\.reconnected .*step=claim .*database=second", timeout=120)
        wait_until(lambda: states("second", stuck) == ["succeeded"] * 3, timeout=120, what="second's jobs done")
        proc.signal()
        assert proc.wait(timeout=120) == 0, proc.stderr
    finally:
        if held:
            outage.__exit__(None, None, None)
        if proc.alive():
            proc.kill()
        if gate is not None:
            gate.shut()


def test_each_databases_wakeup_reaches_its_own_claim_loop():
    listening = connections["second"].vendor == "postgresql"
    # PostgreSQL: a poll far longer than the wait below, so only second's LISTEN can wake its loop.
    poll = "90000" if listening else "300"
    proc = WorkerProc(
        "--queue", "t.ok", "--queue", "t2.ok", "--poll-interval", poll, "--max-poll-interval", poll,
        "--verbosity", "2", env=child_env(),
    )  # fmt: skip
    try:
        start = proc.wait_for(r"worker\.start ", timeout=120)
        word = "listen" if listening else "poll"
        assert f"wakeup={word},{word}" in start and "claim_loops=2" in start, start
        # Both loops found nothing and sleep on their own doorbells.
        for alias in ("default", "second"):
            proc.wait_for(rf"worker\.idle .*database={alias}", timeout=120)
        uid = fq.enqueue("t2.ok", {"n": 1}).id
        wait_until(lambda: states("second", [uid]) == ["succeeded"], timeout=45, what="the job on second done")
        claim = proc.wait_for(r"worker\.claim .*queue=t2\.ok", timeout=10)
        assert "got=1" in claim
        proc.signal()
        assert proc.wait(timeout=120) == 0, proc.stderr
    finally:
        if proc.alive():
            proc.kill()


def _waits(proc: WorkerProc, alias: str, start: int = 0) -> list[float]:
    rx = re.compile(rf"worker\.idle .*database={alias} .*wait_s=([0-9.]+)")
    return [float(m.group(1)) for line in proc.lines[start:] if (m := rx.search(line))]


def test_each_claim_loop_adapts_its_own_poll_interval():
    proc = WorkerProc(
        "--queue", "t.ok", "--queue", "t2.ok", "--poll-interval", "100", "--max-poll-interval", "3200",
        "--verbosity", "2", env=child_env(),
    )  # fmt: skip
    try:
        proc.wait_for(r"worker\.start ", timeout=120)
        # Idle, each loop doubles its poll interval; wait until both are well past the first.
        for alias in ("default", "second"):
            wait_until(
                lambda a=alias: max(_waits(proc, a), default=0) >= 0.8, timeout=120, what=f"{alias}'s poll grown"
            )
        mark = len(proc.lines)
        uid = fq.enqueue("t2.ok", {"n": 1}).id
        wait_until(lambda: states("second", [uid]) == ["succeeded"], timeout=60, what="the job on second done")
        # second's loop found work: its poll starts again from the first interval; default's
        # loop found none (the finished job only woke it) and keeps its longer one.
        wait_until(lambda: 0.1 in _waits(proc, "second", mark), timeout=60, what="second's poll reset")
        wait_until(lambda: _waits(proc, "default", mark), timeout=60, what="default idle again")
        assert min(_waits(proc, "default", mark)) >= 0.8, proc.lines[mark:]
        proc.signal()
        assert proc.wait(timeout=120) == 0, proc.stderr
    finally:
        if proc.alive():
            proc.kill()


# --- the reaper: one thread per database alias ---------------------------------------------------


def _abandoned_lease(queue: str, visibility_ms: int) -> str:
    """Enqueue one job into ``queue`` and claim it under a lease of ``visibility_ms`` that nobody settles; its id."""
    uid = fq.enqueue(queue, {"n": 0}, max_attempts=3).id
    claimed = fq.claim(queue, visibility_ms=visibility_ms, worker="test-abandons")
    assert [job.id for job in claimed] == [uid]
    return uid


def _past_deadline(alias: str, uid: str) -> bool:
    """Whether job ``uid``'s lease on ``alias`` is there and past its deadline (that database's clock)."""
    conn = connections[alias]
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM django_fq_lease l JOIN django_fq_job j ON j.seq = l.job_id "
            f"WHERE j.uid = %s AND l.deadline <= {fq_db.now_sql(conn)}",
            [uid],
        )
        return cur.fetchone()[0] == 1


def test_a_database_that_is_down_or_hung_stops_only_its_own_reaper_thread():
    on_sqlite, gate, env = second_outage()  # a server hangs: second's reaper thread blocks in its reconnect
    proc = WorkerProc(
        "--queue", "t.ok", "--queue", "t2.ok", "--queue", "lite:ok", "--reaper-interval", "100", env=env,
    )  # fmt: skip
    outage, held = transaction.atomic(using="second"), False
    try:
        proc.wait_for(r"worker\.start ", timeout=120)
        warm = fq.enqueue("t2.ok", {"n": -1}).id  # the worker's connections to "second" are made
        wait_until(lambda: states("second", [warm]) == ["succeeded"], timeout=120, what="second reached")
        # Second's reaper thread is at work before the outage: it reaps a lease nobody settles.
        first = _abandoned_lease("t2.reap0", 200)
        wait_until(lambda: states("second", [first]) == ["queued"], timeout=60, what="second's reaper thread reaping")
        line = proc.wait_for(r"reaper\.pass expired=1 .*database=second", timeout=10)
        first_pass = proc.lines.index(line)
        # A lease on second that ends during the outage: only second's reaper thread may handle it.
        stranded = _abandoned_lease("t2.reap", 1000)
        if on_sqlite:
            outage.__enter__()
            held = True
            proc.wait_for(r"worker\.db_error .*step=reap .*database=second", timeout=120)
        else:
            # From here on every statement of the worker on "second" fails or blocks; its reaper
            # thread's reconnect (db.retrying's) blocks in the connect, without a log line.
            gate.hang()
        # The other databases' reaper threads go on: each round's abandoned leases (a fresh
        # queue per round: a reaped job is ready again, and its queue's next claim would take
        # it) are handled. (From another thread: this one's transaction on "second" would refuse them.)
        for n in range(1, 4):
            uids = in_thread(
                lambda n=n: {
                    a: _abandoned_lease(q, 300) for a, q in (("default", f"t.reap{n}"), ("lite", f"lite:reap{n}"))
                }
            )
            for alias, uid in uids.items():
                wait_until(
                    lambda a=alias, u=uid: states(a, [u]) == ["queued"], timeout=60, what=f"{alias}'s lease {n} reaped"
                )
        # Second's lease is past its deadline and still held: nothing reaped it meanwhile.
        wait_until(lambda: _past_deadline("second", stranded), timeout=60, what="second's lease past its deadline")
        assert states("second", [stranded]) == ["running"]
        # The database comes back: its reaper thread reconnects by itself and handles the lease.
        if on_sqlite:
            held = False
            outage.__exit__(None, None, None)
        else:
            gate.open()
        wait_until(lambda: states("second", [stranded]) == ["queued"], timeout=120, what="second's lease reaped")
        proc.wait_for(r"reaper\.pass expired=1 .*database=second", start=first_pass + 1, timeout=10)
        if on_sqlite:
            proc.wait_for(r"worker\.reconnected .*step=reap .*database=second", timeout=120)
        failures = [line for line in proc.lines if "worker.db_error" in line and "step=reap" in line]
        assert all("database=second" in line for line in failures), failures
        for alias in ("default", "lite"):
            assert proc.count(rf"reaper\.pass expired=1 .*database={alias}") >= 3, proc.stderr
        proc.signal()
        assert proc.wait(timeout=120) == 0, proc.stderr
    finally:
        if held:
            outage.__exit__(None, None, None)
        if proc.alive():
            proc.kill()
        if gate is not None:
            gate.shut()


def _ok(job):
    return None


@pytest.mark.parametrize(
    ("queues", "names"),
    [(["t.ok", "t2.ok"], ["fq-reaper-default", "fq-reaper-second"]), (["t.ok"], ["fq-reaper"])],
    ids=["two-aliases", "one-alias"],
)
def test_the_reaper_runs_one_thread_per_alias_of_the_served_queues_all_joined_at_shutdown(queues, names):
    worker = Worker(queues, handlers=dict.fromkeys(queues, _ok), reaper_interval_ms=50, poll_interval_ms=50)
    reaping = worker.reaping
    assert reaping is not None and reaping.thread is None  # none before the run
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("stats", worker.run()))
    runner.start()
    try:
        wait_until(
            lambda: len(reaping.threads) == len(names) and all(t.is_alive() for t in reaping.threads),
            timeout=60,
            what="the reaper threads started",
        )
        assert [t.name for t in reaping.threads] == names
        assert reaping.thread is reaping.threads[0]
        assert set(names) <= {t.name for t in threading.enumerate()}
    finally:
        worker.request_stop("test over")
        runner.join(60)
    assert "stats" in out, "the worker's run did not return"
    assert not [t.name for t in reaping.threads if t.is_alive()]  # the shutdown joined every one


def _jobs_in(alias: str, queue: str) -> int:
    with connections[alias].cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM django_fq_job j JOIN django_fq_queue q ON q.id = j.queue_id WHERE q.name = %s",
            [queue],
        )
        return cur.fetchone()[0]


def test_run_due_of_one_alias_ticks_only_the_entries_whose_queue_is_there(settings):
    settings.FQ_SCHEDULE = {
        "on-default": {"overlap": "allow", "cron": "* * * * *", "queue": "t.cron", "timezone": "UTC"},
        "on-second": {"overlap": "allow", "cron": "* * * * *", "queue": "t2.cron", "timezone": "UTC"},
    }
    with routing.using("second"):  # as second's reaper thread calls it
        assert scheduler.run_due() == 1
    assert (_jobs_in("second", "t2.cron"), _jobs_in("default", "t.cron")) == (1, 0)
    with routing.using("default"):
        assert scheduler.run_due() == 1
    assert (_jobs_in("second", "t2.cron"), _jobs_in("default", "t.cron")) == (1, 1)


def test_flush_due_writes_the_minutes_of_the_aliases_asked_for_and_not_of_the_excluded(monkeypatch):
    queues = {"default": "t.hist", "second": "t2.hist", "lite": "lite:hist"}
    history.TALLY.discard()  # earlier tests' minutes
    for queue in queues.values():
        fq.enqueue(queue, {})  # tallied in this minute, not written yet
    monkeypatch.setattr(history, "GRACE_MS", -2 * history.MINUTE_MS)  # this minute counts as over

    def written() -> dict[str, int]:
        return {alias: QueueMinute.objects.using(alias).count() for alias in queues}

    assert written() == {"default": 0, "second": 0, "lite": 0}
    assert history.flush_due(aliases={"second"}) == 1  # second's reaper thread
    assert written() == {"default": 0, "second": 1, "lite": 0}
    assert history.flush_due(exclude={"lite"}) == 1  # the first thread, lite being served by another
    assert written() == {"default": 1, "second": 1, "lite": 0}
    assert history.flush_due() == 1  # one thread for every alias
    assert written() == {"default": 1, "second": 1, "lite": 1}
