"""What a `fdl join` dial costs, measured in one run.

    python bench/join.py [--runs N] [--archive-mib M]

1. Preparation, cold against warm. A worker re-runs its whole preparation on
   every dial (`--persist` is a provisioning loop), so the warm path must be
   cheap: libtorch already installed, the --source tree already fetched
   (rsync finds nothing to copy), the build recipe re-run, the signature
   probe re-run. Cold: an empty home, a libtorch archive of M MiB downloaded
   from a loopback mirror, checksummed and installed. Prints both medians
   and cold/warm.
2. The agent's overhead over the bare binary: a one-host, one-rank run of a
   trivial binary through `fdl join` (process start, preparation, hello,
   world, rank under the supervisor, exit report) against starting the
   binary directly. Prints both medians and their ratio.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import PY, REPO, compile_package, env_for_fdl

sys.path.insert(0, str(REPO))

TRAIN = """#!{python}
import os, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    print("fdl-signature: 0123456789abcdef", flush=True)
    sys.exit(0)
print("rank", os.environ.get("RANK", "-"), "of", os.environ.get("WORLD_SIZE", "-"), flush=True)
"""


def make_mirror(root: Path, mib: int) -> None:
    archive = root / "libtorch-cpu.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("libtorch/lib/libtorch_cpu.so", os.urandom(mib << 20))
        for i in range(200):
            zf.writestr(f"libtorch/include/torch/h{i}.h", b"// header\n" * 50)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (root / "libtorch-cpu.zip.sha256").write_text(f"{digest}  libtorch-cpu.zip\n")


def make_source(root: Path) -> None:
    for i in range(300):
        (root / "src" / f"m{i // 50}").mkdir(parents=True, exist_ok=True)
        (root / "src" / f"m{i // 50}" / f"f{i}.rs").write_text(f"// module {i}\n" * 40)
    (root / "train.py").write_text(TRAIN.format(python=PY))


def port_in_range() -> int:
    """A free port in 23000-23999 (the range this suite's servers use)."""
    import random
    import socket

    for port in random.sample(range(23000, 24000), 1000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port in 23000-23999")


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port_in_range()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def bench_prepare(work: Path, runs: int, mib: int) -> tuple[float, float]:
    from fdl.agent.options import resolve_options
    from fdl.agent.prepare import prepare

    mirror_dir, src = work / "mirror", work / "source"
    mirror_dir.mkdir(parents=True)
    src.mkdir(parents=True)
    make_mirror(mirror_dir, mib)
    make_source(src)
    server, url = serve(mirror_dir)
    flags = {"controller": "127.0.0.1:1", "source": f"file://{src}", "source_bin": "out/train",
             "source_build": "mkdir -p out && cp train.py out/train && chmod +x out/train", "libtorch": "cpu",
             "devices": "cpu:1"}
    options = resolve_options(None, flags, None, environ={"FDL_LIBTORCH_MIRROR": url})
    cold, warm = [], []
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below
    try:
        for i in range(runs):
            home = work / f"home{i}"
            environ = {**os.environ, "HOME": str(home)}
            environ.pop("LIBTORCH_PATH", None)
            start = time.perf_counter()
            prepare(options, environ=environ, build_output=sink)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            prepare(options, environ=environ, build_output=sink)
            warm.append(time.perf_counter() - start)
            shutil.rmtree(home)
    finally:
        sink.close()
        server.shutdown()
        server.server_close()
    return statistics.median(cold), statistics.median(warm)


def bench_overhead(work: Path, runs: int) -> tuple[float, float]:
    from fdl.controller.policy import RunPolicy
    from fdl.controller.server import ControllerServer

    binary = work / "train"
    binary.write_text(TRAIN.format(python=PY))
    binary.chmod(0o755)
    env = env_for_fdl({"HOME": str(work / "agent-home")})
    bare, joined = [], []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([str(binary)], stdout=subprocess.DEVNULL, check=True)
        bare.append(time.perf_counter() - start)
        policy = RunPolicy(discovery=True, max_hosts=1, window_s=60, heartbeat_s=0.5, poll_s=5.0)
        with ControllerServer(policy, host="127.0.0.1", port=port_in_range()) as server:
            start = time.perf_counter()
            done = subprocess.run([PY, "-m", "fdl", "join", server.address, "--bin", str(binary), "--devices",
                                   "cpu:1", "--host", "bench"], env=env, capture_output=True, text=True)
            joined.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise SystemExit(f"fdl join failed: {done.stderr}")
    return statistics.median(bare), statistics.median(joined)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--archive-mib", type=int, default=64)
    args = parser.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory(prefix="fdl-bench-join-") as tmp:
        work = Path(tmp)
        cold, warm = bench_prepare(work / "prepare", args.runs, args.archive_mib)
        print(f"preparation, cold (download {args.archive_mib} MiB + fetch + build + probe): {cold * 1000:8.1f} ms")
        print(f"preparation, warm (everything cached; re-run per dial):           {warm * 1000:8.1f} ms")
        print(f"  cold / warm: {cold / warm:.1f}x")
        (work / "overhead").mkdir()
        bare, joined = bench_overhead(work / "overhead", args.runs)
        print(f"the binary alone:                                                 {bare * 1000:8.1f} ms")
        print(f"the same binary as a one-rank world through fdl join:            {joined * 1000:8.1f} ms")
        print(f"  fdl join / bare: {joined / bare:.1f}x  (+{(joined - bare) * 1000:.0f} ms per dial)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
