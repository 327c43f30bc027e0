#!/usr/bin/env bash
# The PostgreSQL tests through a real PgBouncer in transaction mode (`make test-pgbouncer`).
#
#   scripts/test-pgbouncer.sh                      # the fast tier, then the kill storm, on dj52
#   PYTHON=.venv-dj6/bin/python scripts/test-pgbouncer.sh
#   PYTEST_ARGS="-x -k claim" scripts/test-pgbouncer.sh
#   FQ_PGBOUNCER_TESTS="tests/worker" FQ_PGBOUNCER_STORM=0 scripts/test-pgbouncer.sh   # a part, no storm
#   scripts/test-pgbouncer.sh --run CMD ARGS...    # CMD instead of the tests, PgBouncer's port in
#                                                  # FQ_PGBOUNCER_PORT (bench/pgbouncer.sh uses it)
#
# Starts PgBouncer (Debian's package; .ci/run installs it when missing) on 127.0.0.1:6432 in
# front of the PostgreSQL server on 127.0.0.1:5432, pool_mode = transaction, and runs pytest
# with the settings docs/scaling.md gives for it (tests/settings.py, FQ_TEST_PG_POOLER):
# the default alias through PgBouncer with prepare_threshold None and
# DISABLE_SERVER_SIDE_CURSORS, and FQ_LISTEN_DATABASE on a direct alias to 5432. Tests that
# cannot apply through a transaction pooler are skipped by their `no_pooler` marker, with the
# reason. Then the chaos kill storm through it. PgBouncer is stopped by its pid and its files
# removed on exit, whatever happened; the test databases (test_fq_pgbouncer*) are dropped
# after it stopped (it holds server connections to them, so pytest keeps them: --reuse-db).
# Without pgbouncer here, or with port 6432 taken, it says why and exits 0 (nothing ran).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv-dj52/bin/python}"
PORT="${FQ_PGBOUNCER_PORT:-6432}"
PG_PORT="${FQ_TEST_PG_DIRECT_PORT:-5432}"
TEST_NAME="${FQ_PGBOUNCER_TEST_NAME:-test_fq_pgbouncer}"
PGBOUNCER="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"

if [ ! -x "$PGBOUNCER" ]; then
    echo "test-pgbouncer: skipped: pgbouncer is not installed (Debian package pgbouncer)"
    exit 0
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "test-pgbouncer: skipped: port $PORT on 127.0.0.1 is already in use"
    exit 0
fi
# PgBouncer refuses to run as root: as root, run it as the postgres user.
as_user=()
if [ "$(id -u)" = 0 ]; then
    as_user=(setpriv --reuid=postgres --regid=postgres --init-groups)
fi

tmp="$(mktemp -d)"
chmod 755 "$tmp"
pid=""
drop_test_dbs() {
    "$PYTHON" - "$PG_PORT" "$TEST_NAME" <<'EOF'
import sys, psycopg
port, name = sys.argv[1], sys.argv[2]
with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
    for (db,) in conn.execute("SELECT datname FROM pg_database WHERE datname = %s OR datname LIKE %s", (name, name + "\\_%")).fetchall():
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
EOF
}
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    drop_test_dbs || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap "exit 143" TERM INT HUP  # so a budget's timeout still stops PgBouncer (it runs in a session of its own)

echo '"postgres" ""' >"$tmp/userlist.txt"
cat >"$tmp/pgbouncer.ini" <<EOF
[databases]
; every database of the server, by the name the client asks for
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $tmp/userlist.txt
pool_mode = transaction
; each test database (one per pytest-xdist process) gets its own pool; the server has 100 slots
default_pool_size = 15
max_db_connections = 20
max_client_conn = 2000
admin_users = postgres
pidfile = $tmp/pgbouncer.pid
EOF
[ "$(id -u)" = 0 ] && chown -R postgres:postgres "$tmp"
setsid env -i PATH=/usr/bin:/bin HOME="$tmp" "${as_user[@]}" "$PGBOUNCER" "$tmp/pgbouncer.ini" \
    >"$tmp/pgbouncer.log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
if ! (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "test-pgbouncer: PgBouncer did not start:" >&2
    cat "$tmp/pgbouncer.log" >&2
    exit 1
fi
echo "test-pgbouncer: $("$PGBOUNCER" --version | head -1) on 127.0.0.1:$PORT (transaction pooling) in front of 127.0.0.1:$PG_PORT"
drop_test_dbs

if [ "${1:-}" = "--run" ]; then
    shift
    FQ_PGBOUNCER_PORT="$PORT" "$@"
    exit $?
fi

export FQ_TEST_DB=postgres FQ_TEST_PG_PORT="$PORT" FQ_TEST_PG_POOLER=transaction FQ_TEST_PG_DIRECT_PORT="$PG_PORT" \
    FQ_TEST_PG_TEST_NAME="$TEST_NAME"
started=$(date +%s)
echo "== fast tier through PgBouncer"
"$PYTHON" -m pytest -p no:cacheprovider -q -m "not slow" -n "${FQ_TEST_WORKERS:-3}" --reuse-db ${PYTEST_ARGS:-} ${FQ_PGBOUNCER_TESTS:-tests}
fast=$?
storm=0
if [ "${FQ_PGBOUNCER_STORM:-1}" != 0 ]; then
    echo "== kill storm through PgBouncer"
    "$PYTHON" -m pytest -p no:cacheprovider -q -m slow --reuse-db -s ${PYTEST_ARGS:-} \
        tests/chaos/test_chaos.py::test_kill_storm_loses_nothing_and_keeps_every_invariant
    storm=$?
fi
echo "test-pgbouncer: fast tier exit $fast, kill storm exit $storm, took $(( $(date +%s) - started ))s"
if [ "$fast" -ne 0 ] || [ "$storm" -ne 0 ]; then
    echo "--- PgBouncer log (tail)"; tail -n 30 "$tmp/pgbouncer.log"
    exit 1
fi
