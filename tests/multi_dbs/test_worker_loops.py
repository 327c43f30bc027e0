"""One ``fq_worker`` process, one claim loop per database alias: a database down, each alias's wakeup and poll.

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

from django_fq import services as fq
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


class Gate:
    """A TCP port on loopback in front of a database server, forwarding while open (tests/chaos's forwarder)."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self._forwarder: Forwarder | None = Forwarder(("127.0.0.1", 0), self.upstream)
        self.port = self._forwarder.address[1]

    def open(self) -> None:
        """Forward again, on the same port (once the old listening socket is gone)."""

        def bound() -> bool:
            try:
                self._forwarder = Forwarder(("127.0.0.1", self.port), self.upstream)
            except OSError:
                return False  # EADDRINUSE until the old accept thread let go of the port
            return True

        wait_until(bound, timeout=30, what=f"port {self.port} free again")

    def shut(self) -> None:
        """Cut every forwarded connection and refuse new ones (the server is gone, as far as a client can tell)."""
        if self._forwarder is not None:
            try:
                self._forwarder.server.shutdown(socket.SHUT_RDWR)  # wakes its accept(), which holds the port
            except OSError:
                pass
            self._forwarder.close()
            self._forwarder = None


def test_a_database_that_is_down_stops_only_its_own_loop_which_reconnects_by_itself():
    second = connections["second"].settings_dict
    on_sqlite = connections["second"].vendor == "sqlite"
    if on_sqlite:
        # SQLite: the test's open transaction holds the file's write lock; each claim of the
        # worker's "second" loop waits its busy timeout (1 s here), then fails "database is locked".
        gate, env = None, child_env(FQ_CHILD_SECOND_TIMEOUT="1")
    else:
        # A server: the worker reaches it through a gate on loopback that the test shuts.
        gate = Gate(second["HOST"] or "127.0.0.1", int(second["PORT"]))
        env = child_env(FQ_CHILD_SECOND_PORT=str(gate.port))
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
