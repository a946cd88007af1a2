"""Cross-host consistency: what only a comparison of host reports can find.

    driver_match  NVIDIA driver versions differ across hosts: warning
    gpu_models    the GPU models each host offers, so a heterogeneous rig is visible
                  (reported, never a failure)
    clock_skew    a host's wall clock disagrees with this machine's, or two hosts' with
                  each other, by more than CLOCK_SKEW_LIMIT_S: warning (join-window
                  deadlines are wall-clock times)

Pure functions over HostReports (schema 2: each carries its `time`) and, for
the clocks, the interval of this machine's clock within which each host
took its reading. The cluster probe calls `consistency_checks` next to its
own cross-host checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdl.hostside.checks.report import ERROR, OK, SKIPPED, WARNING, CheckResult, HostReport

CLOCK_SKEW_LIMIT_S = 5.0


def _usable_gpu(report: HostReport) -> CheckResult | None:
    check = report.check("gpu")
    if check is None or check.status == SKIPPED or (check.status == ERROR and not check.data.get("devices")):
        return None
    return check


def _cpu_note(reports: list[HostReport]) -> str:
    """" (CPU hosts, which have none: a, b)" when some hosts were judged as CPU hosts, else ""."""
    cpu = [r.host for r in reports if r.cpu_host]
    return f" (CPU hosts, which have none: {', '.join(cpu)})" if cpu else ""


def host_groups(values: dict[str, str]) -> str:
    """Hosts grouped by the value they report, largest group first: "2.1 on a, b; 2.0 on c"."""
    by_value: dict[str, list[str]] = {}
    for host, value in values.items():
        by_value.setdefault(value, []).append(host)
    return "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in
                     sorted(by_value.items(), key=lambda item: (-len(item[1]), item[0])))


def driver_match(reports: list[HostReport]) -> CheckResult:
    name = "driver_match"
    versions: dict[str, str] = {}
    for report in reports:
        check = _usable_gpu(report)
        if check is not None and check.data.get("driver_version"):
            versions[report.host] = str(check.data["driver_version"])
    data = {"versions": versions}
    if len(versions) < 2:
        return CheckResult(name, SKIPPED, f"Fewer than two hosts report an NVIDIA driver{_cpu_note(reports)}; "
                                          f"nothing to compare.", data=data)
    if len(set(versions.values())) == 1:
        return CheckResult(name, OK, f"Every host runs NVIDIA driver {next(iter(versions.values()))}.", data=data)
    return CheckResult(
        name, WARNING, f"NVIDIA driver versions differ across hosts ({host_groups(versions)}).",
        hint="install one driver release on every host: mixed drivers train together, but the oldest caps the "
             "CUDA version and driver bugs then differ from host to host",
        data=data)


def gpu_models(reports: list[HostReport]) -> CheckResult:
    """The selected GPUs' models per host; `data.heterogeneous` says whether they differ."""
    name = "gpu_models"
    models: dict[str, list[str]] = {}
    for report in reports:
        check = _usable_gpu(report)
        if check is None:
            continue
        devices = [d for d in check.data.get("devices", []) if d.get("selected", True)]
        if devices:
            models[report.host] = sorted(f"{d.get('name')} ({d.get('sm')})" for d in devices)
    described = {host: ", ".join(f"{names.count(n)}x {n}" for n in sorted(set(names)))
                 for host, names in models.items()}
    kinds = sorted({n for names in models.values() for n in names})
    data = {"models": models, "heterogeneous": len(kinds) > 1}
    if not models:
        return CheckResult(name, SKIPPED, f"No host reports a GPU{_cpu_note(reports)}.", data=data)
    if len(kinds) == 1:
        return CheckResult(name, OK, f"One GPU model across the cluster: {kinds[0]}.", data=data)
    listing = "; ".join(f"{host}: {text}" for host, text in described.items())
    return CheckResult(name, OK, f"Heterogeneous GPUs ({listing}). The slowest model sets the pace of every "
                                 f"synchronous step.", data=data)


@dataclass(frozen=True)
class ClockSample:
    """A host's wall-clock reading, taken between `sent` and `received` on this machine's clock."""

    host: str
    remote: float
    sent: float
    received: float

    @property
    def offset(self) -> float:
        """Best estimate of (host clock - this machine's clock), in seconds."""
        return self.remote - (self.sent + self.received) / 2

    @property
    def low(self) -> float:
        return self.remote - self.received

    @property
    def high(self) -> float:
        return self.remote - self.sent


def clock_samples(reports: list[HostReport], windows: dict[str, tuple[float, float]]) -> list[ClockSample]:
    """Pair each report's `time` with the (sent, received) window this machine saw its probe run in."""
    samples = []
    for report in reports:
        window = windows.get(report.host)
        if report.time is not None and window is not None:
            samples.append(ClockSample(report.host, report.time, window[0], window[1]))
    return samples


def _describe(offset: float) -> str:
    return f"{abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'}"


def clock_skew(samples: list[ClockSample], limit_s: float = CLOCK_SKEW_LIMIT_S) -> CheckResult:
    """Warn when a clock is certainly more than limit_s off this machine's, or off another host's.

    "Certainly": each offset is known only within its sample's window, so a
    slow round trip widens the interval and only what lies outside it counts.
    """
    name = "clock_skew"
    offsets = {s.host: {"offset_s": round(s.offset, 3), "uncertainty_s": round((s.received - s.sent) / 2, 3)}
               for s in samples}
    data = {"offsets": offsets, "limit_s": limit_s}
    if not samples:
        return CheckResult(name, SKIPPED, "No host reported its clock; nothing to compare.", data=data)
    findings: list[str] = []
    for s in samples:
        certain = s.low if s.low > 0 else -s.high if s.high < 0 else 0.0
        if certain > limit_s:
            findings.append(f"the clock of {s.host} is {_describe(s.offset)} this machine's "
                            f"(±{(s.received - s.sent) / 2:.1f} s)")
    apart = []
    for i, a in enumerate(samples):
        for b in samples[i + 1:]:
            gap = max(a.low - b.high, b.low - a.high)
            if gap > limit_s:
                apart.append((gap, a, b))
    if apart and not findings:  # each near this machine, yet far from each other
        gap, a, b = max(apart, key=lambda item: item[0])
        findings.append(f"the clocks of {a.host} and {b.host} are at least {gap:.1f} s apart")
    if not findings:
        spread = max(s.offset for s in samples) - min(s.offset for s in samples)
        return CheckResult(name, OK, f"Host clocks agree with this machine's within {limit_s:.0f} s (largest "
                                     f"offset {max(abs(s.offset) for s in samples):.1f} s, spread "
                                     f"{spread:.1f} s).", data=data)
    text = "; ".join(findings)
    return CheckResult(
        name, WARNING, text[0].upper() + text[1:] + f". Join-window deadlines are wall-clock times, so hosts "
                                                    f"more than {limit_s:.0f} s apart disagree about them.",
        hint="synchronise every host's clock with NTP (chrony or systemd-timesyncd; `timedatectl` shows "
             "whether it is synchronised)",
        data=data)


def consistency_checks(reports: list[HostReport], windows: dict[str, tuple[float, float]] | None = None,
                       *, clock_limit_s: float = CLOCK_SKEW_LIMIT_S) -> list[CheckResult]:
    """driver_match, gpu_models and clock_skew over the host reports."""
    return [driver_match(reports), gpu_models(reports),
            clock_skew(clock_samples(reports, windows or {}), clock_limit_s)]
