#!/usr/bin/env bash
# Print the absolute path of a working Python interpreter of version MAJOR.MINOR.
#
#   scripts/find-python.sh 3.12      -> /root/.pyenv/versions/3.12.1/bin/python3.12
#
# Tries, in order: $PYTHON<MAJOR><MINOR> (e.g. PYTHON312=/path), pythonX.Y on
# PATH, the same through pyenv with PYENV_VERSION set to each installed
# X.Y.* (pyenv shims refuse versions that are not selected), python3, and
# the usual install locations. Each candidate is run and must report the
# wanted version; exits 1 with a message on stderr when none does.
set -uo pipefail

want="${1:?usage: find-python.sh MAJOR.MINOR}"
var="PYTHON${want//./}"

check() {  # check CMD... -> prints sys.executable when the version matches
    "$@" -c "import sys; v='%d.%d' % sys.version_info[:2]; sys.exit(0 if v == '$want' else 1)" >/dev/null 2>&1 \
        && "$@" -c "import sys; print(sys.executable)" 2>/dev/null
}

try() { local out; out="$(check "$@")" && [ -n "$out" ] && { echo "$out"; exit 0; }; }

[ -n "${!var:-}" ] && try "${!var}"
try "python$want"
if command -v pyenv >/dev/null 2>&1; then
    for v in $(pyenv versions --bare 2>/dev/null | grep -E "^${want//./\\.}(\.[0-9]+)?$" | sort -t. -k3,3nr); do
        PYENV_VERSION="$v" try "python$want"
        [ -x "$(pyenv root)/versions/$v/bin/python$want" ] && try "$(pyenv root)/versions/$v/bin/python$want"
    done
fi
try python3
for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want"*/bin/python"$want" \
         /usr/local/bin/python"$want" /usr/bin/python"$want" /opt/python*/bin/python"$want"; do
    [ -x "$p" ] && try "$p"
done

echo "find-python.sh: no Python $want found (set $var=/path/to/python$want)" >&2
exit 1
