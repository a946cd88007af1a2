"""What the cluster's hosts run, for `fdl @cluster nccl build`: read from the cluster probe's own reports.

Nothing here collects anything: `collect()` runs the probe `fdl @cluster probe`
runs (fdl.cluster.probe.probe_cluster) and reads each host's report, the NCCL
version its `nccl` check dated and the compute capabilities its `gpu` check
listed. A host that reports no version (a CPU host, NCCL from a docker
service, no NCCL found, unreachable) is left out of the comparison, with the
reason, so the planner can say why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fdl.nccl.detect import HostNccl
from fdl.nccl.plan import NcclVersion

if TYPE_CHECKING:
    from fdl.config.project import Config
    from fdl.hostside.checks.report import HostReport

_VERSION_RE = re.compile(r"^2\.\d+\.\d+$")
_CAPABILITY_RE = re.compile(r"^(\d{1,2})\.(\d)$")


@dataclass
class Fleet:
    """Each cluster host's NCCL and GPUs, as its probe report says (roster order)."""

    versions: list[HostNccl] = field(default_factory=list)  # hosts that report a dated NCCL
    capabilities: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # host -> its selected GPUs
    unreported: dict[str, str] = field(default_factory=dict)  # host -> why it reports no NCCL version

    def version_of(self, host: str) -> NcclVersion | None:
        return next((r.version for r in self.versions if r.host == host), None)


def collect(config: Config, *, progress: bool | None = None) -> Fleet:
    """Probe every worker of the configuration's cluster (the cluster probe, shared data not checked) and read
    what the reports say."""
    from fdl.cluster.probe import ClusterProbeOptions, probe_cluster

    report = probe_cluster(config, ClusterProbeOptions(skip_mount=True), progress=progress)
    return from_reports(report.hosts)


def from_reports(reports: list[HostReport]) -> Fleet:
    """The fleet as the probe reports describe it (the same reading as the probe's nccl_match check)."""
    from fdl.hostside.checks.report import SKIPPED

    fleet = Fleet()
    for report in reports:
        nccl = report.check("nccl")
        gpu = report.check("gpu")
        if gpu is not None:
            fleet.capabilities[report.host] = _capabilities(gpu.data)
        if nccl is None:
            problem = next((c for c in report.checks if c.status == "error"), None)
            fleet.unreported[report.host] = problem.message if problem is not None else "no NCCL check ran"
        elif nccl.status == SKIPPED or nccl.data.get("docker"):
            fleet.unreported[report.host] = nccl.message
        elif _VERSION_RE.match(str(nccl.data.get("version") or "")):
            major, minor, patch = (int(part) for part in str(nccl.data["version"]).split("."))
            fleet.versions.append(HostNccl(report.host, NcclVersion(major, minor, patch)))
        else:
            fleet.unreported[report.host] = nccl.message
    return fleet


def _capabilities(data: dict[str, Any]) -> list[tuple[int, int]]:
    """The compute capabilities of the GPUs the host's ranks use (every GPU when none is marked selected)."""
    devices = [d for d in data.get("devices") or [] if isinstance(d, dict)]
    chosen = [d for d in devices if d.get("selected")] or devices
    found = []
    for device in chosen:
        match = _CAPABILITY_RE.match(str(device.get("compute_capability") or ""))
        if match:
            found.append((int(match.group(1)), int(match.group(2))))
    return found
