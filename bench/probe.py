"""Wall time of `fdl probe --json` against a bare interpreter, measured in one run.

    python bench/probe.py [--runs N]

The probe runs its full path: the real pynvml against a fake libnvidia-ml.so.1
with two GPUs (built here with gcc, as the tests do) and their health
readings, a scripted host root for the stack checks, a libtorch tree with a
bundled NCCL that is loaded through ctypes, and a data directory that is
written to. Measured twice: in a directory without fdl.yml, and inside a
project (fdl.yml is then read). Prints medians of wall and CPU time (user + system) and their ratios to
`python3 -c pass` (the same interpreter).
Target, on wall time: <= 10x.

With --baseline DIR (another checkout of fdl, e.g. `git worktree add DIR main`;
give it more than once to compare several) each baseline's probe runs in the
same interleaved rounds, so a change is measured before and after against the
same noise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _timing import (  # noqa: E402
    PY,
    compile_package,
    env_for_fdl,
    fdl_command,
    interleaved_timings,
    print_timings,
    trees,
)

from tests.fakes import FakeNvml, build_fake_nvml, make_host_root, make_libtorch  # noqa: E402

TARGET = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--baseline", type=Path, metavar="DIR", action="append", default=[],
                        help="another fdl checkout, measured alongside (repeatable)")
    args = parser.parse_args()
    compile_package(args.baseline)
    with tempfile.TemporaryDirectory(prefix="fdl-bench-probe-") as tmp:
        root = Path(tmp)
        nvml = FakeNvml(build_fake_nvml(root / "nvml"), make_host_root(root / "host"))
        bare_dir, project = root / "bare", root / "project"
        for where in (bare_dir, project):
            make_libtorch(where / "libtorch", "precompiled/cu128", nccl="2.27.5")
        (project / "fdl.yml").write_text("commands:\n  test: {run: cargo test}\n")
        (root / "data").mkdir()
        env = env_for_fdl({**nvml.env("H100:9.0:80G,RTX3060:8.6:12G"), "HOME": str(root)})
        for var in ("LIBTORCH", "LIBTORCH_PATH", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD"):
            env.pop(var, None)
        fdl = fdl_command()
        probe = [*fdl, "probe", "--json", "--data-path", str(root / "data")]
        sample = subprocess.run(probe, cwd=project, env=env, capture_output=True, text=True)
        statuses = {c["name"]: c["status"] for c in json.loads(sample.stdout)["checks"]}
        print(f"probe exit {sample.returncode}, checks: {statuses}")
        tree_envs = trees(env, args.baseline, root / "caches")
        bare_cmd = [*probe, "--libtorch-path", str(bare_dir / "libtorch")]
        results = interleaved_timings({"python3 -c pass": ([PY, "-c", "pass"], env),
                                       **{f"fdl probe --json{tag}": (bare_cmd, tree_env)
                                          for tag, tree_env in tree_envs.items()}},
                                      runs=args.runs, cwd=bare_dir)
        in_project = interleaved_timings({"python3 -c pass": ([PY, "-c", "pass"], env),
                                          **{f"fdl probe --json (project){tag}": (probe, tree_env)
                                             for tag, tree_env in tree_envs.items()}},
                                         runs=args.runs, cwd=project)
    rows = [("python3 -c pass", results["python3 -c pass"], results["python3 -c pass"])]
    for case in (results, in_project):
        rows += [(name, timing, case["python3 -c pass"]) for name, timing in case.items() if name != "python3 -c pass"]
    print_timings(rows)
    worst = max(timing.wall / bare.wall for name, timing, bare in rows if "[" not in name)
    print(f"target <= {TARGET:.0f}x bare: {'met' if worst <= TARGET else 'MISSED'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
