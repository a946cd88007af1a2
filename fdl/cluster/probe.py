"""`fdl @cluster probe`: every worker's probe report, plus the checks only a cluster can fail.

Remote workers are probed by the `fdl_probe` role over Ansible (one module
call per host, all hosts at once). A worker that is this machine (its
address is one of this machine's own) is probed natively, without SSH, in a
child process that gets the worker's `env:` exactly as a remote task would.
Hosts that cannot be reached become reports with one `ssh` error naming the
host and what SSH said.

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

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fdl.cluster.consistency import consistency_checks, host_groups
from fdl.cluster.inventory import ClusterInventory, InventoryHost, build_inventory
from fdl.config.schema import WorkerSpec
from fdl.errors import ConfigError
from fdl.hostside.checks.report import ERROR, OK, SCHEMA_VERSION, SKIPPED, WARNING, CheckResult, HostReport
from fdl.hostside.paths import DEFAULT_DATA_PATH

if TYPE_CHECKING:
    from fdl.config.project import Config

NATIVE_TIMEOUT_S = 120.0


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
    """Per-host reports in roster order, and the cross-host checks."""

    hosts: list[HostReport] = field(default_factory=list)
    cluster: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts) and not any(c.status == ERROR for c in self.cluster)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"schema_version": SCHEMA_VERSION, "ok": self.ok, "hosts": [h.to_dict() for h in self.hosts],
                "cluster": [asdict(c) for c in self.cluster]}


# --------------------------------------------------------------------------- where each host runs


def host_options(worker: WorkerSpec, options: ClusterProbeOptions, *, local: bool) -> dict[str, Any]:
    """The ProbeOptions fields for one worker: flags win, then the worker's own settings.

    The worker's `local_devices` is its declaration (a declared GPU that is
    missing is the gpu_count error; the declared ids also select the GPUs the
    checks judge); --gpus selects on this machine's own worker only.
    """
    devices = worker.local_devices
    declared: list[int] | str | None = None
    if devices.is_cpu:
        declared = f"cpu:{devices.count}"
    elif devices.ids is not None:
        declared = list(devices.ids)
    gpus = list(options.local_gpus) if local and options.local_gpus is not None else None
    return {"data_path": options.data_path or worker.data_path or DEFAULT_DATA_PATH,
            "skip_mount": options.skip_mount, "libtorch_path": options.libtorch_path,
            "docker": options.docker, "gpus": gpus, "local_devices": declared}


# --------------------------------------------------------------------------- probing


def probe_cluster(config: Config, options: ClusterProbeOptions, *, progress: bool | None = None) -> ClusterReport:
    """Probe every worker of config.cluster and run the cross-host checks."""
    if config.cluster is None or not config.cluster.workers:
        env = config.env.name or "(base)"
        raise ConfigError(
            f"env {env} lists no cluster workers, so there is nothing to probe across hosts. List them under "
            f"cluster.workers in {'fdl.' + config.env.name + '.yml' if config.env.name else 'fdl.yml'}, or run "
            f"`fdl probe` without an env to probe this machine only.")
    inventory = build_inventory(config.cluster, config.root)
    workers = inventory.workers
    local = [h for h in workers if h.vars.get("ansible_connection") == "local"]  # this machine: no ssh
    remote = [h for h in workers if h not in local]
    reports: dict[str, HostReport] = {}

    windows: dict[str, tuple[float, float]] = {}  # this machine's clock around each host's probe
    native_threads = []
    for host in local:
        thread = threading.Thread(target=_probe_native, args=(host, options, config.root, reports, windows),
                                  daemon=True)
        thread.start()
        native_threads.append(thread)
    if remote:
        reports.update(_probe_remote(inventory, remote, options, progress, windows))
    for thread in native_threads:
        thread.join()
    ordered = [reports[h.name] for h in workers]
    return ClusterReport(hosts=ordered, cluster=cross_host_checks(ordered) + consistency_checks(ordered, windows))


def _spec(host: InventoryHost) -> WorkerSpec:
    """The worker entry a worker host of the inventory was built from (always set for them)."""
    if host.worker is None:
        raise ValueError(f"{host.name} is not a worker of the cluster")
    return host.worker


def _probe_native(host: InventoryHost, options: ClusterProbeOptions, root: Path | None,
                  out: dict[str, HostReport], windows: dict[str, tuple[float, float]]) -> None:
    """Probe this machine's own worker in a child process with the worker's env: applied, like a remote task."""
    fields = host_options(_spec(host), options, local=True)
    fields["project_root"] = str(root) if root is not None else None
    env = dict(os.environ)
    env.update(_spec(host).env_dict)
    try:
        sent = time.time()
        done = subprocess.run([sys.executable, "-m", "fdl.cluster.native_probe", host.name],
                              input=json.dumps(fields), capture_output=True, text=True, env=env,
                              timeout=NATIVE_TIMEOUT_S)
        windows[host.name] = (sent, time.time())
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                               f"exit code {done.returncode}")
        out[host.name] = HostReport.from_dict(json.loads(done.stdout))
    except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired) as exc:
        out[host.name] = HostReport(host=host.name, checks=[CheckResult(
            "probe", ERROR, f"The probe of this machine ({host.name}) could not run: {exc}.",
            hint="rerun with --debug; `fdl probe` without an env probes this machine directly")])


def _probe_remote(inventory: ClusterInventory, hosts: list[InventoryHost], options: ClusterProbeOptions,
                  progress: bool | None, windows: dict[str, tuple[float, float]]) -> dict[str, HostReport]:
    from fdl.cluster.events import FAILED, UNREACHABLE
    from fdl.cluster.events import OK as HOST_OK
    from fdl.cluster.runner import run_playbook

    # fdl checked every value it sends: the role's argument validation (a task per host) is left out
    extravars: dict[str, Any] = {"fdl_probe_skip_mount": options.skip_mount, "fdl_probe_validate": False,
                                 "fdl_probe_verdict": False}
    if options.data_path is not None:
        extravars["fdl_probe_data_path"] = options.data_path
    if options.libtorch_path is not None:
        extravars["fdl_probe_libtorch_path"] = options.libtorch_path
    if options.docker is not None:
        extravars["fdl_probe_docker"] = options.docker
    sent = time.time()
    wall_minus_monotonic = sent - time.monotonic()  # the runner stamps hosts with time.monotonic()
    result = run_playbook("probe.yml", inventory, extravars=extravars, limit=[h.name for h in hosts],
                          progress=progress, title="probe")
    reports = {}
    for host in hosts:
        outcome = result.hosts[host.name]
        res = outcome.res or {}
        if outcome.status in (HOST_OK, FAILED) and isinstance(res.get("report"), dict):
            report = HostReport.from_dict(res["report"])
            report.host = host.name
            reports[host.name] = report
            # the host read its clock after the run started and before its result came back
            received = outcome.finished + wall_minus_monotonic if outcome.finished is not None else time.time()
            windows[host.name] = (sent, received)
        elif outcome.status == UNREACHABLE:
            reports[host.name] = HostReport(host=host.name, checks=[unreachable_check(host, outcome.message)])
        else:
            reports[host.name] = HostReport(host=host.name, checks=[CheckResult(
                "probe", ERROR, f"The probe could not run on {host.name}: {outcome.message or 'no result'}.",
                hint=_module_hint(outcome.message), data={"status": outcome.status})])
    return reports


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
