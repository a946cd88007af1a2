"""Startup cost of fdl's local commands against a bare interpreter, measured in one run.

    python bench/startup.py [--runs N]

Prints the median wall time of `python3 -c pass`, `fdl --help` and
`fdl config show` (on a small three-layer project), and their ratios to the
bare interpreter. Target: each <= 8x.

With --baseline DIR (another checkout of fdl, e.g. `git worktree add DIR main`)
the baseline's commands run in the same interleaved rounds, so a change is
measured before and after against the same noise.
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
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="another fdl checkout, measured alongside")
    args = parser.parse_args()
    compile_package()
    if args.baseline is not None:
        import compileall

        compileall.compile_dir(str(args.baseline / "fdl"), quiet=1)
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
        trees = {"": env}
        if args.baseline is not None:
            trees[" [baseline]"] = {**env, "PYTHONPATH": str(args.baseline.resolve())}
        commands = {"python3 -c pass": ([PY, "-c", "pass"], env)}
        for tag, tree_env in trees.items():
            commands[f"fdl --help{tag}"] = ([*fdl, "--help"], tree_env)
            commands[f"fdl config show{tag}"] = ([*fdl, "@farm", "config", "show"], tree_env)
        results = interleaved(commands, runs=args.runs, cwd=root)
    bare = results["python3 -c pass"]
    worst = 0.0
    print(f"{'command':<30} {'median ms':>10} {'x bare':>8}")
    for name, seconds in results.items():
        ratio = seconds / bare
        if "[baseline]" not in name:
            worst = max(worst, ratio)
        print(f"{name:<30} {seconds * 1000:>10.1f} {ratio:>8.2f}")
    print(f"target <= {TARGET:.0f}x bare: {'met' if worst <= TARGET else 'MISSED'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
