"""Startup cost of fdl's local commands against a bare interpreter, measured in one run.

    python bench/startup.py [--runs N]

Prints the median wall and CPU time (user + system: what a command costs
itself, which moves less than its wall time on a loaded machine) of
`python3 -c pass`, `fdl --help`, `fdl config show` (on a small three-layer
project) and `fdl status` with no run listening (a loopback port that
refuses), and their ratios to the bare interpreter. Target, on wall time:
`fdl --help` and `fdl config show` <= 8x; `fdl status` is shown, not held to
it (it loads the HTTP client to ask).

With --baseline DIR (another checkout of fdl, e.g. `git worktree add DIR main`;
give it more than once to compare several) each baseline's commands run in the
same interleaved rounds, so a change is measured before and after against the
same noise.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import PY, compile_package, env_for_fdl, fdl_command, interleaved_timings, print_timings, trees

TARGET = 8.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--baseline", type=Path, metavar="DIR", action="append", default=[],
                        help="another fdl checkout, measured alongside (repeatable)")
    args = parser.parse_args()
    compile_package(args.baseline)
    # a port bound but not listening refuses connections: `fdl status` finds no run there
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    no_run = f"127.0.0.1:{closed.getsockname()[1]}"
    with closed, tempfile.TemporaryDirectory() as tmp:
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
        (root / "fdl.farm.yml").write_text("inherit-from: base\ncluster:\n  controller:\n"
                                           "    join: {token_file: .fdl/farm/token}\n")
        (root / ".fdl" / "farm").mkdir(parents=True)
        (root / ".fdl" / "farm" / "token").write_text("5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a\n")
        (root / ".fdl" / "farm" / "token").chmod(0o600)
        env = env_for_fdl()
        fdl = fdl_command()
        commands = {"python3 -c pass": ([PY, "-c", "pass"], env)}
        for tag, tree_env in trees(env, args.baseline, root / ".caches").items():
            commands[f"fdl --help{tag}"] = ([*fdl, "--help"], tree_env)
            commands[f"fdl config show{tag}"] = ([*fdl, "@farm", "config", "show"], tree_env)
            commands[f"fdl status (no run){tag}"] = ([*fdl, "status", "--addr", no_run], tree_env)
        results = interleaved_timings(commands, runs=args.runs, cwd=root)
    bare = results["python3 -c pass"]
    print_timings([(name, timing, bare) for name, timing in results.items()])
    worst = max(timing.wall / bare.wall for name, timing in results.items() if "[" not in name and "status" not in name)
    print(f"target <= {TARGET:.0f}x bare: {'met' if worst <= TARGET else 'MISSED'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
