"""The standing watch's cost, per host and per scrape, measured in one run.

    python bench/probe_textfile.py [--runs N] [--gpus N] [--interval-s S]

One worker's side of the watch (docs/probe.md, "At fleet scale"): the timer's
`fdl probe --quiet --textfile FILE` on a host with N scripted GPUs (the real
pynvml against the fake libnvidia-ml.so.1, a libtorch tree with a bundled
NCCL loaded through ctypes, a data directory written to), sampled round-robin
against the same probe without --textfile and `python3 -c pass`. Medians of
wall time and of CPU (user+system of the process); the file's size and series
count; and what a real prometheus-node-exporter (textfile collector alone,
when installed) serves for it: bytes and time per scrape, with and without
the file. Then the day's cost at the timer's interval, and the fleet's side:
the controller runs no fdl at all, Prometheus ingests the series.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _timing import PY, compile_package, env_for_fdl, fdl_command  # noqa: E402

from tests.fakes import FakeNvml, build_fake_nvml, make_host_root, make_libtorch  # noqa: E402
from tests.prometheus import NodeExporter  # noqa: E402


def run_once(argv: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """Wall and CPU seconds (user+system of the process and what it waited for) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sample(commands: dict[str, list[str]], runs: int, cwd: Path, env: dict) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) per command, round-robin so machine noise hits all of them alike."""
    for argv in commands.values():
        run_once(argv, cwd, env)  # warm the page cache
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            wall, cpu = run_once(argv, cwd, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name])) for name in commands}


def scrapes(textfile_dir: Path, log: Path, runs: int) -> tuple[float, int] | None:
    """Median seconds and bytes of one node_exporter scrape of textfile_dir; None without node_exporter."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    node = NodeExporter(binary, textfile_dir, log).start(port)
    try:
        node.scrape_text()
        times, size = [], 0
        for _ in range(runs):
            start = time.perf_counter()
            size = len(node.scrape_text().encode())
            times.append(time.perf_counter() - start)
        return statistics.median(times), size
    finally:
        node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=8, help="scripted GPUs on the host (default 8, an HGX board)")
    parser.add_argument("--interval-s", type=int, default=300, help="the timer's interval (role default 300)")
    args = parser.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory(prefix="fdl-bench-textfile-") as tmp:
        root = Path(tmp)
        nvml = FakeNvml(build_fake_nvml(root / "nvml"), make_host_root(root / "host"))
        make_libtorch(root / "libtorch", "precompiled/cu128", nccl="2.27.5")
        (root / "data").mkdir()
        (root / "textfile").mkdir()
        (root / "empty").mkdir()
        devices = ",".join(["H100:9.0:80G"] * args.gpus)
        env = env_for_fdl({**nvml.env(devices), "HOME": str(root), "LIBTORCH": str(root / "libtorch")})
        for var in ("LIBTORCH_PATH", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD"):
            env.pop(var, None)
        textfile = root / "textfile" / "fdl-probe.prom"
        probe = [*fdl_command(), "probe", "--quiet", "--data-path", str(root / "data")]
        watch = [*probe, "--textfile", str(textfile)]
        check = subprocess.run(watch, cwd=root, env=env, capture_output=True, text=True)
        text = textfile.read_text()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(f"probe exit {check.returncode} ({'ready' if 'fdl_probe_ready 1' in text else 'NOT READY'}), "
              f"{args.gpus} GPUs, metrics file {len(text.encode())} bytes, {series} series")
        rows = sample({"python3 -c pass": [PY, "-c", "pass"], "fdl probe --quiet": probe,
                       "fdl probe --quiet --textfile": watch}, args.runs, root, env)
        with_file = scrapes(root / "textfile", root / "node_exporter.log", args.runs)
        without = scrapes(root / "empty", root / "node_exporter.log", args.runs)
    bare_wall = rows["python3 -c pass"][0]
    print(f"{'command (medians of ' + str(args.runs) + ')':<32} {'wall ms':>8} {'CPU ms':>8} {'x bare wall':>12}")
    for name, (wall, cpu) in rows.items():
        print(f"{name:<32} {wall * 1000:>8.1f} {cpu * 1000:>8.1f} {wall / bare_wall:>11.2f}x")
    wall, cpu = rows["fdl probe --quiet --textfile"]
    plain = rows["fdl probe --quiet"][1]
    print(f"--textfile adds {(cpu - plain) * 1000:+.1f} ms CPU per run ({cpu / plain:.2f}x the probe alone)")
    runs_per_day = 86400 / args.interval_s
    print(f"per host, one run every {args.interval_s} s: {runs_per_day:.0f} runs, {cpu * runs_per_day:.1f} s CPU a day "
          f"({cpu / args.interval_s * 100:.3f}% of one core)")
    if with_file is not None and without is not None:
        print(f"node_exporter scrape (textfile collector alone): {with_file[1]} bytes in {with_file[0] * 1000:.1f} ms "
              f"with the file, {without[1]} bytes in {without[0] * 1000:.1f} ms without: the probe adds "
              f"{with_file[1] - without[1]} bytes and {series} series per host per scrape")
    else:
        print("node_exporter scrape: prometheus-node-exporter is not installed (apt-get install "
              "prometheus-node-exporter), not measured")
    print(f"fleet of 1,000 hosts: controller CPU for fdl 0 s (no fdl runs there); Prometheus ingests "
          f"{series * 1000} series, {series * 1000 / 60:.0f} samples/s at a 60 s scrape interval "
          f"({series * 1000 / 15:.0f} at 15 s)")
    print(f"(cores here: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
