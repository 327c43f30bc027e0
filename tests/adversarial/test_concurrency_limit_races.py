"""The per-queue concurrency limit while the limit itself changes (docs/reference/semantics.md §2, C07: never more live leases than the limit)."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.models import Lease

from .helpers import after_the_limits_read

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]


def test_claim_uses_the_limit_in_force_when_it_locks_the_queue():
    """Limit 2, one job running. A claim reads the limit (2); configure(concurrency=1) commits; the claim locks the queue.

    The claim then counts one live lease against the stale limit 2 and takes a
    second job: two live leases under a limit of 1, after the limit was in force.
    (leases._claim_once reads ``concurrency`` before ``SELECT ... FOR UPDATE``.)
    """
    q = "adv.limit.change"
    fq.configure(q, concurrency=2)
    fq.enqueue_many(q, [{"payload": n} for n in range(3)])
    assert len(fq.claim(q, visibility_ms=60_000)) == 1
    with after_the_limits_read(lambda: fq.configure(q, concurrency=1)) as changed:
        second = fq.claim(q, visibility_ms=60_000)
    assert changed and changed[0].error is None
    assert fq.policy(q).concurrency == 1
    live = Lease.objects.filter(queue__name=q).count()
    assert live <= 1, f"{live} live leases under a concurrency limit of 1 (claimed {len(second)} after the change)"
