#!/usr/bin/env bash
# The django-fq tour on the example project (what `make demo` runs).
#
# Starts from an empty var/ every time (SQLite database and sent emails live
# there), so it always shows the same story:
#   configure a queue -> enqueue with an idempotency token twice -> inspect ->
#   a hand-written consumer claims and acks -> 300 welcome emails in one bulk
#   enqueue -> a worker drains them -> a rerun sends nothing twice.
#
# PYTHON picks the interpreter (default .venv/bin/python). The demo uses the
# SQLite file under var/: DATABASE_URL is ignored here on purpose, so it never
# touches a real database. To watch the same on PostgreSQL, name a scratch
# database that exists and may be emptied:
#   FQ_DEMO_DATABASE_URL=postgres://postgres@127.0.0.1:5432/fq_demo scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
N_EMAILS="${N_EMAILS:-300}"
unset DATABASE_URL
if [ -n "${FQ_DEMO_DATABASE_URL:-}" ]; then export DATABASE_URL="$FQ_DEMO_DATABASE_URL"; fi
export DJANGO_SETTINGS_MODULE=example_project.settings

if [ -t 1 ]; then B=$'\e[1m'; D=$'\e[2m'; R=$'\e[0m'; else B=; D=; R=; fi
n=0
step() { n=$((n + 1)); printf '\n%s== %d. %s%s\n' "$B" "$n" "$*" "$R"; }
note() { printf '%s   %s%s\n' "$D" "$*" "$R"; }
show() { printf '%s$ %s%s\n' "$D" "$*" "$R"; }
run()  { show "$*"; "$@"; }
quoted() {  # the arguments as a reader would type them: single quotes where needed
    local a out=()
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:=@,+-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
    done
    printf '%s' "${out[*]}"
}
fq()   { show "python manage.py fq $(quoted "$@")"; "$PY" manage.py fq "$@"; }

database="the SQLite database var/db.sqlite3 (WAL, IMMEDIATE transactions)"
if [ -n "${DATABASE_URL:-}" ]; then database="the database named by FQ_DEMO_DATABASE_URL (emptied)"; fi
step "Fresh start: remove var/ and migrate $database"
show "rm -rf var"
rm -rf var
show "python manage.py migrate --no-input | tail -n 3"
"$PY" manage.py migrate --no-input | tail -n 3
if [ -n "${DATABASE_URL:-}" ]; then
    show "python manage.py flush --no-input"
    "$PY" manage.py flush --no-input
fi

step "Configure queue docs:native: 4 jobs at once, 3 attempts, retry backoff 1 s doubling up to 60 s"
fq config docs:native --concurrency 4 --max-attempts 3 --backoff 1000 --max-backoff 60000

step "Enqueue a job with idempotency token print-1 ..."
fq enqueue docs:native '{"job":"print","id":1}' --idempotency print-1 --json
step "... and the very same enqueue again: same id, created 0, no second job"
fq enqueue docs:native '{"job":"print","id":1}' --idempotency print-1 --json

step "Queue statistics: one job ready"
fq stats docs:native

step "The ready jobs page (metadata only, in claim order)"
fq jobs docs:native --state ready

step "A hand-written consumer (scripts/consumer.py): claim with a 60 s lease, print, ack with the receipt"
run "$PY" scripts/consumer.py

step "After the ack the job is succeeded"
fq stats docs:native

step "The worker runs registered handlers: one more job for the print handler, drained with --burst"
fq enqueue docs:native '{"job":"print","id":2}' --json
show "python manage.py fq_worker --queue docs:native --burst"
"$PY" manage.py fq_worker --queue docs:native --burst

step "Enqueue $N_EMAILS welcome emails in one bulk call (fq enqueue-many, one token per user)"
mkdir -p var
"$PY" - "$N_EMAILS" > var/welcome.jsonl <<'PY'
import json, sys
for i in range(1, int(sys.argv[1]) + 1):
    print(json.dumps({"payload": {"user_id": i, "email": f"user{i}@example.com"}, "idempotency": f"welcome-{i}"}))
PY
note "var/welcome.jsonl: $(wc -l < var/welcome.jsonl) lines like $(head -n 1 var/welcome.jsonl)"
show "python manage.py fq enqueue-many emails:welcome var/welcome.jsonl --json > var/enqueued.json"
"$PY" manage.py fq enqueue-many emails:welcome var/welcome.jsonl --json > var/enqueued.json
note "var/enqueued.json: $("$PY" -c '
import json, sys
rows = json.load(open(sys.argv[1]))
created = sum(int(r["created"]) for r in rows)
print("%d results, %d created, %d duplicates; the first is %s" % (len(rows), created, len(rows) - created, json.dumps(rows[0])))' var/enqueued.json)"
fq stats emails:welcome

step "Drain emails:welcome with a worker (exits when nothing is left)"
start=$(date +%s)
show "python manage.py fq_worker --queue emails:welcome --burst 2> var/worker.log"
"$PY" manage.py fq_worker --queue emails:welcome --burst 2> var/worker.log || { cat var/worker.log; exit 1; }
note "worker log: $(wc -l < var/worker.log) lines in var/worker.log; the last ones:"
tail -n 3 var/worker.log
note "drained in about $(( $(date +%s) - start )) s"
fq stats emails:welcome

count_emails() { cat var/emails/*.log 2>/dev/null | grep -c '^Subject: Welcome!' || true; }
count_rows() { "$PY" manage.py shell -v 0 -c 'from example_project.demo.models import WelcomeEmail; print(WelcomeEmail.objects.count())'; }
note "emails written to var/emails: $(count_emails); WelcomeEmail rows: $(count_rows)"

step "Run the welcome job for user 1 again (a new job, no token): the handler sees the record and does not send"
show "python manage.py fq enqueue emails:welcome '{\"user_id\":1,\"email\":\"user1@example.com\"}' --json"
again="$("$PY" manage.py fq enqueue emails:welcome '{"user_id":1,"email":"user1@example.com"}' --json)"
echo "$again"
show "python manage.py fq_worker --queue emails:welcome --burst 2>> var/worker.log"
"$PY" manage.py fq_worker --queue emails:welcome --burst 2>> var/worker.log
job_id="$(printf '%s' "$again" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["id"])')"
fq get emails:welcome "$job_id"
note "emails written to var/emails: $(count_emails) (still $N_EMAILS)"

step "The admin: a demo superuser admin / admin (for this local demo only)"
show "DJANGO_SUPERUSER_PASSWORD=admin python manage.py createsuperuser --noinput --username admin --email admin@example.com"
DJANGO_SUPERUSER_PASSWORD=admin "$PY" manage.py createsuperuser --noinput --username admin --email admin@example.com || true
# The settings read DATABASE_URL: without it runserver would open the SQLite file, not the demo's database.
url_prefix=""
if [ -n "${DATABASE_URL:-}" ]; then url_prefix="DATABASE_URL=$(quoted "$DATABASE_URL") "; fi
note "Run: ${url_prefix}DEBUG=1 $PY manage.py runserver, open http://127.0.0.1:8000/admin/ and log in as admin / admin (Job queues > Queue dashboard)"

printf '\n%sDone.%s Look around: var/emails/ (the sent mails), python manage.py fq --help, docs/quickstart.md\n' "$B" "$R"
