"""The claim loop: the worker's main thread. Count the free slots, claim that many, hand them to the runners.

Each round counts the free slots (``capacity`` = ``concurrency`` +
``prefetch``, minus the jobs in hand) and claims that many jobs in one
``claim`` call per queue (at most :data:`MAX_CLAIM`). Several queues are
served fairly: the queue a round starts with rotates, and a round gives each
queue its share of the free slots, so a busy queue cannot starve a small
one. While jobs run, the loop waits until a quarter of the slots are free
rather than claiming one by one; a claim that got fewer jobs than it asked
for makes the next one ask for less (see ``_MIN_ASK``).

When a round finds nothing the thread sleeps on the worker's
:class:`~django_fq.worker.state.Doorbell` until an enqueue is notified
(PostgreSQL LISTEN/NOTIFY through :mod:`django_fq.wakeup`), a job finishes,
a stop is requested, or the poll interval passes. The poll interval starts
at ``poll_interval_ms`` and doubles while idle up to ``max_poll_interval_ms``
(reset when work is found); on PostgreSQL polling is only the safety net.

A queue whose rate limit stopped a claim (docs/reference/semantics.md §9
"Rate limits") is not claimed from again until the claim's ``rate_wait_ms``
has passed: the loop then sleeps until the soonest such slot frees (or a
shorter poll), rather than asking the database again on every wakeup.

The loop ends (returning why) on a stop request or signal, an orphaned
child's supervisor gone, ``max_jobs`` claimed and done, or in a ``burst``
run once nothing is eligible. A database error never ends it (except a
``burst`` run after :data:`_BURST_DB_FAILURES` rounds): it is logged, the
connection dropped, and the round retried after a growing pause.

Queues on several database aliases (``FQ_QUEUE_DATABASES``): :class:`AliasLoops`
runs one loop per alias, each on a thread of its own with its own connection,
doorbell (rung by its alias's listener) and poll interval, over that alias's
queues. A database that is down stops only its loop's claims: that loop backs
off (0.25 s doubling to 10 s, not cut short by the other databases' finished
jobs) and reconnects by itself. The slots are shared: each loop reserves what
it claims (:meth:`~django_fq.worker.state.InHand.reserve`). A burst run ends
once every loop found nothing (a loop whose database still fails then gives up
too). With one alias nothing of this runs: the loop is the main thread's, as
without the setting.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from .. import routing, services
from ..exceptions import QueueNotFound
from .dbconn import drop_connection, is_db_error
from .events import JobsClaimed
from .logs import emit, summary
from .state import Doorbell, Running

if TYPE_CHECKING:
    from .core import Worker

#: The worker's logger (the receipt mask is installed on it by :mod:`.logs`).
log = logging.getLogger("django_fq.worker")

#: Pause after a database error of the claim loop, doubling up to the cap (seconds).
_ERROR_BACKOFF_S, _ERROR_BACKOFF_MAX_S = 0.25, 10.0
#: How often policies (the default visibility of each queue) are read again (seconds).
_POLICY_TTL_S = 30.0
#: Consecutive failed claim rounds after which a ``burst`` run gives up (a long-running worker never does).
_BURST_DB_FAILURES = 5
#: Most jobs one claim call asks for (docs/reference/semantics.md §5).
MAX_CLAIM = 1000
#: A claim that got fewer jobs than it asked for makes the next claim of that queue ask for
#: twice as many as it got, at least _MIN_ASK; one that got all it asked for, _ASK_GROWTH times
#: as many (up to the free slots). A claim prepares a receipt secret for every job it asks for,
#: so an idle worker woken for one job should not prepare hundreds; a burst of work is back to
#: full batches within a few round trips (2, 8, 32, 128, ...).
_MIN_ASK = 2
_ASK_GROWTH = 4


class ClaimLoop:
    """The main thread of one worker: claims, waits, and decides when the worker is done."""

    def __init__(self, worker: Worker, queues: list[str] | None = None, doorbell: Doorbell | None = None, alias: str | None = None):
        """The claim loop of ``worker`` over ``queues`` (default: all it serves), waking on ``doorbell``.

        ``alias`` is set for one loop of several, one per database alias of the served
        queues (``FQ_QUEUE_DATABASES``; :meth:`Worker.run <django_fq.worker.core.Worker.run>`
        runs each in a thread of its own): its queues are all on that alias, its log lines
        name it, and its claims reserve their slots of the shared capacity first
        (:meth:`~django_fq.worker.state.InHand.reserve`). ``None``: the worker's only loop,
        on the main thread.
        """
        self.worker = worker
        self.hand = worker.hand
        self.queues: list[str] = list(worker.queues if queues is None else queues)
        self.doorbell = doorbell or worker.doorbell
        self.alias = alias
        #: One loop of several (one per alias): shares the capacity with the others.
        self.shared = alias is not None
        #: The fields its log lines add (``database=ALIAS`` for one loop of several).
        self._where: dict[str, str] = {"database": alias} if alias is not None else {}
        self.capacity = worker.capacity
        self._claim_floor = max(1, self.capacity // 4)
        #: Per queue: the most the next claim asks for (absent: as many as there are free slots).
        self._ask: dict[str, int] = {}
        self._rr = 0
        self._policies: dict[str, tuple[int, float]] = {}
        self._queue_set = set(self.queues)
        self._signals = 0
        #: Per queue: the monotonic time before which its rate limit lets no claim through.
        self._rate_until: dict[str, float] = {}
        #: One loop of several, in a burst run: ``busy``, ``idle`` (found nothing) or ``failing``.
        self._state = "busy"
        #: The last round stopped because the other loops' claims in flight held the free slots.
        self._blocked = False

    def reap_once(self) -> None:
        """One reaper round before the first claim, so a burst run reaps too (a database error is logged, not raised).

        The worker's only loop runs :meth:`Reaper.round <django_fq.worker.reaper.Reaper.round>`;
        one loop of several reaps its own alias only, so a database that is down delays no
        other alias's first claim.
        """
        reaping = self.worker.reaping
        if reaping is None:
            return
        try:
            if self.alias is None:
                reaping.round()
            else:
                reaping.round_for(self.alias)
        except Exception as exc:
            if not is_db_error(exc):
                raise
            emit(logging.ERROR, "worker.db_error", worker=self.worker.worker_id, step="reap", **self._where, error=summary(exc))
            drop_connection()

    def run(self) -> str:
        """Claim and wait until the worker is done; return why it stopped (for the ``worker.stop`` line)."""
        poll = self.worker.poll_interval_s
        backoff = 0.0
        failures = 0
        failing_since: float | None = None
        self.reap_once()
        while True:
            self.check_parent()
            if self.worker.stopping:
                return self.worker.stop_reason
            allowance = self.allowance()
            if allowance is not None and allowance <= 0:
                if len(self.hand) == 0:
                    return "max jobs reached"
                self.wait(0.5, until_slot=True)
                continue
            running = len(self.hand)
            if running >= self.capacity or (running and self.capacity - running < self._claim_floor):
                # Claim in batches: while jobs are still running, wait until a
                # quarter of the slots are free instead of claiming one by one.
                self.wait(0.5, until_slot=True)
                continue
            self.doorbell.clear()
            try:
                got, more = self.claim_round()
            except Exception as exc:
                if not is_db_error(exc):
                    raise
                failures += 1
                if self.worker.burst and failures >= _BURST_DB_FAILURES:
                    raise
                backoff = min(_ERROR_BACKOFF_MAX_S, max(_ERROR_BACKOFF_S, backoff * 2))
                failing_since = failing_since or time.monotonic()
                emit(logging.ERROR, "worker.db_error", worker=self.worker.worker_id, step="claim", **self._where, retry_in_s=backoff, error=summary(exc))
                drop_connection()
                if not self.shared:
                    self.wait(backoff)
                    continue
                # One loop of several: a burst run whose other databases have nothing left ends
                # here, as one loop over them all would; else back off, not shortened by the
                # doorbell (the other databases' finished jobs ring it many times a second).
                if self.worker.burst and self._settle_state("failing"):
                    return f"database {self.alias} unreachable"
                self.backoff(backoff)
                continue
            if failing_since is not None:
                emit(logging.WARNING, "worker.reconnected", worker=self.worker.worker_id, step="claim", **self._where, after_s=time.monotonic() - failing_since)
                failing_since, backoff, failures = None, 0.0, 0
            if self.shared and self._state != "busy" and (got or self._state == "failing"):
                self._settle_state("busy")  # it answers again, or found work: the others wait for it
            if self._blocked and not got:
                # Another alias's claim in flight held the free slots: this round asked nothing,
                # so it proves nothing (a burst run is not over); look again once it returns.
                self.hand.await_reservations(0.5)
                continue
            rate_wait = self.rate_wait()
            if got:
                poll = self.worker.poll_interval_s
                if more or (self.worker.burst and rate_wait is None) or len(self.hand) >= self.capacity:
                    continue  # a queue gave all it was asked for (it may have more), or no slot is free
                # Queues are drained for now; a finished job, a notification, the poll or a
                # rate limit's next slot brings the next round.
                self.wait(poll if rate_wait is None else min(poll, rate_wait))
                continue
            if rate_wait is not None:
                # Jobs wait behind a rate limit (eligible now, so a burst run waits for them too):
                # sleep until its next slot frees, then claim at once. No poll doubling.
                self.wait(min(poll, rate_wait))
                continue
            # A burst run is done when a claim made while it held no job found nothing. A claim
            # made while jobs were in hand can come back empty because of them (a concurrency
            # limit they fill, a retry their nack is about to make ready): look again once they finish.
            # One loop of several ends only once every other loop found nothing too (or ended):
            # a job another database's loop is about to claim may enqueue here.
            if self.worker.burst and running == 0 and len(self.hand) == 0 and (not self.shared or self._settle_state("idle")):
                return "nothing left to do"
            emit(logging.DEBUG, "worker.idle", worker=self.worker.worker_id, **self._where, wait_s=poll)
            woke = self.wait(poll)
            if not woke:
                poll = min(self.worker.max_poll_interval_s, max(poll * 2, 0.001))

    def _settle_state(self, state: str) -> bool:
        """Record this loop of several as ``busy``, ``idle`` or ``failing``; True when every other loop is idle or ended."""
        self._state = state
        loops = self.worker.loops
        assert loops is not None  # only a loop of several records a state
        return loops.set_state(self, state)

    def backoff(self, pause: float) -> None:
        """Sleep ``pause`` seconds after a database error of one loop of several; a stop ends it early.

        So does, in a burst run, every other loop being idle or ended (this loop then
        looks once more and ends if its database still fails).
        """
        give_up = time.monotonic() + pause
        loops = self.worker.loops
        assert loops is not None  # only a loop of several backs off on its own
        with self.doorbell.cv:
            while not self.worker.stopping:
                remaining = give_up - time.monotonic()
                if remaining <= 0 or (self.worker.burst and loops.others_settled(self)):
                    return
                self.doorbell.cv.wait(min(remaining, 1.0))
                self.check_parent()

    def rate_wait(self) -> float | None:
        """Seconds until the soonest rate-limited queue lets a claim through (``None``: no queue waits)."""
        if not self._rate_until:
            return None
        now = time.monotonic()
        for name in [n for n, until in self._rate_until.items() if until <= now]:
            del self._rate_until[name]  # its slot has freed: claim from it as usual
        return min(self._rate_until.values()) - now if self._rate_until else None

    def allowance(self) -> int | None:
        """Jobs still allowed by ``max_jobs`` (``None``: no limit)."""
        if self.worker.max_jobs is None:
            return None
        with self.hand.lock:
            return self.worker.max_jobs - self.hand.stats.claimed

    def wait(self, timeout: float, *, until_slot: bool = False) -> bool:
        """Sleep up to ``timeout`` on the worker's condition; True if woken by a notification or stop."""
        give_up = time.monotonic() + timeout
        with self.doorbell.cv:
            while not self.worker.stopping:
                if until_slot:
                    free = self.capacity - len(self.hand.jobs)
                    if free >= self._claim_floor or (free > 0 and not self.hand.jobs):
                        return True
                elif self.doorbell.rung:
                    return True
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return False
                # Short slices so an orphaned child notices its supervisor is gone.
                self.doorbell.cv.wait(min(remaining, 1.0))
                self.check_parent()
            return True

    def on_notify(self, queue: str | None) -> None:
        """A committed enqueue was notified (``None``: on an unknown queue, or the listener reconnected)."""
        if queue is None or queue in self._queue_set:
            self.doorbell.ring()

    def check_parent(self) -> None:
        if self.worker.supervisor_pid and not self.worker.stopping and os.getppid() != self.worker.supervisor_pid:
            emit(logging.WARNING, "worker.orphaned", worker=self.worker.worker_id, supervisor=self.worker.supervisor_pid)
            self.worker.request_stop("supervisor gone")

    def on_signal(self, signum: int, frame) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            emit(logging.INFO, "worker.signal", worker=self.worker.worker_id, signal=name, action="graceful", grace_s=self.worker.grace_s, running=len(self.hand.jobs))
            self.worker.request_stop(f"signal {name}")
            return
        emit(logging.WARNING, "worker.forced_exit", worker=self.worker.worker_id, signal=name, running=len(self.hand.jobs))
        for handler in log.handlers + logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(128 + signum)

    # --- claiming ---------------------------------------------------------------------------

    def claim_round(self) -> tuple[int, bool]:
        """One fair pass over the queues, each claiming its share of the free slots.

        Returns the jobs claimed, and whether some queue gave all it was asked for (it may have more).
        """
        queues = self.queues
        self._blocked = False
        n = len(queues)
        start = self._rr
        self._rr = (self._rr + 1) % n
        got, more = 0, False
        for i in range(n):
            if self.worker.stopping:
                break
            free = self.capacity - len(self.hand)
            allowance = self.allowance()
            if allowance is not None:
                free = min(free, allowance)
            if free <= 0:
                break
            name = queues[(start + i) % n]
            if name in self._rate_until and self._rate_until[name] > time.monotonic():
                continue  # its rate limit lets no claim through yet: no round trip to hear that again
            self._rate_until.pop(name, None)  # set again by claim_into if the rate limit stops this claim
            lanes = self.worker.batch_runner
            if lanes is not None and name in lanes.sizes:
                # A batch queue claims one batch at a time (django_fq.worker.batch).
                share = min(lanes.room(name, free), self._ask.get(name, MAX_CLAIM))
                if share <= 0:
                    continue
            else:
                if lanes is not None:
                    free = lanes.room_outside(free)
                    if free <= 0:
                        continue
                share = min(MAX_CLAIM, -(-free // (n - i)), self._ask.get(name, MAX_CLAIM))
            if not self.shared:
                taken = self.worker.claim_into(name, share)  # a method, so a subclass of Worker may still wrap it
            else:
                # One loop of several: the other aliases' loops claim at the same time. Reserving
                # the slots first (counting their claims in flight) keeps the jobs in hand within
                # ``capacity`` and ``max_jobs`` whatever the interleaving.
                share = self.hand.reserve(share, self.capacity, self.worker.max_jobs)
                if share <= 0:
                    self._blocked = True
                    break
                try:
                    taken = self.worker.claim_into(name, share)
                finally:
                    self.hand.unreserve(share)
            if name in self._rate_until:
                self._ask[name] = share  # short because of the rate limit, not of jobs: ask as much next time
            else:
                self._ask[name] = share * _ASK_GROWTH if taken == share else max(_MIN_ASK, 2 * taken)
            got += taken
            more = more or taken == share
        return got, more

    def visibility_for(self, queue: str) -> int | None:
        """The lease length to ask for on ``queue``; ``None`` when the queue does not exist."""
        if self.worker.visibility_ms is not None:
            return self.worker.visibility_ms
        cached = self._policies.get(queue)
        if cached is not None and time.monotonic() - cached[1] < _POLICY_TTL_S:
            return cached[0]
        try:
            vis = services.policy(queue).visibility_ms
        except QueueNotFound:
            self._policies.pop(queue, None)
            return None
        self._policies[queue] = (vis, time.monotonic())
        return vis

    def claim_into(self, queue: str, count: int) -> int:
        """Claim up to ``count`` jobs of ``queue`` in one call and hand them to the runner pool; return how many."""
        started = time.monotonic()
        got = self._claim_into(queue, count)
        events = self.worker.events
        if events.wants(JobsClaimed):
            events.publish(JobsClaimed(self.worker, queue, count, got, (time.monotonic() - started) * 1000))
        return got

    def _claim_into(self, queue: str, count: int) -> int:
        vis = self.visibility_for(queue)
        if vis is None:
            return 0
        start = time.monotonic()
        try:
            jobs = services.claim(queue, count=count, visibility_ms=vis, worker=self.worker.worker_id)
        except QueueNotFound:
            self._policies.pop(queue, None)
            return 0
        end = time.monotonic()
        rate_wait_ms = getattr(jobs, "rate_wait_ms", 0)  # a wrapped services.claim may answer a plain list
        if rate_wait_ms:
            # Counted from the claim's start, before its reading of the database clock (which decided
            # the wait): a claim that comes a little early costs one round trip, one that comes late
            # leaves the slot idle, and that slack would add up over every window.
            self._rate_until[queue] = start + rate_wait_ms / 1000
        if not jobs:
            return 0
        emit(logging.INFO, "worker.claim", worker=self.worker.worker_id, queue=queue, asked=count, got=len(jobs))
        fraction = self.worker.heartbeat_fraction
        if self.worker.stopping:
            # The stop came while claiming: these jobs never started, give them back at once.
            for claimed in jobs:
                self.worker.settler.release(Running(claimed, vis, start, end, fraction), "shutdown")
            return 0
        runnings = [Running(claimed, vis, start, end, fraction) for claimed in jobs]
        lanes = self.worker.batch_runner
        if lanes is not None and queue in lanes.sizes:
            lanes.add(runnings)  # one batch for one handler call
        else:
            self.hand.add(runnings, self.worker.pool.submit)
        # When the new jobs first need the heartbeat thread: a beat, or the lease's end.
        soonest = min(r.state.expires_mono if r.capped else r.next_beat for r in runnings)
        self.worker.heartbeat.wake_before(soonest)
        return len(jobs)


class AliasLoops:
    """One claim loop per database alias of the served queues (``FQ_QUEUE_DATABASES``), each on a thread of its own.

    Built by the :class:`~django_fq.worker.core.Worker` when its queues are on two
    aliases or more (``groups``: ``{alias: [queue, ...]}``, from
    :func:`django_fq.routing.group_by_alias`). Each loop has its own doorbell, rung by
    its alias's wakeup listener, and its own connection (Django's are per thread), so
    a database that is down or slow holds up only its own loop: that loop backs off
    and reconnects by itself while the others claim. The runner pool, the completers
    and the capacity are shared (:meth:`~django_fq.worker.state.InHand.reserve`); the
    worker's doorbell rings every loop's (a finished job frees a slot for all of them).
    """

    def __init__(self, worker: Worker, groups: dict[str, list[str]]):
        self.worker = worker
        self.loops = [ClaimLoop(worker, queues, Doorbell(), alias) for alias, queues in groups.items()]
        #: Which loop claims each queue (:meth:`Worker.claim_into <django_fq.worker.core.Worker.claim_into>`).
        self.by_queue: dict[str, ClaimLoop] = {q: loop for loop in self.loops for q in loop.queues}
        self._lock = threading.Lock()
        #: Per alias: ``busy``, ``idle``, ``failing`` (burst runs only) or ``done`` (its thread ended).
        self._states: dict[str, str] = {loop.alias or "": "busy" for loop in self.loops}
        self.threads: list[threading.Thread] = []

    @property
    def doorbells(self) -> list[Doorbell]:
        """Every loop's doorbell (the worker's own forwards its rings to them)."""
        return [loop.doorbell for loop in self.loops]

    def set_state(self, loop: ClaimLoop, state: str) -> bool:
        """Record ``loop``'s state; True when every other loop is idle or ended.

        A loop that becomes idle or ends rings the others, so one waiting for it looks again.
        """
        with self._lock:
            changed = self._states[loop.alias or ""] != state
            self._states[loop.alias or ""] = state
            settled = self._others_settled(loop)
        if changed and state in ("idle", "done"):
            for other in self.loops:
                if other is not loop:
                    other.doorbell.ring()
        return settled

    def others_settled(self, loop: ClaimLoop) -> bool:
        """Whether every loop but ``loop`` is idle (found nothing) or ended."""
        with self._lock:
            return self._others_settled(loop)

    def _others_settled(self, loop: ClaimLoop) -> bool:
        return all(s in ("idle", "done") for alias, s in self._states.items() if alias != (loop.alias or ""))

    def run(self) -> str:
        """Run every loop on its thread until all have ended; return why (as :meth:`ClaimLoop.run` does).

        A loop that raises anything but a database error stops the worker, and the error is
        raised here once every loop ended. A burst run's loop whose database kept failing
        raises its error only when no loop ended normally.
        """
        from django.db import connections

        ended: list[tuple[ClaimLoop, str | None, BaseException | None]] = []

        def serve(loop: ClaimLoop) -> None:
            reason, error = None, None
            try:
                with routing.using(loop.alias or ""):
                    reason = loop.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                error = exc
                if not (self.worker.burst and is_db_error(exc)):
                    self.worker.request_stop("claim loop failed")
            finally:
                ended.append((loop, reason, error))
                self.set_state(loop, "done")
                connections.close_all()

        for loop in self.loops:
            thread = threading.Thread(target=serve, args=(loop,), name=f"fq-claim-{loop.alias}", daemon=True)
            self.threads.append(thread)
            thread.start()
        primary = self.loops[0]
        try:
            for thread in self.threads:
                while thread.is_alive():
                    thread.join(0.5)  # short slices: signals are handled on this thread
                    primary.check_parent()
        except BaseException:
            self.worker.request_stop("claim loop failed")
            for thread in self.threads:
                thread.join(10)
            raise
        errors = [e for _loop, _r, e in ended if e is not None]
        fatal = [e for e in errors if not is_db_error(e)]
        if fatal:
            raise fatal[0]
        reasons = [r for _loop, r, _e in ended if r is not None]
        if errors and not reasons:
            raise errors[0]
        for loop, _r, error in ended:
            if error is not None:
                emit(logging.ERROR, "worker.db_error", worker=self.worker.worker_id, step="claim", database=loop.alias, gave_up=True, error=summary(error))
        if self.worker.stopping and self.worker.stop_reason:
            return self.worker.stop_reason
        return "; ".join(dict.fromkeys(reasons)) or "stopped"
