#!/usr/bin/env bash
# The quickstart in one command: install fdl into ./.venv (with PyTorch 2.13.0, for the demo), run `fdl probe`
# on this machine, then train the demo in examples/quickstart as a 2-rank single-host cluster and show
# `fdl status` while it runs. Exits with the demo's code: 0 when both ranks trained and agree.
#
# `fdl probe` exits 1 on a machine without an NVIDIA GPU (or without libtorch/NCCL): that is its verdict on
# this box as a GPU training host, not a failure of the quickstart, so it is reported and the demo goes on.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
.venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
export PATH="$PWD/.venv/bin:$PATH"   # fdl, and the python3 the demo's ranks run

echo "== fdl probe"
if fdl probe; then
    echo "== probe: this machine is ready for GPU training"
else
    echo "== probe exited $? (expected on a machine without a GPU, libtorch or NCCL); the CPU demo runs anyway"
fi

echo "== fdl train (examples/quickstart: 2 CPU ranks, gloo)"
cd examples/quickstart
fdl train -- --pause 0.2 &
demo=$!
trap 'kill -INT $demo 2>/dev/null || true; wait $demo 2>/dev/null || true' INT TERM
for _ in $(seq 1 300); do           # until the run answers and trains (a minute at most), then show it once
    if out=$(fdl status 2>/dev/null) && grep -q training <<<"$out"; then
        echo "== fdl status (while it trains)"
        echo "$out"
        break
    fi
    kill -0 $demo 2>/dev/null || break
    sleep 0.2
done
wait $demo
