#!/usr/bin/env bash
# Install everything the tests need (Debian packages, fdl with its test extras,
# the CPU build of PyTorch) and run the whole suite. Extra arguments go to pytest.
#
#   scripts/test.sh            the whole suite (testbed hosts, sshd, Ansible: needs root or sudo)
#   scripts/test.sh --quick    unit and CLI tests only (tests/unit, tests/cli): minutes, no testbed
#   scripts/test.sh --matrix   every supported controller combination of Python and ansible-core
#                              instead (docs/ansible.md, "Supported platforms"; venvs cached under
#                              ~/.cache/fdl-test/matrix or FDL_MATRIX_CACHE)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=()
if [ "${1:-}" = "--quick" ]; then
    shift
    paths=(tests/unit tests/cli)
elif [ "${1:-}" = "--matrix" ]; then
    shift
    export FDL_MATRIX=all
    paths=(tests/integration/cluster/test_platforms.py)
fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
mapfile -t wanted < <(grep -v '^\s*#' scripts/apt-test.txt | sed 's/\s*#.*//; /^\s*$/d')
missing=()
for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "test: the tests need these Debian packages, missing here (scripts/apt-test.txt says why);" \
         "installing them with ${SUDO:+sudo }apt-get:" >&2
    echo "test:   ${missing[*]}" >&2
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
scripts/install.sh '.[test]'
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    echo "test: installing PyTorch 2.13.0 into .venv (the distributed tests train on CPU ranks)" >&2
    .venv/bin/python -m pip install -c constraints.txt torch==2.13.0
fi
exec .venv/bin/python -m pytest "${paths[@]}" "$@"
