"""The :class:`Worker`: checks its arguments, assembles its parts, runs them, and shuts them down.

The parts (each in its own module, each given the worker) are:

=================  ============================================================  ===========================
part               what it does                                                  module
=================  ============================================================  ===========================
``hand``           the jobs in hand and the counts, under one lock               :mod:`.state`
``doorbell``       wakes the claim loop (notification, finished job, stop)       :mod:`.state`
``loop``           claim loop: free slots, fair claims, waits, when to stop      :mod:`.loop`
``loops``          one claim loop per database alias (several aliases only)      :mod:`.loop`
``pool``           runs the handlers (threads and an event loop, or child processes) :mod:`.runner`, :mod:`.aio`, :mod:`.procpool`
``completer``      acks plain successes in batches                               :mod:`.completer`
``settler``        acks/nacks one run, releases at shutdown, retries             :mod:`.settle`
``heartbeat``      extends leases, marks lost ones                               :mod:`.heartbeat`
``reaping``        reaper thread(s) (or ``None``): expiry, pruning, schedule     :mod:`.reaper`
``presence``       the worker's registry rows: start, heartbeat, shutdown        :mod:`.presence`
``events``         the subscribers (metrics, tracing, yours)                     :mod:`.events`
=================  ============================================================  ===========================

Shutdown (:meth:`Worker.request_stop`, SIGTERM/SIGINT with
``install_signals``): no claim is made any more; running jobs get
``grace_s`` seconds to finish (and are settled normally); the rest are
released with ``error="shutdown"`` (ready again at once, the attempt given
back) and :meth:`Worker.run` returns. A second signal ends the process at
once; the leases then expire. ``kill -9`` loses nothing: the leases expire
and the reaper requeues.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from .. import handlers as registry
from .. import routing, validation, wakeup
from ..exceptions import InvalidArgument, WorkerConfigError
from ..middleware import chain_for
from ..services import history
from ..types import SettleResult
from . import batch as batches
from .aio import default_pool
from .completer import Completer, Completers
from .events import Events, WorkerStarted, WorkerStopped, WorkerStopping, subscribe_all
from .heartbeat import Heartbeat
from .logs import emit
from .loop import MAX_CLAIM, AliasLoops, ClaimLoop
from .options import DEFAULT_SOFT_TIMEOUT_MS, MAX_PREFETCH, MAX_SOFT_TIMEOUT_MS, POOLS
from .presence import Presence
from .reaper import Reaper
from .runner import RunnerPool, execute
from .settle import Settler
from .state import Doorbell, InHand, Outcome, Running, SharedDoorbell, WorkerStats

#: The end of the worker's "no handler" errors: where a new user registers one.
_WHERE_HANDLERS_GO = (
    "register one with @handler('<queue>') in the fq_handlers module of an installed app, "
    "or in FQ_HANDLERS (see docs/quickstart.md)"
)


def _pool_factory(pool: str | Callable[[Worker], RunnerPool] | None) -> Callable[[Worker], RunnerPool]:
    """The callable building the worker's runner pool from the ``pool`` argument of :class:`Worker`."""
    if pool is None or pool == "threads":
        return default_pool  # threads, and an event loop for async def handlers
    if pool == "processes":
        from .procpool import ProcessPool  # imported only by the workers that use it

        return ProcessPool
    if not callable(pool):
        raise WorkerConfigError("pool must be 'threads', 'processes' or a callable building a RunnerPool")
    return pool


def make_worker_id() -> str:
    """A worker id for leases and logs: ``hostname:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Worker:
    """Serve ``queues`` with their registered handlers until stopped.

    Args:
        queues: queue names to serve; ``None`` or empty serves every queue with
            a registered handler. A queue without a handler is a
            :class:`WorkerConfigError`.
        concurrency: jobs run at once (runner threads, or async handlers on the event loop), 1–1000.
        prefetch: jobs claimed ahead of a free runner thread, 0–10000 (default 0).
            Their leases run (and are extended) while they wait, so keep it
            small unless jobs are short: it lets tiny jobs be claimed in
            large batches without hundreds of threads.
        visibility_ms: lease length of each claim; ``None`` uses each queue's policy.
        poll_interval_ms: first pause when a round found no work; doubles while
            idle up to ``max_poll_interval_ms``.
        reaper_interval_ms: run ``services.reap()`` this often (``reaper=False`` disables).
        prune_interval_ms: run ``services.prune()`` this often (0 disables), with the reaper.
        grace_s: after a stop request, how long running jobs may still finish.
        heartbeat_fraction: extend a lease each time this fraction of its visibility passed.
        burst: return once nothing is eligible and no job is running.
        max_jobs: claim at most this many jobs, then return when they are done.
        worker_id: id recorded on leases; default ``hostname:pid:random``. At most
            200 characters of text that encodes as UTF-8, without NUL.
        handlers: ``{queue: callable}`` to use instead of the registry (tests, embedding).
        install_signals: handle SIGTERM/SIGINT (only from the main thread).
        supervisor_pid: stop gracefully when the parent process is no longer this pid.

        subscribers: event subscribers to add at once: callables (every event) or
            ``(callable, EventType, ...)`` tuples (see :mod:`django_fq.worker.events`);
            more can subscribe through ``worker.events.subscribe``.
        pool: where the handlers run: ``"threads"`` (default: in this process, from
            :func:`~django_fq.worker.aio.default_pool`: the
            :class:`~django_fq.worker.runner.ThreadPool` when every handler is sync, an event
            loop (:class:`~django_fq.worker.aio.AsyncioPool`) for ``async def`` handlers, both
            when the worker serves both kinds), ``"processes"``
            (:class:`~django_fq.worker.procpool.ProcessPool`: ``concurrency`` child
            processes, a job past its ``timeout_ms`` killed with its child), or a
            callable ``pool(worker)`` building a :class:`~django_fq.worker.runner.RunnerPool`.
        soft_timeout_ms: process pool only: raise :class:`~django_fq.exceptions.SoftTimeout`
            in the handler this many ms before the kill at the job's timeout (capped at
            half the timeout; 0: none). 0 – 604,800,000; default 1000.
        max_jobs_per_child: process pool only: replace a child after this many jobs
            (``None``: never); at least 1.

    Raises:
        WorkerConfigError: a queue without a handler or with an invalid name, an invalid
            ``worker_id``, ``visibility_ms`` outside 1 ms - 24 h, ``max_jobs`` below 1,
            ``concurrency``/``prefetch``/``heartbeat_fraction`` out of range, handler
            middleware that does not import, is not callable, or is async-only for a sync handler.
    """

    def __init__(
        self,
        queues: Iterable[str] | None = None,
        *,
        concurrency: int = 1,
        prefetch: int = 0,
        visibility_ms: int | None = None,
        poll_interval_ms: int = 200,
        max_poll_interval_ms: int = 1000,
        reaper_interval_ms: int = 1000,
        prune_interval_ms: int = 60_000,
        reaper: bool = True,
        grace_s: float = 30.0,
        heartbeat_fraction: float = 1 / 3,
        burst: bool = False,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        handlers: dict[str, Callable] | None = None,
        install_signals: bool = False,
        supervisor_pid: int | None = None,
        subscribers: Iterable[Any] = (),
        pool: str | Callable[[Worker], RunnerPool] | None = None,
        soft_timeout_ms: int = DEFAULT_SOFT_TIMEOUT_MS,
        max_jobs_per_child: int | None = None,
    ):
        known = registry.registered() if handlers is None else dict(handlers)
        wanted = list(dict.fromkeys(queues or ()))
        # What reaches the database is checked here, once: a value every claim would refuse
        # must stop the worker at start, not make each claim fail while jobs stay ready.
        for name in wanted:
            if not isinstance(name, str) or not validation.QUEUE_NAME.fullmatch(name):
                raise WorkerConfigError(f"invalid queue name {name!r}: use 1-200 characters from [A-Za-z0-9:._-]")
        if worker_id is not None:
            try:
                validation.worker_id(worker_id)
            except InvalidArgument:
                raise WorkerConfigError(
                    "worker_id must be at most 200 characters of valid text (UTF-8, no NUL)"
                ) from None
        if visibility_ms is not None:
            try:
                validation.visibility(visibility_ms)
            except InvalidArgument as exc:
                raise WorkerConfigError(f"visibility_ms: {exc.message}") from None
        if max_jobs is not None and (not isinstance(max_jobs, int) or max_jobs < 1):
            raise WorkerConfigError("max_jobs must be at least 1")
        if not wanted:
            wanted = sorted(known)
            if not wanted:
                raise WorkerConfigError(f"no handlers are registered, so there is no queue to serve; {_WHERE_HANDLERS_GO}")
        missing = [q for q in wanted if q not in known]
        if missing:
            raise WorkerConfigError(
                f"no handler is registered for queue(s): {', '.join(missing)}; {_WHERE_HANDLERS_GO}"
            )
        if not 1 <= concurrency <= MAX_CLAIM:
            raise WorkerConfigError(f"concurrency must be between 1 and {MAX_CLAIM}")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise WorkerConfigError(f"prefetch must be between 0 and {MAX_PREFETCH}")
        if not 0 < heartbeat_fraction < 1:
            raise WorkerConfigError("heartbeat_fraction must be between 0 and 1")
        if not isinstance(soft_timeout_ms, int) or not 0 <= soft_timeout_ms <= MAX_SOFT_TIMEOUT_MS:
            raise WorkerConfigError(f"soft_timeout_ms must be between 0 and {MAX_SOFT_TIMEOUT_MS}")
        if max_jobs_per_child is not None and (not isinstance(max_jobs_per_child, int) or max_jobs_per_child < 1):
            raise WorkerConfigError("max_jobs_per_child must be at least 1")
        if isinstance(pool, str) and pool not in POOLS:
            raise WorkerConfigError("pool must be 'threads', 'processes' or a callable building a RunnerPool")
        self.queues: list[str] = wanted
        self.handlers: dict[str, Callable] = {q: known[q] for q in wanted}
        #: What a run calls per queue: the handler inside its middleware (django_fq.middleware), built once here.
        self.chains: dict[str, Callable] = {q: chain_for(q, fn) for q, fn in self.handlers.items()}
        self.concurrency = concurrency
        self.prefetch = prefetch
        #: ``{queue: batch size}`` of the queues with a batch handler (django_fq.worker.batch).
        try:
            self.batches: dict[str, int] = batches.batch_sizes(self)
        except ValueError as exc:
            raise WorkerConfigError(str(exc)) from None
        batches.check_worker(self, pool)
        #: Jobs in hand at most: running, plus claimed ahead and waiting for a runner thread
        #: (plus, for each batch queue, its running batches and one claimed ahead).
        self.capacity = concurrency + prefetch + batches.extra_capacity(self)
        self.visibility_ms = visibility_ms
        self.poll_interval_s = max(0, poll_interval_ms) / 1000
        self.max_poll_interval_s = max(self.poll_interval_s, max_poll_interval_ms / 1000)
        self.reaper_interval_s = max(0, reaper_interval_ms) / 1000
        self.prune_interval_s = max(0, prune_interval_ms) / 1000
        self.reaper = reaper
        self.grace_s = max(0.0, grace_s)
        self.heartbeat_fraction = heartbeat_fraction
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or make_worker_id()
        self.install_signals = install_signals
        self.supervisor_pid = supervisor_pid
        self.soft_timeout_ms = soft_timeout_ms
        self.max_jobs_per_child = max_jobs_per_child

        self.stopping = False
        self.stop_reason = ""
        self._stop_requested_at: float | None = None
        self._stopping_published = False
        #: Set once the worker's helper threads are to end (heartbeat, reaper).
        self.done = threading.Event()
        self.events = Events()
        subscribe_all(self.events, subscribers)
        #: The database aliases of the served queues (``FQ_QUEUE_DATABASES``), ``FQ_DATABASE`` first when it holds some;
        #: one claim loop, listener, completer and reaper thread per alias. ``[]`` without the setting (the current alias then).
        groups = routing.group_by_alias(wanted) if routing.enabled() else {}
        self.aliases: list[str] = list(groups)
        # One alias: the one claim loop on the main thread, as without the setting.
        self.doorbell: Doorbell = SharedDoorbell() if len(groups) > 1 else Doorbell()
        self.hand = InHand(self.doorbell)
        self.settler = Settler(self)
        self.heartbeat = Heartbeat(self)
        self.completer: Completer | Completers = Completers(self, self.aliases) if len(self.aliases) > 1 else Completer(self)
        self.reaping: Reaper | None = Reaper(self) if reaper else None
        self.pool: RunnerPool = _pool_factory(pool)(self)
        #: Runs the batches of the batch queues (``None`` when the worker serves none).
        self.batch_runner: batches.BatchRunner | None = batches.BatchRunner(self) if self.batches else None
        #: The claim loops, one per alias, when the queues are on two aliases or more (else ``None``).
        self.loops: AliasLoops | None = None
        if len(groups) > 1:
            self.loops = AliasLoops(self, groups)
            self.doorbell.linked = self.loops.doorbells  # type: ignore[attr-defined]
            #: The claim loop (with several, the first alias's: signals and the supervisor check go through it).
            self.loop = self.loops.loops[0]
        else:
            self.loop = ClaimLoop(self)
        #: This worker's rows in the worker registry (django_fq.worker.presence).
        self.presence = Presence(self)
        self._listener: wakeup.Listener | None = None
        self._listeners: list[wakeup.Listener] = []
        self._subscribed: list[tuple[wakeup.Listener, ClaimLoop]] = []

    # --- public control -----------------------------------------------------------------------

    @property
    def stats(self) -> WorkerStats:
        """What this worker did so far (updated as it runs)."""
        return self.hand.stats

    def request_stop(self, reason: str = "stopped") -> None:
        """Stop claiming now; running jobs get ``grace_s`` to finish (safe from any thread or a signal handler)."""
        if not self.stopping:
            self.stop_reason = reason
            self._stop_requested_at = time.monotonic()
            self.stopping = True
        self.doorbell.wake()
        self.heartbeat.poke()
        self._publish_stopping(self.stop_reason)

    def stop(self) -> None:
        """Same as :meth:`request_stop`."""
        self.request_stop("stopped")

    @property
    def running_count(self) -> int:
        """Jobs in hand (claimed and not yet settled or released)."""
        return len(self.hand)

    # --- the steps a subclass used to wrap (kept for it; new code subscribes to events) ----------

    def claim_into(self, queue: str, count: int) -> int:
        """Claim up to ``count`` jobs of ``queue`` in one call and hand them to the runner pool; return how many."""
        loops = self.loops
        return (self.loop if loops is None else loops.by_queue[queue]).claim_into(queue, count)

    def execute(self, running: Running) -> Outcome:
        """Run the handler of the job's queue on its context; never raises."""
        return execute(self, running)

    def settle(self, running: Running, outcome: Outcome) -> SettleResult | None:
        """Settle one finished job (see :meth:`Settler.settle <django_fq.worker.settle.Settler.settle>`)."""
        return self.settler.settle(running, outcome)

    # --- the run --------------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Serve until stopped, out of work (``burst``) or past ``max_jobs``; return the counts."""
        if self.install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.loop.on_signal)
        if self.aliases:
            for alias in self.aliases:
                with routing.using(alias):
                    self._listeners.append(wakeup.listener())  # one per alias: each database notifies its own
        else:
            self._listeners.append(wakeup.listener())
        self._listener = self._listeners[0]
        # Each listener rings the claim loop of its alias (with one loop, the only one).
        loops = self.loops.loops if self.loops is not None else [self.loop]
        self._subscribed = list(zip(self._listeners, loops, strict=True))
        for one, loop in self._subscribed:
            one.subscribe(loop.on_notify)
        self.presence.register()  # listed before it claims, and before the start line
        if self.events.wants(WorkerStarted):
            self.events.publish(WorkerStarted(self))  # before the start line: whoever sees it sees a serving worker
        emit(
            logging.INFO,
            "worker.start",
            worker=self.worker_id,
            pid=os.getpid(),
            queues=",".join(self.queues),
            concurrency=self.concurrency,
            visibility_ms=self.visibility_ms or "policy",
            burst=self.burst,
            reaper=self.reaper,
            wakeup=",".join("listen" if one.active else "poll" for one in self._listeners),
            **({"claim_loops": len(self.loops.loops)} if self.loops is not None else {}),
        )
        reason = "stopped"
        try:
            self._start_threads()
            reason = self.loop.run() if self.loops is None else self.loops.run()
        finally:
            self._publish_stopping(reason)
            self._finish()
            emit(
                logging.INFO,
                "worker.stop",
                worker=self.worker_id,
                reason=reason,
                ok=self.stats.ok,
                failed=self.stats.failed,
                not_settled=self.stats.settle_errors,
                timed_out=self.stats.timed_out,
                released=self.stats.released,
            )
            if self.events.wants(WorkerStopped):
                self.events.publish(WorkerStopped(self, reason))
        return self.stats

    def _publish_stopping(self, reason: str) -> None:
        """Tell the subscribers, once, that no claim will be made any more."""
        if self._stopping_published:
            return
        self._stopping_published = True
        if self.events.wants(WorkerStopping):
            self.events.publish(WorkerStopping(self, reason))

    @property
    def _threads(self) -> list[threading.Thread]:
        """Every thread this worker started (runners, completer, heartbeat, reaper, the claim loops of several aliases)."""
        completers = self.completer.threads if isinstance(self.completer, Completers) else [self.completer.thread]
        parts = [*completers, self.heartbeat.thread, *(self.reaping.threads if self.reaping else [])]
        lanes = self.batch_runner.threads if self.batch_runner is not None else []
        loops = self.loops.threads if self.loops is not None else []
        return self.pool.threads + lanes + loops + [t for t in parts if t is not None]

    def _start_threads(self) -> None:
        self.pool.start()
        if self.batch_runner is not None:
            self.batch_runner.start()
        self.completer.start()
        self.heartbeat.start()
        if self.reaping is not None:
            self.reaping.start()
        self.presence.start()

    # --- shutdown -----------------------------------------------------------------------------

    def _finish(self) -> None:
        """Let running jobs finish within the grace period, release the rest, stop the helper threads."""
        hand, settler = self.hand, self.settler
        # Jobs claimed ahead that no runner thread has started: give them back now,
        # not after the running ones finish (another worker can take them at once).
        with hand.lock:
            waiting = {seq: r for seq, r in hand.jobs.items() if not r.begun and not r.settling}
            for running in waiting.values():
                running.settling = True
        for running in waiting.values():
            settler.release(running, "shutdown")
        if waiting:
            hand.free(list(waiting))
        if len(hand):
            give_up = (self._stop_requested_at or time.monotonic()) + self.grace_s
            emit(logging.INFO, "worker.draining", worker=self.worker_id, running=len(hand), grace_s=max(0.0, give_up - time.monotonic()))
            with self.doorbell.cv:
                while hand.jobs and time.monotonic() < give_up:
                    self.doorbell.cv.wait(min(0.1, give_up - time.monotonic()))
        with hand.lock:
            left = [r for r in hand.jobs.values() if not r.settling]
        for running in left:
            if hand.take(running):
                settler.release(running, "shutdown")
        self.done.set()
        self.pool.stop()
        if self.batch_runner is not None:
            self.batch_runner.stop()
        self.completer.stop()
        self.heartbeat.poke()
        completers = self.completer.threads if isinstance(self.completer, Completers) else [self.completer.thread]
        reapers = self.reaping.threads if self.reaping else []  # one, or one per alias of the served queues
        for thread in (*completers, self.heartbeat.thread, *reapers):
            if thread is not None:
                thread.join(timeout=10)
        for one, loop in self._subscribed:
            one.unsubscribe(loop.on_notify)
        self.presence.stop()  # every job settled or released: the row goes
        # The minutes this process tallied and has not written (docs/reference/history.md).
        try:
            history.flush()
        except Exception:  # never stops a shutdown: the history is a view
            logging.getLogger(__name__).exception("history not written at shutdown")
        connections.close_all()
