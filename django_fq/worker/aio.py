"""``async def`` handlers: one event loop in one thread of the worker runs up to ``concurrency`` of them at once.

:class:`AsyncioPool` is a :class:`~django_fq.worker.runner.RunnerPool` whose
runner is an asyncio event loop (thread ``fq-asyncio``). The claim loop's
:meth:`~AsyncioPool.submit` hands each job to the loop with
``loop.call_soon_threadsafe``; the loop starts a task per job, and an
:class:`asyncio.Semaphore` of ``concurrency`` lets that many handlers run at
once (the rest, claimed ahead with ``--prefetch``, wait for a slot and are
given back at shutdown like a thread pool's). No thread is started per job.

Everything around the handler is the thread pool's code
(:meth:`RunnerPool.startable <django_fq.worker.runner.RunnerPool.startable>`,
:meth:`RunnerPool.end <django_fq.worker.runner.RunnerPool.end>`, the events and
:func:`~django_fq.worker.runner.failure_outcome`). :meth:`~RunnerPool.end` (the
hand-over to the completer, the settle, the check for a transaction the
handler left open, the connection tidying) may touch the database, so it runs
through ``asgiref``'s ``sync_to_async``: on the same thread as the Django
async ORM calls of the handlers (``await Model.objects.acreate(...)``), which is
the thread whose connection a handler may have left inside a transaction.

A lost lease — the job's ``timeout_ms`` reached, the job cancelled, the lease
expired, or the job given back at shutdown once the grace period is over —
cancels the handler's task (:class:`asyncio.CancelledError` at its current
``await``): unlike a thread, a task can be stopped, and its result would not be
stored anyway. The run then counts as a lost lease, as in a thread.

A worker that serves both kinds of handler runs both pools
(:class:`SplitPool`): sync handlers on the ``concurrency`` runner threads,
async ones on the loop. ``--concurrency`` is shared through the worker's hand:
the worker holds at most ``concurrency + prefetch`` jobs of either kind, so with
the default ``--prefetch 0`` at most ``concurrency`` handlers run at once,
sync and async together.

Handlers are classified once, at worker start (:func:`is_async_handler`). A
handler that decides per job — the Django Tasks runner, whose queues hold sync
and async ``@task`` functions alike — carries an async twin (``fq_async``) and
``fq_async_for(payload) -> bool`` (:func:`async_twin`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import connections

from ..exceptions import WorkerConfigError
from .context import _task_job, set_current_task
from .logs import emit, since, summary
from .runner import SKIP, START, RunnerPool, ThreadPool, failure_outcome, job_finished, job_started
from .state import Outcome, Running

if TYPE_CHECKING:
    from .core import Worker

#: The worker's logger (the receipt mask is installed on it by :mod:`.logs`).
log = logging.getLogger("django_fq.worker")


def is_async_handler(fn: Any) -> bool:
    """True when calling ``fn`` returns a coroutine: an ``async def`` function, a ``functools.partial``
    of one, a bound async method, or an object whose ``__call__`` is ``async def``.

    Also honours ``asgiref.sync.markcoroutinefunction`` (``inspect.markcoroutinefunction`` on 3.12+).
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    if _is_coroutine_function(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn) or isinstance(fn, type):
        return False
    call = getattr(fn, "__call__", None)  # noqa: B004 - an instance with an async __call__
    return call is not None and _is_coroutine_function(call)


def _is_coroutine_function(fn: Any) -> bool:
    from asgiref.sync import iscoroutinefunction  # knows asgiref's markcoroutinefunction

    return inspect.iscoroutinefunction(fn) or iscoroutinefunction(fn)


def async_twin(fn: Any) -> tuple[Callable, Callable[[Any], bool]] | None:
    """``(fq_async, fq_async_for)`` of a handler that picks sync or async per job, or ``None``.

    Such a handler (the Django Tasks runner) carries ``fq_async``, the coroutine function
    that runs a job on the loop, and ``fq_async_for(payload) -> bool``, which says, per job,
    whether to use it (``False``: the handler itself runs on a thread).
    """
    twin, pick = getattr(fn, "fq_async", None), getattr(fn, "fq_async_for", None)
    if callable(twin) and callable(pick) and is_async_handler(twin):
        return twin, pick
    return None


async def execute_async(worker: Worker, running: Running, handler: Callable) -> Outcome:
    """Await the async ``handler`` on the job's context, publishing its start and end; never raises.

    A cancellation while the lease is lost (the pool cancels the task then) is a ``lost``
    outcome; any other :class:`asyncio.CancelledError` the handler lets out is a failure.
    """
    context = running.context
    wait_ms, started = job_started(worker, running)
    token = set_current_task(context)
    try:
        result = await handler(context)
    except asyncio.CancelledError as exc:
        reason = running.state.lost_reason()
        if reason is not None:
            outcome = Outcome(
                "lost",
                error=f"the lease was lost ({reason}): the task was cancelled",
                summary=reason,
                elapsed_ms=since(started),
            )
        else:
            outcome = failure_outcome(exc, started)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not end the loop
        outcome = failure_outcome(exc, started)
    else:
        outcome = Outcome.ok(result, since(started))
    finally:
        _task_job.reset(token)
    job_finished(worker, running, outcome, wait_ms)
    return outcome


class AsyncioPool(RunnerPool):
    """One event loop, in thread ``fq-asyncio``, running up to ``worker.concurrency`` async handlers at once.

    Args:
        worker: the :class:`~django_fq.worker.Worker` whose async jobs run here.

    :meth:`submit` takes ``handler``: the coroutine function to run, already in its
    middleware (default: the queue's registered handler, which must then be async, in
    its middleware: :meth:`chain`).
    """

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()  # a strong reference: the loop keeps only weak ones
        self._in_handler: set[asyncio.Task] = set()
        self._stopping = False
        self._closing = False
        self._chains: dict[Any, Callable] = {}

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="fq-asyncio", daemon=True)
        self._thread.start()

    @property
    def threads(self) -> list[threading.Thread]:
        return [self._thread] if self._thread is not None else []

    def submit(self, seq: int, running: Running, handler: Callable | None = None) -> None:
        queue = running.claimed.queue
        fn = handler if handler is not None else self.chain(queue, self.worker.handlers[queue])
        assert self._loop is not None, "AsyncioPool.submit before start"
        self._loop.call_soon_threadsafe(self._spawn, seq, running, fn)

    def stop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop_when_idle)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def chain(self, queue: str, handler: Callable) -> Callable:
        """The coroutine function a job of ``queue`` runs with ``handler``: the handler inside its middleware.

        The queue's registered handler has its chain already (``worker.chains``, built at
        start); another one (an async twin, see :func:`async_twin`) gets the queue's
        middleware through :func:`django_fq.middleware.chain_for`, once. Raises
        :class:`~django_fq.exceptions.WorkerConfigError` for middleware that cannot wrap it.
        """
        if handler is self.worker.handlers.get(queue):
            return self.worker.chains[queue]
        key = (queue, handler)
        chained = self._chains.get(key)
        if chained is None:
            from .. import handlers
            from ..middleware import chain_for

            chained = self._chains[key] = chain_for(queue, handler, own=handlers.middleware_of(queue))
        return chained

    # --- on the loop's thread -------------------------------------------------------------------

    def _serve(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        self._slots = asyncio.Semaphore(self.worker.concurrency)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _spawn(self, seq: int, running: Running, handler: Callable) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._run(seq, running, handler), name=f"fq-job-{running.claimed.id}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self._stopping and not self._tasks:
            self._close()

    def _stop_when_idle(self) -> None:
        self._stopping = True
        if not self._tasks:
            self._close()

    def _close(self) -> None:
        assert self._loop is not None
        if not self._closing:
            self._closing = True
            self._loop.create_task(self._shut())

    async def _shut(self) -> None:
        try:
            # The thread of sync_to_async holds the async ORM's connections (and the settles').
            await sync_to_async(connections.close_all)()
        finally:
            assert self._loop is not None
            self._loop.stop()

    def _cancel(self, task: asyncio.Task) -> None:
        """The job's lease was lost: cancel its handler (if it is still in it)."""
        if task in self._in_handler:
            task.cancel()

    async def _run(self, seq: int, running: Running, handler: Callable) -> None:
        verdict, outcome = SKIP, None
        task = asyncio.current_task()
        assert task is not None and self._slots is not None and self._loop is not None
        try:
            async with self._slots:
                verdict = self.startable(running)
                if verdict is START:
                    loop = self._loop
                    self._in_handler.add(task)
                    running.state.on_lost = lambda: _call_soon(loop, self._cancel, task)
                    try:
                        reason = running.state.lost_reason() if running.state.lost.is_set() else None
                        if reason is not None:  # lost between startable() and the hook: do not start it
                            outcome = Outcome(
                                "lost",
                                error=f"the lease was lost ({reason}) before the handler started",
                                summary=reason,
                            )
                        else:
                            outcome = await execute_async(self.worker, running, handler)
                    finally:
                        self._in_handler.discard(task)
                        running.state.on_lost = None
        except BaseException as exc:  # the loop must survive anything (a cancel while waiting for a slot too)
            if verdict is START and outcome is None:
                log.exception("worker internal error")
                emit(logging.ERROR, "worker.internal_error", **running.where(), error=summary(exc))
                verdict = SKIP
        if verdict is SKIP:
            self.end(seq, running, verdict, outcome)  # frees the slot: no database work
            return
        # Settling and the open-transaction check need the database: the ORM's thread. A cancel
        # arriving now (a handler that swallowed one and got another) must not skip the end.
        ending = asyncio.ensure_future(sync_to_async(self.end)(seq, running, verdict, outcome))
        while not ending.done():
            try:
                await asyncio.shield(ending)
            except asyncio.CancelledError:
                continue


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nothing left to cancel
        pass


class SplitPool(RunnerPool):
    """A worker serving sync and async handlers: a :class:`ThreadPool` and an :class:`AsyncioPool` side by side.

    Each job goes to the pool of its queue's handler; a handler with an async twin
    (:func:`async_twin`) picks per job. See the module docstring for how ``--concurrency``
    is shared.
    """

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self.sync = ThreadPool(worker)
        self.aio = AsyncioPool(worker)
        self._async_queues = {q for q, fn in worker.handlers.items() if is_async_handler(fn)}
        self._twins: dict[str, tuple[Callable, Callable[[Any], bool]]] = {}
        for queue, fn in worker.handlers.items():
            twin = async_twin(fn)
            if twin is None:
                continue
            try:
                self._twins[queue] = (self.aio.chain(queue, twin[0]), twin[1])
            except WorkerConfigError as exc:
                # Middleware that is sync-only cannot wrap the twin: every job of the queue runs
                # the handler itself on a thread (the Tasks runner then uses async_to_sync).
                emit(logging.WARNING, "worker.async_off", queue=queue, reason=str(exc))

    def start(self) -> None:
        self.sync.start()
        self.aio.start()

    def submit(self, seq: int, running: Running) -> None:
        queue = running.claimed.queue
        if queue in self._async_queues:
            self.aio.submit(seq, running)
            return
        twin = self._twins.get(queue)
        if twin is not None:
            try:
                use_twin = twin[1](running.claimed.payload)
            except Exception as exc:  # noqa: BLE001 - a picker bug must not end the claim loop: run the handler
                emit(logging.ERROR, "worker.internal_error", **running.where(), step="fq_async_for", error=summary(exc))
                use_twin = False
            if use_twin:
                self.aio.submit(seq, running, twin[0])
                return
        self.sync.submit(seq, running)

    def stop(self) -> None:
        self.sync.stop()
        self.aio.stop()

    @property
    def threads(self) -> list[threading.Thread]:
        return self.sync.threads + self.aio.threads


def default_pool(worker: Worker) -> RunnerPool:
    """The pool a worker runs its handlers on when none is given.

    Only sync handlers: the :class:`ThreadPool` (unchanged). Only async handlers:
    the :class:`AsyncioPool` alone (no runner threads). Both, or a handler that picks
    per job: the :class:`SplitPool`.
    """
    kinds = [is_async_handler(fn) for fn in worker.handlers.values()]
    routed = any(async_twin(fn) is not None for fn in worker.handlers.values())
    if not routed and kinds and all(kinds):
        return AsyncioPool(worker)
    if routed or any(kinds):
        return SplitPool(worker)
    return ThreadPool(worker)
