"""Tools of the adversarial tests: run a call on another thread (own connection), see lock waits.

Lock waits are looked up in the server's own views (PostgreSQL ``pg_stat_activity``; InnoDB's
``INNODB_TRX`` joined to the process list on MariaDB/MySQL), limited to this test database.
"""

from __future__ import annotations

import contextlib
import threading
import time

from django.db import connection, connections, transaction


class Background:
    """Run ``fn`` on a thread with its own database connection; keep its value or exception."""

    def __init__(self, fn, name: str = "adv-background"):
        self.fn = fn
        self.value = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()

    def start(self) -> Background:
        self.thread.start()
        return self

    def join(self, timeout: float = 30.0) -> Background:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.thread.name} still running after {timeout}s"
        return self


def run_elsewhere(fn, timeout: float = 30.0) -> Background:
    """Run ``fn`` on another thread (another connection) and wait for it."""
    return Background(fn).start().join(timeout)


#: Per vendor: sessions of this database, other than the asking one, waiting for a lock right now.
#: InnoDB lists row-lock waits in INNODB_TRX (trx_state 'LOCK WAIT'); a metadata-lock wait (DDL,
#: LOCK TABLES) shows only in the process list's state. The server is shared, so both are limited
#: to this test database (the process list's DB).
_LOCK_WAITERS_SQL = {
    "postgresql": (
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ),
    "mysql": (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST p "
        "LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID "
        "WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() "
        "AND (t.trx_state = 'LOCK WAIT' OR p.STATE LIKE 'Waiting for%%lock%%')"
    ),
}


#: Seconds between two looks. InnoDB refreshes its INFORMATION_SCHEMA lock views only when they were
#: last read more than 0.1 s ago, so reading them faster would keep showing the first picture.
_POLL_S = {"mysql": 0.15}


def lock_waiters(alias: str = "default") -> int:
    """Sessions of this test database (``alias``) waiting for a lock right now (PostgreSQL, MariaDB/MySQL)."""
    conn = connections[alias]
    with conn.cursor() as cur:
        cur.execute(_LOCK_WAITERS_SQL[conn.vendor])
        return cur.fetchone()[0]


def wait_for_lock_waiter(n: int = 1, timeout: float = 10.0, thread: Background | None = None) -> None:
    """Block until ``n`` other sessions wait on a lock (the racing call reached its blocking point).

    Uses a connection of its own (the calling thread may be inside a transaction it must not disturb).
    """
    result = {}

    def look():
        give_up = time.monotonic() + timeout
        pause = _POLL_S.get(connections["default"].vendor, 0.01)
        while time.monotonic() < give_up:
            if thread is not None and not thread.thread.is_alive():
                result["ok"] = "finished"
                return
            if lock_waiters() >= n:
                result["ok"] = "waiting"
                return
            time.sleep(pause)

    run_elsewhere(look, timeout + 5)
    assert result.get("ok"), f"no session started waiting for a lock within {timeout}s"


__all__ = ["Background", "lock_waiters", "run_elsewhere", "wait_for_lock_waiter"]


class repeatable_read:
    """A transaction of the caller's at REPEATABLE READ whose snapshot is taken on entry (a read of ``table``)."""

    def __init__(self, table: str = "django_fq_queue"):
        self.table = table

    def __enter__(self):
        if connection.vendor == "mysql":
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute(f"SELECT COUNT(*) FROM {self.table}")  # the snapshot is taken here
            cur.fetchone()
        return self

    def __exit__(self, *exc):
        return self.atomic.__exit__(*exc)


#: The claim's first read of the queue's limits (services.leases._claim_once), before any lock.
LIMITS_READ = "SELECT concurrency, rate_limit, rate_window_ms, key_concurrency, key_rate_limit FROM"


@contextlib.contextmanager
def after_the_limits_read(fn):
    """Within the block, run ``fn`` elsewhere (and wait for it) right after this connection first reads a queue's limits.

    Yields the list that then holds ``fn``'s :class:`Background` (empty if the read never came).
    """
    done: list[Background] = []

    def hook(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not done and sql.startswith(LIMITS_READ):
            done.append(run_elsewhere(fn))
        return result

    with connection.execute_wrapper(hook):
        yield done
