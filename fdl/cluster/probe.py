"""`fdl @cluster probe`: every worker's probe report, plus the checks only a cluster can fail.

Every worker is probed by the `fdl_probe` role, all hosts in one run of the flodl.fdl.probe playbook (one
module call per host, all at once): a remote worker over SSH, the worker that is this machine through the
same role with a local connection (its inventory entry says `ansible_connection: local`). Hosts that cannot
be reached become reports with one `ssh` error naming the host and what SSH said.

With `--collective` the same run enters the role at its collective step: the probe also says what each host
offers the all-reduce smoke test, and the next task runs every host's ranks at once (fdl.hostside.collective);
their results come back as that task's result, and fdl.collective.run.combine turns them into the cluster's
`collective` check. One inventory, one playbook run, one report.

Cross-host checks, on top of each host's own:
- `nccl_match`: NCCL major.minor must be the same everywhere (NCCL refuses a
  handshake across a major.minor skew);
- `libtorch_match`: one libtorch (torch) version across the cluster;
- `data_match`: the shared data path present on some hosts but not others;
- `driver_match`, `gpu_models`, `clock_skew` (fdl.cluster.consistency): driver
  versions, GPU models and wall clocks compared, each host's clock reading
  bracketed by this machine's clock around its probe.

The report's JSON (`ClusterReport.to_dict()`) extends the local probe's
multi-host form: `schema_version`, `ok`, `hosts` (each a host report) and
`cluster` (the cross-host checks).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fdl.cluster.consistency import consistency_checks, host_groups
from fdl.cluster.inventory import InventoryHost, build_inventory
from fdl.errors import ConfigError
from fdl.hostside.checks.report import ERROR, OK, SCHEMA_VERSION, SKIPPED, WARNING, CheckResult, HostReport

if TYPE_CHECKING:
    from fdl.cluster.events import HostResult
    from fdl.collective.results import CollectiveResult
    from fdl.collective.run import CollectiveOptions
    from fdl.config.project import Config


@dataclass(frozen=True)
class ClusterProbeOptions:
    """Flags that pass through to every host; None means "each host's own setting"."""

    data_path: str | None = None
    skip_mount: bool = False
    libtorch_path: str | None = None
    docker: str | None = None
    local_gpus: list[int] | None = None  # --gpus: overrides local_devices for this machine's own worker only


@dataclass
class ClusterReport:
    """Per-host reports in roster order, and the cross-host checks (with --collective, the smoke test's
    result beside them, for its table)."""

    hosts: list[HostReport] = field(default_factory=list)
    cluster: list[CheckResult] = field(default_factory=list)
    collective: CollectiveResult | None = None

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts) and not any(c.status == ERROR for c in self.cluster)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"schema_version": SCHEMA_VERSION, "ok": self.ok, "hosts": [h.to_dict() for h in self.hosts],
                "cluster": [asdict(c) for c in self.cluster]}


# --------------------------------------------------------------------------- what fdl tells the role


def is_local(host: InventoryHost) -> bool:
    """The worker that is this machine: reached through the local connection, not ssh."""
    return host.vars.get("ansible_connection") == "local"


def probe_extravars(options: ClusterProbeOptions, collective: CollectiveOptions | None = None,
                    master_port: int | None = None) -> dict[str, Any]:
    """The role's variables that apply to every host: the flags given, the entry point, the smoke test's."""
    extravars: dict[str, Any] = {"fdl_probe_skip_mount": options.skip_mount, "fdl_probe_verdict": False}
    if options.data_path is not None:
        extravars["fdl_probe_data_path"] = options.data_path
    if options.libtorch_path is not None:
        extravars["fdl_probe_libtorch_path"] = options.libtorch_path
    if options.docker is not None:
        extravars["fdl_probe_docker"] = options.docker
    if collective is not None:
        extravars.update(fdl_probe_collective=True, fdl_probe_collective_timeout_s=collective.time_limit_s,
                         fdl_probe_collective_max_bytes=collective.max_bytes)
        if master_port is not None:
            extravars["fdl_probe_collective_port"] = master_port
    return extravars


def local_host_vars(options: ClusterProbeOptions, root: str | None) -> dict[str, Any]:
    """The role's variables for this machine's own worker only: --gpus, and the project (its libtorch/)."""
    hostvars: dict[str, Any] = {}
    if options.local_gpus is not None:
        hostvars["fdl_probe_gpus"] = ",".join(map(str, options.local_gpus))
    if root is not None:
        hostvars["fdl_probe_project_root"] = root
    return hostvars


# --------------------------------------------------------------------------- probing


def probe_cluster(config: Config, options: ClusterProbeOptions, *, collective: CollectiveOptions | None = None,
                  progress: bool | None = None) -> ClusterReport:
    """Probe every worker of config.cluster (and, with `collective`, run the all-reduce smoke test across
    them) in one playbook run; add the cross-host checks."""
    from fdl.cluster.events import FAILED, UNREACHABLE
    from fdl.cluster.events import OK as HOST_OK
    from fdl.cluster.runner import run_playbook

    if config.cluster is None or not config.cluster.workers:
        env = config.env.name or "(base)"
        raise ConfigError(
            f"env {env} lists no cluster workers, so there is nothing to probe across hosts. List them under "
            f"cluster.workers in {'fdl.' + config.env.name + '.yml' if config.env.name else 'fdl.yml'}, or run "
            f"`fdl probe` without an env to probe this machine only.")
    inventory = build_inventory(config.cluster, config.root)
    workers = inventory.workers
    for host in workers:
        if is_local(host):
            host.vars.update(local_host_vars(options, str(config.root) if config.root is not None else None))
    extravars = probe_extravars(options, collective, config.cluster.controller.rendezvous_port)
    sent = time.time()
    wall_minus_monotonic = sent - time.monotonic()  # the runner stamps hosts with time.monotonic()
    result = run_playbook("probe.yml", inventory, extravars=extravars, limit=[h.name for h in workers],
                          progress=progress, title="probe")
    reports: dict[str, HostReport] = {}
    windows: dict[str, tuple[float, float]] = {}  # this machine's clock around each host's probe
    offers: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    for host in workers:
        outcome = result.hosts[host.name]
        probed, returned = _returned(outcome, "report")
        if outcome.status in (HOST_OK, FAILED) and isinstance(probed.get("report"), dict):
            report = HostReport.from_dict(probed["report"])
            report.host = host.name
            reports[host.name] = report
            # the host read its clock after the run started and before its result came back
            windows[host.name] = (sent, returned + wall_minus_monotonic)
            if isinstance(probed.get("offer"), dict):
                offers[host.name] = probed["offer"]
            ran, _ = _returned(outcome, "events")
            outcomes[host.name] = ran or {"msg": outcome.message}
        elif outcome.status == UNREACHABLE:
            reports[host.name] = HostReport(host=host.name, checks=[unreachable_check(host, outcome.message)])
        else:
            reports[host.name] = HostReport(host=host.name, checks=[CheckResult(
                "probe", ERROR, f"The probe could not run on {host.name}: {outcome.message or 'no result'}.",
                hint=_module_hint(outcome.message), data={"status": outcome.status})])
    ordered = [reports[h.name] for h in workers]
    cluster = ClusterReport(hosts=ordered, cluster=cross_host_checks(ordered) + consistency_checks(ordered, windows))
    if collective is not None:
        from fdl.collective.results import to_check
        from fdl.collective.run import combine

        cluster.collective = combine(offers, outcomes, hosts=[h.name for h in workers],
                                     time_limit_s=collective.time_limit_s)
        cluster.cluster.append(to_check(cluster.collective))
    return cluster


def _returned(outcome: HostResult, key: str) -> tuple[dict[str, Any], float]:
    """The module return of the host's task that carries `key` (the probe's "report", the smoke test's "events"),
    and when it arrived (time.monotonic()); ({}, now) when no task returned it."""
    for task in outcome.tasks:
        if task.res is not None and key in task.res:
            return task.res, task.finished if task.finished is not None else time.monotonic()
    return {}, time.monotonic()


def _login(host: InventoryHost) -> str:
    v = host.vars
    user = f"{v['ansible_user']}@" if v.get("ansible_user") else ""
    port = f":{v['ansible_port']}" if v.get("ansible_port", 22) != 22 else ""
    return f"{user}{v.get('ansible_host', host.name)}{port}"


def unreachable_check(host: InventoryHost, message: str | None) -> CheckResult:
    """An `ssh` error naming the host and SSH's own reason, with the fix that reason points to."""
    reason = _ssh_reason(message or "unreachable")
    lowered = reason.lower()
    if host.via is not None and lowered.startswith(f"unreachable through {host.via.name}:"):
        # its execution node failed (fdl.cluster.nodes says how); the host itself was never asked
        return CheckResult("ssh", ERROR, f"{host.name} ({_login(host)}) is {reason}", data={"reason": reason,
                           "via": host.via.name},
                           hint=f"check execution node {host.via.name} ({_login(host.via)}): it must answer ssh "
                                f"from here and hold the ansible-runner of the flodl.fdl.execution_node playbook")
    if "permission denied" in lowered:
        what, hint = "SSH authentication failed", (
            f"check that the identity for {host.name} "
            f"({host.vars.get('ansible_ssh_private_key_file') or 'ssh default'}) "
            f"is in ~{host.vars.get('ansible_user', '')}/.ssh/authorized_keys there, and the user name")
    elif "host key verification failed" in lowered or "remote host identification has changed" in lowered:
        what, hint = "SSH refused the host key", (
            f"the host key of {host.vars.get('ansible_host')} is not the one in ~/.ssh/known_hosts; if the host "
            f"was reinstalled, remove the old key with ssh-keygen -R {host.vars.get('ansible_host')}")
    elif "timed out" in lowered or "no route" in lowered or "unreachable" in lowered:
        what, hint = "the host does not answer", "check that it is up and that its address and port are right"
    elif "refused" in lowered:
        what, hint = "nothing accepts SSH connections there", "start sshd on the host, or fix the port"
    elif "stopped answering" in lowered or "broken pipe" in lowered or "closed" in lowered or "reset" in lowered:
        what, hint = "the SSH connection was lost", "check the host's network link, then rerun"
    else:
        what, hint = "SSH failed", "try `ssh` to the host by hand with the same user and key"
    return CheckResult("ssh", ERROR, f"{host.name} ({_login(host)}) is unreachable: {what}: {reason}",
                       hint=hint, data={"reason": reason})


_LOST_RE = re.compile(r"Data could not be sent to remote host \"[^\"]*\"\. Make sure this host can be reached over "
                      r"ssh:?\s*$")


def _ssh_reason(message: str) -> str:
    """SSH's own reason out of Ansible's unreachable message."""
    text = message.strip()
    if text.startswith("Task failed:"):
        text = text[len("Task failed:"):].strip()
    if _LOST_RE.match(text):  # the master connection died and ssh said nothing more
        return "the host stopped answering while the task ran"
    text = text.replace("Failed to connect to the host via ssh:", "").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Warning:")]
    return (lines[-1] if lines else message.strip()).rstrip(".")


def _module_hint(message: str | None) -> str:
    text = (message or "").lower()
    if "interpreter" in text or "not found" in text or "no such file" in text:
        return "set the worker's python: in fdl.cluster.yml to a Python 3.8+ that exists on the host"
    return "rerun with --debug; the Ansible artifacts of the run are kept under ~/.cache/fdl/runner"


# --------------------------------------------------------------------------- cross-host checks


def _major_minor(version: str | None) -> str | None:
    if not version:
        return None
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


def cross_host_checks(reports: list[HostReport]) -> list[CheckResult]:
    """The checks that compare hosts: NCCL major.minor, libtorch version, shared data presence."""
    return [_nccl_match(reports), _libtorch_match(reports), _data_match(reports)]


def _nccl_match(reports: list[HostReport]) -> CheckResult:
    name = "nccl_match"
    versions: dict[str, str] = {}
    full: dict[str, str] = {}
    cpu_hosts = [r.host for r in reports if r.cpu_host]
    if cpu_hosts:  # the world's backend is gloo as soon as one host offers CPU ranks (fdl.controller.world)
        who = "every host runs" if len(cpu_hosts) == len(reports) else \
            f"{', '.join(cpu_hosts)} {'runs' if len(cpu_hosts) == 1 else 'run'}"
        return CheckResult(name, SKIPPED, f"Not compared: {who} CPU ranks, so the world trains over gloo and "
                                          f"NCCL is not used.", data={"versions": {}, "cpu_hosts": cpu_hosts})
    for report in reports:
        check = report.check("nccl")
        if check is None or check.status == SKIPPED or check.data.get("docker"):
            continue
        mm = _major_minor(check.data.get("version"))
        if mm is not None:
            versions[report.host] = mm
            full[report.host] = check.data["version"]
    if len(versions) < 2:
        return CheckResult(name, SKIPPED, "Fewer than two hosts report an NCCL version; nothing to compare.",
                           data={"versions": full})
    if len(set(versions.values())) == 1:
        return CheckResult(name, OK, f"Every host has NCCL {next(iter(versions.values()))}.x "
                                     f"({host_groups(full)}).", data={"versions": full})
    newest = max(set(versions.values()), key=lambda v: tuple(int(p) for p in v.split(".")))
    behind = sorted(h for h, v in versions.items() if v != newest)
    target = max((v for h, v in full.items() if versions[h] == newest),
                 key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    return CheckResult(
        name, ERROR, f"NCCL versions differ across hosts ({host_groups(full)}); NCCL refuses to connect ranks whose "
                     f"major.minor differ.",
        hint=f"on {', '.join(behind)}, build NCCL {target} with `fdl nccl build --tag v{target}` and preload it "
             f"through the worker's env: in fdl.cluster.yml (LD_PRELOAD: <path>/lib/libnccl.so.2)",
        data={"versions": full, "behind": behind, "target": target})


def _libtorch_match(reports: list[HostReport]) -> CheckResult:
    name = "libtorch_match"
    versions: dict[str, str] = {}
    for report in reports:
        check = report.check("libtorch")
        if check is not None and check.data.get("version"):
            versions[report.host] = str(check.data["version"]).split("+")[0]
    if len(versions) < 2:
        return CheckResult(name, SKIPPED, "Fewer than two hosts report a libtorch version; nothing to compare.",
                           data={"versions": versions})
    if len(set(versions.values())) == 1:
        return CheckResult(name, OK, f"Every host has libtorch {next(iter(versions.values()))}.",
                           data={"versions": versions})
    return CheckResult(
        name, ERROR, f"libtorch versions differ across hosts ({host_groups(versions)}); ranks built against different "
                     f"libtorch releases do not train together reliably.",
        hint="install the same libtorch release on every host (the variant may differ per GPU: cu128, sm61 "
             "builds), and point each worker's arch: at it",
        data={"versions": versions})


def _data_match(reports: list[HostReport]) -> CheckResult:
    name = "data_match"
    present: list[str] = []
    missing: list[str] = []
    paths: dict[str, str] = {}
    for report in reports:
        check = report.check("data")
        if check is None or check.status == SKIPPED:
            continue
        paths[report.host] = check.data.get("path", "")
        (present if check.status in (OK, WARNING) else missing).append(report.host)
    data = {"present": present, "missing": missing, "paths": paths}
    if not present and not missing:
        return CheckResult(name, SKIPPED, "The shared data path was not checked on any host.", data=data)
    if present and missing:
        where = ", ".join(f"{h} ({paths[h]})" for h in missing)
        return CheckResult(
            name, ERROR, f"The shared data path is available on {', '.join(present)} but not on {where}; every "
                         f"rank reads the same dataset.",
            hint="mount the shared storage on those hosts (or fix their data_path: in fdl.cluster.yml)", data=data)
    if missing:
        return CheckResult(name, SKIPPED, "Not compared: no host has the shared data path (each host's data "
                                          "check says why).", data=data)
    return CheckResult(name, OK, f"The shared data path is available on all {len(present)} hosts checked.",
                       data=data)
