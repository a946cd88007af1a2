"""One line that says whether a host is ready: what `fdl probe` prints for a host, and the verdict the
fdl_probe module returns (the role prints it for every host).

Host-side (fdl/hostside/): it runs in fdl and inside the Ansible probe module on every host.
"""

from __future__ import annotations

from .probe import CORE_CHECKS
from .report import SKIPPED, HostReport


def verdict(report: HostReport) -> str:
    """The host in one line: ready, with what was found; or not, with every error (then warning) named."""
    problems = report.errors + report.warnings
    if not problems:
        return summary_line(report)
    return headline(report) + ": " + "; ".join(f"{check.name}: {check.message.rstrip('.')}" for check in problems)


def failure(report: HostReport) -> str:
    """Why the fdl_probe module fails its task: how many errors, each named with its message."""
    named = ", ".join(f"{check.name}: {check.message}" for check in report.errors)
    return f"probe found {len(report.errors)} error(s): {named}"


def headline(report: HostReport) -> str:
    """Ready or NOT READY, and how many errors and warnings the host has."""
    errors, warnings = len(report.errors), len(report.warnings)
    counts = ", ".join(filter(None, [f"{errors} error{'s' if errors != 1 else ''}" if errors else "",
                                     f"{warnings} warning{'s' if warnings != 1 else ''}" if warnings else ""]))
    return f"{report.host}: {'NOT READY' if errors else 'ready'} ({counts})"


def summary_line(report: HostReport) -> str:
    """The green path: one line of the facts that matter (warnings, if any, are listed by render_human)."""
    parts: list[str] = []
    for check in report.checks:
        data = check.data
        if check.name not in CORE_CHECKS:
            continue  # green depth checks stay out of the one-line summary
        if check.status == SKIPPED and data.get("cpu_host"):
            if check.name == "gpu":
                parts.append(f"CPU host ({data.get('declared')}, gloo; GPU and NCCL checks skipped)")
            continue
        if check.status == SKIPPED:
            parts.append(f"{check.name} skipped")
        elif check.name == "gpu":
            devices = [d for d in data.get("devices", []) if d.get("selected")]
            sms = sorted({d["sm"] for d in devices})
            parts.append(f"{len(devices)} GPU{'s' if len(devices) != 1 else ''} ({', '.join(sms)})")
        elif check.name == "libtorch":
            parts.append(" ".join(filter(None, ["libtorch", data.get("version"), data.get("variant")])))
        elif check.name == "nccl":
            parts.append(f"NCCL from docker service {data['docker_service']}" if data.get("docker_service")
                         else f"NCCL {data.get('version')}")
        elif check.name == "data":
            parts.append(f"data {data.get('path')}")
        else:
            parts.append(f"{check.name} ok")
    hidden = sum(1 for c in report.checks
                 if c.status == SKIPPED and c.name not in CORE_CHECKS and not c.data.get("cpu_host"))
    more = f" ({hidden} more check{'s' if hidden != 1 else ''} skipped: `fdl probe --json` says why)" if hidden else ""
    return f"{report.host}: ready: " + ", ".join(parts) + more
