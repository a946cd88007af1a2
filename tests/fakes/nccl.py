"""Helpers for the `fdl nccl` tests: the docker stand-in and a few comparisons.

GPUs come from the shared fake NVML (tests/fakes/__init__.py, fixture `fake_nvml`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FAKES = Path(__file__).resolve().parent


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

