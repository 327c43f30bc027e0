#!/usr/bin/env bash
# Drain and pickup latency on PostgreSQL directly and through PgBouncer in transaction mode, one
# after the other in one sitting (docs/performance.md, "Through PgBouncer").
#
#   bench/pgbouncer.sh                 # full size (N = 20,000, 3 repetitions)
#   bench/pgbouncer.sh --quick         # smoke test
#
# PgBouncer is started on 127.0.0.1:6432 by scripts/test-pgbouncer.sh --run (and stopped by it);
# the bench databases are fq_bench_direct and fq_bench_bouncer on 127.0.0.1:5432. Extra
# arguments go to bench/run.py. Results: var/bench/pgbouncer-<UTC time>/{direct,bouncer}/.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
out="var/bench/pgbouncer-$(date -u +%Y%m%dT%H%M%SZ)"
"$PYTHON" bench/run.py --db postgres --phases drain,latency --pg-name fq_bench_direct --out "$out/direct" "$@" || exit 1
# Through PgBouncer: the database is created through it too, and dropped with FORCE afterwards.
scripts/test-pgbouncer.sh --run env FQ_BENCH_PG_POOLER=transaction \
    bash -c 'FQ_BENCH_PG_PORT=$FQ_PGBOUNCER_PORT "$0" bench/run.py --db postgres --phases drain,latency --pg-name fq_bench_bouncer --out "$1/bouncer" "${@:2}"' \
    "$PYTHON" "$out" "$@" || exit 1
echo "bench/pgbouncer.sh: $out/direct/summary.md and $out/bouncer/summary.md"
