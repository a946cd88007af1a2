"""The GPU check: driver, CUDA driver version and every device, through NVML.

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library
and pynvml (through .nvml, imported only when the check runs), relative imports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .devices import Selection, parse_gpu_ids
from .health import declared_gpu_ids
from .report import ERROR, OK, WARNING, CheckResult

if TYPE_CHECKING:
    from .nvml import NvmlDevice, NvmlInventory

NAME = "gpu"

CONTAINER_HINT = ("inside a container, start it with GPU access (docker run --gpus all, or the compose "
                  "`deploy.resources.reservations.devices` block, with the NVIDIA Container Toolkit installed)")
CPU_HOST_HINT = ("a host that trains on CPU ranks needs no GPU: say so (`fdl probe --cpu`; a cluster worker: "
                 "local_devices: cpu:N) and it is judged as a CPU host")


def parse_selection(gpus: Any, environ: Mapping[str, str], devices: Sequence[NvmlDevice],
                    source: str = "--gpus") -> Selection:
    """The selection in force: an explicit `gpus` (ids or "all"/"0,1") wins over CUDA_VISIBLE_DEVICES.

    `source` names where an explicit `gpus` came from ("--gpus", or
    "local_devices" for a worker's declared devices). CUDA_VISIBLE_DEVICES
    follows CUDA's rules: entries are indices or UUID prefixes (GPU-..., or
    MIG-... naming an instance of a GPU in MIG mode), and the first entry that
    names no device ends the list.
    """
    if gpus is not None:
        spec = gpus if isinstance(gpus, str) else ",".join(str(int(i)) for i in gpus)
        if spec.strip() == "all":
            return Selection(source, "all", None)
        try:
            ids = parse_gpu_ids(spec)
        except ValueError:  # names nothing this host has
            return Selection(source, spec, (), (spec.strip(),))
        present = {d.index for d in devices}
        return Selection(source, spec, tuple(i for i in ids if i in present),
                         tuple(str(i) for i in ids if i not in present))
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return Selection(None, None, None)
    chosen: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        match = _match_device(entry, devices)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return Selection("CUDA_VISIBLE_DEVICES", visible, tuple(chosen))


def _match_device(entry: str, devices: Sequence[NvmlDevice]) -> int | None:
    if entry.isdigit():
        index = int(entry)
        return index if any(d.index == index for d in devices) else None
    if entry.startswith("GPU-"):
        found = [d.index for d in devices if d.uuid and d.uuid.startswith(entry)]
        return found[0] if len(found) == 1 else None
    if entry.startswith("MIG-"):  # an instance: its GPU is the one in use
        found = [d.index for d in devices if d.health is not None
                 and any(uuid.startswith(entry) for uuid in d.health.mig_instances)]
        return found[0] if len(found) == 1 else None
    return None


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.0f} GiB" if value >= (1 << 30) else f"{value / (1 << 20):.0f} MiB"


def describe_device(device: NvmlDevice) -> dict[str, Any]:
    return {"index": device.index, "name": device.name, "uuid": device.uuid,
            "compute_capability": f"{device.major}.{device.minor}", "sm": device.sm,
            "memory_total": device.memory_total, "memory_free": device.memory_free}


def check_gpu(gpus: str | Iterable[Any] | None = None, environ: Mapping[str, str] | None = None,
              local_devices: str | Iterable[Any] | None = None,
              ) -> tuple[CheckResult, NvmlInventory | None, Selection | None]:
    """Run the GPU check; return (CheckResult, NvmlInventory or None, Selection or None).

    `gpus` is an explicit selection (--gpus); without one, a worker's declared
    GPU ids (`local_devices`) select, then CUDA_VISIBLE_DEVICES. A declared
    GPU that is missing is the gpu_count check's finding, not this one's.
    """
    from .nvml import (
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        NVML_ERROR_NO_PERMISSION,
        NvmlUnavailable,
        pynvml_hint,
        read_inventory,
    )

    if environ is None:
        environ = os.environ
    try:
        inventory = read_inventory()
    except NvmlUnavailable as exc:
        data: dict[str, Any] = {"nvml_error": exc.detail, "nvml_error_code": exc.code, "devices": []}
        if exc.reason == "pynvml-missing":
            return CheckResult(NAME, ERROR, "pynvml (NVIDIA's NVML bindings) is not installed for this Python.",
                               hint=pynvml_hint(),
                               data=data), None, None
        if exc.reason == "library-missing":
            return CheckResult(
                NAME, ERROR, "No NVIDIA driver found: the NVML library libnvidia-ml.so.1 is not installed.",
                hint=f"install the NVIDIA driver (it provides libnvidia-ml.so.1); {CONTAINER_HINT}; {CPU_HOST_HINT}",
                data=data), None, None
        if exc.code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            message = "The NVIDIA driver's kernel module and its user-space library are different versions."
            hint = ("this follows a driver upgrade without a reboot: reboot the host (or unload and reload the "
                    "nvidia kernel modules)")
        elif exc.code == NVML_ERROR_DRIVER_NOT_LOADED:
            message = "The NVIDIA kernel driver is not loaded."
            hint = f"load it (modprobe nvidia) or reboot, and check `dmesg | grep -i nvidia`; {CONTAINER_HINT}"
        elif exc.code == NVML_ERROR_NO_PERMISSION:
            message = "NVML refused access to the GPUs (insufficient permissions)."
            hint = "check the permissions of /dev/nvidia* for this user"
        else:
            message = f"NVML could not {'start' if exc.reason == 'init-failed' else 'read the GPUs'}: {exc.detail}."
            hint = f"run nvidia-smi for the driver's own account; reboot after a driver upgrade; {CONTAINER_HINT}"
        return CheckResult(NAME, ERROR, message, hint=hint, data=data), None, None

    if gpus is None and declared_gpu_ids(local_devices) is not None:
        selection = parse_selection(declared_gpu_ids(local_devices), environ, inventory.devices, "local_devices")
    else:
        selection = parse_selection(gpus, environ, inventory.devices)
    selected = set(d.index for d in inventory.devices) if selection.indices is None else set(selection.indices)
    devices = []
    for device in inventory.devices:
        entry = describe_device(device)
        entry["selected"] = device.index in selected
        devices.append(entry)
    data = {"driver_version": inventory.driver_version, "cuda_driver_version": inventory.cuda_driver_version,
            "count": len(devices), "devices": devices,
            "selection": {"source": selection.source, "spec": selection.spec,
                          "indices": None if selection.indices is None else list(selection.indices)}}
    driver = f"driver {inventory.driver_version or '?'}, CUDA {inventory.cuda_driver_version or '?'}"

    if not devices:
        return CheckResult(
            NAME, ERROR, f"NVML works ({driver}) but reports no GPU on this host.",
            hint=f"check the card is seen by the system (lspci | grep -i nvidia); {CONTAINER_HINT}; {CPU_HOST_HINT}",
            data=data), inventory, selection
    listing = ", ".join(f"{d.index}: {d.name} {d.sm} {_gib(d.memory_total)}"
                        + ("" if d.index in selected else " (not selected)") for d in inventory.devices)
    summary = f"{len(devices)} GPU{'s' if len(devices) != 1 else ''} ({driver}): {listing}."
    if selection.missing and selection.source == "--gpus":
        return CheckResult(
            NAME, ERROR, f"--gpus asks for GPU {', '.join(selection.missing)}, which this host does not have. "
            + summary, hint=f"pick indices between 0 and {len(devices) - 1}, or --gpus all",
            data=data), inventory, selection
    if not selected and selection.source == "local_devices":
        return CheckResult(NAME, ERROR, f"None of the declared local_devices ({selection.spec}) exists here. "
                           + summary, hint="find the missing GPUs (nvidia-smi, dmesg | grep -i xid) or correct "
                                           "local_devices in the cluster file", data=data), inventory, selection
    if not selected:
        return CheckResult(
            NAME, WARNING, f"{selection.source}={selection.spec!r} hides every GPU from ranks. " + summary,
            hint="unset CUDA_VISIBLE_DEVICES or list device indices / UUIDs that exist",
            data=data), inventory, selection
    return CheckResult(NAME, OK, summary, data=data), inventory, selection
