"""What fdl's orchestration adds around an NCCL build, measured in one run.

The docker client is the stand-in from tests/fakes (no Docker engine here), so
the docker work itself is near zero and what is left is fdl + ansible-playbook
+ the role's tasks. Printed: the median wall time of a whole `fdl nccl build`,
of the same docker commands run directly, and of `--dry-run`; and the
orchestration as a share of the shortest real build (5 minutes).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._timing import PY, compile_package, env_for_fdl, median_wall
from tests.fakes.nccl import clean_path, install_docker_standin

RUNS = 3


def main() -> None:
    compile_package()
    with tempfile.TemporaryDirectory(prefix="fdl-bench-nccl-") as tmp:
        base = Path(tmp)
        project = base / "proj"
        (project / "libtorch/precompiled/cu128/lib").mkdir(parents=True)
        (project / "libtorch/precompiled/cu128/lib/libnccl.so.2.27.5").write_bytes(b"\x7fELF")
        (project / "fdl.yml").write_text("commands: {}\n")
        docker = install_docker_standin(base / "bin")
        env = env_for_fdl({"PATH": clean_path(base / "bin"), "FAKE_DOCKER_LOG": str(base / "log"),
                           "FAKE_DOCKER_STATE": str(base / "state.json")})
        fdl = [PY, "-m", "fdl", "nccl", "build", "--archs", "6.1;12.0"]
        build = median_wall(fdl, runs=RUNS, cwd=project, env=env, warmup=1)
        dry = median_wall(fdl + ["--dry-run"], runs=RUNS, cwd=project, env=env, warmup=1)

        context = project / "libtorch/nccl/context/v2.27.5-sm61-sm120"
        script = base / "direct.sh"
        script.write_text(
            "set -e\n"
            f"D={docker}\n"
            "$D --version >/dev/null; $D info --format '{{.ServerVersion}}' >/dev/null\n"
            f"$D build --tag fdl-nccl:x --file {context}/Dockerfile.nccl.source {context} >/dev/null\n"
            "C=$($D create fdl-nccl:x)\n"
            f"rm -rf {base}/direct; mkdir {base}/direct; $D cp $C:/opt/nccl/build/lib {base}/direct/lib\n"
            "$D rm $C >/dev/null\n")
        direct = median_wall(["bash", str(script)], runs=RUNS, cwd=project, env=env, warmup=1)
        shutil.rmtree(project / "libtorch/nccl", ignore_errors=True)

    overhead = build - direct
    print(f"fdl nccl build (stand-in docker)  {build:6.2f} s  (median of {RUNS})")
    print(f"same docker commands, direct      {direct:6.2f} s")
    print(f"fdl nccl build --dry-run          {dry:6.2f} s")
    print(f"orchestration / direct            {build / direct:6.1f} x")
    print(f"orchestration / 5-minute build    {overhead / 300:6.1%}")


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as exc:
        sys.exit(f"bench failed: {exc}")
