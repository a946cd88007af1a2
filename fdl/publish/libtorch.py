"""Which libtorch a build gate compiles against, and the environment a recipe gets.

Resolution is the probe's (`fdl.checks.libtorch.resolve_libtorch`): LIBTORCH
or LIBTORCH_PATH when set, else the project's `libtorch/` tree (its
`.active` variant), else `~/.flodl/libtorch`. Nothing installed anywhere is
fine for a shell recipe that links nothing: the gate then runs without
LIBTORCH_PATH and says so. A location that is set or present but broken is an
error.

A variant's GPU vendor comes from what the probe read (its `.arch` file,
`build-version`, or the directory name), else from the variant's name: `cpu*`
is CPU-only, `cu<N>` and `sm<N>` are NVIDIA, `rocm<N>` and `gfx<N>` are AMD.
The recipe gets `FDL_GPU_FEATURE` accordingly (`cuda`, `rocm`, or empty for
CPU), and on AMD the system ROCm runtime is put ahead of libtorch's bundled
copy in `LD_LIBRARY_PATH`: libtorch-rocm carries the whole user-space ROCm
stack, and when that copy disagrees with the host's kernel driver the process
dies at its first GPU operation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fdl.errors import FdlError

if TYPE_CHECKING:
    from fdl.checks import libtorch as checks

VARIANT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
ROCM_ENV = ("ROCM_PATH", "HIP_PATH", "HSA_PATH")
_ROCM_RUNTIME = ("libamdhip64.so", "libhsa-runtime64.so")


class LibtorchError(FdlError):
    """A libtorch the command was told to use is missing or unusable."""


@dataclass(frozen=True)
class Libtorch:
    """A libtorch directory (with lib/ and, for builds, include/) and what it is."""

    path: Path
    label: str  # the variant (precompiled/cu128) or the directory as given
    vendor: str | None  # "nvidia" | "amd" | None (CPU)
    found_by: str  # "LIBTORCH", "LIBTORCH_PATH", "project" or "home"

    @property
    def feature(self) -> str:
        return {"nvidia": "cuda", "amd": "rocm"}.get(self.vendor or "", "")


def classify_vendor(label: str, directory: Path | None = None) -> str | None:
    """The GPU vendor of a libtorch variant from its name (or its .arch file when the name says nothing)."""
    base = label.rstrip("/").rsplit("/", 1)[-1].lower()
    if base.startswith("cpu"):
        return None
    if re.match(r"(cu|sm)[0-9]", base):
        return "nvidia"
    if re.match(r"(rocm|gfx|hip)[0-9]", base):
        return "amd"
    if directory is not None:
        try:
            meta = (directory / ".arch").read_text(errors="replace")
        except OSError:
            meta = ""
        fields = dict(line.split("=", 1) for line in meta.splitlines() if "=" in line)
        if fields.get("rocm", "").strip() or fields.get("hip", "").strip():
            return "amd"
        cuda = fields.get("cuda", "").strip().lower()
        if cuda in ("none", "cpu", ""):
            return None if "cuda" in fields else "nvidia"
        return "nvidia"
    return "nvidia"


def libtorch_roots(project_root: Path | None, home: Path | None = None) -> list[tuple[Path, str]]:
    """The directories that hold libtorch variants, strongest first."""
    roots = []
    if project_root is not None:
        roots.append((Path(project_root) / "libtorch", "project"))
    roots.append(((home or Path.home()) / ".flodl" / "libtorch", "home"))
    return roots


def _from_probe(info: checks.Libtorch, label: str | None = None) -> Libtorch:
    path = Path(info.path)
    name = label or info.active or str(path)
    vendor = {"cuda": "nvidia", "rocm": "amd", "cpu": None}.get(info.kind or "", "?")
    if vendor == "?":
        vendor = classify_vendor(info.active or path.name, path)
    return Libtorch(path=path, label=name, vendor=vendor, found_by=info.source)


def resolve_active(project_root: Path | None, env: Mapping[str, str] | None = None,
                   home: Path | None = None) -> Libtorch | None:
    """This box's libtorch for the primary gate, or None when none is installed anywhere."""
    from fdl.checks.libtorch import LibtorchNotFound, resolve_libtorch

    env = os.environ if env is None else env
    home = home or Path.home()
    given = any(env.get(name, "").strip() for name in ("LIBTORCH", "LIBTORCH_PATH"))
    if not given and not any(root.exists() for root, _ in libtorch_roots(project_root, home)):
        return None
    try:
        info = resolve_libtorch(None, env, None if project_root is None else str(project_root), str(home))
    except LibtorchNotFound as exc:
        raise LibtorchError(exc.message, hint=exc.hint) from None
    return _from_probe(info)


def resolve_variant(variant: str, project_root: Path | None, home: Path | None = None, *,
                    what: str | None = None) -> Libtorch:
    """A named variant (`precompiled/rocm70`) for a check-build, from the project's tree or ~/.flodl.

    what: how messages name the request (default `--gate VARIANT`; the launcher names the host's arch:).
    """
    from fdl.checks.libtorch import LibtorchNotFound, resolve_libtorch

    what = what or f"--gate {variant}"
    if not VARIANT_RE.fullmatch(variant) or ".." in variant.split("/"):
        raise LibtorchError(f"{what}: not a libtorch variant name (like precompiled/cu128 or "
                            f"builds/sm61-sm120).")
    looked = []
    for root, found_by in libtorch_roots(project_root, home):
        path = root / variant
        looked.append(str(path))
        if (path / "lib").is_dir():
            try:
                info = resolve_libtorch(str(path), {}, None, None)
            except LibtorchNotFound as exc:
                raise LibtorchError(f"{what}: {exc.message}", hint=exc.hint) from None
            info.source, info.active = found_by, variant
            return _from_probe(info, variant)
    raise LibtorchError(
        f"{what}: no libtorch variant '{variant}' here (looked in {' and '.join(looked)}).",
        hint="Install it first (fdl libtorch download); a check-build needs no GPU, only the libraries to "
             "link against.",
    )


def rocm_runtime_lib_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    """The system ROCm runtime's library directories, from $ROCM_PATH / $HIP_PATH / $HSA_PATH, else /opt/rocm.

    For each root the directory (lib or lib64) that actually holds the runtime
    wins; a root without one contributes its lib/ (the loader skips a missing
    directory, so that costs nothing).
    """
    env = os.environ if env is None else env
    roots = [env[name].strip() for name in ROCM_ENV if env.get(name, "").strip()]
    if not roots:
        roots = ["/opt/rocm"]
    out: list[str] = []
    for root in roots:
        chosen = None
        for sub in ("lib", "lib64"):
            directory = Path(root) / sub
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            if any(name.startswith(_ROCM_RUNTIME) for name in names):
                chosen = str(directory)
                break
        chosen = chosen or str(Path(root) / "lib")
        if chosen not in out:
            out.append(chosen)
    return out


def build_env(libtorch: Libtorch | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a build recipe runs with: base plus LIBTORCH_PATH, FDL_GPU_FEATURE, LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    if libtorch is None:
        env.pop("LIBTORCH_PATH", None)
        env["FDL_GPU_FEATURE"] = ""
        return env
    env["LIBTORCH_PATH"] = str(libtorch.path)
    env["FDL_GPU_FEATURE"] = libtorch.feature
    parts = [str(libtorch.path / "lib")]
    if libtorch.vendor == "amd":
        parts = rocm_runtime_lib_dirs(env) + parts
    previous = env.get("LD_LIBRARY_PATH", "")
    parts += [p for p in previous.split(":") if p and p not in parts]
    env["LD_LIBRARY_PATH"] = ":".join(parts)
    return env
