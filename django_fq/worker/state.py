"""The worker's shared state: the jobs in hand, their counts, and the doorbell of the claim loop.

Every part of the worker (claim loop, runner pool, completer, heartbeat,
shutdown) meets here and nowhere else:

* :class:`InHand` — the jobs this worker holds a lease on (running, or
  claimed ahead and waiting for a runner), keyed by a sequence number, and
  the :class:`WorkerStats`. One lock guards both. Exactly one party settles
  a job: whoever wins :meth:`InHand.take` (the runner that ran it, or
  shutdown's release).
* :class:`Doorbell` — wakes the claim loop: a notification of new work, a
  finished job (a free slot, maybe a retry made eligible), a stop request.
  With one claim loop per database alias, :class:`SharedDoorbell` forwards
  the worker's rings to each loop's own.
* :class:`Running` — one job in hand: its claim (with the receipt, never
  shown to the handler), its lease timing and its handler's context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..types import ClaimedJob
from .context import JobContext, LeaseState
from .logs import job_fields_text


@dataclass(frozen=True)
class Outcome:
    """How one run of a handler ended, before settling.

    ``kind`` is ``ok`` (``result`` holds the return value), ``failed`` or
    ``permanent`` (``error`` holds the text to store: message + traceback,
    ``summary`` a one-line version for the log), ``lost`` (the handler
    raised :class:`LeaseLost`), ``snooze`` (:class:`~django_fq.Snooze`:
    released with ``delay_ms``) or ``retry`` (:class:`~django_fq.RetryAfter`:
    nacked with ``delay_ms`` and ``error``).
    """

    kind: str
    result: Any = None
    error: str = ""
    summary: str = ""
    elapsed_ms: int = 0
    delay_ms: int | None = None

    @classmethod
    def ok(cls, result: Any, elapsed_ms: int) -> Outcome:
        """``Outcome("ok", result=result, elapsed_ms=elapsed_ms)``, made without the frozen ``__init__``.

        A frozen dataclass sets each field through ``object.__setattr__``; a worker makes one
        outcome per job, so the plain success fills the instance's dict at once (the same
        fields, equal to the one ``__init__`` makes).
        """
        outcome = _new_outcome(cls)
        outcome.__dict__.update(kind="ok", result=result, error="", summary="", elapsed_ms=elapsed_ms, delay_ms=None)
        return outcome


_new_outcome = object.__new__


@dataclass
class WorkerStats:
    """Counts of what a worker did.

    ``ok`` acked, ``failed`` nacked, ``settle_errors`` settles refused (the
    lease was gone or the job cancelled when the handler finished) or
    skipped because the lease was known to be lost, ``timed_out`` those of
    ``settle_errors`` whose lease ended at the job's own ``timeout_ms`` (the
    attempt is recorded as failed by the reaper step), ``released`` jobs
    given back at shutdown, ``claimed`` jobs claimed, ``snoozed`` jobs put off
    by :class:`~django_fq.Snooze` (released with a delay, not in ``jobs``).
    """

    ok: int = 0
    failed: int = 0
    settle_errors: int = 0
    timed_out: int = 0
    released: int = 0
    claimed: int = 0
    snoozed: int = 0

    @property
    def jobs(self) -> int:
        """Jobs run to the end of their handler (whatever the outcome)."""
        return self.ok + self.failed + self.settle_errors


class Running:
    """A job in hand: its claim (with the receipt — never shown to the handler) and its lease timing."""

    __slots__ = (
        "claimed",
        "visibility_ms",
        "claim_start",
        "claim_end",
        "state",
        "context",
        "capped",
        "next_beat",
        "settling",
        "started",
        "begun",
        "_logged",
    )

    def __init__(self, claimed: ClaimedJob, visibility_ms: int, claim_start: float, claim_end: float, fraction: float):
        self.claimed = claimed
        self.visibility_ms = visibility_ms
        self.claim_start = claim_start
        self.claim_end = claim_end
        self.state = LeaseState(claimed.deadline, self.local_time_of(claimed.deadline))
        self.context = JobContext.from_claim(claimed, self.state)
        # The claim caps the first deadline at the job's timeout: a shorter lease than asked means
        # the deadline *is* the timeout, and extending cannot move it.
        self.capped = claimed.deadline - claimed.claimed_at < visibility_ms
        self.state.at_timeout = self.capped
        self.next_beat = claim_start + visibility_ms / 1000 * fraction
        self.settling = False
        self.started = time.monotonic()
        self.begun = False  # a runner thread took it (guarded by InHand.lock)
        self._logged: tuple[dict, str] | None = None

    def local_time_of(self, db_ms: int) -> float:
        """Earliest local monotonic time at which the database clock can read ``db_ms``.

        ``claimed_at`` was read by the database while the claim call ran, so
        at local time ``claim_start`` the database clock was at most
        ``claimed_at``: it reaches ``db_ms`` no earlier than this.
        """
        return self.claim_start + (db_ms - self.claimed.claimed_at) / 1000

    def where(self) -> dict:
        """The job's fields of a log line: ``{"job": id, "queue": name, "attempt": "n/max"}`` (a new dict)."""
        c = self.claimed
        return {"job": c.id, "queue": c.queue, "attempt": f"{c.attempts}/{c.max_attempts}"}

    def logged(self) -> tuple[dict, str]:
        """:meth:`where` and its ``key=value`` text, made once per job (for :func:`~django_fq.worker.logs.emit_job`)."""
        logged = self._logged
        if logged is None:
            c = self.claimed
            logged = self._logged = job_fields_text(c.id, c.queue, c.attempts, c.max_attempts)
        return logged



class Doorbell:
    """Wakes the claim loop: :meth:`ring` for work that may be there, :meth:`wake` for any change.

    ``cv`` is the condition the claim loop (and shutdown's drain) wait on;
    ``rung`` says a ring came since the loop last cleared it.
    """

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.rung = False

    def ring(self) -> None:
        """Work may be eligible (an enqueue was notified, a job finished): the claim loop looks again."""
        with self.cv:
            self.rung = True
            self.cv.notify_all()

    def wake(self) -> None:
        """Wake the waiters without claiming there is work (a stop request)."""
        with self.cv:
            self.cv.notify_all()

    def clear(self) -> None:
        with self.cv:
            self.rung = False


class SharedDoorbell(Doorbell):
    """The worker's doorbell when it runs one claim loop per database alias: rings reach every loop's own.

    ``linked`` is set once the loops exist (:class:`~django_fq.worker.loop.AliasLoops`).
    The drain at shutdown still waits on this one's condition.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linked: list[Doorbell] = []

    def ring(self) -> None:
        super().ring()
        for one in self.linked:
            one.ring()

    def wake(self) -> None:
        super().wake()
        for one in self.linked:
            one.wake()


class InHand:
    """The jobs a worker holds a lease on, and its counts; one lock guards both.

    ``jobs`` maps a sequence number (``int``) to its :class:`Running`; the
    claim loop adds them, whoever ends a job frees its slot with :meth:`free`
    (which rings the doorbell: a slot is free).
    """

    def __init__(self, doorbell: Doorbell):
        self.lock = threading.Lock()
        self.jobs: dict[int, Running] = {}
        self.stats = WorkerStats()
        self.doorbell = doorbell
        self._seq = 0
        #: Slots reserved by claims in flight (several claim loops only: :meth:`reserve`).
        self.reserved = 0
        self._unreserved = threading.Condition(self.lock)

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, runnings: list[Running], hand_to: Callable[[int, Running], None]) -> None:
        """Record freshly claimed jobs (counted as claimed) and pass each, numbered, to ``hand_to``."""
        with self.lock:
            self.stats.claimed += len(runnings)
            for running in runnings:
                self._seq += 1
                self.jobs[self._seq] = running
                hand_to(self._seq, running)

    def reserve(self, want: int, capacity: int, max_jobs: int | None) -> int:
        """Reserve up to ``want`` slots for a claim about to be made; return how many (0: none free).

        For a worker with one claim loop per database alias: the free slots are
        ``capacity`` less the jobs in hand and the other loops' reservations, and at
        most ``max_jobs`` (``None``: no limit) less those claimed and reserved.
        :meth:`unreserve` gives them back once the claim returned (its jobs are then in hand).
        """
        with self.lock:
            free = capacity - len(self.jobs) - self.reserved
            if max_jobs is not None:
                free = min(free, max_jobs - self.stats.claimed - self.reserved)
            granted = max(0, min(want, free))
            self.reserved += granted
            return granted

    def unreserve(self, n: int) -> None:
        """Give back ``n`` slots of :meth:`reserve` (waking :meth:`await_reservations`)."""
        with self._unreserved:
            self.reserved -= n
            self._unreserved.notify_all()

    def await_reservations(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a claim in flight to give back its reserved slots."""
        with self._unreserved:
            if self.reserved:
                self._unreserved.wait(timeout)

    def free(self, seqs: list[int]) -> None:
        """Forget the jobs numbered ``seqs`` (settled or released) and ring the doorbell."""
        with self.lock:
            for seq in seqs:
                self.jobs.pop(seq, None)
        # A finished job frees a slot and may have made work eligible (a retry): look again.
        self.doorbell.ring()

    def take(self, running: Running) -> bool:
        """Reserve the right to settle ``running`` (once: the runner, or shutdown's release)."""
        with self.lock:
            if running.settling:
                return False
            running.settling = True
            return True

    def begin(self, running: Running, stopping: bool) -> bool:
        """A runner thread picks ``running`` up: True if it may start it (not stopping, not being settled)."""
        with self.lock:
            start = not stopping and not running.settling
            running.begun = start
            return start

    def held(self) -> list[Running]:
        """The jobs whose lease is still ours to extend (not being settled, not known lost)."""
        with self.lock:
            return [r for r in self.jobs.values() if not r.settling and not r.state.lost.is_set()]

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` of :class:`WorkerStats`."""
        with self.lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def count_lost(self, reason: str) -> None:
        """Count a job whose lease was gone when its handler ended (``reason`` as the heartbeat recorded it)."""
        with self.lock:
            self.stats.settle_errors += 1
            if reason == "timeout":
                self.stats.timed_out += 1
