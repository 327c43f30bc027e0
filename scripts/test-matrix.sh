#!/usr/bin/env bash
# Run the test suite on every supported combination and print a summary.
#
#   scripts/test-matrix.sh                 # the full matrix (what `make test` runs)
#   scripts/test-matrix.sh dj52-sqlite     # only the named legs
#   PYTEST_ARGS="-x -k claim" scripts/test-matrix.sh
#
# Legs: dj52-sqlite, dj52-postgres (Django 5.2 LTS, Python 3.11, .venv-dj52)
#       dj6-sqlite,  dj6-postgres  (Django 6.x,    Python 3.12, .venv-dj6)
#       dj52-mariadb, dj6-mariadb  (MariaDB on 127.0.0.1:3306, user root; mysqlclient is
#                                   installed into the leg's venv when missing)
#       dj60-sqlite                (Django 6.0,    Python 3.13, .venv-dj60): the oldest
#                                   Django 6 and the newest Python the classifiers name
# Every leg runs even when an earlier one failed; the exit status is non-zero
# if any leg failed. Tests marked `slow` are excluded (FQ_MARKERS overrides the
# marker expression; `make test-slow` uses it). With FQ_ALLOW_EMPTY=1 a leg
# that collects no test (pytest exit 5) counts as passed.
# FQ_SUMMARY_FILE=path appends "passed failed skipped" for the run to that file, and
# FQ_FAILED_FILE=path one "LEG NODE-ID" line per failing test. The summary names each
# failing test (from the JUnit XML of each leg), not only the leg.
# PostgreSQL and MariaDB legs use their own test database per leg (test_fq_<leg>), so
# they never clash with a developer's run on the default test_fq.
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_LEGS=(dj52-sqlite dj52-postgres dj52-mariadb dj6-sqlite dj6-postgres dj6-mariadb dj60-sqlite)
legs=("$@")
[ ${#legs[@]} -eq 0 ] && legs=("${ALL_LEGS[@]}")
markers="${FQ_MARKERS-not slow}"
reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT

declare -A status venv_ok
venv=""
ensure_venv() {  # ensure_venv LEG -> sets $venv; creates/updates each venv once per run
    local pyver req
    case "$1" in
        dj52-*) venv=.venv-dj52; pyver=3.11; req="Django>=5.2,<5.3" ;;
        dj6-*)  venv=.venv-dj6;  pyver=3.12; req="Django>=6.0,<6.2" ;;
        dj60-*) venv=.venv-dj60; pyver=3.13; req="Django>=6.0,<6.1" ;;
        *) echo "unknown leg $1 (known: ${ALL_LEGS[*]})" >&2; return 2 ;;
    esac
    if [ -z "${venv_ok[$venv]:-}" ]; then
        if scripts/venv.sh "$venv" "$pyver" "$req"; then venv_ok[$venv]=yes; else venv_ok[$venv]=no; fi
    fi
    [ "${venv_ok[$venv]}" = yes ] || return 1
    # The server legs need the mysqlclient driver (the "mysql" extra), which compiles against
    # libmariadb-dev with pkg-config (.ci/run installs both): the MariaDB legs to run at all,
    # the PostgreSQL legs because tests/backup/test_cross_db.py drives a MariaDB child from
    # them. The SQLite legs do without it.
    case "$1" in
        *-mariadb|*-postgres)
            "$venv/bin/python" -c "import MySQLdb" >/dev/null 2>&1 ||
                "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "mysqlclient>=2.2" ;;
    esac
}

# FQ_PREPARE_ONLY=1: create/update the legs' venvs (and mysqlclient) and stop (scripts/test-slow.sh,
# before it runs two lanes at once).
if [ "${FQ_PREPARE_ONLY:-0}" = 1 ]; then
    for leg in "${legs[@]}"; do ensure_venv "$leg" || exit 1; done
    exit 0
fi

for leg in "${legs[@]}"; do
    echo
    echo "==================== $leg (pytest -m \"$markers\") ===================="
    if ! ensure_venv "$leg"; then
        status[$leg]="FAILED (environment)"
        continue
    fi
    db="${leg#*-}"
    start=$SECONDS
    # The fast tier runs on FQ_TEST_WORKERS pytest-xdist processes (default 3 on
    # this 2-core machine: the tests mostly wait on the database and on child
    # processes); the slow tier runs serially, as its tests restart PostgreSQL
    # or measure the machine.
    workers="${FQ_TEST_WORKERS:-3}"
    durations=5
    # The slow tier is a couple of dozen tests: show every one's time, to keep its budget honest.
    [ "$markers" = "slow" ] && workers=0 && durations=0
    xdist=()
    [ "$workers" != 0 ] && xdist=(-n "$workers")
    # shellcheck disable=SC2086  # PYTEST_ARGS is a word list on purpose
    # The engine tests (ENGINE_TESTS in tests/conftest.py and tests marked one_django: worker
    # processes, races, kills, the cases, property runs, whose subject is our engine on the
    # database, not Django's surface) run once per database in the fast tier, on its dj6 leg;
    # the other legs deselect them and say where they ran. The slow tier runs what it selects.
    one_django_on=""
    [[ "$leg" != dj6-* && "$markers" != slow ]] && one_django_on="dj6-$db"
    FQ_TEST_LEG="$leg" FQ_TEST_ONE_DJANGO_ON="$one_django_on" FQ_TEST_DB="$db" \
        FQ_TEST_PG_TEST_NAME="test_fq_${leg//-/_}" \
        "$venv/bin/python" -m pytest -p no:cacheprovider -q ${markers:+-m "$markers"} "${xdist[@]}" \
        --durations=$durations --junitxml="$reports/$leg.xml" ${PYTEST_ARGS:-}
    rc=$?
    took=$((SECONDS - start))
    if [ $rc -eq 0 ]; then
        status[$leg]="ok (${took}s)"
    elif [ $rc -eq 5 ] && [ "${FQ_ALLOW_EMPTY:-0}" = 1 ]; then
        status[$leg]="ok, no tests collected (${took}s)"
    else
        status[$leg]="FAILED (pytest exit $rc, ${took}s)"
    fi
done

echo
echo "==================== summary ===================="
failed=0
for leg in "${legs[@]}"; do
    printf '  %-14s %s\n' "$leg" "${status[$leg]}"
    case "${status[$leg]}" in ok*) ;; *) failed=1 ;; esac
done
# One closing line with the totals over every leg, from the JUnit reports, after the name of
# each failing test (leg, then the pytest node id).
python3 scripts/junit-summary.py "$reports" matrix "${FQ_SUMMARY_FILE:-}" "${FQ_FAILED_FILE:-}"
exit $failed
