#!/usr/bin/env bash
# Drain and pickup latency on PostgreSQL directly and through PgBouncer in transaction mode,
# alternated in one sitting (docs/performance.md, "Through PgBouncer").
#
#   bench/pgbouncer.sh                 # 3 rounds of direct + bouncer, N = 20,000, 20 pickups each
#   bench/pgbouncer.sh --quick         # smoke test (1 round, N = 2,000)
#   bench/pgbouncer.sh --rounds 5 --n 10000
#   FQ_PGBOUNCER_PORT=6442 bench/pgbouncer.sh   # PgBouncer on another port (6432 is taken)
#
# PgBouncer is started by scripts/test-pgbouncer.sh --run (and stopped by it, whatever
# happened); bench/pgbouncer.py runs bench/run.py --phases drain,latency --reps 1 once per side
# and round, the order swapped every round. The bench databases are fq_bench_direct and
# fq_bench_bouncer on 127.0.0.1:5432 (the second created and used through PgBouncer).
# Results: var/bench/pgbouncer-<UTC time>/report.md (and each run's own directory beside it).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
# scripts/test-pgbouncer.sh drops the test databases named after this on start and exit: a name
# of its own, so a benchmark never drops the databases of a test run beside it.
export FQ_PGBOUNCER_TEST_NAME="${FQ_PGBOUNCER_TEST_NAME:-fq_bench_pgbouncer_unused}"
exec scripts/test-pgbouncer.sh --run "$PYTHON" bench/pgbouncer.py "$@"
