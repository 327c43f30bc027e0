"""MariaDB / MySQL: the statements a claim, an ack and an enqueue send, counted by the server.

Every statement is a round trip on this backend (no pipelining, no multi-statement
text). The server's per-session ``Questions`` counter counts what the client sent,
the ``SET autocommit`` and ``COMMIT`` of Django's transactions included, which a
cursor wrapper would not see. An idle worker polls every ``--poll-interval``, so an
empty claim is the statement run most often (docs/performance.md, MariaDB).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_fq import db, storage
from django_fq import services as fq

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]


def _questions() -> int:
    with connection.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cur.fetchone()[1])


def _sent(fn) -> tuple[int, list[str], object]:
    """(statements the client sent, the SQL of those through Django's cursors, fn's result) while ``fn()`` runs."""
    connection.ensure_connection()
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    before = _questions()
    with connection.execute_wrapper(record):
        result = fn()
    after = _questions()
    return after - before - 1, seen, result  # the second SHOW counts itself


def test_an_empty_claim_is_one_statement_and_no_transaction():
    fq.configure("rt:empty")
    fq.claim("rt:empty")  # the connection's first transaction-free statements are behind us
    sent, sql, jobs = _sent(lambda: fq.claim("rt:empty", count=2))
    assert jobs == []
    assert sent == 1, sql
    # A job not yet due and a running job with a live lease leave it one statement too.
    fq.enqueue("rt:empty", "later", delay_ms=60_000)
    fq.enqueue("rt:empty", "now")
    assert len(fq.claim("rt:empty", visibility_ms=60_000)) == 1
    sent, sql, jobs = _sent(lambda: fq.claim("rt:empty", count=2))
    assert (jobs, sent) == ([], 1), sql


def test_a_claim_ack_and_enqueue_of_one_job_send_no_more_statements_than_measured():
    """The counts of docs/performance.md (MariaDB round trips): claim 14 → 11, ack 12 → 11, enqueue 12 → 9.

    One more each in a REPEATABLE READ session (``FQ_TEST_MYSQL_ISOLATION``): SET TRANSACTION.
    """
    fq.configure("rt:one")
    fq.enqueue("rt:one", "warm-up")  # the connection's once-only reads (isolation level) are behind us
    fq.ack("rt:one", fq.claim("rt:one")[0].receipt)
    committed = storage.for_connection(connection).session_read_committed(connection)
    extra = 0 if committed else 1
    sent_enqueue, sql, _ = _sent(lambda: fq.enqueue("rt:one", {"n": 1}))
    assert sent_enqueue <= 9 + extra, sql
    sent_claim, sql, jobs = _sent(lambda: fq.claim("rt:one", count=2))
    assert len(jobs) == 1
    assert sent_claim <= 11 + extra, sql
    sent_ack, sql, _ = _sent(lambda: fq.ack("rt:one", jobs[0].receipt))
    assert sent_ack <= 11 + extra, sql
    assert any("ISOLATION" in s.upper() for s in sql) is not committed


def _session(level: str) -> None:
    """A new connection whose session isolation is ``level`` before django-fq's first transaction on it."""
    connection.close()
    with connection.cursor() as cur:
        cur.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")


def test_django_fqs_transactions_skip_set_transaction_only_when_the_session_is_read_committed():
    store = storage.for_connection(connection)
    try:
        _session("READ COMMITTED")
        assert store.session_read_committed(connection) is True
        _, sql, _ = _sent(lambda: fq.configure("rt:iso"))
        assert not any("ISOLATION" in s.upper() for s in sql)
        _session("REPEATABLE READ")
        assert store.session_read_committed(connection) is False
        _, sql, _ = _sent(lambda: fq.configure("rt:iso", visibility_ms=1234))
        assert any(s.upper() == "SET TRANSACTION ISOLATION LEVEL READ COMMITTED" for s in sql), sql
    finally:
        connection.close()  # the next test gets a connection as Django's settings make it


def test_in_a_repeatable_read_session_django_fqs_own_transaction_still_reads_the_newest_commit():
    """READ COMMITTED in db.write_atomic: a row committed elsewhere after the first read is seen by the second."""
    fq.configure("rt:rr", visibility_ms=1000)
    try:
        _session("REPEATABLE READ")
        seen = []

        def elsewhere():
            try:
                fq.configure("rt:rr", visibility_ms=2000)
            finally:
                connections.close_all()

        with db.write_atomic(), connection.cursor() as cur:
            cur.execute("SELECT visibility_ms FROM django_fq_queue WHERE name = %s", ["rt:rr"])
            seen.append(cur.fetchone()[0])  # a REPEATABLE READ snapshot would be taken here
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join(60)
            assert not thread.is_alive()
            cur.execute("SELECT visibility_ms FROM django_fq_queue WHERE name = %s", ["rt:rr"])
            seen.append(cur.fetchone()[0])
        assert seen == [1000, 2000]
    finally:
        connection.close()
