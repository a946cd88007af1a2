#!/usr/bin/env bash
# Install everything the tests need (Debian packages, fdl with its test extras,
# the CPU build of PyTorch) and run the whole suite. Extra arguments go to pytest.
#
#   scripts/test.sh            the whole suite (testbed hosts, sshd, Ansible: needs root or sudo)
#   scripts/test.sh --quick    unit and CLI tests only (tests/unit, tests/cli): minutes, no testbed
#   scripts/test.sh --matrix   every supported controller combination of Python and ansible-core
#                              instead (docs/ansible.md, "Supported platforms"; venvs cached under
#                              ~/.cache/fdl-test/matrix or FDL_MATRIX_CACHE)
#
# Each phase (Debian packages, the install, PyTorch, pytest) ends with a line on stderr saying how long it
# took, and the last line gives the total. The tests run with a home and XDG directories of the run's own
# (tests/conftest.py), so two clones can run this at once on one machine.
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
now() { date +%s%N; }
# "12.3 s" or "4 min 07 s" since the start time given (nanoseconds)
took() {
    local ms=$(( ($(now) - $1) / 1000000 ))
    if [ $ms -lt 60000 ]; then
        printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100))
    else
        printf '%d min %02d s' $((ms / 60000)) $((ms % 60000 / 1000))
    fi
}
all=$(now)

phase=$(now)
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
    echo "test: phase 1/4, Debian packages: ${#missing[@]} installed in $(took "$phase")" >&2
else
    echo "test: phase 1/4, Debian packages: all ${#wanted[@]} present ($(took "$phase"))" >&2
fi

phase=$(now)
scripts/install.sh '.[test]'
echo "test: phase 2/4, fdl and its test extras into .venv: $(took "$phase")" >&2

phase=$(now)
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    echo "test: installing PyTorch 2.13.0 into .venv (the distributed tests train on CPU ranks)" >&2
    .venv/bin/python -m pip install -c constraints.txt torch==2.13.0
    echo "test: phase 3/4, PyTorch 2.13.0 installed in $(took "$phase")" >&2
else
    echo "test: phase 3/4, PyTorch already in .venv ($(took "$phase"))" >&2
fi

phase=$(now)
echo "test: phase 4/4, pytest${paths[*]:+ ${paths[*]}}${*:+ $*}" >&2
rc=0
.venv/bin/python -m pytest "${paths[@]}" "$@" || rc=$?
echo "test: phase 4/4, pytest: exit $rc after $(took "$phase")" >&2
echo "test: all phases: $(took "$all")" >&2
exit $rc
