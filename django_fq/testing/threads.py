"""A real :class:`~django_fq.worker.Worker` on a thread of the test process, stopped and joined at the end.

The worker's threads use connections of their own, so they see only what is
committed: use it in tests whose writes commit (pytest-django's
``transactional_db``, Django's ``TransactionTestCase``), not inside a test's
transaction, where :func:`~django_fq.testing.drain` is the tool.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.db import connections

from .. import handlers as registry
from .. import services, wakeup
from ..exceptions import WaitTimeout
from ..types import JobInfo
from ..worker import Worker, WorkerStats

#: How long :meth:`WorkerThread.stop` waits for the worker to return (seconds): its grace period, then this.
JOIN_TIMEOUT_S = 30.0


class WorkerThread:
    """A worker serving ``queues`` on a daemon thread (see :func:`worker_thread`).

    ``worker`` is the :class:`~django_fq.worker.Worker`; ``stats`` its counts.
    """

    def __init__(
        self, queues: Iterable[str] | None = None, *, handlers: dict[str, Callable] | None = None, **options: Any
    ):
        if handlers is None:
            registry.autodiscover()
        options.setdefault("poll_interval_ms", 20)  # an idle worker on SQLite or MariaDB looks again this often
        options.setdefault("max_poll_interval_ms", 100)
        options.setdefault("reaper", False)
        options.setdefault("grace_s", 10.0)
        self.worker = Worker(list(queues or ()) or None, handlers=handlers, **options)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fq-test-worker", daemon=True)

    @property
    def stats(self) -> WorkerStats:
        return self.worker.stats

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by stop()
            self._error = exc
        finally:
            connections.close_all()

    def start(self) -> WorkerThread:
        self._thread.start()
        return self

    def wait(self, queue: str, job_id: str, *, timeout_ms: int = 10_000) -> JobInfo:
        """Wait until the job succeeded, died or was cancelled (``services.wait``); return it.

        Raises :class:`~django_fq.WaitTimeout` after ``timeout_ms``, and the
        worker's own error at once if it stopped with one.
        """
        give_up = time.monotonic() + timeout_ms / 1000
        while True:
            self._raise_error()
            left = int((give_up - time.monotonic()) * 1000)
            try:
                return services.wait(queue, job_id, timeout_ms=max(0, min(left, 200)))
            except WaitTimeout:
                if left <= 200:
                    raise

    def stop(self) -> WorkerStats:
        """Ask the worker to stop, join its thread; re-raise what ended it, if anything; return its counts."""
        self.worker.request_stop("test over")
        give_up = time.monotonic() + self.worker.grace_s + JOIN_TIMEOUT_S
        # The worker's run() joins its helper threads; its runner threads end once they see the stop: join them too.
        for thread in [self._thread, *self.worker.pool.threads]:
            if thread.ident is not None:
                thread.join(timeout=max(0.0, give_up - time.monotonic()))
            if thread.is_alive():
                raise AssertionError(
                    f"the test worker's thread {thread.name} did not stop within {self.worker.grace_s + JOIN_TIMEOUT_S:.0f} s"
                )
        self._raise_error()
        return self.stats

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


@contextlib.contextmanager
def worker_thread(queues: Iterable[str] | None = None, **options: Any) -> Iterator[WorkerThread]:
    """Run a real worker on a thread for the ``with`` block; stop and join it at the end.

    Args:
        queues: the queues to serve (none: every queue with a handler).
        options: :class:`~django_fq.worker.Worker` arguments; the defaults
            here are a 20 ms first poll (100 ms at most), no reaper, a 10 s
            grace period.

    Yields the :class:`WorkerThread`. Leaving the block stops the worker
    (running jobs get the grace period), closes the wakeup listeners of the
    process (PostgreSQL holds one connection for them) and re-raises an error that ended the worker.
    """
    thread = WorkerThread(queues, **options).start()
    try:
        yield thread
    finally:
        try:
            thread.stop()
        finally:
            # The worker's wakeup listener (PostgreSQL: a connection of its own) would keep the
            # test database from being dropped at the end of the run; the next user starts a new one.
            wakeup.shutdown_all()
