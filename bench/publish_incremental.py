"""What an incremental republish costs against a cold publish, measured in one run.

    python bench/publish_incremental.py [--runs N] [--files N]

A dependency-free Rust crate (plus --files filler source files, so the copy has
something to do) is published with the default gate (`cargo build --release`):

- cold:   into a fresh served directory (full copy, full build);
- fill:   again, nothing changed: the publish is staged in the served
          directory's second release, so this one copy is full (the build
          cache moves along, so cargo finds nothing to do);
- warm:   again, nothing changed, into the first release again (rsync sends
          nothing, cargo finds nothing to do): every later republish;
- edit:   after a one-line change to main.rs (one file copied, one crate rebuilt);
- bare:   `fdl publish --help`, the fixed cost of starting fdl.

Prints the median wall time of each and the ratios fill/cold, warm/cold and edit/cold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import PY, compile_package, env_for_fdl


def make_crate(root: Path, files: int) -> None:
    (root / "src").mkdir(parents=True)
    (root / "Cargo.toml").write_text('[package]\nname = "benchy"\nversion = "0.1.0"\nedition = "2021"\n')
    (root / "src" / "main.rs").write_text('fn main() { println!("0"); }\n')
    data = root / "assets"
    data.mkdir()
    for n in range(files):
        (data / f"part{n:04d}.txt").write_text(f"filler {n}\n" * 400)


def timed(argv: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"bench: publish failed:\n{result.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=500)
    args = parser.parse_args()
    if shutil.which("cargo") is None:
        raise SystemExit("bench: needs cargo on PATH")
    compile_package()
    samples: dict[str, list[float]] = {"bare": [], "cold": [], "fill": [], "warm": [], "edit": []}
    with tempfile.TemporaryDirectory(prefix="fdl-bench-publish-") as tmp:
        root = Path(tmp)
        crate = root / "crate"
        make_crate(crate, args.files)
        env = env_for_fdl({"CARGO_NET_OFFLINE": "true"})
        env.pop("CARGO_TARGET_DIR", None)
        for run in range(args.runs):
            served = root / f"served{run}"
            publish = [PY, "-m", "fdl", "publish", f"file://{crate}", "--bin", "target/release/benchy",
                       "--to", str(served)]
            samples["bare"].append(timed([PY, "-m", "fdl", "publish", "--help"], root, env))
            samples["cold"].append(timed(publish, root, env))
            samples["fill"].append(timed(publish, root, env))
            samples["warm"].append(timed(publish, root, env))
            (crate / "src" / "main.rs").write_text(f'fn main() {{ println!("{run + 1}"); }}\n')
            samples["edit"].append(timed(publish, root, env))
            shutil.rmtree(served)
    med = {name: statistics.median(values) for name, values in samples.items()}
    print(f"crate with {args.files} filler files, {args.runs} runs, {os.cpu_count()} cpus")
    print(f"{'publish':<8} {'median s':>9} {'x cold':>7}")
    for name in ("cold", "fill", "warm", "edit", "bare"):
        print(f"{name:<8} {med[name]:>9.2f} {med[name] / med['cold']:>7.2f}")
    print(f"fill/cold = {med['fill'] / med['cold']:.2f}, warm/cold = {med['warm'] / med['cold']:.2f}, "
          f"edit/cold = {med['edit'] / med['cold']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
