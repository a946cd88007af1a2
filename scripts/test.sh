#!/usr/bin/env bash
# Install everything the tests need (Debian packages, fdl with its test extras,
# the CPU build of PyTorch) and run the whole suite. Extra arguments go to pytest.
#   scripts/test.sh --matrix   every supported controller combination of Python and ansible-core
#                              instead (docs/ansible.md, "Supported platforms"; venvs cached under
#                              ~/.cache/fdl-test/matrix or FDL_MATRIX_CACHE)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
mapfile -t wanted < <(grep -v '^\s*#' scripts/apt-test.txt | sed '/^\s*$/d')
missing=()
for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "test: installing Debian packages: ${missing[*]}" >&2
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
scripts/install.sh '.[test]'
.venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
if [ "${1:-}" = "--matrix" ]; then
    shift; export FDL_MATRIX=all; set -- tests/integration/cluster/test_platforms.py "$@"
fi
exec .venv/bin/python -m pytest "$@"
