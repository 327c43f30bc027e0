#!/usr/bin/env bash
# Build the distributions, check them, and prove the wheel works on its own.
#
#   scripts/package-check.sh                       # what `make package-check` runs
#   PYTHON=.venv-tools/bin/python scripts/package-check.sh
#
# 1. `python -m build`: the sdist, then the wheel built from that sdist, into a
#    temporary directory (nothing is left in the repository);
# 2. `twine check --strict` on both (metadata, README rendering);
# 3. the wheel holds the migrations, templates, static files, management
#    commands and py.typed, its version is django_fq.__version__, and it
#    registers the pytest plugin (entry point pytest11 django_fq);
# 4. a fresh venv (SMOKE_PYTHON_VERSION, default 3.11: the oldest supported)
#    installs the wheel alone, with its runtime dependencies and nothing from
#    the dev extras. From a temporary directory, so the repository is not on
#    sys.path, a tiny project on SQLite runs: `check`, `migrate`, `fq config`,
#    `fq enqueue`, `fq_worker --burst` with a handler, then the job's stored
#    result is read back; `collectstatic` finds the admin stylesheet and the
#    admin templates load.
# PYTHON needs `build` and `twine` (the `package` extra). Exits non-zero on the
# first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

PYTHON="${PYTHON:-python3}"
SMOKE_PYTHON_VERSION="${SMOKE_PYTHON_VERSION:-3.11}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

step() { printf '\n>> %s\n' "$*"; }

step "build sdist and wheel"
"$PYTHON" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
# setuptools builds in the tree; leave nothing behind.
rm -rf build
ls -1 "$work/dist"
sdist=("$work"/dist/django_fq-*.tar.gz)
wheel=("$work"/dist/django_fq-*-py3-none-any.whl)
[ -f "${sdist[0]}" ] && [ -f "${wheel[0]}" ] || { echo "missing sdist or wheel" >&2; exit 1; }

step "twine check --strict"
"$PYTHON" -m twine check --strict "${sdist[0]}" "${wheel[0]}"

step "contents of the wheel"
"$PYTHON" - "${wheel[0]}" "${sdist[0]}" "$repo" <<'EOF'
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

wheel, sdist, repo = sys.argv[1], sys.argv[2], Path(sys.argv[3])
names = set(zipfile.ZipFile(wheel).namelist())
source = (repo / "django_fq" / "__init__.py").read_text()
version = re.search(r'^__version__ = "([^"]+)"', source, re.M).group(1)
problems = []
if f"django_fq-{version}-py3-none-any.whl" != Path(wheel).name:
    problems.append(f"wheel name {Path(wheel).name} does not carry __version__ {version}")
# Every file the package keeps in git (modules, migrations, templates, static,
# py.typed) must be in the wheel.
tracked = subprocess.run(
    ["git", "ls-files", "django_fq"], cwd=repo, capture_output=True, text=True, check=True
).stdout.split()
for path in sorted(tracked):
    if path not in names:
        problems.append(f"missing from the wheel: {path}")
for required in (
    "django_fq/py.typed",
    "django_fq/migrations/0001_initial.py",
    "django_fq/management/commands/fq.py",
    "django_fq/management/commands/fq_worker.py",
    "django_fq/static/django_fq/admin.css",
    "django_fq/templates/admin/django_fq/dashboard.html",
):
    if required not in names:
        problems.append(f"missing from the wheel: {required}")
stray = sorted(n for n in names if not n.startswith(("django_fq/", f"django_fq-{version}.dist-info/")))
if stray:
    problems.append(f"unexpected files in the wheel: {stray}")
meta = zipfile.ZipFile(wheel).read(f"django_fq-{version}.dist-info/METADATA").decode()
for needle in ("License-Expression: BSD-3-Clause", "Classifier: Typing :: Typed", "Requires-Python: >=3.11"):
    if needle not in meta:
        problems.append(f"METADATA lacks {needle!r}")
# The pytest plugin (docs/how-to/testing.md) is registered for pytest11.
entry_points = zipfile.ZipFile(wheel).read(f"django_fq-{version}.dist-info/entry_points.txt").decode()
if "[pytest11]" not in entry_points or "django_fq = django_fq.testing.pytest_plugin" not in entry_points:
    problems.append("entry_points.txt lacks the pytest11 entry point django_fq = django_fq.testing.pytest_plugin")
members = tarfile.open(sdist).getnames()
for required in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"):
    if f"django_fq-{version}/{required}" not in members:
        problems.append(f"missing from the sdist: {required}")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"version {version}: {len(names)} files in the wheel, {len(members)} entries in the sdist")
EOF

step "install the wheel in a fresh venv (Python $SMOKE_PYTHON_VERSION, no dev extras)"
base="$(scripts/find-python.sh "$SMOKE_PYTHON_VERSION")"
"$base" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check "${wheel[0]}"
"$py" -m pip list --disable-pip-version-check --format=freeze | sed 's/^/   /'
if "$py" -m pip show --disable-pip-version-check pytest >/dev/null 2>&1; then
    echo "pytest is installed: the wheel must not pull the dev extras" >&2
    exit 1
fi

step "a tiny project on SQLite, outside the repository"
proj="$work/project"
mkdir -p "$proj"
cat >"$proj/smoke_settings.py" <<EOF
SECRET_KEY = "package-check-only"
USE_TZ = True
DEBUG = False
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_fq",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": "$proj/db.sqlite3",
    "OPTIONS": {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    },
}}
STATIC_URL = "/static/"
STATIC_ROOT = "$proj/static"
ROOT_URLCONF = "smoke_settings"
urlpatterns = []
FQ_HANDLERS = {"smoke": "smoke_jobs.double"}
EOF
cat >"$proj/smoke_jobs.py" <<'EOF'
def double(job):
    return {"doubled": job.payload["n"] * 2, "attempts": job.attempts}
EOF

cd "$proj"
export DJANGO_SETTINGS_MODULE=smoke_settings PYTHONPATH="$proj"
where="$("$py" -c 'import django_fq, sys; print(django_fq.__file__)')"
case "$where" in
    "$work/venv/"*) echo "django_fq imported from $where" ;;
    *) echo "django_fq was imported from $where, not from the installed wheel" >&2; exit 1 ;;
esac
"$py" -m django check --fail-level WARNING
"$py" -m django migrate --no-input -v 0
"$py" -m django fq config smoke --max-attempts 2 --json
"$py" -m django fq enqueue smoke '{"n": 21}' --idempotency smoke-1 --json | tee "$work/enqueue.json"
"$py" -m django fq_worker --queue smoke --burst --no-progress
"$py" - "$work/enqueue.json" <<'EOF'
import json
import sys

import django

django.setup()
from django_fq import services as fq

job_id = json.load(open(sys.argv[1]))["id"]
info = fq.get("smoke", job_id)
assert info.state == "succeeded", info
assert info.result == {"doubled": 42, "attempts": 1}, info.result
counts = fq.stats("smoke").counts
assert counts["succeeded"] == 1 and counts["ready"] == 0, counts

from django.template.loader import get_template

for name in ("admin/django_fq/dashboard.html", "admin/django_fq/queue/change_list.html"):
    get_template(name)
print(f"job {job_id} succeeded with {info.result}; admin templates load")
EOF
"$py" -m django collectstatic --no-input -v 0
[ -f "$proj/static/django_fq/admin.css" ] || { echo "collectstatic did not find django_fq/admin.css" >&2; exit 1; }
echo "collectstatic copied django_fq/admin.css"

printf '\npackage-check: OK\n'
