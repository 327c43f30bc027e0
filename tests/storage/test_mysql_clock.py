"""MariaDB / MySQL: the store's clock is UTC epoch milliseconds at execution, whatever the session time zone.

docs/reference/semantics.md §9 (Time): every instant is read from the database clock
at the moment the statement needs it. ``SYSDATE()`` is that moment;
``UNIX_TIMESTAMP`` reads it back in the session time zone, which the store
sets to UTC on every connection of django-fq's alias
(docs/explanation/storage.md "Time zone").
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from django_fq import storage

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]

#: UTC at statement start in epoch ms, computed without any time zone conversion.
UTC_MS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"


def _one(sql: str, params=()) -> tuple:
    with connection.cursor() as cur:
        cur.execute(sql, list(params))
        return cur.fetchone()


def test_a_new_connection_of_django_fqs_alias_is_in_utc():
    connection.close()
    assert _one("SELECT @@session.time_zone") == ("+00:00",)
    connection.close()  # the next connection is prepared again
    _one("SET time_zone = '+05:30'")
    connection.close()
    assert _one("SELECT @@session.time_zone") == ("+00:00",)


@pytest.mark.parametrize("zone", ["+05:30", "-08:00", "+00:00", "SYSTEM"])
def test_the_clock_is_utc_in_any_session_time_zone(zone):
    clock = storage.for_connection(connection).clock_sql
    try:
        _one("SET time_zone = %s", [zone])
        for _ in range(5):
            now, utc, local_offset = _one(
                f"SELECT {clock}, {UTC_MS}, TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())"
            )
            assert isinstance(now, int)
            # Same statement: the clock reads at execution, UTC_TIMESTAMP at statement start.
            assert 0 <= now - utc < 1000, (zone, now, utc)
        if zone != "SYSTEM" and zone != "+00:00":
            assert local_offset != 0  # the session really was in another zone
    finally:
        connection.close()  # the next test gets a prepared (UTC) connection


def test_the_clock_has_millisecond_precision():
    clock = storage.for_connection(connection).clock_sql
    seen = set()
    deadline = time.monotonic() + 5
    while len(seen) < 20 and time.monotonic() < deadline:
        seen.add(_one(f"SELECT {clock}")[0])
    assert len(seen) >= 20
    # Whole seconds only would leave every value a multiple of 1000; milliseconds rarely do.
    assert sum(1 for v in seen if v % 1000) >= 15


def test_the_clock_is_read_at_execution_not_at_statement_or_transaction_start():
    clock = storage.for_connection(connection).clock_sql
    before, _, after = _one(f"SELECT {clock}, SLEEP(0.05), {clock}")
    assert after - before >= 50  # one statement, two instants
    with transaction.atomic():
        first = _one(f"SELECT {clock}")[0]
        start = time.monotonic()
        while time.monotonic() - start < 0.03:
            time.sleep(0.005)
        second = _one(f"SELECT {clock}")[0]
    assert second - first >= 30
