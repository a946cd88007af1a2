"""The build gate: compile the published tree once before the fleet sees it.

The primary gate runs the run's recipe in its cwd against this box's libtorch
and checks the artifact is where `bin` says. Each `--gate VARIANT` runs the
same recipe again as a check-build against another libtorch variant, under its
own CARGO_TARGET_DIR (`<cwd>/target/gate/<variant>`) so every variant keeps a
warm incremental cache; success is its whole verdict. Linking against a GPU
variant needs no GPU, but it needs that vendor's development headers on this
box (libtorch ships libraries, not the CUDA or HIP headers), so a missing set
is refused up front with the install line for this platform.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fdl.errors import FdlError
from fdl.hostside.envvars import without_secrets
from fdl.hostside.libtorch.variants import Libtorch
from fdl.libtorch.gate import build_env


class GateError(FdlError):
    """The build gate (or a --gate check-build) refused the tree; nothing was published."""


@dataclass(frozen=True)
class GateResult:
    """One gate that ran."""

    name: str  # "build" for the primary gate, else the variant
    libtorch: str | None
    target_dir: str | None
    recipe: str


# --------------------------------------------------------------------------- vendor headers

_VENDOR_NAMES = {"nvidia": "CUDA", "amd": "ROCm (HIP)"}


def header_dirs(vendor: str, env: Mapping[str, str] | None = None) -> list[Path]:
    """Include directories where a vendor's development headers are looked for."""
    env = os.environ if env is None else env
    roots: list[str] = []
    if vendor == "nvidia":
        roots += [env.get(name, "") for name in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
        nvcc = shutil.which("nvcc", path=env.get("PATH"))
        if nvcc:
            roots.append(str(Path(os.path.realpath(nvcc)).parent.parent))
        roots += ["/usr/local/cuda", "/opt/cuda", "/usr"]
    else:
        roots += [env.get(name, "") for name in ("ROCM_PATH", "HIP_PATH")]
        roots += ["/opt/rocm", "/usr"]
    out: list[Path] = []
    for root in roots:
        if root.strip():
            include = Path(root.strip()) / "include"
            if include not in out:
                out.append(include)
    return out


def vendor_header(vendor: str) -> str:
    return "cuda_runtime.h" if vendor == "nvidia" else "hip/hip_runtime.h"


def headers_present(vendor: str, env: Mapping[str, str] | None = None,
                    search: Sequence[Path] | None = None) -> bool:
    header = vendor_header(vendor)
    return any((d / header).is_file() for d in (header_dirs(vendor, env) if search is None else search))


def package_manager(path: str | None = None) -> str | None:
    """apt, dnf or brew: the package manager on this box (first found on PATH)."""
    for tool, name in (("apt-get", "apt"), ("dnf", "dnf"), ("brew", "brew")):
        if shutil.which(tool, path=path):
            return name
    return None


def header_install_line(vendor: str, manager: str | None, *, root: bool | None = None) -> str:
    """The exact command that installs a vendor's development headers with this platform's package manager."""
    sudo = "" if (os.geteuid() == 0 if root is None else root) else "sudo "
    if manager == "apt":
        if vendor == "nvidia":
            return (f"{sudo}apt-get install nvidia-cuda-toolkit   (Debian: from the contrib/non-free "
                    f"components; Ubuntu: multiverse)")
        return f"{sudo}apt-get install libamdhip64-dev   (Debian 12+, Ubuntu 23.04+)"
    if manager == "dnf":
        if vendor == "nvidia":
            return f"{sudo}dnf install cuda-toolkit   (from NVIDIA's CUDA repository)"
        return f"{sudo}dnf install rocm-hip-devel"
    if manager == "brew":
        return (f"no Homebrew package provides {_VENDOR_NAMES[vendor]} headers (they do not exist for macOS): "
                f"run this gate on a Linux box")
    if vendor == "nvidia":
        return "install the CUDA toolkit (nvcc, cuda_runtime.h): https://developer.nvidia.com/cuda-downloads"
    return "install the ROCm HIP development package (hip/hip_runtime.h): https://rocm.docs.amd.com"


def check_gate_headers(libtorch: Libtorch, env: Mapping[str, str] | None = None) -> None:
    """Refuse a --gate whose vendor's development headers are missing on this box."""
    if libtorch.vendor is None or headers_present(libtorch.vendor, env):
        return
    looked = ", ".join(str(d) for d in header_dirs(libtorch.vendor, env))
    line = header_install_line(libtorch.vendor, package_manager((env or os.environ).get("PATH")))
    raise GateError(
        f"--gate {libtorch.label}: this box has no {_VENDOR_NAMES[libtorch.vendor]} development headers "
        f"({vendor_header(libtorch.vendor)} is not in {looked}). A check-build against a "
        f"{_VENDOR_NAMES[libtorch.vendor]} libtorch needs them even without a GPU: libtorch ships libraries, "
        f"not headers. Nothing was touched.\n  install: {line}",
    )


# --------------------------------------------------------------------------- running a recipe


def run_recipe(recipe: str, directory: Path, env: Mapping[str, str], output: IO[Any] | None = None) -> int:
    """Run a shell recipe in directory; its output goes to `output` (default: stderr). Returns the exit code.

    The recipe (and everything it runs: cargo, every crate's build.rs) never sees a join secret: the
    environment is given without FDL_JOIN_TOKEN (fdl.hostside.envvars.SECRET_ENV_NAMES)."""
    env = without_secrets(dict(env))
    out = sys.stderr if output is None else output
    try:
        out.flush()
    except (OSError, ValueError):
        pass
    try:
        completed = subprocess.run(["/bin/sh", "-c", recipe], cwd=directory, env=dict(env), stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=out)
    except OSError as exc:
        raise GateError(f"cannot run the build recipe in {directory}: {exc.strerror}.") from None
    return completed.returncode


def primary_gate(tree: Path, cwd: str, recipe: str, binary: str, libtorch: Libtorch | None,
                 output: IO[Any] | None = None) -> GateResult:
    """Build the tree in cwd against this box's libtorch; the artifact must exist afterwards."""
    directory = tree / cwd
    if not directory.is_dir():
        raise GateError(f"cwd '{cwd}' is not a directory in the published tree ({directory}).",
                        hint="cwd is a path inside the source tree.")
    env = build_env(libtorch)
    # bin is relative to cwd with cargo's default target dir: a CARGO_TARGET_DIR
    # from this shell would put the artifact elsewhere than every worker will.
    env.pop("CARGO_TARGET_DIR", None)
    code = run_recipe(recipe, directory, env, output)
    if code != 0:
        raise GateError(
            f"the build gate failed: `{recipe}` exited {code} in {directory} (its output is above).",
            hint="Fix the build (the compiler output is above) and publish again.",
        )
    artifact = directory / binary
    if not artifact.is_file():
        raise GateError(
            f"the build passed but bin '{binary}' is not there ({artifact}).",
            hint="bin is the built artifact relative to cwd, e.g. target/release/<name> (a workspace member "
                 "builds into the workspace's target/, e.g. ../target/release/<name>).",
        )
    return GateResult(name="build", libtorch=None if libtorch is None else str(libtorch.path),
                      target_dir=None, recipe=recipe)


def variant_gate(tree: Path, cwd: str, recipe: str, libtorch: Libtorch, output: IO[Any] | None = None) -> GateResult:
    """Check-build against another variant under its own CARGO_TARGET_DIR; success is the verdict."""
    directory = tree / cwd
    target_dir = directory / "target" / "gate" / libtorch.label
    env = build_env(libtorch)
    env["CARGO_TARGET_DIR"] = str(target_dir)
    code = run_recipe(recipe, directory, env, output)
    if code != 0:
        raise GateError(
            f"--gate {libtorch.label}: the check-build failed: `{recipe}` exited {code} against {libtorch.path} "
            f"(its output is above).",
            hint="The tree compiles for this box's libtorch but not for that variant; fix it and publish again.",
        )
    return GateResult(name=libtorch.label, libtorch=str(libtorch.path), target_dir=str(target_dir), recipe=recipe)


def rustc_version(env: Mapping[str, str] | None = None) -> str | None:
    """`rustc -V` on this box (advisory), or None without a toolchain."""
    try:
        out = subprocess.run(["rustc", "-V"], capture_output=True, text=True, timeout=60,
                             env=None if env is None else dict(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and text else None
