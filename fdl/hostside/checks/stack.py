"""Per-host software stack checks: what sits between the GPUs and libtorch.

    nouveau       the open-source nouveau driver loaded (it holds the GPUs the NVIDIA
                  driver needs): error
    device_nodes  /dev/nvidiactl and /dev/nvidiaN of every selected GPU present, character
                  devices, readable and writable by this user: error; /dev/nvidia-uvm
                  missing: warning (nvidia-modprobe creates it on first CUDA use),
                  present but inaccessible: error
    cuda_driver   the driver's CUDA version against the CUDA build of libtorch: an older
                  major version cannot run it (error); an older minor version runs through
                  CUDA's minor-version compatibility, except PTX JIT (warning)

The file system root these read (`/proc/modules`, `/dev`) is a parameter
(run_probe takes it from FDL_PROBE_ROOT, default `/`) so tests can script a host.

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library only, relative imports.
"""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING

from .report import ERROR, OK, SKIPPED, WARNING, CheckResult

if TYPE_CHECKING:
    from ..libtorch.variants import Libtorch
    from .nvml import NvmlDevice, NvmlInventory

STACK_CHECKS = ("nouveau", "device_nodes", "cuda_driver")

# The oldest Linux driver of each CUDA toolkit release (NVIDIA's CUDA toolkit release notes, table 3).
MIN_DRIVER_FOR_CUDA = {
    "11.6": "510.39.01", "11.7": "515.43.04", "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02",
    "12.2": "535.54.03", "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
    "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
}


def _path(root: str, absolute: str) -> str:
    return os.path.join(root, absolute.lstrip("/"))


# ---- nouveau ----

def loaded_modules(root: str = "/") -> list[str] | None:
    """Names of the loaded kernel modules (from /proc/modules under root); None when unreadable."""
    try:
        with open(_path(root, "/proc/modules"), encoding="utf-8", errors="replace") as handle:
            return [line.split()[0] for line in handle if line.strip()]
    except OSError:
        return None


def check_nouveau(root: str = "/") -> CheckResult:
    name = "nouveau"
    modules = loaded_modules(root)
    if modules is None:
        return CheckResult(name, SKIPPED, "Not checked: /proc/modules cannot be read here.",
                           data={"modules_file": _path(root, "/proc/modules")})
    nvidia = sorted(m for m in modules if m == "nvidia" or m.startswith("nvidia_"))
    data = {"loaded": "nouveau" in modules, "nvidia_modules": nvidia}
    if "nouveau" in modules:
        return CheckResult(
            name, ERROR, "The nouveau kernel module (the open-source driver for NVIDIA cards) is loaded; it "
                         "takes the GPUs the NVIDIA driver needs, so CUDA cannot use them.",
            hint="blacklist it: put `blacklist nouveau` and `options nouveau modeset=0` in "
                 "/etc/modprobe.d/blacklist-nouveau.conf, rebuild the initramfs (update-initramfs -u, or "
                 "dracut -f) and reboot",
            data=data)
    loaded = f" (NVIDIA modules loaded: {', '.join(nvidia)})" if nvidia else ""
    return CheckResult(name, OK, f"nouveau is not loaded{loaded}.", data=data)


# ---- device_nodes ----

def _node_state(path: str) -> str:
    """ok, missing, not-a-device or no-access (for this process's user)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "no-access"
    if not stat.S_ISCHR(info.st_mode):
        return "not-a-device"
    return "ok" if os.access(path, os.R_OK | os.W_OK) else "no-access"


def check_device_nodes(root: str = "/", devices: list[NvmlDevice] | None = None) -> CheckResult:
    """The /dev/nvidia* nodes CUDA opens for these devices (nvml.NvmlDevice list); skipped without GPUs."""
    name = "device_nodes"
    if not devices:
        return CheckResult(name, SKIPPED, "Not checked: no GPU is selected on this host (the gpu check says why).")
    wanted = ["/dev/nvidiactl"]
    for device in devices:
        minor = device.health.minor_number if device.health and device.health.minor_number is not None \
            else device.index
        wanted.append(f"/dev/nvidia{minor}")
    wanted.append("/dev/nvidia-uvm")
    nodes = {node: _node_state(_path(root, node)) for node in wanted}
    data = {"nodes": nodes, "root": root, "uid": os.geteuid()}
    required_missing = [n for n, s in nodes.items() if s == "missing" and n != "/dev/nvidia-uvm"]
    not_devices = [n for n, s in nodes.items() if s == "not-a-device"]
    denied = [n for n, s in nodes.items() if s == "no-access"]
    problems: list[tuple[str, str, str]] = []
    if required_missing:
        problems.append((ERROR, f"{', '.join(required_missing)} {'is' if len(required_missing) == 1 else 'are'} "
                                f"missing, so CUDA cannot open the GPU.",
                         "the driver creates these when it loads: run `nvidia-smi` once as root (or install "
                         "nvidia-modprobe); inside a container, start it with GPU access (--gpus all)"))
    if not_devices:
        problems.append((ERROR, f"{', '.join(not_devices)} {'is' if len(not_devices) == 1 else 'are'} not a "
                                f"character device.",
                         "remove the stray file(s) and let the driver recreate them (reboot, or "
                         "`nvidia-smi` as root); in a container, fix the device mapping"))
    if denied:
        problems.append((ERROR, f"this user (uid {os.geteuid()}) cannot open {', '.join(denied)} for reading "
                                f"and writing.",
                         "add the user to the group that owns them (`ls -l /dev/nvidia*`, often video), or "
                         "fix the mode the driver gives them (NVreg_DeviceFileMode / the udev rule)"))
    if nodes["/dev/nvidia-uvm"] == "missing":
        problems.append((WARNING, "/dev/nvidia-uvm is missing; CUDA needs it and nvidia-modprobe creates it on "
                                  "first use, but only where nvidia-modprobe is installed.",
                         "load nvidia-uvm at boot (modprobe nvidia-uvm, plus nvidia-modprobe -u -c=0 to create "
                         "the node); inside a container, pass /dev/nvidia-uvm in"))
    if not problems:
        return CheckResult(name, OK, f"{', '.join(nodes)} are present and usable by this user.", data=data)
    status = ERROR if any(p[0] == ERROR for p in problems) else WARNING
    message = " ".join(p[1][0].upper() + p[1][1:] for p in problems)
    return CheckResult(name, status, message, hint="; ".join(p[2] for p in problems), data=data)


# ---- cuda_driver ----

def _major_minor(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    match = re.match(r"^\s*(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def driver_hint(cuda: str) -> str:
    minimum = MIN_DRIVER_FOR_CUDA.get(cuda)
    need = f"driver {minimum} or newer" if minimum else f"a driver that supports CUDA {cuda}"
    return f"upgrade the NVIDIA driver (CUDA {cuda} needs {need}), or use a libtorch variant built for CUDA " \
           f"the driver supports"


def check_cuda_driver(inventory: NvmlInventory | None = None, libtorch: Libtorch | None = None) -> CheckResult:
    """The driver's CUDA version (NVML) against the libtorch build's (libtorch.Libtorch)."""
    name = "cuda_driver"
    if inventory is None or not inventory.cuda_driver_version:
        return CheckResult(name, SKIPPED, "Not checked: the driver's CUDA version is unknown (the gpu check "
                                          "says why).")
    if libtorch is None or libtorch.kind != "cuda":
        kind = "no libtorch" if libtorch is None else f"a {libtorch.kind or 'unrecorded'} libtorch build"
        return CheckResult(name, SKIPPED, f"Not checked: {kind}, no CUDA build to compare.",
                           data={"driver_cuda": inventory.cuda_driver_version})
    have, need = _major_minor(inventory.cuda_driver_version), _major_minor(libtorch.cuda)
    driver = f"driver {inventory.driver_version or '?'} supports CUDA {inventory.cuda_driver_version}"
    data = {"driver_version": inventory.driver_version, "driver_cuda": inventory.cuda_driver_version,
            "libtorch_cuda": libtorch.cuda, "libtorch_variant": libtorch.variant}
    if have is None or need is None or libtorch.cuda is None:
        return CheckResult(name, SKIPPED, f"Not checked: the libtorch build's CUDA version is not recorded "
                                          f"({driver}).", data=data)
    label = f"libtorch {libtorch.variant or ''} is built for CUDA {libtorch.cuda}".replace("  ", " ")
    if have[0] < need[0]:
        return CheckResult(name, ERROR, f"The {driver}, but {label}: a driver of an older CUDA major version "
                                        f"cannot run it.", hint=driver_hint(libtorch.cuda), data=data)
    if have < need:
        return CheckResult(name, WARNING, f"The {driver}, but {label}: it runs through CUDA's minor-version "
                                          f"compatibility, except kernels that need PTX compiled at run time.",
                           hint=driver_hint(libtorch.cuda), data=data)
    return CheckResult(name, OK, f"The {driver}; {label}.", data=data)
