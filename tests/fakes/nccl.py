"""Helpers for the `fdl nccl` tests: a fake NVML library and a docker stand-in, built at test time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAKES = Path(__file__).resolve().parent


def build_fake_nvml(directory: Path) -> Path:
    """Compile tests/fakes/nccl_nvml.c into DIRECTORY/libnvidia-ml.so.1; returns DIRECTORY."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnvidia-ml.so.1",
                    "-o", str(directory / "libnvidia-ml.so.1"), str(FAKES / "nccl_nvml.c")], check=True)
    return directory


def nvml_env(lib_dir: Path, gpus: str | None) -> dict:
    """Environment that makes pynvml load the fake, with these GPUs ('name:6.1;name:12.0')."""
    env = {"LD_LIBRARY_PATH": str(lib_dir)}
    env["FAKE_NVML_GPUS"] = gpus or ""
    return env


def install_docker_standin(bin_dir: Path) -> Path:
    """Put an executable `docker` (tests/fakes/docker_standin.py) in BIN_DIR; returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "docker"
    target.write_text(f"#!{sys.executable}\n" + (FAKES / "docker_standin.py").read_text())
    target.chmod(0o755)
    return target


def clean_path(*first: Path) -> str:
    """A PATH with FIRST, this interpreter's bin and the system dirs, and no real docker client."""
    dirs = [str(d) for d in first] + [str(Path(sys.executable).parent), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    return os.pathsep.join(d for d in dirs if not (Path(d) / "docker").exists() or any(d == str(f) for f in first))


def tree(root: Path) -> list[str]:
    """Every path under root, for before/after comparisons."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def docker_calls(log: Path) -> list[list[str]]:
    """The argv of every stand-in docker invocation, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

