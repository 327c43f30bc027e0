# django-fq — developer commands.
#
#   make demo        the example project end to end on SQLite (creates .venv first)
#   make test        the whole matrix: Django 5.2/Python 3.11 and Django 6.x/Python 3.12,
#                    each on SQLite, PostgreSQL and MariaDB, plus Django 6.0/Python 3.13
#                    on SQLite (tests marked `slow` excluded); one leg:
#                    scripts/test-matrix.sh LEG, e.g. dj52-mariadb (builds mysqlclient)
#   make test-quick  one venv (.venv), SQLite only (no database server or mysqlclient)
#   make test-slow   only the tests marked `slow`, on SQLite and PostgreSQL (Django 5.2;
#                    SLOW_LEGS="dj6-sqlite ..." picks other legs), then the admin's browser
#                    tests on Django 6.x (BROWSER_LEGS, default dj6-sqlite; empty: skip), then
#                    the MariaDB kill storms and server restart (CHAOS_LEGS, default dj52-mariadb);
#                    the PostgreSQL legs in one lane, the rest in another, at the same time
#                    (scripts/test-slow.sh; FQ_SLOW_LANES=1: one after the other)
#   make test-pgbouncer  the whole PostgreSQL fast tier and the kill storm through a real
#                    PgBouncer (transaction pooling, 127.0.0.1:6432, started and stopped by
#                    scripts/test-pgbouncer.sh; Django 5.2; ~11 min); skipped with the reason
#                    without pgbouncer
#   make test-pgbouncer-ci  its pooler-sensitive part and a 10 s kill storm (what .ci/run
#                    runs, under FQ_PGBOUNCER_BUDGET; FQ_CI_PGBOUNCER=0 skips it)
#   make venvs       create/update .venv, .venv-dj52, .venv-dj6 and .venv-dj60 without running anything
#   make bench       benchmark suite on PostgreSQL + SQLite (docs/performance.md);
#                    BENCH_ARGS="--db mariadb" (or "--db all") measures MariaDB/MySQL,
#                    BENCH_ARGS="--with-anchors" adds the other Django queues
#   make bench-quick the same in quick mode (< 3 min; a smoke test, not results)
#   make chaos       fault and load scenarios (kill storms of plain jobs, a workflow and a batch,
#                    database restart, partition, stress, SQLite busy writer, Patroni failover)
#                    on fresh databases (docs/reliability.md);
#                    CHAOS_ARGS="--db mariadb" (or "--db all") runs them on MariaDB too
#   make lint        ruff check and mypy (django-stubs) on django_fq, in .venv-tools
#   make screenshots the admin's pages at desktop and phone width into docs/img/admin/ and docs/admin.md
#                    (scripts/admin_screenshots.py: example project on SQLite, headless Chromium)
#   make docs        build the documentation site into site/ (mkdocs build --strict)
#   make docs-serve  the documentation site with live reload on DOCS_ADDR (127.0.0.1:8001)
#   make package-check  build sdist + wheel, twine check, install the wheel in a
#                    fresh venv and run a job with it (scripts/package-check.sh)
#   make clean       remove var/ (demo database, emails) and build leftovers
#
# Extra pytest arguments: make test PYTEST_ARGS="-x -k claim"
# PostgreSQL legs expect a server on 127.0.0.1:5432 (user postgres, trust auth), MariaDB
# legs one on 127.0.0.1:3306 (user root, no password) and libmariadb-dev + pkg-config;
# see tests/settings.py for the FQ_TEST_PG_* / FQ_TEST_MYSQL_* overrides.

SHELL := /bin/bash
.DEFAULT_GOAL := help

DJ52 := Django>=5.2,<5.3
DJ6  := Django>=6.0,<6.2
DJ60 := Django>=6.0,<6.1
# Legs of the slow tier (any of dj52-sqlite dj52-postgres dj6-sqlite dj6-postgres dj60-sqlite,
# dj52-mariadb dj6-mariadb).
SLOW_LEGS ?= dj52-sqlite dj52-postgres
# Legs that also run the admin's browser tests (tests/admin/test_browser.py) after the slow tier:
# the admin's templates differ between Django 5.2 and 6.x. Empty: none.
BROWSER_LEGS ?= dj6-sqlite
# Legs that run the kill storms (plain, workflow, batch) and the server restart of the chaos suite after that (the rest
# of the MariaDB slow tier takes some 20 minutes, too long for CI). Empty: none. The restart
# needs root (it stops and starts the local server).
CHAOS_LEGS ?= dj52-mariadb
CHAOS_TESTS := tests/chaos/test_chaos.py::test_kill_storm_loses_nothing_and_keeps_every_invariant \
	tests/chaos/test_chaos.py::test_workflow_kill_storm_runs_every_step_after_its_dependencies_and_the_callback_once \
	tests/chaos/test_chaos.py::test_batch_kill_storm_fires_the_callback_once_with_the_real_counts \
	tests/chaos/test_chaos.py::test_mariadb_restarted_twice_producers_and_workers_recover
# .venv-tools: ruff, mypy, mkdocs, build and twine (Python 3.12, Django 6.x),
# kept apart from the test venvs.
TOOLS_EXTRAS := lint,docs,package,postgres,tasks
DOCS_ADDR ?= 127.0.0.1:8001

.PHONY: help demo test test-quick test-slow test-pgbouncer test-pgbouncer-ci venv venvs clean bench bench-quick chaos \
	tools-venv lint docs docs-serve package-check screenshots

help:
	@sed -n '3,42p' Makefile | sed 's/^# \{0,1\}//'

venv:
	@scripts/venv.sh .venv 3.11

venvs: venv
	@scripts/venv.sh .venv-dj52 3.11 "$(DJ52)"
	@scripts/venv.sh .venv-dj6 3.12 "$(DJ6)"
	@scripts/venv.sh .venv-dj60 3.13 "$(DJ60)"

demo: venv
	@PYTHON=.venv/bin/python scripts/demo.sh

# Its own venv: the screenshots extra (Pillow) is not one the other venvs need.
screenshots:
	@FQ_VENV_EXTRAS=dev,screenshots scripts/venv.sh .venv-shots 3.12 "$(DJ6)"
	.venv-shots/bin/python scripts/admin_screenshots.py

test:
	@scripts/test-matrix.sh

test-quick: venv
	FQ_TEST_DB=sqlite .venv/bin/python -m pytest -p no:cacheprovider -q -m "not slow" $(PYTEST_ARGS)

test-slow:
	@SLOW_LEGS="$(SLOW_LEGS)" BROWSER_LEGS="$(BROWSER_LEGS)" CHAOS_LEGS="$(CHAOS_LEGS)" \
	    CHAOS_TESTS="$(CHAOS_TESTS)" scripts/test-slow.sh

test-pgbouncer:
	@scripts/venv.sh .venv-dj52 3.11 "$(DJ52)"
	@PYTHON=.venv-dj52/bin/python scripts/test-pgbouncer.sh

test-pgbouncer-ci:
	@scripts/venv.sh .venv-dj52 3.11 "$(DJ52)"
	@PYTHON=.venv-dj52/bin/python scripts/test-pgbouncer.sh --ci

bench: venv
	.venv/bin/python bench/run.py $(BENCH_ARGS)

bench-quick: venv
	.venv/bin/python bench/run.py --quick $(BENCH_ARGS)

# CHAOS_ARGS="--scenario kill-storm --db postgres --minutes 30" picks, sizes or soaks.
# The db-restart scenario restarts the local PostgreSQL cluster or MariaDB server (every session ends).
chaos: venv
	.venv/bin/python -m tests.chaos.run $(CHAOS_ARGS)

tools-venv:
	@FQ_VENV_EXTRAS=$(TOOLS_EXTRAS) scripts/venv.sh .venv-tools 3.12 "$(DJ6)"

# Both tools run even when the first one fails. `ruff format --check` is not
# part of it: most files were never run through a formatter.
lint: tools-venv
	@rc=0; \
	echo ">> ruff check"; .venv-tools/bin/ruff check . || rc=1; \
	echo ">> mypy django_fq"; .venv-tools/bin/mypy django_fq || rc=1; \
	exit $$rc

docs: tools-venv
	NO_MKDOCS_2_WARNING=1 .venv-tools/bin/mkdocs build --strict --site-dir site

docs-serve: tools-venv
	NO_MKDOCS_2_WARNING=1 .venv-tools/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

package-check: tools-venv
	@PYTHON=.venv-tools/bin/python scripts/package-check.sh

clean:
	rm -rf var build dist site *.egg-info
