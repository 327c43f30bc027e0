"""The process pool of ``fq_worker --pool processes``: each job runs in a child process the worker can kill.

A Python thread cannot be stopped from outside, so a handler stuck in C
code or a blocking call keeps a runner thread for ever, however far past
its ``timeout_ms``. :class:`ProcessPool` keeps ``concurrency`` long-lived
child processes instead, each served by one runner thread of the worker:

* the runner thread sends the child one job at a time over a pipe: the
  claimed job **without its receipt** (id, queue, payload, attempts,
  max_attempts, timestamps, deadline, and whatever else
  :meth:`JobContext.from_claim <django_fq.worker.JobContext.from_claim>`
  reads), and gets back how the handler ended (kind, result, error text
  with traceback, one-line summary);
* the worker keeps everything else: the lease and its heartbeat, the
  completer's batched acks, settling, the events. The child never sees a
  receipt and never settles;
* at ``--soft-timeout-ms`` before the job's timeout the runner signals the
  child (``SIGUSR1``): :class:`~django_fq.exceptions.SoftTimeout` is
  raised in the handler, on the child's main thread;
* when the lease is lost — the job's timeout passed (the heartbeat marks it
  ``timeout`` as for threads), an extend was refused, the job was
  cancelled, or shutdown released it — the runner kills the child
  (``SIGKILL``) and settles the run as lost, exactly as the thread pool
  settles a handler that returns after its timeout: not settled, counted in
  ``timed_out``, the attempt recorded as failed (history kind ``timeout``)
  by the reaper step and retried per the queue's policy;
* a child that dies by itself (a segfault, ``os._exit``) fails the attempt
  with an error naming its exit status; the next job gets a new child, as
  does every job after a kill, and after ``--max-jobs-per-child`` jobs.

Children start with multiprocessing's ``spawn`` method: a fresh interpreter
that imports Django, runs ``django.setup()`` and loads the handlers.
``fork`` would copy a process that has threads (heartbeat, completer,
runners) and open database connections, whose locks and sockets the copy
must never touch; ``forkserver`` starts faster but exists on POSIX only and
still needs the same setup in each child. A child starts once per runner
(and after a kill), so spawn's start-up cost (about a second) is not paid
per job.

A child dies with its worker: on Linux it asks the kernel for ``SIGKILL``
when its parent ends (``PR_SET_PDEATHSIG``), and everywhere a thread of the
child checks once a second that its parent is still the worker. It ignores
SIGINT and SIGTERM: the worker decides when it stops (Ctrl-C on a terminal
reaches the whole process group; the children must finish within the grace
period like threads, not die at once).
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import importlib
import inspect
import logging
import math
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
from multiprocessing.connection import wait as wait_any
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections

from .. import handlers as registry
from .. import procchild
from ..exceptions import LeaseLost, SoftTimeout, WorkerConfigError
from ..middleware import chain_for
from .context import JobContext, LeaseState, set_current
from .dbconn import abandon_open_transactions, tidy_connections
from .events import LeaseLostEvent
from .logs import emit, since, summary
from .runner import RunnerPool, failure_outcome, job_finished, job_started
from .state import Outcome, Running

if TYPE_CHECKING:
    from .core import Worker

#: The multiprocessing start method of the children (see the module docstring for why).
START_METHOD = "spawn"
#: How long a child may take to start (a fresh interpreter importing Django and the handlers), in seconds.
CHILD_START_S = 120.0
#: How long a child may take to exit once asked (or killed), in seconds.
CHILD_EXIT_S = 5.0
#: The signal that raises SoftTimeout in a child's handler (POSIX; ``None`` elsewhere).
SOFT_SIGNAL = getattr(signal, "SIGUSR1", None)
#: Longest wait of a runner thread between two looks at its job's lease, in seconds. A lost
#: lease wakes it at once (LeaseLostEvent); this bounds how late a timeout found by a later
#: heartbeat (an extend cut at the timeout) is seen for the soft timeout.
LOOK_S = 0.25
#: How long past the local end of a lease the runner marks it lost itself when the heartbeat
#: thread has not yet (it may be waiting on the database), in seconds.
LATE_S = 0.5
#: How often a child checks that its parent is still the worker (seconds; Linux needs no check).
PARENT_CHECK_S = 1.0
#: Linux ``prctl`` option: the signal a process gets when the thread that started it ends.
_PR_SET_PDEATHSIG = 1


class _Child:
    """One child process and the worker's end of its pipe (used by one runner thread only).

    ``soft`` is shared memory of two integers: the number of the job to stop with
    SoftTimeout (0: none) and the monotonic time of the kill in ms.
    """

    def __init__(self, process: Any, conn: Any, soft: Any):
        self.process = process
        self.conn = conn
        self.soft = soft
        self.jobs = 0  # jobs sent, also the number of the job it runs

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        """SIGKILL, wait for the end, close the pipe."""
        try:
            self.process.kill()
        except (OSError, ValueError):
            pass  # ended already
        self.process.join(CHILD_EXIT_S)
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle child to exit; kill it if it does not within :data:`CHILD_EXIT_S`."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(CHILD_EXIT_S)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


class _Slot:
    """What one runner thread owns: its child, and a pipe that wakes it when its job's lease is lost."""

    def __init__(self, index: int):
        self.index = index
        self.child: _Child | None = None
        self.running: Running | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.ready = threading.Event()
        self.error = ""

    def wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass  # full (a wake-up is pending anyway) or closed

    def close(self) -> None:
        for fd in (self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


class ProcessPool(RunnerPool):
    """``worker.concurrency`` runner threads, each running its jobs in a long-lived child process.

    Args:
        worker: the :class:`~django_fq.worker.Worker`; its ``soft_timeout_ms`` (ms before the
            kill at the timeout; at most half the job's timeout; 0: none) and
            ``max_jobs_per_child`` (``None``: never recycle) apply.

    Raises:
        WorkerConfigError: a handler a child process cannot import (defined in a function
            or in ``__main__``), or settings a child cannot load (no ``DJANGO_SETTINGS_MODULE``).
    """

    def __init__(self, worker: Worker):
        super().__init__(worker)
        if SOFT_SIGNAL is None:
            raise WorkerConfigError(
                "--pool processes needs a POSIX system (Linux, macOS): it signals and kills its children"
            )
        self._context: Any = multiprocessing.get_context(START_METHOD)
        self._spec = child_spec(worker)
        self._soft_s = worker.soft_timeout_ms / 1000
        self._max_jobs = worker.max_jobs_per_child
        self._work: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._slots: list[_Slot] = []
        self._local = threading.local()
        worker.events.subscribe(self._on_lost, LeaseLostEvent)

    # --- the RunnerPool interface ---------------------------------------------------------------

    def start(self) -> None:
        """Start the runner threads and their children; return once every child is ready.

        Raises:
            WorkerConfigError: a child could not start (its error in the message).
        """
        for n in range(self.worker.concurrency):
            slot = _Slot(n)
            self._slots.append(slot)
            # The runner thread starts its own child: PR_SET_PDEATHSIG ties a child to the thread that started it.
            thread = threading.Thread(target=self._runner, args=(slot,), name=f"fq-proc-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        give_up = time.monotonic() + CHILD_START_S + CHILD_EXIT_S
        for slot in self._slots:
            slot.ready.wait(max(0.0, give_up - time.monotonic()))
        errors = [
            slot.error or "it did not start in time" for slot in self._slots if slot.error or not slot.ready.is_set()
        ]
        if errors:
            self.stop()
            raise WorkerConfigError(f"--pool processes: a child process could not start: {errors[0]}")

    def submit(self, seq: int, running: Running) -> None:
        self._work.put((seq, running))

    def stop(self) -> None:
        for slot in self._slots:
            self._work.put(None)
            slot.wake()  # a job released at shutdown: kill its child now, not at the next look

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def execute(self, running: Running) -> Outcome:
        """Run the job's handler in this runner's child and publish its start and end; never raises."""
        worker = self.worker
        # Also makes the heartbeat the context's progress writer: the child's reports arrive over
        # the pipe and are stored from here as a thread's are (JobContext.progress).
        wait_ms, started = job_started(worker, running)
        slot: _Slot = self._local.slot
        slot.running = running
        try:
            outcome = self._run_in_child(slot, running, started)
        finally:
            slot.running = None
        child = slot.child
        if child is not None and self._max_jobs is not None and child.jobs >= self._max_jobs:
            child.stop()
            slot.child = None
        if slot.child is None and not worker.stopping:
            # A new child before this slot is free again: a job claimed into it must not wait
            # for a child to start while its timeout runs.
            self._replace(slot)
        job_finished(worker, running, outcome, wait_ms)
        return outcome

    # --- the runner threads ---------------------------------------------------------------------

    def _runner(self, slot: _Slot) -> None:
        self._local.slot = slot
        try:
            try:
                slot.child = self._start_child(slot)
            except Exception as exc:  # noqa: BLE001 - reported by start()
                slot.error = str(exc)
                return
            finally:
                slot.ready.set()
            while True:
                item = self._work.get()
                if item is None:
                    return
                self.run_one(*item)
        finally:
            if slot.child is not None:
                slot.child.stop()
                slot.child = None
            slot.close()
            connections.close_all()

    def _replace(self, slot: _Slot) -> None:
        if slot.child is not None:
            slot.child.kill()
            slot.child = None
        try:
            slot.child = self._start_child(slot)
        except Exception as exc:  # noqa: BLE001 - the next job tries again
            emit(logging.ERROR, "worker.child_error", worker=self.worker.worker_id, slot=slot.index, error=summary(exc))

    def _start_child(self, slot: _Slot) -> _Child:
        """Start a child process and wait until it is ready (its handlers loaded).

        Raises:
            RuntimeError: the child failed to set up (its error), ended, or was not ready in time.
        """
        ctx = self._context
        conn, child_conn = ctx.Pipe(duplex=True)
        soft = ctx.RawArray("q", 2)
        process = ctx.Process(target=procchild.main, args=(child_conn, soft, self._spec), name=f"fq-job-{slot.index}")
        process.start()
        child_conn.close()
        child = _Child(process, conn, soft)
        try:
            if not conn.poll(CHILD_START_S):
                raise RuntimeError(f"the child process was not ready within {CHILD_START_S:g} s")
            message = conn.recv()
        except EOFError:
            process.join(CHILD_EXIT_S)
            child.kill()
            raise RuntimeError(f"the child process ended while it started ({_exit_text(process.exitcode)})") from None
        except BaseException:
            child.kill()
            raise
        if message[0] != "ready":
            child.kill()
            raise RuntimeError(message[1])
        emit(logging.INFO, "worker.child_start", worker=self.worker.worker_id, slot=slot.index, pid=process.pid)
        return child

    def _send(self, slot: _Slot, job: tuple) -> _Child | None:
        """Send ``job`` to the slot's child (a new one if it is gone); the child, or ``None`` if none takes it."""
        for _ in range(2):
            child = slot.child
            if child is None or not child.alive():
                self._replace(slot)
                child = slot.child
                if child is None:
                    return None
            child.jobs += 1
            child.soft[0] = 0
            try:
                child.conn.send((child.jobs, *job))
                return child
            except (OSError, ValueError):
                child.kill()  # it died between two jobs: start another
                slot.child = None
        return None

    def _run_in_child(self, slot: _Slot, running: Running, started: float) -> Outcome:
        worker = self.worker
        state = running.state
        where = running.where()
        # The receipt never leaves this process.
        claimed = dataclasses.replace(running.claimed, receipt="")
        child = self._send(slot, (claimed, running.capped))
        if child is None:
            error = "no child process could be started to run the job (see worker.child_error)"
            return Outcome("failed", error=error, summary=error, elapsed_ms=since(started))
        soft_sent = self._soft_s <= 0
        while True:
            now = time.monotonic()
            reason = state.reason if state.lost.is_set() else None
            if reason is None and now >= state.expires_mono + LATE_S:
                # The heartbeat thread has not seen the end of this lease yet (busy with the database): as it would.
                reason = "timeout" if running.capped else "expired"
                if not worker.heartbeat.lost(running, reason):
                    reason = state.reason or reason
            if reason is not None:
                child.kill()
                slot.child = None
                emit(logging.WARNING, "job.killed", **where, pid=child.pid, reason=reason, ms=since(started))
                return Outcome("lost", error=str(LeaseLost(reason)), summary=reason, elapsed_ms=since(started))
            look = min(LOOK_S, max(0.0, state.expires_mono + LATE_S - now))
            if not soft_sent and running.capped:
                soft_at = state.expires_mono - self._soft_lead(running)
                if now >= soft_at:
                    soft_sent = True
                    child.soft[1] = int(state.expires_mono * 1000)
                    child.soft[0] = child.jobs
                    try:
                        os.kill(child.pid, SOFT_SIGNAL)  # type: ignore[arg-type]
                    except OSError:
                        pass  # it just ended: the sentinel says so
                    left = max(0, int((state.expires_mono - now) * 1000))
                    emit(logging.INFO, "job.soft_timeout", **where, pid=child.pid, kill_in_ms=left)
                else:
                    look = min(look, soft_at - now)
            ready = wait_any([child.conn, child.process.sentinel, slot.wake_r], look)
            if slot.wake_r in ready:
                os.read(slot.wake_r, 4096)
            if child.conn in ready or child.process.sentinel in ready:
                if child.conn.poll():  # an answer sent just before the child ended is still read
                    try:
                        message = child.conn.recv()
                    except EOFError:
                        return self._died(slot, child, running, started)
                    except Exception as exc:  # noqa: BLE001 - a result this process cannot unpickle
                        error = f"the handler's return value cannot be stored as the job's result: {summary(exc)}"
                        return Outcome("failed", error=error, summary=error, elapsed_ms=since(started))
                    if message[0] == "progress":
                        _take_progress(running, child, message)
                        continue
                    _, kind, result, error, line, delay_ms = message
                    return Outcome(
                        kind, result=result, error=error, summary=line, delay_ms=delay_ms, elapsed_ms=since(started)
                    )
                if not child.alive():
                    return self._died(slot, child, running, started)

    def _died(self, slot: _Slot, child: _Child, running: Running, started: float) -> Outcome:
        """The child ended while it ran the job: fail the attempt (retried per the queue's policy)."""
        child.process.join(CHILD_EXIT_S)
        how = _exit_text(child.process.exitcode)
        child.kill()
        slot.child = None
        error = f"the job's child process (pid {child.pid}) ended before the handler returned: {how}"
        emit(logging.WARNING, "job.child_died", **running.where(), pid=child.pid, exit=how)
        return Outcome("failed", error=error, summary=error, elapsed_ms=since(started))

    def _soft_lead(self, running: Running) -> float:
        """Seconds before the kill at which SoftTimeout is raised: ``soft_timeout_ms``, at most half the timeout.

        A capped deadline is claim time + ``timeout_ms`` (docs/reference/semantics.md), so the
        job's timeout is its deadline minus ``claimed_at``.
        """
        budget_s = max(0, running.state.deadline - running.claimed.claimed_at) / 1000
        return min(self._soft_s, budget_s / 2)

    def _on_lost(self, event: LeaseLostEvent) -> None:
        """A lease was lost (heartbeat thread): wake the runner whose child runs that job, which kills it."""
        for slot in self._slots:
            running = slot.running
            if running is not None and running.context is event.job:
                slot.wake()
                return


def _take_progress(running: Running, child: _Child, message: tuple) -> None:
    """A progress report the child sent, ``("progress", job number, value, message)``: keep it for this run.

    A report of an earlier job of the child (a thread its handler left behind) is dropped,
    and so is a malformed one: the child runs untrusted handler code.
    """
    if len(message) != 4 or message[1] != child.jobs:
        return
    try:
        running.context.progress(message[2], message[3])
    except Exception:  # noqa: BLE001 - validated in the child already; a bad one changes nothing
        pass


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# --- what the child is given ----------------------------------------------------------------------


def child_spec(worker: Worker) -> dict:
    """What every child of ``worker`` needs to set itself up (plain data, pickled by multiprocessing).

    ``handlers`` maps each queue to ``None`` (the registry's handler, found again by
    loading the handlers in the child) or ``"module:qualname"`` of a handler given to
    the worker directly. ``databases`` gives each database alias the name the worker
    uses (a test database included).

    Raises:
        WorkerConfigError: no ``DJANGO_SETTINGS_MODULE``, or a handler that cannot be imported by name.
    """
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise WorkerConfigError(
            "--pool processes needs the DJANGO_SETTINGS_MODULE environment variable: "
            "its child processes load the settings from it"
        )
    paths: dict[str, str | None] = {}
    for queue, fn in worker.handlers.items():
        if registry.get(queue) is fn:
            paths[queue] = None
            continue
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        path = f"{module}:{qualname}"
        try:
            found = _import(path) if module and module != "__main__" and "<" not in qualname else None
        except Exception:  # noqa: BLE001 - said below
            found = None
        if found is not fn:
            raise WorkerConfigError(
                f"--pool processes: the handler of queue {queue!r} ({path}) cannot be imported by name in a "
                "child process; define it at module level and register it with @handler or FQ_HANDLERS"
            )
        paths[queue] = path
    return {
        "parent_pid": os.getpid(),
        "handlers": paths,
        "databases": {alias: conf.get("NAME") for alias, conf in settings.DATABASES.items()},
    }


def _import(path: str) -> Any:
    module, _, qualname = path.partition(":")
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


# --- the child ------------------------------------------------------------------------------------


def child_main(conn: Any, soft: Any, spec: dict) -> None:
    """A child process (Django set up by :func:`django_fq.procchild.main`): load the handlers, then run the jobs the worker sends until told to stop.

    Messages from the worker: ``(number, claimed job without receipt, at_timeout)`` or
    ``None`` (exit). Answers: ``("ready", pid)`` once, ``("error", text)`` if setting up
    failed, ``("progress", value, message)`` for the handler's progress reports (at most
    one a second, and the last one before the answer) and ``("done", kind, result, error,
    summary, delay_ms)`` per job.
    """
    _die_with_parent(spec["parent_pid"])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # the worker decides when its children stop
    try:
        handlers = _child_setup(spec)
    except BaseException as exc:  # noqa: BLE001 - said to the worker, which stops
        try:
            conn.send(("error", summary(exc)))
        except Exception:  # noqa: BLE001
            pass
        return
    sending = threading.Lock()  # the main thread's answers and the progress thread's reports share the pipe

    def send(message: tuple) -> None:
        with sending:
            conn.send(message)

    runner = _ChildRunner(soft, handlers, send)
    signal.signal(SOFT_SIGNAL, runner.on_soft)  # type: ignore[arg-type]
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if message is None:
            return
        answer = runner.run(*message)
        try:
            send(answer)
        except (OSError, ValueError):
            return
        except Exception as exc:  # noqa: BLE001 - a result pickle cannot send
            error = f"the handler's return value cannot be stored as the job's result: {summary(exc)}"
            send(("done", "failed", None, error, error, None))
        tidy_connections()


def _die_with_parent(parent_pid: int) -> None:
    """End this process when the worker ends (even by SIGKILL): PR_SET_PDEATHSIG on Linux, and a check every second."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # noqa: BLE001 - the check below still works
            pass
    if os.getppid() != parent_pid:
        os._exit(1)  # the worker died before we asked

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_S)  # a poll: there is no portable event for "my parent ended"
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="fq-parent-watch", daemon=True).start()


def _child_setup(spec: dict) -> dict:
    """The worker's database names, the handlers: ``{queue: callable}`` (Django is set up: :mod:`django_fq.procchild`)."""
    for alias, name in spec["databases"].items():
        if alias in settings.DATABASES:
            settings.DATABASES[alias]["NAME"] = name
    if any(path is None for path in spec["handlers"].values()):
        from ..checks import load_handlers

        load_handlers()
    found = {}
    for queue, path in spec["handlers"].items():
        fn = registry.get(queue) if path is None else _import(path)
        if fn is None:
            raise WorkerConfigError(f"no handler is registered for queue {queue!r} in the child process")
        # The handler inside its middleware, as Worker.chains builds it in the worker (a handler
        # given to the worker directly has none of its own there either).
        found[queue] = chain_for(queue, fn) if path is None else chain_for(queue, fn, own=())
    return found


class _PipeProgress:
    """The progress writer of a run in a child: sends its reports to the worker, at most one a second.

    Set as the run's ``JobContext._writer``: :meth:`JobContext.progress` calls
    :meth:`wake_before` with the time the next report may go (the throttle of
    :class:`~django_fq.worker.context.ProgressReports`). The report is sent by a
    timer thread, never by the handler's main thread, so a SoftTimeout raised
    there cannot cut a message in half on the pipe. Each message carries the
    job's number: the worker drops a report of an earlier job.
    """

    def __init__(self, context: JobContext, number: int, send: Any):
        self.context = context
        self.number = number
        self.send = send
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.closed = False

    def wake_before(self, due: float) -> None:
        with self.lock:
            if self.closed or (self.timer is not None and self.timer.is_alive()):
                return
            self.timer = threading.Timer(max(0.0, due - time.monotonic()), self.flush)
            self.timer.daemon = True
            self.timer.start()

    def flush(self) -> None:
        with self.lock:
            self.timer = None  # a report made from now on needs a timer of its own
        reports = self.context._reports
        report = reports.take(time.monotonic()) if reports is not None else None
        if report is None:
            if reports is not None and reports.pending is not None:
                self.wake_before(reports.due)  # woken a moment early: try again at the due time
            return
        try:
            self.send(("progress", self.number, *report))
        except Exception:  # noqa: BLE001 - the worker is gone or the pipe closed: the report is lost, not the job
            pass
        finally:
            reports.written()  # type: ignore[union-attr]

    def close(self) -> None:
        """The handler returned: send the report still pending at once (after a send in flight)."""
        with self.lock:
            self.closed = True
            timer = self.timer
        if timer is not None:
            timer.cancel()
        reports = self.context._reports
        report = reports.take_last(timeout_s=5.0) if reports is not None else None
        if report is None:
            return
        try:
            self.send(("progress", self.number, *report))
        except Exception:  # noqa: BLE001 - as in flush
            pass
        finally:
            reports.written()  # type: ignore[union-attr]


class _ChildRunner:
    """Runs one job at a time on the child's main thread, where SoftTimeout is raised."""

    def __init__(self, soft: Any, handlers: dict, send: Any = None):
        self.soft = soft
        self.handlers = handlers
        self.send = send
        self.pid = os.getpid()
        self.number = 0
        self.in_handler = False

    def on_soft(self, signum: int, frame: Any) -> None:
        """SIGUSR1: raise SoftTimeout in the handler if it is the job the worker means (not a finished one)."""
        if self.in_handler and self.soft[0] == self.number:
            self.soft[0] = 0
            raise SoftTimeout(max(0, int(self.soft[1] - time.monotonic() * 1000)))

    def run(self, number: int, claimed: Any, at_timeout: bool) -> tuple:
        lease = LeaseState(claimed.deadline, math.inf)  # the worker watches the lease and kills this process
        lease.at_timeout = at_timeout
        context = JobContext.from_claim(claimed, lease)
        writer = _PipeProgress(context, number, self.send) if self.send is not None else None
        context._writer = writer
        call = self.handlers[claimed.queue]
        self.number = number
        set_current(context)
        answer: tuple
        try:
            try:
                self.in_handler = True
                result = call(context)
                if inspect.iscoroutine(result):
                    # An async def handler (its async middleware chain): the child has no loop
                    # of its own, so the run gets one; the kill at the timeout still applies.
                    result = asyncio.run(result)
            finally:
                self.in_handler = False
                if os.getpid() != self.pid:
                    # A copy the handler made with os.fork() and no exec: it must neither answer
                    # for the job nor read the next ones from the pipe, nor touch the connections.
                    os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not end the child
            # Mapped as the thread pool maps it (LeaseLost, PermanentFailure, Snooze, RetryAfter, a bad delay).
            ended = failure_outcome(exc, time.monotonic())
            answer = ("done", ended.kind, None, ended.error, ended.summary, ended.delay_ms)
        else:
            answer = ("done", "ok", result, "", "", None)
        finally:
            set_current(None)
        if writer is not None:
            writer.close()
        if abandon_open_transactions():
            error = "the handler left a database transaction open; it was rolled back"
            answer = ("done", "failed", None, error, error, None)
        return answer
