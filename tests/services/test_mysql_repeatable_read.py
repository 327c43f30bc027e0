"""MariaDB / MySQL: a claim and the reaper inside a caller's REPEATABLE READ transaction act on committed rows.

InnoDB's REPEATABLE READ reads from a snapshot taken at the transaction's
first read. django-fq's own transactions run at READ COMMITTED; inside a
caller's transaction (docs/explanation/storage.md "Isolation") the rows the
claim and the reaper decide on are read with locking reads, which see the
latest committed versions. Here the caller's snapshot is older than a
concurrent claim + ack and a concurrent enqueue: nothing may act on what the
snapshot still shows (docs/reference/semantics.md §5: one live lease per job,
an acked job is never claimed or expired again).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_fq import services as fq
from django_fq.models import Job, Lease
from tests.threads import elsewhere

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]


def _repeatable_read_next() -> None:
    with connection.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def test_a_claim_in_an_old_snapshot_takes_only_what_is_eligible_now():
    fq.configure("rr:claim")
    first = fq.enqueue("rr:claim", {"n": 1}).id
    second: list[str] = []

    def claim_ack_and_enqueue():
        (job,) = fq.claim("rr:claim")
        assert job.id == first
        fq.ack("rr:claim", job.receipt)
        second.append(fq.enqueue("rr:claim", {"n": 2}).id)

    _repeatable_read_next()
    with transaction.atomic():
        assert Job.objects.get(uid=first).state == "queued"  # the snapshot is taken here
        elsewhere(claim_ack_and_enqueue)
        # The caller's snapshot is stale: it still shows the first job queued, the second absent.
        assert Job.objects.get(uid=first).state == "queued"
        assert not Job.objects.filter(uid=second[0]).exists()
        claimed = fq.claim("rr:claim", count=10)
        assert [j.id for j in claimed] == second  # the acked job is not taken again; the new one is
        assert claimed[0].attempts == 1
    acked = Job.objects.get(uid=first)
    assert (acked.state, acked.attempts, acked.generation) == ("succeeded", 1, 1)
    assert not Lease.objects.filter(job=acked).exists()
    assert Job.objects.get(uid=second[0]).state == "running"
    stats = fq.stats("rr:claim")
    assert (stats.totals["claimed"], stats.totals["acked"]) == (2, 1)


def test_the_reaper_in_an_old_snapshot_expires_only_leases_that_still_exist(clock):
    fq.configure("rr:reap", max_attempts=5)
    acked_id = fq.enqueue("rr:reap", {"n": 1}).id
    lapsed_id = fq.enqueue("rr:reap", {"n": 2}).id
    acked, lapsed = fq.claim("rr:reap", count=2, visibility_ms=60_000)
    assert (acked.id, lapsed.id) == (acked_id, lapsed_id)

    _repeatable_read_next()
    with transaction.atomic():
        assert Lease.objects.filter(job__uid__in=[acked_id, lapsed_id]).count() == 2  # the snapshot
        elsewhere(lambda: fq.ack("rr:reap", acked.receipt))
        assert Lease.objects.filter(job__uid__in=[acked_id, lapsed_id]).count() == 2  # still stale
        clock.advance(120_000)  # both leases' deadlines have passed now; only one lease is left
        result = fq.reap("rr:reap")
        assert (result.expired, result.timed_out, result.dead) == (1, 0, 0)
    done = Job.objects.get(uid=acked_id)
    assert (done.state, done.attempts) == ("succeeded", 1)
    again = Job.objects.get(uid=lapsed_id)
    assert (again.state, again.attempts) == ("queued", 1)  # expired: back in the queue after its backoff
    assert not Lease.objects.filter(job__uid__in=[acked_id, lapsed_id]).exists()
    stats = fq.stats("rr:reap")
    assert (stats.totals["acked"], stats.totals["expired"]) == (1, 1)
