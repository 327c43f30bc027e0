"""The database server checks (django_fq.E030–E032, W030–W032; docs/reference/checks.md).

The decisions are tested on stated facts (any leg: no server needed); the
MariaDB leg also provokes the findings it can on the real server.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

from django_fq import checks, conf, storage
from django_fq.storage.mysql import BINARY_COLUMNS, MysqlStore, ServerFacts, server_findings

TABLES = ["django_fq_queue", "django_fq_job", "django_fq_lease", "django_fq_token", "django_fq_counter", "django_fq_payload", "django_fq_claim_floor", "django_fq_key", "django_fq_rate", "django_fq_rate_log", "django_fq_key_claim", "django_fq_dependency", "django_fq_batch", "django_fq_batch_member", "django_fq_worker", "django_fq_minute"]
MIB = 1024 * 1024


def _facts(**changes) -> ServerFacts:
    facts = ServerFacts(
        mariadb=True, version=(10, 11, 19), log_bin=False, binlog_format="MIXED", max_allowed_packet=16 * MIB,
        default_engine="InnoDB", engines=dict.fromkeys(TABLES, "InnoDB"),
    )
    for name, value in changes.items():
        setattr(facts, name, value)
    return facts


def _ids(found) -> list[str]:
    return [f.id for f in found]


def _find(**changes) -> list[str]:
    return _ids(server_findings(_facts(**changes), tables=TABLES, max_payload_bytes=MIB))


def test_a_good_server_has_no_findings():
    assert _find() == []
    assert _find(mariadb=False, version=(8, 0, 36)) == []
    assert _find(log_bin=True, binlog_format="ROW") == []


@pytest.mark.parametrize(("mariadb", "version", "ok"), [
    (True, (10, 5, 27), False), (True, (10, 6, 0), True), (True, (11, 4, 2), True),
    (False, (5, 7, 44), False), (False, (8, 0, 11), True), (False, (9, 1, 0), True),
])
def test_e030_server_version(mariadb, version, ok):
    assert _find(mariadb=mariadb, version=version) == ([] if ok else ["django_fq.E030"])


def test_e031_tables_and_new_tables_must_be_innodb():
    assert _find(engines={**dict.fromkeys(TABLES, "InnoDB"), "django_fq_job": "MyISAM"}) == ["django_fq.E031"]
    # Before migrate: the tables do not exist, and the default engine would make them.
    assert _find(engines={}, default_engine="MyISAM") == ["django_fq.E031"]
    assert _find(engines={}, default_engine="InnoDB") == []
    assert _find(default_engine="Aria") == []  # the tables are made already, and InnoDB


def test_e032_statement_binlog():
    assert _find(log_bin=True, binlog_format="STATEMENT") == ["django_fq.E032"]
    assert _find(log_bin=False, binlog_format="STATEMENT") == []


def test_w030_packet_room_for_a_payload():
    assert _find(max_allowed_packet=2 * MIB) == ["django_fq.W030"]
    assert _find(max_allowed_packet=2 * MIB + 64 * 1024) == []


def test_w031_key_columns_no_longer_binary():
    binary = {(t, c): "utf8mb4_nopad_bin" for t, cs in BINARY_COLUMNS.items() for c in cs}
    assert _find(collations=binary) == []
    found = server_findings(
        _facts(collations={**binary, ("django_fq_token", "token"): "utf8mb4_general_ci"}), tables=TABLES,
        max_payload_bytes=MIB,
    )
    assert _ids(found) == ["django_fq.W031"]
    assert "django_fq_token.token (utf8mb4_general_ci)" in found[0].msg
    assert not found[0].error


def test_w032_connection_charset():
    assert _find(charset="utf8mb3") == ["django_fq.W032"]
    assert _find(charset="latin1") == ["django_fq.W032"]
    assert _find(charset="UTF8MB4") == []


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_mysql_w032_on_a_three_byte_connection():
    try:
        _one("SET NAMES utf8mb3")
        assert _ids(checks.check_database_server(None, databases=[connection.alias])) == ["django_fq.W032"]
    finally:
        connection.close()
    assert checks.check_database_server(None, databases=[connection.alias]) == []


def test_the_models_tables_are_the_ones_checked():
    assert sorted(m._meta.db_table for m in apps.get_app_config("django_fq").get_models()) == sorted(TABLES)


@pytest.mark.django_db
def test_the_test_server_passes_every_check():
    store = storage.for_connection(connection)
    assert store.check_server(connection, tables=TABLES, max_payload_bytes=conf.max_payload_bytes()) == []
    assert checks.check_database_server(None, databases=[connection.alias]) == []
    assert checks.check_database_server(None, databases=None) == []  # a plain `check` does not ask the database


@pytest.mark.mysql_only
@pytest.mark.django_db
def test_mysql_w030_against_the_servers_packet_size(settings):
    (packet,) = _one("SELECT @@max_allowed_packet")
    store = storage.for_connection(connection)
    # The store is asked for payload sizes on both sides of the server's limit (the setting's own
    # cap, 32 MiB, may fit any server: CI raises the packet size to 128 MiB).
    fits = (packet - 64 * 1024) // 2
    assert store.check_server(connection, tables=TABLES, max_payload_bytes=fits) == []
    (found,) = store.check_server(connection, tables=TABLES, max_payload_bytes=fits + 1)
    assert found.id == "django_fq.W030" and str(packet) in found.msg
    settings.FQ_MAX_PAYLOAD_BYTES = min(fits + 1, conf.HARD_PAYLOAD_CAP_BYTES)
    expected = ["django_fq.W030"] if fits + 1 <= conf.HARD_PAYLOAD_CAP_BYTES else []
    assert _ids(checks.check_database_server(None, databases=[connection.alias])) == expected


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_mysql_e031_new_tables_with_another_default_engine():
    store = storage.for_connection(connection)
    assert isinstance(store, MysqlStore)
    try:
        _one("SET SESSION default_storage_engine = MyISAM")
        found = store.check_server(connection, tables=[*TABLES, "django_fq_not_made_yet"], max_payload_bytes=MIB)
        assert _ids(found) == ["django_fq.E031"]
        assert "default_storage_engine=MyISAM" in found[0].msg
        assert store.check_server(connection, tables=TABLES, max_payload_bytes=MIB) == []
    finally:
        connection.close()


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_mysql_w031_after_a_table_conversion():
    store = storage.for_connection(connection)
    binary = store.binary_collation(connection)
    _one("ALTER TABLE django_fq_token MODIFY token varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL")
    try:
        found = checks.check_database_server(None, databases=[connection.alias])
        assert _ids(found) == ["django_fq.W031"]
        assert "django_fq_token.token" in found[0].msg
    finally:
        _one(f"ALTER TABLE django_fq_token MODIFY token varchar(255) CHARACTER SET utf8mb4 COLLATE {binary} NOT NULL")
    assert checks.check_database_server(None, databases=[connection.alias]) == []


def _one(sql: str) -> tuple:
    with connection.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone() if cur.description else ()
