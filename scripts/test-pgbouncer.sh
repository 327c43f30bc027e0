#!/usr/bin/env bash
# The PostgreSQL tests through a real PgBouncer in transaction mode (`make test-pgbouncer`,
# `make test-pgbouncer-ci`).
#
#   scripts/test-pgbouncer.sh                      # the whole leg: fast tier, then the kill storm, on dj52
#   scripts/test-pgbouncer.sh --ci                 # the CI part (.ci/run step 6): the pooler-sensitive
#                                                  # tests (CI_TESTS below) and a 10 s kill storm
#   PYTHON=.venv-dj6/bin/python scripts/test-pgbouncer.sh
#   PYTEST_ARGS="-x -k claim" scripts/test-pgbouncer.sh
#   FQ_PGBOUNCER_TESTS="tests/worker" FQ_PGBOUNCER_STORM=0 scripts/test-pgbouncer.sh   # a part, no storm
#   FQ_PGBOUNCER_PORT=6442 FQ_PGBOUNCER_TEST_NAME=test_fq_mine scripts/test-pgbouncer.sh  # beside another run
#   FQ_PGBOUNCER_REPORTS=DIR FQ_PGBOUNCER_LOG=FILE scripts/test-pgbouncer.sh   # keep the JUnit reports, the log
#   scripts/test-pgbouncer.sh --run CMD ARGS...    # CMD instead of the tests, PgBouncer's port in
#                                                  # FQ_PGBOUNCER_PORT (bench/pgbouncer.sh uses it)
#
# Starts PgBouncer (Debian's package; .ci/run installs it when missing) on 127.0.0.1:6432 in
# front of the PostgreSQL server on 127.0.0.1:5432, pool_mode = transaction, and runs pytest
# with the settings docs/scaling.md gives for it (tests/settings.py, FQ_TEST_PG_POOLER):
# the default alias through PgBouncer with prepare_threshold None and
# DISABLE_SERVER_SIDE_CURSORS, and FQ_LISTEN_DATABASE on a direct alias to 5432. Tests that
# cannot apply through a transaction pooler are skipped by their `no_pooler` marker, with the
# reason. Then the chaos kill storm through it (FQ_CHAOS_SECONDS long from the first claim:
# 20 s, or 10 s with --ci). PgBouncer is stopped by its pid and its files
# removed on exit, whatever happened; the test databases (test_fq_pgbouncer*) are dropped
# after it stopped (it holds server connections to them, so pytest keeps them: --reuse-db).
# Without pgbouncer here, or with the port taken, it says why and exits 0 (nothing ran).
# Like scripts/test-matrix.sh it ends with the failing tests (legs "pgbouncer" and
# "pgbouncer-storm") and the totals, from pytest's JUnit reports, and appends them to
# FQ_SUMMARY_FILE / FQ_FAILED_FILE when those are set (.ci/run).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv-dj52/bin/python}"
PORT="${FQ_PGBOUNCER_PORT:-6432}"
PG_PORT="${FQ_TEST_PG_DIRECT_PORT:-5432}"
TEST_NAME="${FQ_PGBOUNCER_TEST_NAME:-test_fq_pgbouncer}"
# The CI part: what depends on how connections and transactions behave behind the pooler (every
# verb's transactions, the claim and settle statements, the wakeup through the direct alias, the
# worker's connections across threads and processes, long-poll claims, export's snapshot), some
# 27 % of the whole leg's test time. Left to the whole leg: the worker's features that run the
# same claim and settle statements in other shapes (--pool processes, batch and async handlers,
# progress, bad delays, start options, the metrics port) and the admin pages, CLI, tasks, checks,
# fuzzing…, which reach the database through the same verbs.
CI_TESTS="tests/services tests/storage tests/worker tests/api/test_longpoll.py tests/backup/test_backup.py"
CI_ARGS=()
for name in procpool procpool_progress procpool_fork batch async async_blocked_loop progress bad_delay \
    start_options metrics_port_supervised metrics_endpoint; do
    CI_ARGS+=(--ignore="tests/worker/test_$name.py")
done
part=all
if [ "${1:-}" = "--ci" ]; then
    part=ci
    shift
fi
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
    # FQ_PGBOUNCER_LOG=PATH keeps PgBouncer's whole log (a "got packet 'A' from server when not
    # linked" line there is a notification for a LISTEN someone sent through the pooler).
    [ -n "${FQ_PGBOUNCER_LOG:-}" ] && cp "$tmp/pgbouncer.log" "$FQ_PGBOUNCER_LOG"
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
tests="${FQ_PGBOUNCER_TESTS:-tests}"
part_args=()
if [ "$part" = ci ]; then
    tests="${FQ_PGBOUNCER_TESTS:-$CI_TESTS}"
    part_args=("${CI_ARGS[@]}")
    export FQ_CHAOS_SECONDS="${FQ_CHAOS_SECONDS:-10}"
fi
# FQ_PGBOUNCER_REPORTS=DIR keeps the JUnit reports (pgbouncer.xml, pgbouncer-storm.xml) there.
reports="${FQ_PGBOUNCER_REPORTS:-$tmp/reports}"
mkdir -p "$reports"
started=$(date +%s)
echo "== fast tier through PgBouncer: $tests"
# shellcheck disable=SC2086  # PYTEST_ARGS and the test list are word lists on purpose
"$PYTHON" -m pytest -p no:cacheprovider -q -m "not slow" -n "${FQ_TEST_WORKERS:-3}" --reuse-db \
    --durations=5 --junitxml="$reports/pgbouncer.xml" "${part_args[@]}" ${PYTEST_ARGS:-} $tests
fast=$?
fast_took=$(( $(date +%s) - started ))
storm=0
if [ "${FQ_PGBOUNCER_STORM:-1}" != 0 ]; then
    echo "== kill storm through PgBouncer (${FQ_CHAOS_SECONDS:-20} s)"
    # shellcheck disable=SC2086
    "$PYTHON" -m pytest -p no:cacheprovider -q -m slow --reuse-db -s --junitxml="$reports/pgbouncer-storm.xml" \
        ${PYTEST_ARGS:-} tests/chaos/test_chaos.py::test_kill_storm_loses_nothing_and_keeps_every_invariant
    storm=$?
fi
echo
echo "test-pgbouncer ($part): fast tier exit $fast (${fast_took}s), kill storm exit $storm, took $(( $(date +%s) - started ))s"
python3 scripts/junit-summary.py "$reports" pgbouncer "${FQ_SUMMARY_FILE:-}" "${FQ_FAILED_FILE:-}"
if [ "$fast" -ne 0 ] || [ "$storm" -ne 0 ]; then
    echo "--- PgBouncer log (tail)"; tail -n 30 "$tmp/pgbouncer.log"
    exit 1
fi
