"""The libtorch a build compiles against, and the environment its recipe gets: the publish gate, the
launcher's prebuilds and `fdl join --source` builds all use this.

Resolution is the probe's (fdl.hostside.libtorch.resolve) without its last resort: LIBTORCH or LIBTORCH_PATH when
set, else the project's `libtorch/` root, else `~/.flodl/libtorch`. Nothing installed anywhere (an empty or
half-made root included) is fine for a recipe that links nothing: the build then runs without
LIBTORCH_PATH. A location that is set, or a root whose `.active` names something, but is broken is an error.

The recipe gets `LIBTORCH_PATH`, `FDL_GPU_FEATURE` (`cuda`, `rocm`, or empty for CPU: the variant's vendor,
fdl.hostside.libtorch.variants) and `LD_LIBRARY_PATH`; on AMD the system ROCm runtime is put ahead of libtorch's
bundled copy, because libtorch-rocm carries the whole user-space ROCm stack, and when that copy disagrees
with the host's kernel driver the process dies at its first GPU operation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from fdl.errors import FdlError
from fdl.hostside.envvars import FDL_GPU_FEATURE
from fdl.hostside.libtorch.resolve import (
    LibtorchNotFound,
    holds_libtorch,
    home_of,
    project_refusal,
    resolve_libtorch,
    roots,
)
from fdl.hostside.libtorch.variants import Libtorch
from fdl.hostside.trust import tree_refusal

VARIANT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
ROCM_ENV = ("ROCM_PATH", "HIP_PATH", "HSA_PATH")
_ROCM_RUNTIME = ("libamdhip64.so", "libhsa-runtime64.so")


class LibtorchError(FdlError):
    """A libtorch the command was told to use is missing or unusable."""


def resolve_active(project_root: Path | None, env: Mapping[str, str] | None = None,
                   home: Path | None = None) -> Libtorch | None:
    """This box's libtorch for a build, or None when none is installed anywhere."""
    env = os.environ if env is None else env
    home_dir = str(home) if home is not None else home_of(env)
    project = None if project_root is None else str(project_root)
    given = any(env.get(name, "").strip() for name in ("LIBTORCH", "LIBTORCH_PATH"))
    if not given and not any(root.refused or holds_libtorch(root.path) for root in roots(project, home_dir)):
        return None
    try:
        return resolve_libtorch(None, env, project, home_dir)
    except LibtorchNotFound as exc:
        raise LibtorchError(exc.message, hint=exc.hint) from None


def resolve_variant(variant: str, project_root: Path | None, home: Path | None = None, *,
                    what: str | None = None) -> Libtorch:
    """A named variant (`precompiled/rocm70`) for a check-build, from the project's root or ~/.flodl.

    what: how messages name the request (default `--gate VARIANT`; the launcher names the host's arch:).
    """
    what = what or f"--gate {variant}"
    if not VARIANT_RE.fullmatch(variant) or ".." in variant.split("/"):
        raise LibtorchError(f"{what}: not a libtorch variant name (like precompiled/cu128 or "
                            f"builds/sm61-sm120).")
    home_dir = str(home) if home is not None else home_of()
    looked = []
    for root in roots(None if project_root is None else str(project_root), home_dir):
        if root.refused:
            refusal = project_refusal(root)
            raise LibtorchError(f"{what}: {refusal.message}", hint=refusal.hint)
        path = root.path / variant
        looked.append(str(path))
        if (path / "lib").is_dir():
            if root.scope == "project" and tree_refusal(root.path, path / "lib"):
                refusal = project_refusal(root._replace(refused=tree_refusal(root.path, path / "lib")))
                raise LibtorchError(f"{what}: {refusal.message}", hint=refusal.hint)
            try:
                info = resolve_libtorch(str(path), {}, None, None)
            except LibtorchNotFound as exc:
                raise LibtorchError(f"{what}: {exc.message}", hint=exc.hint) from None
            info.source, info.active = root.scope, variant
            return info
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
    bases = [env[name].strip() for name in ROCM_ENV if env.get(name, "").strip()]
    if not bases:
        bases = ["/opt/rocm"]
    out: list[str] = []
    for base in bases:
        chosen = None
        for sub in ("lib", "lib64"):
            directory = Path(base) / sub
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            if any(name.startswith(_ROCM_RUNTIME) for name in names):
                chosen = str(directory)
                break
        chosen = chosen or str(Path(base) / "lib")
        if chosen not in out:
            out.append(chosen)
    return out


def build_env(libtorch: Libtorch | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a build recipe runs with: base plus LIBTORCH_PATH, FDL_GPU_FEATURE, LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    if libtorch is None:
        env.pop("LIBTORCH_PATH", None)
        env[FDL_GPU_FEATURE] = ""
        return env
    env["LIBTORCH_PATH"] = libtorch.path
    env[FDL_GPU_FEATURE] = libtorch.feature
    parts = [str(Path(libtorch.path) / "lib")]
    if libtorch.vendor == "amd":
        parts = rocm_runtime_lib_dirs(env) + parts
    previous = env.get("LD_LIBRARY_PATH", "")
    parts += [p for p in previous.split(":") if p and p not in parts]
    env["LD_LIBRARY_PATH"] = ":".join(parts)
    return env
