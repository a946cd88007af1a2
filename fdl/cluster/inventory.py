"""The cluster as an Ansible inventory: one builder for fdl and for the `flodl.fdl.cluster` plugin.

`build_inventory()` turns a validated `ClusterSpec` into hosts, groups and
host variables. fdl's runner writes it out as a JSON inventory; the
`flodl.fdl.cluster` inventory plugin (inventory_plugins/cluster.py) feeds the
same structure to Ansible directly, so `ansible-playbook -i hosts.fdl.yml` and
`fdl @cluster ...` see identical hosts, and treat a worker that is this
machine alike: reached without ssh (`ansible_connection: local`).

Groups: `fdl_workers` (every worker), `fdl_controller` (the worker that is
the controller host, or a separate entry for it) and one `arch_<variant>` per
libtorch variant (`precompiled/cu128` -> `arch_precompiled_cu128`).

Execution nodes (`cluster.execution_nodes`) are hosts of the group
`fdl_execution_nodes`, never workers. A worker (or node) that names `via: NODE`
is in the group `fdl_via_<NODE>` and carries `fdl_via: NODE`; its connection
variables are the ones Ansible uses *on that node*, where its playbooks run
(fdl.cluster.nodes): its `identity:` is a path on the node, and without one the
node's own ssh setup applies. How this machine's own ssh reaches it end to end
(the rank session, through ProxyJump) is kept apart, in `InventoryHost.session`.

Standard library and fdl.config only, imported relatively: no Ansible import, and the flodl.fdl collection
carries this module for its inventory plugin (fdl/collection.py).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.schema import ClusterSpec, ExecutionNodeSpec, SshDefaults, WorkerSpec
from ..hostside.paths import DEFAULT_DATA_PATH, home

if TYPE_CHECKING:
    from ..config.project import Config

WORKERS_GROUP = "fdl_workers"
CONTROLLER_GROUP = "fdl_controller"
NODES_GROUP = "fdl_execution_nodes"
ARCH_GROUP_PREFIX = "arch_"
VIA_GROUP_PREFIX = "fdl_via_"
VIA_VAR = "fdl_via"  # host variable: the execution node whose Ansible drives this host
DEFAULT_PYTHON = "/usr/bin/python3"


def arch_group(arch: str) -> str:
    """The Ansible group of a libtorch variant: letters, digits and '_' only."""
    return ARCH_GROUP_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", arch)


def via_group(node: str) -> str:
    """The Ansible group of the hosts an execution node drives: letters, digits and '_' only."""
    return VIA_GROUP_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", node)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def is_this_machine(address: str, port: int = 22) -> bool:
    """True when address is one of this machine's own addresses (so reaching it needs no SSH).

    A loopback address with a non-default port is taken for an SSH tunnel to
    somewhere else. Names other than localhost and this machine's hostname are
    not resolved (a slow resolver must not stall the probe): they count as remote.
    """
    if is_loopback(address):
        return port == 22
    if address == socket.gethostname():
        return True
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((str(ip), 0))  # only an address this machine holds can be bound
        except OSError:
            return False
    return True


@dataclass
class InventoryHost:
    """One inventory host: its name, variables, groups, and the worker entry it came from."""

    name: str
    vars: dict[str, Any]
    groups: list[str] = field(default_factory=list)
    worker: WorkerSpec | None = None
    # The execution node whose Ansible drives this host (vars are then as that node uses them), and how this
    # machine's own ssh authenticates to the host end to end through it (identity, known hosts: paths here).
    via: InventoryHost | None = field(default=None, repr=False)
    session: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClusterInventory:
    """Hosts (in roster order), group members, and variables for every host."""

    hosts: dict[str, InventoryHost] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    all_vars: dict[str, Any] = field(default_factory=dict)

    @property
    def workers(self) -> list[InventoryHost]:
        return [self.hosts[name] for name in self.groups.get(WORKERS_GROUP, [])]

    def subset(self, names: list[str]) -> ClusterInventory:
        """The same inventory restricted to `names` (unknown names raise KeyError)."""
        for name in names:
            if name not in self.hosts:
                raise KeyError(name)
        keep = [n for n in self.hosts if n in names]
        return ClusterInventory(
            hosts={n: self.hosts[n] for n in keep},
            groups={g: [n for n in members if n in keep] for g, members in self.groups.items()},
            all_vars=dict(self.all_vars),
        )

    def to_ansible(self) -> dict[str, Any]:
        """The inventory in Ansible's JSON/YAML inventory format."""
        children = {g: {"hosts": {n: None for n in members}} for g, members in self.groups.items() if members}
        return {"all": {"vars": dict(self.all_vars),
                        "hosts": {n: dict(h.vars) for n, h in self.hosts.items()},
                        "children": children}}


def _project_path(identity: str | None, root: Path | None) -> str | None:
    """An identity file as an absolute path: ~ expanded, relative paths taken from the project root."""
    if identity is None:
        return None
    path = Path(identity).expanduser()
    if not path.is_absolute() and root is not None:
        path = root / path
    return str(path)


def _ssh_args(ssh: SshDefaults | None, root: Path | None) -> dict[str, Any]:
    known_hosts = _project_path(ssh.known_hosts if ssh is not None else None, root)
    if known_hosts is None:
        return {}
    return {"ansible_ssh_common_args": f"-o UserKnownHostsFile={shlex.quote(known_hosts)}"}


def worker_vars(worker: WorkerSpec, root: Path | None, ssh: SshDefaults | None = None, *,
                local: bool = False) -> dict[str, Any]:
    """The host variables of one worker (the contract playbooks and roles rely on); `local`: the worker is this
    machine, reached without ssh (`ansible_connection: local`), as fdl probes and runs it."""
    hostvars: dict[str, Any] = {
        "ansible_host": worker.address,
        "ansible_port": worker.port,
        "ansible_python_interpreter": worker.python or DEFAULT_PYTHON,
        "fdl_arch": worker.arch,
        "fdl_local_devices": str(worker.local_devices),
        "fdl_env": worker.env_dict,
        "fdl_data_path": worker.data_path or DEFAULT_DATA_PATH,
    }
    if worker.user is not None:
        hostvars["ansible_user"] = worker.user
    identity = _project_path(worker.identity, root)
    if identity is not None:
        hostvars["ansible_ssh_private_key_file"] = identity
    if worker.via is not None:  # reached from the node: a path there, and the node's own known_hosts
        if worker.identity is not None:
            hostvars["ansible_ssh_private_key_file"] = worker.identity
        hostvars[VIA_VAR] = worker.via
        return hostvars
    hostvars.update(_ssh_args(ssh, root))
    if local:
        hostvars.update(local_vars(hostvars["ansible_python_interpreter"]))
    return hostvars


def session_vars(ssh: SshDefaults | None, root: Path | None) -> dict[str, Any]:
    """How this machine's own ssh authenticates to a host behind an execution node, end to end through ProxyJump:
    cluster.ssh's identity and known_hosts (paths on this machine), or ssh's own defaults."""
    out: dict[str, Any] = {}
    identity = _project_path(ssh.identity if ssh is not None else None, root)
    if identity is not None:
        out["ansible_ssh_private_key_file"] = identity
    out.update(_ssh_args(ssh, root))
    return out


def node_vars(node: ExecutionNodeSpec, root: Path | None, ssh: SshDefaults | None = None) -> dict[str, Any]:
    """The host variables of an execution node: how Ansible and fdl's ssh reach it (from this machine, or from the
    node named in its via:), and the interpreter that runs modules there."""
    hostvars: dict[str, Any] = {"ansible_host": node.address, "ansible_port": node.port,
                                "ansible_python_interpreter": node.python}
    if node.user is not None:
        hostvars["ansible_user"] = node.user
    if node.via is not None:
        if node.identity is not None:
            hostvars["ansible_ssh_private_key_file"] = node.identity
        hostvars[VIA_VAR] = node.via
        return hostvars
    identity = _project_path(node.identity, root)
    if identity is not None:
        hostvars["ansible_ssh_private_key_file"] = identity
    hostvars.update(_ssh_args(ssh, root))
    return hostvars


def local_vars(python: str = DEFAULT_PYTHON) -> dict[str, Any]:
    """The host variables of this machine reached without ssh (connection: local).

    `ansible_async_dir` is spelled out: ansible-core's async_status finds a job under the account's home as
    the password database has it (`~user`), while the job itself writes under $HOME, so an async task (the
    NCCL image build) reported "could not find job" whenever $HOME was set elsewhere. This machine's $HOME
    is known here, so both sides get the same absolute directory."""
    return {"ansible_connection": "local", "ansible_python_interpreter": python,
            "ansible_async_dir": os.path.join(home(), ".ansible_async")}


def local_inventory(name: str = "localhost", python: str | None = None) -> ClusterInventory:
    """This machine alone, as host `name` with connection: local and fdl's own interpreter by default.

    For playbooks fdl runs here rather than on the cluster (`fdl nccl build` without --host);
    `run_playbook` treats it like any other inventory.
    """
    host = InventoryHost(name=name, vars=local_vars(python or sys.executable))
    return ClusterInventory(hosts={name: host})


def build_inventory(cluster: ClusterSpec, root: Path | None = None,
                    is_local: Callable[[str, int], bool] = is_this_machine) -> ClusterInventory:
    """Hosts, groups and variables for a cluster; `root` anchors relative identity paths. A worker for which
    is_local(address, port) holds gets the local connection."""
    inv = ClusterInventory()
    inv.groups[WORKERS_GROUP] = []
    inv.groups[CONTROLLER_GROUP] = []
    controller = cluster.controller
    inv.all_vars = {"fdl_controller_host": controller.host, "fdl_controller_port": controller.port}
    nodes = _nodes(cluster, root)
    for worker in cluster.workers:
        local = worker.via is None and is_local(worker.address, worker.port)
        host = InventoryHost(name=worker.host, worker=worker, vars=worker_vars(worker, root, cluster.ssh, local=local))
        if worker.via is not None:
            host.via = nodes[worker.via]
            host.session = session_vars(cluster.ssh, root)
            host.groups.append(via_group(worker.via))
            inv.groups.setdefault(via_group(worker.via), []).append(worker.host)
        host.groups.append(WORKERS_GROUP)
        inv.groups[WORKERS_GROUP].append(worker.host)
        if controller.host in (worker.host, worker.address):
            host.groups.append(CONTROLLER_GROUP)
            inv.groups[CONTROLLER_GROUP].append(worker.host)
        if worker.arch:
            group = arch_group(worker.arch)
            host.groups.append(group)
            inv.groups.setdefault(group, []).append(worker.host)
        inv.hosts[worker.host] = host
    for name, node in nodes.items():  # after the workers: the roster order stays the inventory's order
        inv.hosts[name] = node
        inv.groups.setdefault(NODES_GROUP, []).append(name)
        if node.via is not None:
            inv.groups.setdefault(via_group(node.via.name), []).append(name)
    if not inv.groups[CONTROLLER_GROUP] and controller.host not in inv.hosts:
        # The controller runs no ranks here: it is still a host playbooks can target (fdl_controller).
        hostvars: dict[str, Any] = {"ansible_host": controller.host, "ansible_python_interpreter": DEFAULT_PYTHON}
        if is_loopback(controller.host):
            hostvars.update(local_vars())
        else:
            hostvars["ansible_port"] = cluster.ssh.port
            if cluster.ssh.user is not None:
                hostvars["ansible_user"] = cluster.ssh.user
            identity = _project_path(cluster.ssh.identity, root)
            if identity is not None:
                hostvars["ansible_ssh_private_key_file"] = identity
            hostvars.update(_ssh_args(cluster.ssh, root))
        inv.hosts[controller.host] = InventoryHost(name=controller.host, vars=hostvars, groups=[CONTROLLER_GROUP])
        inv.groups[CONTROLLER_GROUP].append(controller.host)
    return inv


def _nodes(cluster: ClusterSpec, root: Path | None) -> dict[str, InventoryHost]:
    """The execution nodes as hosts of fdl_execution_nodes, each linked to the node of its via: (the schema checked
    their names and via: chains)."""
    nodes = {node.host: InventoryHost(name=node.host, vars=node_vars(node, root, cluster.ssh), groups=[NODES_GROUP])
             for node in cluster.execution_nodes}
    for node in cluster.execution_nodes:
        if node.via is not None:
            nodes[node.host].via = nodes[node.via]
            nodes[node.host].session = session_vars(cluster.ssh, root)
            nodes[node.host].groups.append(via_group(node.via))
    return nodes


_FILE_RE = re.compile(r"^fdl(?:\.(?P<env>[A-Za-z0-9][A-Za-z0-9_-]{0,63}))?\.(?:yml|yaml|json)$")


def env_of_file(path: Path) -> tuple[bool, str | None]:
    """(is an fdl config file name, its env): fdl.yml -> (True, None), fdl.cluster.yml -> (True, 'cluster')."""
    match = _FILE_RE.match(path.name)
    if not match:
        return False, None
    return True, match.group("env")


def inventory_from_file(path: Path, env: str | None = None,
                        project_dir: Path | None = None) -> tuple[ClusterInventory, Config]:
    """Load the configuration a cluster file belongs to and build its inventory.

    `path` is an fdl config file (fdl.yml or fdl.<env>.yml); its env is taken
    from the name unless given. Returns (inventory, config); the inventory is
    empty when the merged configuration has no cluster: block. Raises ConfigError.
    """
    from ..config.discover import find_base
    from ..config.project import EnvSelection, load_config
    from ..config.source import display_path
    from ..errors import ConfigError

    path = Path(path).resolve()
    if env is None:
        env = env_of_file(path)[1]
    directory = (project_dir or path.parent).resolve()
    if project_dir is None and env is not None:
        base = find_base(directory)
        if base is not None and base.parent != directory:
            raise ConfigError(
                f"{display_path(path)} is an env overlay, but the project's base file is {display_path(base)}, in "
                f"another directory. An overlay must sit next to its base fdl.yml; move it there (or add an "
                f"fdl.yml beside it)."
            )
    config = load_config(directory, EnvSelection(env, "inventory file") if env else EnvSelection())
    if config.cluster is None:
        return ClusterInventory(), config
    return build_inventory(config.cluster, config.root), config
