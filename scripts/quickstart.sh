#!/usr/bin/env bash
# The quickstart in one command: install fdl into ./.venv (with PyTorch 2.13.0, for the demo), run `fdl probe`
# on this machine, then train the demo in examples/quickstart as a 2-rank single-host cluster and show
# `fdl status` while it runs. Exits with the demo's code: 0 when both ranks trained and agree; the last line
# it prints is that verdict.
#
# `fdl probe` exits 1 on a machine without an NVIDIA GPU (or without libtorch/NCCL): that is its verdict on
# this box as a GPU training host, not a failure of the quickstart, so it is reported, the box is probed again
# as a CPU host (`fdl probe --cpu`: what the demo's CPU ranks need), and the demo goes on. That probe skips
# the shared data path (the demo reads no dataset); the summary says so and how to check it.
# If the demo's port (1337) is taken, the run moves to a free port and says so; `fdl status` still finds it.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
scripts/install.sh
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    echo "quickstart: installing PyTorch 2.13.0 into .venv for the demo (a few hundred MB on a fresh box)" >&2
    .venv/bin/python -m pip install -c constraints.txt torch==2.13.0
fi
export PATH="$here/.venv/bin:$PATH"   # fdl, and the python3 the demo's ranks run

skipped_data=""   # set when a probe left out the shared data path: the summary says so
echo "== fdl probe"
if fdl probe; then
    echo "== probe: this machine is ready for GPU training"
else
    echo "== probe exited $? (expected on a machine without a GPU, libtorch or NCCL); as a CPU host:"
    echo "== fdl probe --cpu --skip-mount"
    skipped_data=yes
    if fdl probe --cpu --skip-mount; then
        echo "== probe: this machine is ready for training on CPU ranks"
    else
        echo "== probe --cpu exited $?; the demo runs anyway"
    fi
fi

echo "== fdl train (examples/quickstart: 2 CPU ranks, gloo)"
cd examples/quickstart
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fdl train -- --pause 0.2 > >(tee "$log") &
demo=$!
trap 'kill -INT $demo 2>/dev/null || true; wait $demo 2>/dev/null || true; rm -f "$log"' INT TERM
for _ in $(seq 1 300); do           # until the run answers and trains (a minute at most), then show it once
    if out=$(fdl status 2>/dev/null) && grep -q training <<<"$out"; then
        echo "== fdl status (while it trains)"
        echo "$out"
        break
    fi
    kill -0 $demo 2>/dev/null || break
    sleep 0.2
done
code=0
wait $demo || code=$?
wait || true   # and tee, so every rank line is in the log

echo
echo "fdl is installed in $here/.venv/bin/fdl. To use it from any directory:"
echo "    export PATH=\"$here/.venv/bin:\$PATH\"    (or: source $here/.venv/bin/activate)"
echo "To see the same demo run as a cluster over SSH on this machine: examples/cluster/try-local"
if [ -n "$skipped_data" ]; then
    echo "The CPU-host probe skipped the shared data path (--skip-mount). Training that reads a dataset needs it"
    echo "on every host: fdl probe checks /flodl/data, or the directory you name:"
    echo "    fdl probe --cpu --data-path /path/to/your/data"
fi
sums=$(grep -o 'weights checksum [0-9a-f]*' "$log" | awk '{print $3}' | sort -u || true)
ranks=$(grep -c 'weights checksum' "$log" || true)
if [ "$code" -eq 0 ] && [ "$ranks" -eq 2 ] && [ "$(wc -w <<<"$sums")" -eq 1 ]; then
    echo "quickstart: OK: both ranks agree on checksum $sums (2-rank training on this machine)."
else
    echo "quickstart: FAILED: the demo exited $code; ranks reporting a checksum: $ranks; checksums: ${sums:-none}."
    [ "$code" -ne 0 ] || code=1
fi
exit "$code"
