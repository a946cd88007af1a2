"""Per-GPU health checks, read through NVML: the GPU half of a DCGM level-1 / node-health-check run.

Each check judges the GPUs the run will use (the selection) from the
readings `nvml.read_health` took while the GPU check held NVML open, so they
cost no second NVML session:

    gpu_count           declared local_devices present; GPUs NVML counts but cannot open
    gpu_persistence     persistence mode off: warning
    gpu_ecc             uncorrectable ECC errors (volatile or aggregate): error; ECC off or
                        about to change: warning
    gpu_retired_memory  page retirement pending, 60+ retired pages, row remapping pending
                        or failed: error; more than 15 pages retired after double-bit errors:
                        warning (DCGM's limits)
    gpu_pcie            link narrower than it can be: warning; slower generation while the
                        GPU is busy: warning (an idle GPU slows its link on purpose)
    gpu_throttle        clocks held down by HW slowdown, HW/SW thermal slowdown or power
                        brake: warning
    gpu_mig             MIG mode reported; on, while the run expects whole GPUs: error;
                        a mode change waiting for a reset: warning

A reading NVML does not support on a board (ECC on a GeForce, MIG before
Ampere) is not a finding; a reading that failed for another reason is a
warning, since a health gate must say when it could not look.

Host-side (fdl/hostside/: runs in fdl and on managed hosts): standard library only, relative imports.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .devices import parse_devices
from .report import ERROR, OK, SKIPPED, WARNING, CheckResult

if TYPE_CHECKING:
    from .devices import Selection
    from .nvml import GpuHealth, NvmlDevice, NvmlInventory

# A per-GPU check: check(inventory, selection, *args), made from a judge(devices, findings, *args).
GpuCheck = Callable[..., CheckResult]

GPU_CHECKS = ("gpu_count", "gpu_persistence", "gpu_ecc", "gpu_retired_memory", "gpu_pcie", "gpu_throttle",
              "gpu_mig")

# DCGM's limits (dcgm_gpu_hardware_limits.h): a board with this many retired pages is due for replacement,
# and double-bit retirements past the soft limit mean its memory keeps failing.
RETIRED_PAGES_LIMIT = 60
RETIRED_DBE_SOFT_LIMIT = 15
# Performance states up to P2 mean the GPU is working; above that it idles and may slow its PCIe link.
BUSY_PSTATE_MAX = 2

# NVML clock event ("throttle") reasons (nvml.h nvmlClocksEventReason*).
CLOCK_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
FAULT_REASONS = {  # the reasons that mean something is wrong with the board, its cooling or its power
    "hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown", "hw_power_brake_slowdown": "HW power brake",
}

GPU_IS_LOST = 15
RESET_HINT = "drain the host, then reset the GPU (nvidia-smi -r -i {index}) or reboot it"
UNREADABLE_HINT = "run `nvidia-smi -q` on the host to see what the driver reports; NVML refused the query"


def _worst(statuses: Iterable[str]) -> str:
    seen = set(statuses)
    return ERROR if ERROR in seen else WARNING if WARNING in seen else OK


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _gpu(device: NvmlDevice) -> str:
    return f"GPU {device.index} ({device.name})"


def _health(device: NvmlDevice) -> GpuHealth:
    """The readings read_inventory took for `device` (it always takes them)."""
    if device.health is None:
        raise ValueError(f"GPU {device.index} has no health readings")
    return device.health


class _Findings:
    """What check `name` found across devices: (status, sentence, hint) triples and per-device facts."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: list[tuple[str, str, str | None]] = []
        self.devices: list[dict[str, Any]] = []

    def add(self, status: str, sentence: str, hint: str | None = None) -> None:
        self.items.append((status, sentence, hint))

    def unreadable(self, device: NvmlDevice, query: str, what: str) -> bool:
        """Note a failed `query` reading (a GpuHealth query group) of `device` as a warning; True when it failed."""
        error = _health(device).failed.get(query)
        if error is None:
            return False
        self.add(WARNING, f"{_gpu(device)}: could not read its {what} ({error}).", UNREADABLE_HINT)
        return True

    def result(self, ok_message: str, extra: dict[str, Any] | None = None) -> CheckResult:
        name = self.name
        status = _worst(item[0] for item in self.items)
        data = {"devices": self.devices, **(extra or {})}
        if status == OK:
            return CheckResult(name, OK, ok_message, data=data)
        shown = [(s, text, hint) for s, text, hint in self.items if s in (ERROR, WARNING)]
        hints: list[str] = []
        for item in shown:
            hint = item[2]
            if hint and hint not in hints:
                hints.append(hint)
        return CheckResult(name, status, " ".join(item[1] for item in shown), hint="; ".join(hints) or None,
                           data=data)


def selected_devices(inventory: NvmlInventory | None, selection: Selection | None) -> list[NvmlDevice]:
    if inventory is None:
        return []
    if selection is None or selection.indices is None:
        return list(inventory.devices)
    return [d for d in inventory.devices if d.index in selection.indices]


def _skip(name: str, inventory: NvmlInventory | None, devices: list[NvmlDevice]) -> CheckResult | None:
    if inventory is None:
        return CheckResult(name, SKIPPED, "Not checked: NVML is unavailable (the gpu check says why).")
    if not devices:
        return CheckResult(name, SKIPPED, "Not checked: no GPU is selected on this host.")
    return None


def _per_gpu(name: str) -> Callable[[GpuCheck], GpuCheck]:
    """Make `judge(devices, findings, *args)` the check `name(inventory, selection, *args)`.

    The check is skipped without NVML or without a selected GPU; otherwise
    `judge` reads the selected devices into a fresh `_Findings(name)` and
    returns its result.
    """
    def decorate(judge: GpuCheck) -> GpuCheck:
        @functools.wraps(judge)
        def check(inventory: NvmlInventory | None, selection: Selection | None, *args: Any) -> CheckResult:
            devices = selected_devices(inventory, selection)
            return _skip(name, inventory, devices) or judge(devices, _Findings(name), *args)
        return check
    return decorate


# ---- gpu_count ----

def declared_gpu_ids(local_devices: str | Iterable[Any] | None) -> list[int] | None:
    """The GPU ids a worker declares (`local_devices`: [0, 1], "0,1"); None for none declared or CPU ranks."""
    if local_devices is None:
        return None
    try:
        devices = parse_devices(local_devices)
    except ValueError:  # the configuration check refuses it; nothing is declared here
        return None
    return None if devices.is_cpu or devices.ids is None else list(devices.ids)


def check_gpu_count(inventory: NvmlInventory | None, local_devices: str | Iterable[Any] | None = None) -> CheckResult:
    """Declared GPUs that are missing, and GPUs NVML counts but cannot open (fallen off the bus)."""
    name = "gpu_count"
    if inventory is None:
        return CheckResult(name, SKIPPED, "Not checked: NVML is unavailable (the gpu check says why).")
    declared = declared_gpu_ids(local_devices)
    present = [d.index for d in inventory.devices]
    data = {"count": inventory.count, "present": present, "declared": declared,
            "unreachable": [{"index": u.index, "error": u.error, "code": u.code} for u in inventory.unreachable]}
    findings = _Findings(name)
    for lost in inventory.unreachable:
        wanted = declared is None or lost.index in declared
        if lost.code == GPU_IS_LOST:
            findings.add(ERROR, f"GPU {lost.index} is lost: NVML counts it but the driver lost contact with it "
                                f"(fallen off the bus).",
                         "check `dmesg` for Xid 79 and reboot the host; if it recurs, reseat the card and "
                         "check its power and cooling")
        else:
            findings.add(ERROR if wanted else WARNING,
                         f"GPU {lost.index} is counted by NVML but cannot be opened ({lost.error}).",
                         "check `nvidia-smi` on the host; inside a container, pass every GPU the run uses")
    if declared is not None:
        missing = [i for i in declared if i not in present]
        if missing:
            have = (f"NVML sees {_plural(len(present), 'usable GPU')}"
                    + (f" ({', '.join(map(str, present))})" if present else ""))
            findings.add(ERROR, f"local_devices declares GPU {', '.join(map(str, missing))}, but {have}.",
                         "find the missing GPU (`nvidia-smi`, `lspci | grep -i nvidia`, `dmesg | grep -i xid`) "
                         "and reboot or service the host, or remove it from local_devices in the cluster file")
    if not findings.items and declared is None:
        return CheckResult(name, SKIPPED, f"NVML counts {_plural(inventory.count, 'GPU')}; no local_devices "
                                          f"declared to compare with.", data=data)
    result = findings.result(f"Every declared GPU ({', '.join(map(str, declared or []))}) is present.", data)
    del result.data["devices"]  # about the host's device list, not a per-device reading
    return result


# ---- gpu_persistence ----

@_per_gpu("gpu_persistence")
def check_persistence(devices: list[NvmlDevice], findings: _Findings) -> CheckResult:
    off: list[NvmlDevice] = []
    for device in devices:
        health = _health(device)
        findings.devices.append({"index": device.index, "persistence": health.persistence})
        if not findings.unreadable(device, "persistence", "persistence mode") and health.persistence is False:
            off.append(device)
    if off:
        findings.add(WARNING, f"Persistence mode is off on {', '.join(_gpu(d) for d in off)}: the driver "
                              f"tears the GPU state down whenever no process holds it, so every run pays the "
                              f"start-up again and settings such as clocks can reset.",
                     "enable the nvidia-persistenced service (systemctl enable --now nvidia-persistenced), "
                     "or run `nvidia-smi -pm 1` as root")
    return findings.result(f"Persistence mode is on for {_plural(len(devices), 'selected GPU')}.")


# ---- gpu_ecc ----

@_per_gpu("gpu_ecc")
def check_ecc(devices: list[NvmlDevice], findings: _Findings) -> CheckResult:
    supported = 0
    for device in devices:
        h = _health(device)
        findings.devices.append({
            "index": device.index, "supported": "ecc" not in h.unsupported, "enabled": h.ecc_current,
            "pending": h.ecc_pending, "uncorrected_volatile": h.ecc_uncorrected_volatile,
            "uncorrected_aggregate": h.ecc_uncorrected_aggregate})
        if "ecc" in h.unsupported:
            continue  # a board without ECC memory
        if findings.unreadable(device, "ecc", "ECC mode"):
            continue
        supported += 1
        if h.ecc_current is False:
            findings.add(WARNING, f"{_gpu(device)}: ECC is off, so memory errors on it go unnoticed.",
                         f"turn ECC on (nvidia-smi -e 1 -i {device.index}) and reset the GPU or reboot")
        if h.ecc_pending is not None and h.ecc_current is not None and h.ecc_pending != h.ecc_current:
            findings.add(WARNING, f"{_gpu(device)}: ECC turns {'on' if h.ecc_pending else 'off'} at its next "
                                  f"reset; until then it runs with ECC {'on' if h.ecc_current else 'off'}.",
                         RESET_HINT.format(index=device.index))
        findings.unreadable(device, "ecc_errors", "ECC error counts")
        volatile, aggregate = h.ecc_uncorrected_volatile or 0, h.ecc_uncorrected_aggregate or 0
        if volatile:
            findings.add(ERROR, f"{_gpu(device)}: {_plural(volatile, 'uncorrectable ECC error')} since the "
                                f"driver loaded; data on this GPU may already be corrupt.",
                         RESET_HINT.format(index=device.index) + ", and if the errors come back, have the "
                         "board serviced (`nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER` shows the history)")
        elif aggregate:
            findings.add(ERROR, f"{_gpu(device)}: {_plural(aggregate, 'uncorrectable ECC error')} over the "
                                f"board's lifetime (none since the driver loaded).",
                         "check that the memory was repaired (`nvidia-smi -q -d PAGE_RETIREMENT,ROW_REMAPPER`); "
                         f"if so, clear the lifetime count (nvidia-smi -p 1 -i {device.index}), otherwise have "
                         "the board serviced")
    if not supported and not findings.items:
        return findings.result("ECC is not supported on the selected GPUs (boards without ECC memory).")
    return findings.result(f"ECC is on with no uncorrectable errors on {_plural(supported, 'GPU')}.")


# ---- gpu_retired_memory ----

@_per_gpu("gpu_retired_memory")
def check_retired_memory(devices: list[NvmlDevice], findings: _Findings) -> CheckResult:
    for device in devices:
        h = _health(device)
        findings.devices.append({
            "index": device.index, "retired_sbe": h.retired_sbe, "retired_dbe": h.retired_dbe,
            "retired_pending": h.retired_pending, "remapped_corrected": h.remapped_corrected,
            "remapped_uncorrected": h.remapped_uncorrected, "remap_pending": h.remap_pending,
            "remap_failure": h.remap_failure})
        findings.unreadable(device, "retired_pages", "retired pages")
        findings.unreadable(device, "row_remap", "row remapper state")
        retired = (h.retired_sbe or 0) + (h.retired_dbe or 0)
        if h.retired_pending:
            findings.add(ERROR, f"{_gpu(device)}: a memory page is waiting to be retired; until the GPU is "
                                f"reset it keeps using the failing page.", RESET_HINT.format(index=device.index))
        if retired >= RETIRED_PAGES_LIMIT:
            findings.add(ERROR, f"{_gpu(device)}: {retired} memory pages retired ({h.retired_dbe or 0} after "
                                f"double-bit errors), at or past the replacement limit of {RETIRED_PAGES_LIMIT}.",
                         "take the GPU out of service and have the board replaced")
        elif (h.retired_dbe or 0) > RETIRED_DBE_SOFT_LIMIT:
            findings.add(WARNING, f"{_gpu(device)}: {h.retired_dbe} memory pages retired after double-bit "
                                  f"errors (more than {RETIRED_DBE_SOFT_LIMIT}): its memory keeps failing.",
                         "watch the count (nvidia-smi -q -d PAGE_RETIREMENT); more than one new retirement "
                         "a week means the board needs replacing")
        if h.remap_failure:
            findings.add(ERROR, f"{_gpu(device)}: row remapping failed (no spare rows left for a failing "
                                f"memory row).", "take the GPU out of service and have the board replaced")
        if h.remap_pending:
            findings.add(ERROR, f"{_gpu(device)}: a memory row remap is waiting for a GPU reset.",
                         RESET_HINT.format(index=device.index))
    return findings.result(f"No pending or excessive memory retirement on {_plural(len(devices), 'GPU')}.")


# ---- gpu_pcie ----

@_per_gpu("gpu_pcie")
def check_pcie(devices: list[NvmlDevice], findings: _Findings) -> CheckResult:
    for device in devices:
        h = _health(device)
        busy = h.pstate is not None and h.pstate <= BUSY_PSTATE_MAX
        findings.devices.append({"index": device.index, "gen": h.pcie_gen, "gen_max": h.pcie_gen_max,
                                 "width": h.pcie_width, "width_max": h.pcie_width_max, "pstate": h.pstate})
        if findings.unreadable(device, "pcie", "PCIe link state"):
            continue
        if h.pcie_width is None or h.pcie_width_max is None:
            continue
        link = f"gen{h.pcie_gen} x{h.pcie_width}, capable of gen{h.pcie_gen_max} x{h.pcie_width_max}"
        if h.pcie_width < h.pcie_width_max:
            findings.add(WARNING, f"{_gpu(device)}: PCIe link runs at x{h.pcie_width} of x{h.pcie_width_max} "
                                  f"lanes ({link}); host-device copies get proportionally slower.",
                         "reseat the card (or its riser) in a full-width slot and check the BIOS lane "
                         "settings; `lspci -vv` shows LnkSta against LnkCap")
        elif h.pcie_gen is not None and h.pcie_gen_max is not None and h.pcie_gen < h.pcie_gen_max and busy:
            findings.add(WARNING, f"{_gpu(device)}: PCIe link trained at gen{h.pcie_gen} while the GPU is busy "
                                  f"(P{h.pstate}); it can run gen{h.pcie_gen_max} ({link}).",
                         "check the slot's generation setting in the BIOS and the riser or cable; "
                         "`lspci -vv` shows LnkSta against LnkCap")
    return findings.result(f"PCIe links run at full width on {_plural(len(devices), 'GPU')} (an idle GPU "
                           f"may slow the link generation to save power; that is not judged).")


# ---- gpu_throttle ----

def decode_clock_reasons(mask: int) -> list[str]:
    return [label for bit, label in CLOCK_REASONS.items() if mask & bit]


@_per_gpu("gpu_throttle")
def check_throttle(devices: list[NvmlDevice], findings: _Findings) -> CheckResult:
    for device in devices:
        h = _health(device)
        reasons = [] if h.clock_reasons is None else decode_clock_reasons(h.clock_reasons)
        findings.devices.append({"index": device.index, "reasons": reasons, "mask": h.clock_reasons})
        if findings.unreadable(device, "clock_reasons", "clock throttle reasons"):
            continue
        faults = [FAULT_REASONS[r] for r in reasons if r in FAULT_REASONS]
        if faults:
            thermal = any("thermal" in r for r in reasons)
            findings.add(WARNING, f"{_gpu(device)}: clocks held down by {', '.join(faults)}.",
                         "check cooling (fans, airflow, inlet temperature; `nvidia-smi -q -d TEMPERATURE`)"
                         if thermal else
                         "check the power supply and its cabling (a power brake is asserted by the system, "
                         "HW slowdown by the board); `nvidia-smi -q -d PERFORMANCE` shows the active reasons")
    return findings.result(f"No fault is holding the clocks down on {_plural(len(devices), 'GPU')}.")


# ---- gpu_mig ----

@_per_gpu("gpu_mig")
def check_mig(devices: list[NvmlDevice], findings: _Findings, whole_gpus: bool) -> CheckResult:
    enabled: list[NvmlDevice] = []
    for device in devices:
        h = _health(device)
        findings.devices.append({"index": device.index, "supported": "mig" not in h.unsupported,
                                 "enabled": h.mig_current, "pending": h.mig_pending,
                                 "instances": list(h.mig_instances)})
        if "mig" in h.unsupported:
            continue
        if findings.unreadable(device, "mig", "MIG mode"):
            continue
        if h.mig_current:
            enabled.append(device)
            if whole_gpus:
                findings.add(ERROR, f"{_gpu(device)}: MIG mode is on ({_plural(len(h.mig_instances), 'instance')})"
                                    f", but the run expects whole GPUs: a rank given this GPU would see only "
                                    f"one MIG slice.",
                             f"turn MIG off (nvidia-smi -mig 0 -i {device.index}, then reset the GPU), or select "
                             f"MIG instances explicitly through CUDA_VISIBLE_DEVICES=MIG-...")
        if h.mig_pending is not None and h.mig_current is not None and h.mig_pending != h.mig_current:
            findings.add(WARNING, f"{_gpu(device)}: MIG mode turns {'on' if h.mig_pending else 'off'} at its next "
                                  f"reset.", RESET_HINT.format(index=device.index))
    data = {"whole_gpus": whole_gpus}
    if enabled:
        listing = ", ".join(f"{_gpu(d)}: {_plural(len(_health(d).mig_instances), 'instance')}" for d in enabled)
        return findings.result(f"MIG mode is on for {listing}; the run uses MIG instances.", data)
    return findings.result(f"MIG mode is off on {_plural(len(devices), 'GPU')} (whole GPUs).", data)


def expects_whole_gpus(whole_gpus: object, selection: Selection | None,
                       local_devices: str | Iterable[Any] | None) -> bool:
    """Whether ranks get whole GPUs: explicit `whole_gpus` wins; CPU ranks or MIG UUID selections do not."""
    if whole_gpus is not None:
        return bool(whole_gpus)
    if isinstance(local_devices, str) and local_devices.strip().startswith("cpu"):
        return False
    spec = getattr(selection, "spec", None) or ""
    return "MIG-" not in spec
