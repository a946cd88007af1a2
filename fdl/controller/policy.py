"""What one run's join window admits and when it forms: the controller's input.

`RunPolicy` is built from the cluster block (`RunPolicy.from_cluster`) or
directly by a caller (the launcher, tests, the benchmark). It is plain data;
the state machine in `fdl.controller.machine` interprets it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from fdl.config.parse import DEFAULT_PORT
from fdl.config.schema import MAX_WORKERS, START_MODES, ClusterSpec
from fdl.errors import ConfigError
from fdl.hostside.checks.devices import Devices
from fdl.hostside.paths import DEFAULT_DATA_PATH

#: Hard bounds, whatever a policy asks for: the roster and the world stay finite.
MAX_HOSTS = MAX_WORKERS
MAX_RANKS = 1 << 16


@dataclass(frozen=True)
class RosterHost:
    """A host a roster run expects (one `cluster.workers` entry)."""

    host: str
    devices: Devices = field(default_factory=Devices)
    address: str | None = None
    data_path: str | None = None


@dataclass(frozen=True)
class RunPolicy:
    """The rules of one join window.

    discovery=True admits walk-ins (the window alone defines the world);
    otherwise only the hosts in `roster` are admitted.
    """

    discovery: bool = True
    start: str = "auto"  # auto | manual | hybrid
    token: str | None = None
    quorum_hosts: int | None = None  # None: every roster host (roster runs), 1 (discovery)
    quorum_ranks: int | None = None
    window_s: float = 600.0  # counts from the first admission
    roster: tuple[RosterHost, ...] = ()
    max_hosts: int | None = None  # discovery capacity; reaching it completes the roster
    max_ranks: int = MAX_RANKS
    run_id: str | None = None  # pinned run id; None: the first member's id sets the cohort's
    launch_id: str | None = None  # the launcher's own id: TORCHELASTIC_RUN_ID when the cohort carries none
    args: tuple[str, ...] = ()  # the run's own arguments, handed to every rank
    controller_addr: str = f"127.0.0.1:{DEFAULT_PORT}"  # FDL_CONTROLLER as ranks should dial it
    master_addr: str | None = None  # None: the address of rank 0's host
    master_port: int = DEFAULT_PORT + 1
    data_path: str = DEFAULT_DATA_PATH  # FDL_DATA_PATH when neither hello nor roster names one
    heartbeat_s: float = 3.0  # how often agents should beat
    silence_s: float = 15.0  # no word for this long: dropped (before forming) or fatal (after)
    poll_s: float = 25.0  # the longest a world long-poll is held open
    reserved: frozenset[str] = frozenset()  # hosts the launcher joins itself: no hello over the network may name them
    insecure_no_token: bool = False  # the explicit opt-out: a non-loopback window without a token

    def __post_init__(self) -> None:
        if self.start not in START_MODES:
            raise ConfigError(f"start mode {self.start!r} is not one of {', '.join(START_MODES)}.")
        if not self.window_s > 0:
            raise ConfigError(f"window_s must be a positive number of seconds, not {self.window_s!r}.")
        if not self.discovery and not self.roster:
            raise ConfigError(
                "this run has no roster (cluster.workers is empty) and discovery is off, so no host could "
                "ever be admitted. List workers: or set cluster.controller.join.discovery: true."
            )
        if self.max_hosts is not None and not 1 <= self.max_hosts <= MAX_HOSTS:
            raise ConfigError(f"max_hosts must be from 1 to {MAX_HOSTS}, not {self.max_hosts}.")
        if not self.discovery and self.quorum_hosts is not None and self.quorum_hosts > len(self.roster):
            raise ConfigError(
                f"quorum hosts: {self.quorum_hosts} is more than the {len(self.roster)} hosts in the roster; "
                f"the window could never reach it. Lower quorum.hosts or add workers."
            )
        if self.discovery and self.quorum_hosts is not None and self.quorum_hosts > self.capacity:
            raise ConfigError(
                f"quorum hosts: {self.quorum_hosts} is more than max_hosts {self.capacity}; the window could "
                f"never reach it."
            )
        for name in ("heartbeat_s", "silence_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be a positive number of seconds.")

    @property
    def capacity(self) -> int:
        """The most hosts this window admits."""
        if not self.discovery:
            return len(self.roster)
        return min(self.max_hosts or MAX_HOSTS, MAX_HOSTS)

    @property
    def need_hosts(self) -> int:
        if self.quorum_hosts is not None:
            return self.quorum_hosts
        return len(self.roster) if not self.discovery else 1

    @property
    def need_ranks(self) -> int:
        return self.quorum_ranks or 0

    @property
    def roster_names(self) -> tuple[str, ...]:
        return tuple(entry.host for entry in self.roster)

    def with_token(self, token: str) -> RunPolicy:
        from dataclasses import replace

        return replace(self, token=token)

    @classmethod
    def from_cluster(cls, cluster: ClusterSpec, *, run_id: str | None = None, launch_id: str | None = None,
                     args: tuple[str, ...] = (), heartbeat_s: float = 3.0, silence_s: float = 15.0,
                     poll_s: float = 25.0) -> RunPolicy:
        """The policy a `cluster:` block describes (controller.join + workers)."""
        ctl = cluster.controller
        join = ctl.join
        roster = tuple(
            RosterHost(host=w.host, devices=w.local_devices, address=w.address, data_path=w.data_path)
            for w in cluster.workers
        )
        return cls(
            discovery=join.discovery,
            start=join.start,
            token=join.token,
            quorum_hosts=join.quorum_hosts,
            quorum_ranks=join.quorum_ranks,
            window_s=join.window_s,
            roster=() if join.discovery else roster,
            max_hosts=join.max_hosts,
            run_id=run_id,
            launch_id=launch_id,
            args=tuple(args),
            controller_addr=ctl.address,
            master_port=ctl.rendezvous_port,
            heartbeat_s=heartbeat_s,
            silence_s=silence_s,
            poll_s=poll_s,
            insecure_no_token=join.insecure_no_token,
        )


def addresses_of(name: str) -> frozenset[str]:
    """The IP addresses a roster address names (a literal is itself; a name is resolved; none when it does not
    resolve). Compared with the peer address a hello comes from."""
    literal = normalize_ip(name)
    if literal is not None:
        return frozenset({literal})
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return frozenset()
    return frozenset(ip for ip in (normalize_ip(str(info[4][0])) for info in infos) if ip is not None)


def normalize_ip(text: str | None) -> str | None:
    """An IP address in one spelling (IPv4-mapped IPv6 as IPv4, no scope id), or None when text is not one."""
    if not text:
        return None
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)
