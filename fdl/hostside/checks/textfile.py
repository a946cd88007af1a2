"""The probe report as Prometheus metrics, for node_exporter's textfile collector.

    text = render(report.to_dict())            # the document `fdl probe --json` prints, as metrics
    write_textfile(path, report.to_dict())     # atomically, mode 0644, into the collector's directory

Built only from the report's JSON form, so the metrics and the --json twin
cannot disagree. What is exported (docs/probe.md, "At fleet scale", lists
every family):

- the verdict (`fdl_probe_ready`), every check's status as one 0/1 series
  per possible status (`fdl_probe_check_status{check,status}`), when the
  probe last ran and how long it took;
- the numeric health facts the checks read, per selected GPU (`gpu` label:
  its NVML index): persistence mode, ECC mode and uncorrectable error counts,
  retired pages and remapped rows, PCIe link generation and width against
  their maximum, performance state, clock event reasons, MIG mode;
- the driver, libtorch and NCCL versions as `_info` series (value 1).

Label values are the report's own facts (check names, statuses, GPU index,
model and UUID, version strings), escaped as the text format requires, with
control characters dropped and length capped, so every series set is bounded
by the host's hardware; messages and hints (free text) never become labels,
and nothing secret is in a probe report to begin with. A reading the report
does not have (null) is left out rather than exported as a made-up value.
node_exporter refuses samples with timestamps, so none carry one.

Host-side (fdl/hostside/): it runs in `fdl probe` and in the probe module on
every host.
"""

from __future__ import annotations

import math
import time
from typing import Any, Tuple

from .report import ERROR, OK, SKIPPED, WARNING

STATUSES = (OK, WARNING, ERROR, SKIPPED)
TEXTFILE_MODE = 0o644  # node_exporter runs as its own account and must read the file
SUFFIX = ".prom"  # the collector reads only *.prom files of its directory
LABEL_MAX = 128  # longest label value kept (a version string, a GPU model, a UUID fit easily)
# NVML's clock event reasons in the order health.CLOCK_REASONS lists them (docs/probe.md): one series each.
CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                 "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")

Labels = Tuple[Tuple[str, str], ...]

# name: (type, help). The order here is the order in the file.
FAMILIES = {
    "fdl_probe_ready": ("gauge", "1 when no probe check found an error (fdl probe exits 0), else 0."),
    "fdl_probe_check_status": ("gauge", "1 for the status each probe check ended in, 0 for the other statuses "
                                        "(ok, warning, error, skipped)."),
    "fdl_probe_last_run_timestamp_seconds": ("gauge", "When the probe ran, in Unix seconds (this host's clock)."),
    "fdl_probe_duration_seconds": ("gauge", "How long the probe's checks took, in seconds."),
    "fdl_gpu_driver_info": ("gauge", "The NVIDIA driver version and the CUDA version it supports (value 1)."),
    "fdl_gpus": ("gauge", "GPUs NVML counts on this host, unreachable ones included."),
    "fdl_gpus_unreachable": ("gauge", "GPUs NVML counts but cannot open (fallen off the bus, hidden)."),
    "fdl_gpu_info": ("gauge", "One series per GPU: its model, UUID and compute capability (value 1)."),
    "fdl_gpu_selected": ("gauge", "1 when the GPU is one the ranks use (and the health checks judge), else 0."),
    "fdl_gpu_memory_total_bytes": ("gauge", "The GPU's total memory, in bytes."),
    "fdl_gpu_persistence_mode": ("gauge", "1 when persistence mode is on, else 0."),
    "fdl_gpu_ecc_mode": ("gauge", "1 when ECC is on, else 0 (absent on boards without ECC memory)."),
    "fdl_gpu_ecc_pending_mode": ("gauge", "The ECC mode after the GPU's next reset: 1 on, 0 off."),
    "fdl_gpu_ecc_uncorrected_errors_total": ("counter", "Uncorrectable ECC errors: since the driver loaded "
                                                        "(scope volatile) or over the board's life (aggregate)."),
    "fdl_gpu_retired_pages": ("gauge", "Memory pages retired, by cause (multiple single-bit or a double-bit ECC "
                                       "error)."),
    "fdl_gpu_retired_pages_pending": ("gauge", "1 when a page retirement waits for the GPU's next reset."),
    "fdl_gpu_remapped_rows": ("gauge", "Memory rows remapped, by the kind of error that caused it."),
    "fdl_gpu_row_remap_pending": ("gauge", "1 when a row remap waits for the GPU's next reset."),
    "fdl_gpu_row_remap_failure": ("gauge", "1 when a row remap failed (the board needs service)."),
    "fdl_gpu_pcie_link_generation": ("gauge", "The PCIe generation the GPU's link runs at now."),
    "fdl_gpu_pcie_link_generation_max": ("gauge", "The highest PCIe generation the GPU's link can run at here."),
    "fdl_gpu_pcie_link_width": ("gauge", "The PCIe lanes the GPU's link runs with now."),
    "fdl_gpu_pcie_link_width_max": ("gauge", "The most PCIe lanes the GPU's link can run with here."),
    "fdl_gpu_performance_state": ("gauge", "The GPU's performance state (0 full speed ... 15 idle)."),
    "fdl_gpu_clock_event_reason": ("gauge", "1 for each reason NVML gives for holding the GPU's clocks down."),
    "fdl_gpu_mig_mode": ("gauge", "1 when MIG mode is on, else 0 (absent where MIG is not supported)."),
    "fdl_gpu_mig_instances": ("gauge", "MIG instances on the GPU."),
    "fdl_libtorch_info": ("gauge", "The libtorch ranks would link: version, variant, kind and CUDA version "
                                   "(value 1)."),
    "fdl_nccl_info": ("gauge", "The NCCL ranks would load: version and where it was found (value 1)."),
}


def escape(value: str) -> str:
    """A label value as the text format writes it: \\ \" and newline escaped; other control characters
    dropped and the length capped at LABEL_MAX."""
    kept = "".join(ch for ch in str(value) if ch == "\n" or ch.isprintable())
    kept = kept[:LABEL_MAX]
    return kept.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"not a finite number: {value!r}")
    return repr(number)


class _Metrics:
    """Samples per family, in FAMILIES order when rendered; a sample whose value is None is left out."""

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[Labels, str]]] = {}

    def add(self, metric: str, value: Any, /, **labels: Any) -> None:
        if value is None or metric not in FAMILIES:
            return
        pairs = tuple((key, escape(str(text))) for key, text in labels.items())
        self.samples.setdefault(metric, []).append((pairs, _number(value)))

    def text(self) -> str:
        lines = []
        for name, (kind, help_text) in FAMILIES.items():
            rows = self.samples.get(name)
            if not rows:
                continue
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in rows:
                inner = ",".join(f'{key}="{text}"' for key, text in labels)
                lines.append(f"{name}{{{inner}}} {value}" if inner else f"{name} {value}")
        return "\n".join(lines) + "\n"


def _checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("name")): c for c in doc.get("checks") or [] if isinstance(c, dict)}


def _devices(check: dict[str, Any] | None) -> list[dict[str, Any]]:
    data = (check or {}).get("data") or {}
    found = [d for d in data.get("devices") or [] if isinstance(d, dict) and isinstance(d.get("index"), int)]
    return sorted(found, key=lambda d: d["index"])


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def render(doc: dict[str, Any], now: float | None = None) -> str:
    """The metrics text of one host's report (HostReport.to_dict()); `now` ends the run time (default: now)."""
    metrics = _Metrics()
    checks = _checks(doc)
    metrics.add("fdl_probe_ready", not any(c.get("status") == ERROR for c in checks.values()))
    for name, check in checks.items():
        for status in STATUSES:
            metrics.add("fdl_probe_check_status", check.get("status") == status, check=name, status=status)
    started = doc.get("time")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        metrics.add("fdl_probe_last_run_timestamp_seconds", float(started))
        metrics.add("fdl_probe_duration_seconds", round(max(0.0, (time.time() if now is None else now) - started), 6))
    _gpu(metrics, checks)
    _health(metrics, checks)
    _versions(metrics, checks)
    return metrics.text()


def _gpu(metrics: _Metrics, checks: dict[str, dict[str, Any]]) -> None:
    data = (checks.get("gpu") or {}).get("data") or {}
    if data.get("driver_version"):
        metrics.add("fdl_gpu_driver_info", 1, driver_version=data["driver_version"],
                    cuda_version=data.get("cuda_driver_version") or "")
    count = (checks.get("gpu_count") or {}).get("data") or {}
    if isinstance(count.get("count"), int):
        metrics.add("fdl_gpus", count["count"])
        metrics.add("fdl_gpus_unreachable", len(count.get("unreachable") or []))
    for device in _devices(checks.get("gpu")):
        gpu = device["index"]
        metrics.add("fdl_gpu_info", 1, gpu=gpu, name=device.get("name") or "", uuid=device.get("uuid") or "",
                    compute_capability=device.get("compute_capability") or "")
        metrics.add("fdl_gpu_selected", _flag(device.get("selected")), gpu=gpu)
        metrics.add("fdl_gpu_memory_total_bytes", device.get("memory_total"), gpu=gpu)


def _health(metrics: _Metrics, checks: dict[str, dict[str, Any]]) -> None:
    for d in _devices(checks.get("gpu_persistence")):
        metrics.add("fdl_gpu_persistence_mode", _flag(d.get("persistence")), gpu=d["index"])
    for d in _devices(checks.get("gpu_ecc")):
        if d.get("supported") is False:
            continue  # a board without ECC memory: nothing to count
        gpu = d["index"]
        metrics.add("fdl_gpu_ecc_mode", _flag(d.get("enabled")), gpu=gpu)
        metrics.add("fdl_gpu_ecc_pending_mode", _flag(d.get("pending")), gpu=gpu)
        for scope in ("volatile", "aggregate"):
            metrics.add("fdl_gpu_ecc_uncorrected_errors_total", d.get(f"uncorrected_{scope}"), gpu=gpu, scope=scope)
    for d in _devices(checks.get("gpu_retired_memory")):
        gpu = d["index"]
        metrics.add("fdl_gpu_retired_pages", d.get("retired_sbe"), gpu=gpu, cause="multiple_single_bit_ecc")
        metrics.add("fdl_gpu_retired_pages", d.get("retired_dbe"), gpu=gpu, cause="double_bit_ecc")
        metrics.add("fdl_gpu_retired_pages_pending", _flag(d.get("retired_pending")), gpu=gpu)
        metrics.add("fdl_gpu_remapped_rows", d.get("remapped_corrected"), gpu=gpu, cause="correctable")
        metrics.add("fdl_gpu_remapped_rows", d.get("remapped_uncorrected"), gpu=gpu, cause="uncorrectable")
        metrics.add("fdl_gpu_row_remap_pending", _flag(d.get("remap_pending")), gpu=gpu)
        metrics.add("fdl_gpu_row_remap_failure", _flag(d.get("remap_failure")), gpu=gpu)
    for d in _devices(checks.get("gpu_pcie")):
        gpu = d["index"]
        metrics.add("fdl_gpu_pcie_link_generation", d.get("gen"), gpu=gpu)
        metrics.add("fdl_gpu_pcie_link_generation_max", d.get("gen_max"), gpu=gpu)
        metrics.add("fdl_gpu_pcie_link_width", d.get("width"), gpu=gpu)
        metrics.add("fdl_gpu_pcie_link_width_max", d.get("width_max"), gpu=gpu)
        metrics.add("fdl_gpu_performance_state", d.get("pstate"), gpu=gpu)
    for d in _devices(checks.get("gpu_throttle")):
        if d.get("mask") is None:
            continue  # not read: no reason is known to be active or not
        reasons = set(d.get("reasons") or [])
        for reason in CLOCK_REASONS:
            metrics.add("fdl_gpu_clock_event_reason", reason in reasons, gpu=d["index"], reason=reason)
    for d in _devices(checks.get("gpu_mig")):
        if d.get("supported") is False:
            continue
        metrics.add("fdl_gpu_mig_mode", _flag(d.get("enabled")), gpu=d["index"])
        metrics.add("fdl_gpu_mig_instances", len(d.get("instances") or []), gpu=d["index"])


def _versions(metrics: _Metrics, checks: dict[str, dict[str, Any]]) -> None:
    torch = (checks.get("libtorch") or {}).get("data") or {}
    if torch.get("version") or torch.get("variant"):
        metrics.add("fdl_libtorch_info", 1, version=torch.get("version") or "", variant=torch.get("variant") or "",
                    kind=torch.get("kind") or "", cuda=torch.get("cuda") or "")
    nccl = (checks.get("nccl") or {}).get("data") or {}
    if nccl.get("version"):
        metrics.add("fdl_nccl_info", 1, version=nccl["version"], origin=nccl.get("origin") or "")


MARKER = b"# HELP fdl_probe_"  # render()'s first line (fdl_probe_ready): a file holding it holds fdl's series
MAX_SCANNED = 1000  # *.prom files looked into per write (a textfile directory holds a handful)


def other_fdl_files(path: str) -> list[str]:
    """The other *.prom files in path's directory that hold fdl's probe metrics.

    node_exporter's textfile collector reads every *.prom file of its directory into one set of series, so a
    second fdl file (a timer and a cron job, two roles, a renamed --textfile) exports every fdl series twice;
    node_exporter says so only in its own log. Only the head of each regular file is read; a file that cannot
    be read is passed over."""
    import os
    import stat

    directory = os.path.dirname(os.path.abspath(path))
    own = os.path.basename(path)
    found: list[str] = []
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(SUFFIX) and name != own)
    except OSError:
        return found
    for name in names[:MAX_SCANNED]:
        other = os.path.join(directory, name)
        try:
            if not stat.S_ISREG(os.lstat(other).st_mode):
                continue
            with open(other, "rb") as handle:
                head = handle.read(4096)
        except OSError:
            continue
        if head.startswith(MARKER) or b"\n" + MARKER in head:
            found.append(other)
    return found


def write_textfile(path: str, doc: dict[str, Any], now: float | None = None) -> str:
    """Render `doc` and replace `path` with it atomically (a temporary file in the same directory that the
    collector's *.prom glob does not match, then a rename), mode 0644. Returns the text; raises OSError."""
    # Imported here, not at the top: a caller that loads checks/ as a top-level package (no parent) can
    # still render.
    from ..fsio import atomic_write

    text = render(doc, now)
    atomic_write(path, text, mode=TEXTFILE_MODE)
    return text
