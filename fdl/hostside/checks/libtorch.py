"""The libtorch check: which libtorch ranks would link, its version, variant and GPU coverage.

Which libtorch that is, and what it records about itself, is libtorch's host-side core (..libtorch:
the resolution order, the roots, the variant record; fdl/libtorch/ has the whole package): this module only
judges it against the GPUs the GPU check found. docs/probe.md has the rules.

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library only, relative imports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from ..libtorch.resolve import LibtorchNotFound, home_of, python_torch_dir, resolve_libtorch
from ..libtorch.variants import Libtorch, arch_covers
from .report import ERROR, OK, WARNING, CheckResult

if TYPE_CHECKING:
    from .devices import Selection
    from .nvml import NvmlInventory

NAME = "libtorch"


def check_libtorch(libtorch_path: str | None = None, environ: Mapping[str, str] | None = None,
                   project_root: str | None = None, home: str | None = None, inventory: NvmlInventory | None = None,
                   selection: Selection | None = None) -> tuple[CheckResult, Libtorch | None]:
    """Run the libtorch check against the GPUs the GPU check found; return (CheckResult, Libtorch or None)."""
    environ = os.environ if environ is None else environ
    if home is None:
        home = home_of(environ)
    try:
        info = resolve_libtorch(libtorch_path, environ, project_root, home, python_torch_dir(environ))
    except LibtorchNotFound as exc:
        return CheckResult(NAME, ERROR, exc.message, hint=exc.hint, data={"tried": exc.tried}), None

    data = info.to_data()
    devices = list(inventory.devices) if inventory is not None else []
    if selection is not None and selection.indices is not None:
        devices = [d for d in devices if d.index in selection.indices]
    label = " ".join(filter(None, [info.version or "(version unrecorded)", info.variant]))
    where = f"{info.path} (from {info.source})"
    summary = f"libtorch {label} at {where}."
    problems: list[tuple[str, str, str | None]] = []  # (status, sentence, hint)

    if info.kind is None:
        problems.append((WARNING, "Its variant (cpu, cuXYZ or rocmX.Y) is not recorded, so its GPU support "
                         "cannot be checked.", "add an .arch file with cuda= and archs= lines (docs/probe.md)"))
    elif info.kind == "cpu" and devices:
        problems.append((WARNING, f"This is a CPU build, so training will not use the {len(devices)} GPU"
                         f"{'s' if len(devices) != 1 else ''} here.",
                         "install and activate a CUDA variant (fdl libtorch download)"))
    elif info.kind == "rocm" and devices:
        problems.append((ERROR, "This is a ROCm (AMD) build, but this host's GPUs are NVIDIA.",
                         "install and activate a CUDA variant (fdl libtorch download)"))
    elif info.kind == "cuda" and devices:
        if info.archs is None:
            problems.append((WARNING, "Its compiled arch list is not recorded, so GPU coverage cannot be "
                             "checked.", "add an archs= line to the variant's .arch file (docs/probe.md)"))
        else:
            missed = [d for d in devices if not arch_covers(info.archs, d.major, d.minor)]
            data["uncovered_devices"] = [d.index for d in missed]
            if missed:
                names = ", ".join(f"GPU {d.index} ({d.name}, {d.sm})" for d in missed)
                problems.append((ERROR, f"{names} {'is' if len(missed) == 1 else 'are'} not covered by this "
                                 f"build's arch list ({' '.join(info.archs) or 'empty'}); kernels would fail "
                                 f"to load there.",
                                 "use a variant compiled for "
                                 + ", ".join(sorted({f"{d.major}.{d.minor}" for d in missed}))
                                 + " (a libtorch built from source with those archs under builds/, activated "
                                   "with fdl libtorch activate, or a precompiled variant that lists them)"))
        # the driver's CUDA version against this build's is the cuda_driver check (stack.py)

    if not problems:
        covered = ""
        if info.kind == "cuda" and devices and info.archs:
            covered = f" Its archs ({' '.join(info.archs)}) cover every selected GPU."
        return CheckResult(NAME, OK, summary + covered, data=data), info
    status = ERROR if any(p[0] == ERROR for p in problems) else WARNING
    message = " ".join([summary] + [p[1] for p in problems])
    hint = "; ".join(p[2] for p in problems if p[2])
    return CheckResult(NAME, status, message, hint=hint or None, data=data), info
