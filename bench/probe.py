"""Wall time of `fdl probe --json` against a bare interpreter, measured in one run.

    python bench/probe.py [--runs N]

The probe runs its full path: the real pynvml against a fake libnvidia-ml.so.1
with two GPUs (built here with gcc, as the tests do) and their health
readings, a scripted host root for the stack checks, a libtorch tree with a
bundled NCCL that is loaded through ctypes, and a data directory that is
written to. Measured twice: in a directory without fdl.yml, and inside a
project (fdl.yml is then read). Prints medians and ratios to `python3 -c pass`
(the same interpreter). Target: <= 10x.
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
from _timing import PY, compile_package, env_for_fdl, fdl_command, interleaved  # noqa: E402

from tests.fakes import FakeNvml, build_fake_nvml, make_host_root, make_libtorch  # noqa: E402

TARGET = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    compile_package()
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
        results = interleaved({
            "python3 -c pass": ([PY, "-c", "pass"], env),
            "fdl probe --json": ([*probe, "--libtorch-path", str(bare_dir / "libtorch")], env),
        }, runs=args.runs, cwd=bare_dir)
        in_project = interleaved({
            "python3 -c pass": ([PY, "-c", "pass"], env),
            "fdl probe --json (project)": (probe, env),
        }, runs=args.runs, cwd=project)
    bare = results["python3 -c pass"]
    rows = [("python3 -c pass", bare, 1.0),
            ("fdl probe --json", results["fdl probe --json"], results["fdl probe --json"] / bare),
            ("fdl probe --json (project)", in_project["fdl probe --json (project)"],
             in_project["fdl probe --json (project)"] / in_project["python3 -c pass"])]
    print(f"{'command':<28} {'median ms':>10} {'x bare':>8}")
    for name, seconds, ratio in rows:
        print(f"{name:<28} {seconds * 1000:>10.1f} {ratio:>8.2f}")
    worst = max(r[2] for r in rows)
    print(f"target <= {TARGET:.0f}x bare: {'met' if worst <= TARGET else 'MISSED'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
