#!/usr/bin/env bash
# Install fdl from this checkout into ./.venv (created if missing). Extra pip
# arguments are passed on, e.g. `scripts/install.sh '.[test]'`. Says what it
# installs before installing it, and lets pip show its progress. Every release
# is held to constraints.txt (what the tests ran with; scripts/refresh-constraints
# re-resolves it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "install: $PY lacks venv/ensurepip; installing the Debian package python3-venv (apt-get)" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi
if [ ! -x .venv/bin/python ]; then
    echo "install: creating the virtual environment $PWD/.venv ($("$PY" --version 2>&1))" >&2
    "$PY" -m venv .venv
fi
deps=$(.venv/bin/python - "${1:-.}" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = [d.split(";")[0].strip() for d in project["dependencies"]]
extra = sys.argv[1].partition("[")[2].rstrip("]")
for name in filter(None, extra.split(",")):
    wanted += [d.split(";")[0].strip() for d in project["optional-dependencies"][name]]
print(", ".join(wanted))
PY
)
echo "install: into $PWD/.venv: pip (upgraded), then fdl from this checkout (editable) and what it needs," \
     "at the releases constraints.txt pins:" >&2
echo "install:   $deps" >&2
.venv/bin/python -m pip install --upgrade pip
.venv/bin/python -m pip install -c constraints.txt -e "${1:-.}"
