"""Shared timing helpers for the bench/ scripts: medians of whole-process wall times, one run."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def env_for_fdl(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.pop("FDL_ENV", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure as installed: with bytecode cached
    env.update(extra or {})
    return env


def compile_package() -> None:
    """Byte-compile fdl as an installed wheel would be, so no run pays for compiling sources."""
    import compileall

    compileall.compile_dir(str(REPO / "fdl"), quiet=1)


def median_wall(argv: list[str], *, runs: int, cwd: Path | None = None, env: dict | None = None,
                warmup: int = 2) -> float:
    """Median wall seconds of running argv to completion (output discarded)."""
    samples = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved(commands: dict[str, tuple[list[str], dict]], *, runs: int, cwd: Path | None = None) -> dict:
    """Median wall per command, sampled round-robin so machine noise hits all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for argv, env in commands.values():  # warm the page cache
        subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(runs):
        for name, (argv, env) in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


PY = sys.executable


def fdl_command() -> list[str]:
    """How a user starts fdl: the console script next to this interpreter (else python -m fdl)."""
    script = Path(PY).parent / "fdl"
    return [str(script)] if script.exists() else [PY, "-m", "fdl"]
