"""PostgreSQL: the one-statement claim in two variants, each short enough for psycopg to keep it parsed.

psycopg keeps its parsed form of a statement only up to 4,096 bytes; the claim
is a plain variant (the claim floor's bands) and a keyed one (a queue with
``key_concurrency``), each claiming from its own kind of queue only and chosen
by the kind the store last saw (docs/performance.md#fourth-round-claim-and-ack-overlap).
A queue that changes kind is claimed correctly at once, and never twice.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from psycopg import _queries

from django_fq import db, storage
from django_fq import services as fq
from django_fq.storage import postgres

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


def test_both_claim_variants_fit_psycopg_s_parse_cache():
    now = db.now_sql(connection)
    for keyed in (False, True):
        for relaxed in (False, True):
            sql = postgres._claim_pg(keyed, now, relaxed)
            assert len(sql.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, (keyed, relaxed, len(sql))
            assert ("AS keyed" in sql) is keyed and ("AS at_floor" in sql) is not keyed


def test_a_queue_that_changes_kind_is_claimed_by_the_other_variant_at_once():
    q = "cv.kind"
    store = storage.for_connection(connection)
    fq.enqueue_many(q, [{"payload": n} for n in range(3)])
    assert len(fq.claim(q, count=2)) == 2
    assert q not in store._keyed_queues

    fq.configure(q, key_concurrency=1)
    fq.enqueue_many(q, [{"payload": f"k{n}", "concurrency_key": "k"} for n in range(3)])
    got = fq.claim(q, count=10)  # the plain variant claims nothing from it; the keyed one does
    assert Counter(j.payload for j in got) == Counter({2: 1, "k0": 1}), [j.payload for j in got]
    assert q in store._keyed_queues
    assert fq.claim(q, count=10) == []  # key k is busy: the keyed variant holds it back
    assert fq.stats(q).counts["running"] == 4

    fq.configure(q, key_concurrency=0)
    got = fq.claim(q, count=10)
    assert sorted(j.payload for j in got) == ["k1", "k2"]
    assert q not in store._keyed_queues
    assert fq.stats(q).counts["running"] == 6 and fq.stats(q).totals["claimed"] == 6
