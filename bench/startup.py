"""Startup cost of fdl's local commands against a bare interpreter, measured in one run.

    python bench/startup.py [--runs N]

Prints the median wall time of `python3 -c pass`, `fdl --help` and
`fdl config show` (on a small three-layer project), and their ratios to the
bare interpreter. Target: each <= 8x.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import PY, compile_package, env_for_fdl, fdl_command, interleaved

TARGET = 8.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "fdl.yml").write_text(textwrap.dedent("""\
            cluster:
              controller: {host: 10.0.0.1, port: 1337}
              workers:
                - {host: node-b, address: 10.0.0.12, local_devices: [0, 1]}
            commands:
              test: {run: cargo test}
            """))
        (root / "fdl.base.yml").write_text("cluster:\n  controller:\n    join: {discovery: true}\n")
        (root / "fdl.farm.yml").write_text("inherit-from: base\ncluster:\n  controller:\n    join: {token: t}\n")
        env = env_for_fdl()
        fdl = fdl_command()
        results = interleaved({
            "python3 -c pass": ([PY, "-c", "pass"], env),
            "fdl --help": ([*fdl, "--help"], env),
            "fdl config show": ([*fdl, "@farm", "config", "show"], env),
        }, runs=args.runs, cwd=root)
    bare = results["python3 -c pass"]
    worst = 0.0
    print(f"{'command':<20} {'median ms':>10} {'x bare':>8}")
    for name, seconds in results.items():
        ratio = seconds / bare
        worst = max(worst, ratio)
        print(f"{name:<20} {seconds * 1000:>10.1f} {ratio:>8.2f}")
    print(f"target <= {TARGET:.0f}x bare: {'met' if worst <= TARGET else 'MISSED'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
