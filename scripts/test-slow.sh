#!/usr/bin/env bash
# The slow tier (`make test-slow`): the tests marked `slow` on SLOW_LEGS, the admin's browser
# tests on BROWSER_LEGS and the chaos tests (CHAOS_TESTS) on CHAOS_LEGS, in two lanes run at
# the same time:
#
#   lane "server": the PostgreSQL legs of SLOW_LEGS;
#   lane "local":  the other legs of SLOW_LEGS (SQLite), then BROWSER_LEGS, then CHAOS_LEGS.
#
# Why two lanes: most slow tests wait (on worker processes, restarts, timers: a kill storm runs
# for a fixed time, a rate limit holds for 20 s), so a 2-core machine has room for a second test
# beside them; run one after the other they took 30 minutes on an idle machine. The lanes never
# share a database server: the server lane restarts PostgreSQL (and runs its own Patroni
# cluster), the local lane's SQLite tests touch no server and its chaos legs restart MariaDB
# only. FQ_SLOW_LANES=1 runs everything in one lane, in the order above.
#
# Every line is prefixed with its lane's name; each lane ends with scripts/test-matrix.sh's
# summary (the failing tests by name). Exits non-zero when any part failed.
#
#   SLOW_LEGS="dj52-sqlite dj52-postgres" BROWSER_LEGS=dj6-sqlite CHAOS_LEGS=dj52-mariadb \
#       CHAOS_TESTS="tests/chaos/test_chaos.py::…" scripts/test-slow.sh
set -uo pipefail
cd "$(dirname "$0")/.."

read -r -a slow_legs <<<"${SLOW_LEGS:-}"
read -r -a browser_legs <<<"${BROWSER_LEGS:-}"
read -r -a chaos_legs <<<"${CHAOS_LEGS:-}"
server=() local_=()
for leg in "${slow_legs[@]}"; do
    case "$leg" in *-postgres) server+=("$leg") ;; *) local_+=("$leg") ;; esac
done

# Venvs (and mysqlclient) once, before the lanes: two lanes must not pip-install into one venv at once.
FQ_PREPARE_ONLY=1 scripts/test-matrix.sh "${slow_legs[@]}" "${browser_legs[@]}" "${chaos_legs[@]}" || exit 1

run_server() {
    [ ${#server[@]} -eq 0 ] && return 0
    FQ_MARKERS=slow FQ_ALLOW_EMPTY=1 scripts/test-matrix.sh "${server[@]}"
}

run_local() {
    local rc=0
    if [ ${#local_[@]} -gt 0 ]; then
        FQ_MARKERS=slow FQ_ALLOW_EMPTY=1 scripts/test-matrix.sh "${local_[@]}" || rc=1
    fi
    if [ ${#browser_legs[@]} -gt 0 ]; then
        FQ_MARKERS=slow FQ_ALLOW_EMPTY=1 PYTEST_ARGS="tests/admin/test_browser.py ${PYTEST_ARGS:-}" \
            scripts/test-matrix.sh "${browser_legs[@]}" || rc=1
    fi
    if [ ${#chaos_legs[@]} -gt 0 ]; then
        # shellcheck disable=SC2086  # CHAOS_TESTS is a word list of node ids
        FQ_MARKERS=slow FQ_ALLOW_EMPTY=1 PYTEST_ARGS="${CHAOS_TESTS:-} ${PYTEST_ARGS:-}" \
            scripts/test-matrix.sh "${chaos_legs[@]}" || rc=1
    fi
    return $rc
}

if [ "${FQ_SLOW_LANES:-2}" = 1 ]; then
    run_local; a=$?
    run_server; b=$?
    [ $a -eq 0 ] && [ $b -eq 0 ]
    exit
fi

# sed -u: lines appear as they come, each with its lane (the two lanes' lines interleave).
(run_server 2>&1 | sed -u 's/^/[server] /'; exit "${PIPESTATUS[0]}") &
server_pid=$!
(run_local 2>&1 | sed -u 's/^/[local]  /'; exit "${PIPESTATUS[0]}") &
local_pid=$!
# .ci/run's budget (timeout) signals its whole process group, both lanes with it; a TERM or an
# interrupt sent to this script alone stops the lanes too.
trap 'pkill -TERM -P $server_pid; pkill -TERM -P $local_pid; kill $server_pid $local_pid 2>/dev/null' TERM INT
wait $server_pid; a=$?
wait $local_pid; b=$?
[ $a -eq 0 ] && [ $b -eq 0 ]
