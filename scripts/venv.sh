#!/usr/bin/env bash
# Create (if missing) and fill (if out of date) one virtualenv of the project.
#
#   scripts/venv.sh DIR PYTHON_VERSION [EXTRA_REQUIREMENT...]
#   scripts/venv.sh .venv-dj6 3.12 "Django>=6.0,<6.2"
#
# Installs the project editable with its dev extras (`pip install -e ".[dev]"`)
# plus the extra requirements. FQ_VENV_EXTRAS picks other extras instead of
# "dev" (`FQ_VENV_EXTRAS=lint,docs scripts/venv.sh .venv-tools 3.12`).
# A stamp file DIR/.fq-stamp holds a hash of pyproject.toml, the interpreter
# version and the extras; when it matches, nothing is installed again, so
# repeated `make test` runs start at once.
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${1:?usage: venv.sh DIR PYTHON_VERSION [REQUIREMENT...]}"
pyver="${2:?usage: venv.sh DIR PYTHON_VERSION [REQUIREMENT...]}"
shift 2
extras="${FQ_VENV_EXTRAS:-dev}"

if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import sys" >/dev/null 2>&1; then
    base="$(scripts/find-python.sh "$pyver")"
    echo ">> creating $dir with $base"
    rm -rf "$dir"
    "$base" -m venv "$dir"
fi

have="$("$dir/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$have" != "$pyver" ]; then
    echo "venv.sh: $dir has Python $have, expected $pyver; remove it and rerun" >&2
    exit 1
fi

stamp="$( { cat pyproject.toml; echo "python=$have"; echo "extras=$extras"; printf 'req=%s\n' "$@"; } | sha256sum | cut -d' ' -f1)"
if [ -f "$dir/.fq-stamp" ] && [ "$(cat "$dir/.fq-stamp")" = "$stamp" ]; then
    exit 0
fi

echo ">> installing django-fq[$extras] $* into $dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extras]" "$@"
"$dir/bin/python" -c 'import django, sys; print(f">> {sys.argv[1]}: Python {sys.version.split()[0]}, Django {django.get_version()}")' "$dir"
echo "$stamp" > "$dir/.fq-stamp"
