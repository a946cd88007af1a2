"""Shared timing helpers for the bench/ scripts: medians of whole-process wall (and CPU) times, one run."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]


def env_for_fdl(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.pop("FDL_ENV", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure as installed: with bytecode cached
    env.update(extra or {})
    return env


def compile_package(baselines: list[Path] | tuple[Path, ...] = ()) -> None:
    """Byte-compile fdl (and each --baseline checkout's) as an installed wheel would be, so no run pays for
    compiling sources."""
    import compileall

    for tree in (REPO, *baselines):
        compileall.compile_dir(str(tree / "fdl"), quiet=1)


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


class Timing(NamedTuple):
    """Medians of one command's runs: wall seconds, and CPU seconds (user + system of it and its children)."""

    wall: float
    cpu: float


def interleaved(commands: dict[str, tuple[list[str], dict]], *, runs: int, cwd: Path | None = None) -> dict:
    """Median wall per command, sampled round-robin so machine noise hits all of them alike."""
    return {name: timing.wall for name, timing in interleaved_timings(commands, runs=runs, cwd=cwd).items()}


def interleaved_timings(commands: dict[str, tuple[list[str], dict]], *, runs: int,
                        cwd: Path | None = None) -> dict[str, Timing]:
    """Median wall and CPU per command, sampled round-robin so machine noise hits all of them alike.

    On a loaded machine the wall time of a short command is mostly waiting for a core; its CPU time is
    what the command itself costs, and moves much less with the load."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for argv, env in commands.values():  # warm the page cache
        subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(runs):
        for name, (argv, env) in commands.items():
            used = _children_cpu()
            start = time.perf_counter()
            subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(_children_cpu() - used)
    return {name: Timing(statistics.median(walls[name]), statistics.median(cpus[name])) for name in commands}


def print_timings(rows: list[tuple[str, Timing, Timing]]) -> None:
    """One line per (name, timing, the bare interpreter's timing of the same rounds): medians and ratios."""
    width = max(len(name) for name, _, _ in rows) + 1
    print(f"{'command':<{width}} {'wall ms':>8} {'x bare':>7} {'cpu ms':>8} {'x bare':>7}")
    for name, timing, bare in rows:
        print(f"{name:<{width}} {timing.wall * 1000:>8.1f} {timing.wall / bare.wall:>7.2f} "
              f"{timing.cpu * 1000:>8.1f} {timing.cpu / bare.cpu:>7.2f}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


PY = sys.executable


def trees(env: dict, baselines: list[Path], caches: Path) -> dict[str, dict]:
    """The environment of this checkout ("") and of each --baseline checkout (tagged by name).

    Each tree runs with a cache directory of its own under `caches`, as an installed fdl would: what one
    version of fdl remembers (the collection it built, any cached parse) is not found stale and rewritten
    by the next tree in the same round."""
    found = {"": {**env, "XDG_CACHE_HOME": str(caches / "this")}}
    for index, baseline in enumerate(baselines):
        tag = " [baseline]" if len(baselines) == 1 else f" [{baseline.resolve().name}]"
        found[tag] = {**env, "PYTHONPATH": str(baseline.resolve()), "XDG_CACHE_HOME": str(caches / f"baseline-{index}")}
    return found


def fdl_command() -> list[str]:
    """How a user starts fdl: the console script next to this interpreter (else python -m fdl)."""
    script = Path(PY).parent / "fdl"
    return [str(script)] if script.exists() else [PY, "-m", "fdl"]
