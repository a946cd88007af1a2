"""What a launcher run is made of: its hosts, their ranks, and the controller's rules.

`plan_launch()` decides the mode of a `cluster: true` command:

- **cluster**: the active configuration lists cluster workers (or opens a
  discovery window). Every worker is a host of the run; a worker whose address
  is this machine runs its ranks here without SSH, and `--gpus` replaces its
  `local_devices` (remote workers keep theirs).
- **single**: no cluster workers, but `--gpus` names two or more GPUs, or the
  command sets `local_devices:` (`cpu:N` or GPU ids). The run is a one-host
  cluster on this machine: controller on 127.0.0.1 (port 1337 unless the
  configuration's `cluster.controller.port` says otherwise), no SSH.
- otherwise None: the command runs once, as an ordinary process.

Pure planning: no processes, no network.
"""

from __future__ import annotations

import shlex
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fdl.config.parse import DEFAULT_PORT
from fdl.config.schema import ClusterSpec, CommandSpec, WorkerSpec
from fdl.errors import ConfigError, UsageError
from fdl.hostside.checks.devices import Devices
from fdl.hostside.envvars import FDL_PORT, read

if TYPE_CHECKING:
    from fdl.controller.policy import RunPolicy
    from fdl.gpus import GpuSelection

IsLocal = Callable[[str, int], bool]  # is_local(address, port): is this worker this machine?

CLUSTER, SINGLE = "cluster", "single"


@dataclass(frozen=True)
class LaunchHost:
    """One host the launcher itself runs ranks on."""

    name: str
    address: str
    devices: Devices  # concrete: GPU ids or cpu:N, never "all"
    local: bool  # this machine: ranks start here, no SSH
    worker: WorkerSpec | None = None  # None for a single-host run

    @property
    def arch(self) -> str | None:
        return self.worker.arch if self.worker is not None else None

    @property
    def env(self) -> dict[str, str]:
        return self.worker.env_dict if self.worker is not None else {}

    @property
    def data_path(self) -> str | None:
        return self.worker.data_path if self.worker is not None else None

    @property
    def python(self) -> str:
        return self.worker.python if self.worker is not None else "/usr/bin/python3"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher needs to know before it starts anything."""

    mode: str  # CLUSTER | SINGLE
    command: CommandSpec
    args: tuple[str, ...]  # the command's args, then the command line's
    hosts: tuple[LaunchHost, ...]
    root: Path
    run_id: str
    bind: str
    port: int
    controller_addr: str  # what ranks get as FDL_CONTROLLER
    cluster: ClusterSpec | None = None
    discovery: bool = False
    notes: tuple[str, ...] = field(default=())
    configured_addr: str | None = None  # the configured controller address (differs when the run moved)

    @property
    def remote(self) -> list[LaunchHost]:
        return [h for h in self.hosts if not h.local]

    @property
    def ranks(self) -> int:
        return sum(h.devices.ranks() for h in self.hosts)

    def policy(self) -> RunPolicy:
        """The controller's RunPolicy for this run."""
        from fdl.controller.policy import RosterHost, RunPolicy

        if self.mode == CLUSTER:
            assert self.cluster is not None
            # A roster run's cohort is this launch; a discovery window leaves the id to its walk-ins.
            return RunPolicy.from_cluster(self.cluster, run_id=None if self.discovery else self.run_id,
                                          launch_id=self.run_id, args=self.args)
        host = self.hosts[0]
        return RunPolicy(discovery=False, start="auto", roster=(RosterHost(host.name, host.devices, host.address),),
                         run_id=self.run_id, launch_id=self.run_id, args=self.args,
                         controller_addr=self.controller_addr,
                         master_port=self.port + 1 if self.port < 65535 else self.port - 1)

    def rank_argv(self, artifact: str | None) -> list[str]:
        """What every rank runs: the artifact with the args, or the command's shell line with them."""
        if self.command.bin is not None:
            assert artifact is not None
            return [artifact, *self.args]
        assert self.command.run is not None
        return ["/bin/sh", "-c", " ".join([self.command.run, *(shlex.quote(a) for a in self.args)])]


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def this_host_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def concrete_gpus(devices: Devices, what: str, count: int | None) -> Devices:
    """Devices with `all` replaced by this machine's GPU ids (a hello names what it offers)."""
    if devices.is_cpu or devices.ids is not None:
        return devices
    if not count:
        raise ConfigError(
            f"{what} offers all GPUs, but NVML sees none on this machine. Name the devices: GPU ids "
            f"(local_devices: [0, 1] or --gpus 0,1), or cpu:N for N CPU ranks.")
    return Devices(ids=tuple(range(count)))


def _gpu_count() -> int | None:
    from fdl.hostside.checks.nvml import device_count

    return device_count()


def port_free(host: str, port: int) -> bool:
    """Whether a listener could bind host:port right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # what the controller's server sets too
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P with P and P + 1 (the rendezvous port ranks use) both free now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port < 65535 and port_free(host, port + 1):
            return port
    raise UsageError("found no free pair of ports on this machine for the run's controller.")


def chosen_port(flag: int | None, environ: Mapping[str, str], configured: int) -> tuple[int, str]:
    """(port, where it came from): --port, else FDL_PORT, else the configuration (or 1337)."""
    if flag is not None:
        return flag, "--port"
    text = read(FDL_PORT, environ).strip()
    if text:
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise UsageError(f"{FDL_PORT}={text!r} is not a port number from 1 to 65535.",
                             hint=f"Set {FDL_PORT} to a free port, or unset it to use the configured one.")
        return int(text), FDL_PORT
    return configured, "config"


def plan_launch(spec: CommandSpec, args: list[str] | tuple[str, ...], cluster: ClusterSpec | None, root: Path,
                gpus: GpuSelection | None = None, *, is_local: IsLocal | None = None,
                gpu_count: Callable[[], int | None] = _gpu_count, run_id: str | None = None,
                port: int | None = None, environ: Mapping[str, str] | None = None,
                is_free: Callable[[str, int], bool] = port_free) -> LaunchPlan | None:
    """The plan of a `cluster: true` command, or None when it should run as one ordinary process.

    gpus: the --gpus selection (fdl.gpus.GpuSelection) or None. is_local(address, port) tells
    whether a worker is this machine (default: fdl.cluster.inventory.is_this_machine). port: --port;
    else FDL_PORT from environ; else cluster.controller.port (1337 by default). A single-host run
    whose port came from the configuration and is taken moves to a free one (noted in the plan).
    """
    import os

    if not spec.cluster:
        raise UsageError(f"'{spec.name}' is not a cluster command (cluster: true).")
    environ = os.environ if environ is None else environ
    all_args = (*spec.args, *args)
    run_id = run_id or new_run_id()
    configured = cluster.controller.port if cluster is not None else DEFAULT_PORT
    chosen, source = chosen_port(port, environ, configured)
    if cluster is not None and chosen != cluster.controller.port:
        cluster = cluster._replace(controller=cluster.controller._replace(port=chosen))
    if cluster is not None and (cluster.workers or cluster.controller.join.discovery):
        if is_local is None:
            from fdl.cluster.inventory import is_this_machine

            is_local = is_this_machine
        return _cluster_plan(spec, all_args, cluster, root, gpus, is_local, gpu_count, run_id)
    devices: Devices | None = None
    if gpus is not None:
        # --gpus replaces the command's local_devices; without them it promotes only from two GPUs up
        ids = gpus.ids
        if ids is None:
            count = gpu_count() or 0
            ids = tuple(range(count)) if count >= 2 or spec.local_devices is not None else None
            if ids == ():
                concrete_gpus(Devices(), "--gpus all", 0)  # raises: no GPU to offer
        if ids is not None and (len(ids) >= 2 or spec.local_devices is not None):
            devices = Devices(ids=ids)
    elif spec.local_devices is not None:
        devices = spec.local_devices
        if not devices.is_cpu:
            devices = concrete_gpus(devices, f"commands.{spec.name}.local_devices", gpu_count())
    if devices is None:
        return None
    port = chosen
    notes: list[str] = []
    if not is_free("127.0.0.1", port) or (port < 65535 and not is_free("127.0.0.1", port + 1)):
        if source != "config":
            raise UsageError(f"port {port} ({source}) on 127.0.0.1 is taken (or {port + 1}, the ranks' "
                             f"rendezvous port, is), so this run's controller cannot listen there.",
                             hint=f"Pick another with --port N or {FDL_PORT}=N, or stop what listens there.")
        moved = free_port_pair()
        which = "the default controller port" if port == DEFAULT_PORT else "the configured controller port"
        notes.append(f"127.0.0.1:{port} ({which}) is taken, so this run's controller "
                     f"listens on 127.0.0.1:{moved} instead; plain `fdl status` still finds it (--port or "
                     f"{FDL_PORT} picks one)")
        port = moved
    host = LaunchHost(name=this_host_name(), address="127.0.0.1", devices=devices, local=True)
    return LaunchPlan(mode=SINGLE, command=spec, args=all_args, hosts=(host,), root=root, run_id=run_id,
                      bind="127.0.0.1", port=port, controller_addr=f"127.0.0.1:{port}", cluster=cluster,
                      configured_addr=f"127.0.0.1:{configured}", notes=tuple(notes))


def _cluster_plan(spec: CommandSpec, args: tuple[str, ...], cluster: ClusterSpec, root: Path,
                  gpus: GpuSelection | None, is_local: IsLocal, gpu_count: Callable[[], int | None],
                  run_id: str) -> LaunchPlan:
    hosts = []
    notes = []
    local_seen = False
    for worker in cluster.workers:
        local = bool(is_local(worker.address, worker.port))
        devices = worker.local_devices
        what = f"cluster.workers[{worker.host}]"
        if local and gpus is not None:
            devices = Devices(ids=gpus.ids)
            what = "--gpus all"
            notes.append(f"--gpus {gpus} replaces local_devices of {worker.host} (this machine); remote "
                         f"workers keep theirs")
        if local:
            local_seen = True
            devices = concrete_gpus(devices, what, gpu_count() if devices.ids is None and not devices.is_cpu
                                    else None)
        elif not devices.is_cpu and devices.ids is None:
            raise ConfigError(
                f"{what}: local_devices is not set (or is 'all'), so the launcher cannot tell how many ranks "
                f"{worker.host} runs. List its GPU ids (local_devices: [0, 1]) or cpu:N for N CPU ranks.")
        hosts.append(LaunchHost(name=worker.host, address=worker.address, devices=devices, local=local,
                                worker=worker))
    if gpus is not None and not local_seen:
        notes.append("--gpus applies to this machine's own worker only, and none of cluster.workers is this "
                     "machine: every worker keeps its local_devices")
    ctl = cluster.controller
    return LaunchPlan(mode=CLUSTER, command=spec, args=args, hosts=tuple(hosts), root=root, run_id=run_id,
                      bind=ctl.bind, port=ctl.port, controller_addr=ctl.address, cluster=cluster,
                      discovery=ctl.join.discovery, notes=tuple(notes))
