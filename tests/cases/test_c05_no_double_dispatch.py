"""C05 — No double dispatch under a race (READ COMMITTED; every database with row locks).

One ready job, 20 threads (each on its own connection) call ``claim(count=1)``
at the same moment, 1000 rounds. The same 20 threads serve every round; two
barriers per round line them up and hand the results to the test thread.

To keep rounds cheap, the 1000 jobs are enqueued up front one minute apart
(``at``) and each round moves the database clock so that exactly the next
one is due: every round there is one ready job among many scheduled ones.
(Leases last 24 h, longer than the clock moves over all rounds.)

The case names PostgreSQL; it runs wherever concurrent claimers really race
(MariaDB/MySQL too), and SQLite, which runs writers one at a time, skips it.
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.test import override_settings

from django_fq import db
from django_fq import services as fq
from django_fq.models import Job, Lease

THREADS = 20
ROUNDS = 1000
TIMEOUT = 60
SPACING = 10_000  # ms between the jobs' run_at: far more than a round takes
LEASE = 86_400_000  # 24 h: longer than the 1000 rounds' clock moves, so no lease expires


def _isolation(conn) -> str:
    """The isolation level of ``conn``'s session, as ``"read committed"`` (lower case, words apart)."""
    # PostgreSQL names the level; MariaDB/MySQL spell it READ-COMMITTED, in @@transaction_isolation
    # (MySQL 8, MariaDB 11.1+) or @@tx_isolation (older MariaDB; gone from MySQL 8).
    queries = {
        "postgresql": ["SHOW transaction_isolation"],
        "mysql": ["SELECT @@transaction_isolation", "SELECT @@tx_isolation"],
    }[conn.vendor]
    for sql in queries:
        try:
            with transaction.atomic(using=conn.alias), conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchone()[0].lower().replace("-", " ")
        except DatabaseError:
            if sql == queries[-1]:
                raise
    raise AssertionError("unreachable")


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
@override_settings(FQ_TEST_CLOCK_OFFSET_MS=0)
@pytest.mark.parametrize(
    "rounds",
    # 200 rounds in the fast tier (about 15 s); the full 1,000 in the slow tier.
    [200, pytest.param(ROUNDS, marks=pytest.mark.slow)],
    ids=["200-rounds", "1000-rounds"],
)
def test_c05_twenty_claimers_one_ready_job_exactly_one_winner(rounds):
    queue = "c05"
    fq.configure(queue, visibility_ms=LEASE)
    level = _isolation(connection)
    if level != "read committed":  # e.g. the MariaDB leg under FQ_TEST_MYSQL_ISOLATION="repeatable read"
        pytest.skip(f"C05 is a READ COMMITTED case; this database's sessions run at {level}")

    first = db.db_now_ms() + SPACING
    items = [{"payload": {"round": i}, "at": first + i * SPACING} for i in range(rounds)]
    enqueued = [r.id for r in fq.enqueue_many(queue, items)]

    start = threading.Barrier(THREADS + 1, timeout=TIMEOUT)
    end = threading.Barrier(THREADS + 1, timeout=TIMEOUT)
    got: list[list] = [[None] * THREADS for _ in range(rounds)]
    failures: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            for rnd in range(rounds):
                start.wait()
                got[rnd][index] = [j.id for j in fq.claim(queue, count=1, worker=f"t{index}")]
                end.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            failures.append(exc)
            start.abort()
            end.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    bad_rounds, rounds_run = [], 0
    try:
        for rnd in range(rounds):
            # Job rnd is due, job rnd+1 is not. (Set inside this test's own
            # override, not with the clock fixture: 1000 stacked overrides
            # would make every settings lookup walk a 1000-deep chain.)
            settings.FQ_TEST_CLOCK_OFFSET_MS = 0
            settings.FQ_TEST_CLOCK_OFFSET_MS = first + rnd * SPACING + 1000 - db.db_now_ms()
            start.wait()
            end.wait()
            winners = [ids for ids in got[rnd] if ids]
            if winners != [[enqueued[rnd]]]:
                bad_rounds.append((rnd, got[rnd]))
            rounds_run += 1
    except threading.BrokenBarrierError:
        pass
    finally:
        start.abort()
        end.abort()
        for t in threads:
            t.join(TIMEOUT)
    assert not failures, failures[0]
    assert all(not t.is_alive() for t in threads)
    assert rounds_run == rounds
    assert bad_rounds == [], f"{len(bad_rounds)} rounds without exactly one winner, e.g. {bad_rounds[:3]}"

    # Every job was dispatched once: one claim, one lease, attempts 1.
    assert Job.objects.filter(state="running", attempts=1, generation=1).count() == rounds
    assert Lease.objects.count() == rounds
    assert fq.stats(queue).totals["claimed"] == rounds
