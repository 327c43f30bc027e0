"""A small object API for people who think in queues.

    >>> from django_fq import Queue
    >>> emails = Queue("emails", visibility_ms=120_000)
    >>> job_id = emails.enqueue({"to": "a@example.com"})
    >>> job = emails.dequeue()          # a ClaimedJob, or None
    >>> emails.ack(job, result={"sent": True})
    >>> emails.size()                   # scheduled + ready jobs

Every method is a thin call into :mod:`django_fq.services` with this queue's
name, so the same rules and errors apply.
"""

from __future__ import annotations

from . import services, validation
from .exceptions import QueueNotFound
from .types import ClaimedJob, SettleResult


class Queue:
    """A handle on the queue ``name`` (1–200 of ``[A-Za-z0-9:._-]``).

    ``visibility_ms`` (1 ms – 24 h) is the lease length of :meth:`dequeue`;
    ``None`` uses the queue's policy. Creating the handle writes nothing.
    """

    def __init__(self, name: str, *, visibility_ms: int | None = None):
        self.name = validation.queue_name(name)
        self.visibility_ms = None if visibility_ms is None else validation.visibility(visibility_ms)

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    def enqueue(self, payload, **options) -> str:
        """Enqueue ``payload`` (options as :func:`services.enqueue`); return the job id."""
        return services.enqueue(self.name, payload, **options).id

    def dequeue(self, *, wait_ms: int = 0) -> ClaimedJob | None:
        """Claim the next eligible job, or return ``None`` when there is none (after ``wait_ms``)."""
        jobs = services.claim(self.name, count=1, visibility_ms=self.visibility_ms, wait_ms=wait_ms)
        return jobs[0] if jobs else None

    def ack(self, job: ClaimedJob, *, result=None) -> SettleResult:
        """Acknowledge a job returned by :meth:`dequeue`."""
        return services.ack(self.name, job.receipt, result=result)

    def nack(self, job: ClaimedJob, *, delay_ms: int | None = None, error: str | None = None) -> SettleResult:
        """Report a failed attempt of a job returned by :meth:`dequeue`."""
        return services.nack(self.name, job.receipt, delay_ms=delay_ms, error=error)

    def size(self) -> int:
        """Pending jobs: scheduled + ready (0 for a queue that does not exist yet)."""
        try:
            counts = services.stats(self.name).counts
        except QueueNotFound:
            return 0
        return counts["scheduled"] + counts["ready"]
