"""The all-reduce smoke test on this host's CPU: bus bandwidth per size for 2 and 4 gloo ranks.

    python bench/collective.py [--max-size 64M] [--time-limit 120]

Runs `fdl probe --collective`'s local path (real PyTorch ranks under the rank
supervisor) twice, with 2 and with 4 CPU ranks, and prints, per message
size, each run's bus bandwidth and their ratio (4 ranks / 2 ranks), then each
run's wall time as a share of its time limit. Machine-dependent figures; the
ratios are what compare across machines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fdl.collective.results import human_size
from fdl.collective.run import CollectiveOptions, parse_size, run_local


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-size", default="64M")
    parser.add_argument("--time-limit", type=float, default=120.0)
    args = parser.parse_args()
    options = CollectiveOptions(time_limit_s=args.time_limit, max_bytes=parse_size(args.max_size))
    runs = {n: run_local(None, n, options, host="bench") for n in (2, 4)}
    for n, result in runs.items():
        if not result.finished:
            print(f"{n} ranks did not finish: {result.failure or result.errors or 'abandoned'}")
            return 1
    two, four = ({r.bytes: r for r in runs[n].rows} for n in (2, 4))
    print(f"{'size':>10} {'busbw 2 ranks':>14} {'busbw 4 ranks':>14} {'4/2':>6}")
    for size in sorted(set(two) & set(four)):
        a, b = two[size].busbw_gbs, four[size].busbw_gbs
        print(f"{human_size(size):>10} {a:>12.3f}   {b:>12.3f}   {b / a if a else 0:>6.2f}")
    for n, result in runs.items():
        print(f"{n} ranks: {result.elapsed_s:.1f} s wall, {result.elapsed_s / args.time_limit:.2f} of the "
              f"{args.time_limit:.0f} s limit; slowest rank {result.slowest_rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
