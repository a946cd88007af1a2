#!/usr/bin/env bash
# Install fdl from this checkout into ./.venv (created if missing). Extra pip
# arguments are passed on, e.g. `scripts/install.sh '.[test]'`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "install: $PY lacks venv/ensurepip; installing python3-venv" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e "${1:-.}"
