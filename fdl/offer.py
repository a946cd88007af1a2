"""The GPU stack check before a dial, and what this box offers.

NVIDIA GPUs are read through the probe's own check (`fdl.hostside.checks.gpu`, the real
NVML path); AMD GPUs through the kernel's KFD topology in sysfs, which the
ROCm driver publishes without any user-space library. A box with neither has
nothing to offer (an FdlError; `fdl join` decides once, before its first
dial, that this is permanent: fdl.agent.permanent), except for a worker
declared with `--devices cpu:N`, which runs N CPU ranks and needs no GPU at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from fdl.errors import FdlError
from fdl.hostside.checks.devices import Devices

KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


class Offer(NamedTuple):
    """The devices this box offers the run, resolved to ids (never 'all')."""

    devices: Devices
    vendor: str | None = None  # "nvidia" | "amd" | None (CPU ranks)
    gpu_names: tuple[str, ...] = ()
    capabilities: tuple[tuple[int, int], ...] = ()  # NVIDIA compute capability per offered GPU
    summary: str = ""


def amd_gpus(topology: str = KFD_TOPOLOGY) -> list[str]:
    """gfx names of the AMD GPUs the KFD driver exposes, in node order (CPU nodes skipped)."""
    found: list[tuple[int, str]] = []
    try:
        nodes = os.listdir(topology)
    except OSError:
        return []
    for node in nodes:
        if not node.isdigit():
            continue
        try:
            text = (Path(topology) / node / "properties").read_text(errors="replace")
        except OSError:
            continue
        props = dict(line.split(None, 1) for line in text.splitlines() if len(line.split(None, 1)) == 2)
        if int(props.get("simd_count", "0").strip() or 0) <= 0:
            continue
        version = int(props.get("gfx_target_version", "0").strip() or 0)
        name = f"gfx{version // 10000}{(version // 100) % 100:x}{version % 100:x}" if version else "amd-gpu"
        found.append((int(node), name))
    return [name for _, name in sorted(found)]


def check_gpu_stack(devices: Devices, environ: Mapping[str, str] | None = None,
                    topology: str = KFD_TOPOLOGY) -> Offer:
    """Check the GPU stack and resolve the offer; raises FdlError when there is nothing to offer."""
    if devices.is_cpu:
        return Offer(devices=devices, summary=f"{devices.count} CPU rank{'s' if devices.count != 1 else ''} "
                                              f"(gloo), no GPU needed")
    from fdl.hostside.checks.gpu import check_gpu
    from fdl.hostside.checks.report import ERROR

    result, inventory, _ = check_gpu(gpus="all", environ=environ)
    if result.status == ERROR or inventory is None or not inventory.devices:
        amd = amd_gpus(topology)
        if amd:
            return _offer_amd(devices, amd)
        hint = (result.hint + ". " if result.hint else "") + \
            "A box without GPUs can still join as CPU ranks: --devices cpu:N."
        raise FdlError(f"the GPU stack check failed, so this box has nothing to offer: {result.message}", hint=hint)
    present = {d.index: d for d in inventory.devices}
    ids = tuple(present) if devices.ids is None else devices.ids
    missing = [i for i in ids if i not in present]
    if missing:
        raise FdlError(
            f"--devices offers GPU {', '.join(map(str, missing))}, which this box does not have (it has "
            f"{len(present)}: ids {', '.join(map(str, present))}).",
            hint="Offer ids that exist, or leave --devices out to offer every GPU.")
    chosen = [present[i] for i in ids]
    return Offer(devices=Devices(ids=tuple(ids)), vendor="nvidia", gpu_names=tuple(d.name for d in chosen),
                 capabilities=tuple((d.major, d.minor) for d in chosen),
                 summary=f"{len(chosen)} NVIDIA GPU{'s' if len(chosen) != 1 else ''}: "
                         + ", ".join(f"{d.index} {d.name} ({d.sm})" for d in chosen))


def _offer_amd(devices: Devices, names: list[str]) -> Offer:
    ids = tuple(range(len(names))) if devices.ids is None else devices.ids
    missing = [i for i in ids if i >= len(names)]
    if missing:
        raise FdlError(
            f"--devices offers GPU {', '.join(map(str, missing))}, which this box does not have (it has "
            f"{len(names)} AMD GPUs).", hint="Offer ids that exist, or leave --devices out to offer every GPU.")
    return Offer(devices=Devices(ids=ids), vendor="amd", gpu_names=tuple(names[i] for i in ids),
                 summary=f"{len(ids)} AMD GPU{'s' if len(ids) != 1 else ''}: "
                         + ", ".join(f"{i} {names[i]}" for i in ids))
