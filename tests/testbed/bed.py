"""A testbed of SSH hosts made of Linux network namespaces on a bridge.

Each host is a network namespace `<prefix>-h<i>` with one veth leg on the
bridge `<prefix>br0`, its own address in the /24 `<net>.0/24`, its own OpenSSH
daemon (own config, host key, pid file, log; ListenAddress = its address;
`UsePAM no`) and its own login user `<prefix><i>` with its own home and an
authorized key generated for the run. The test machine itself sits on the
bridge at `<net>.1` (`Testbed.gateway`), which is where a controller under
test listens when workers must dial it.

Everything is named from one prefix, so a crashed run's leftovers can be
found and removed: `Testbed.up()` first takes a per-prefix lock, then deletes
any namespace, link, user or work directory carrying the prefix (they can
only be leftovers, since the lock is held), builds the hosts, checks that the
bridge and every namespace exist, and only then sends traffic (to the
testbed's own addresses). Teardown runs even when the body fails.

Namespaces share the file system (and the UTS name) with the test machine:
files a host should see go under `Testbed.shared` (world-readable), and hosts
are told apart by address or user, not by `hostname`.

Execution nodes and the hosts behind them (`Testbed.up(n, nodes=k,
behind=m)`): k more hosts `n1..nk` whose users hold the testbed's key and a
known_hosts of every host (their own ssh setup, for fdl's `via:`), and m hosts
`b1..bm` on a second bridge `<prefix>br1` in another /24 (`inner_net`). Each
node has a second leg on that bridge; this machine has none, and an
`unreachable` route for that /24 for as long as the testbed lives, so the
hosts behind the nodes are reachable from the nodes only.

Needs root, iproute2 and openssh-server. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import ipaddress
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
DEFAULT_PREFIX = "fdlt"
DEFAULT_NET = "10.231.0"  # the first three octets of the testbed's /24
DEFAULT_INNER_NET = "10.232.0"  # the /24 behind the execution nodes (FDL_TESTBED_INNER_NET)
MAX_HOSTS = 200
XDG_DIRS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")


class TestbedError(RuntimeError):
    """The testbed could not be built, checked or torn down."""

    __test__ = False  # not a pytest test class


def _sh(*argv: str, check: bool = True, timeout: float = 30, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input, env=env)
    if check and proc.returncode != 0:
        raise TestbedError(f"{shlex.join(argv)} failed (rc {proc.returncode}): {proc.stderr.strip()}")
    return proc


def flock_waiting(path: Path, timeout: float, poll: float = 0.2) -> int | None:
    """Open `path` (made 0600 if missing) and take an exclusive flock on it, waiting up to `timeout` seconds.
    Returns the open descriptor holding the lock (close it to release), or None, closed, on timeout."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(poll)


def missing_tools() -> list[str]:
    """What the testbed needs and this machine lacks (empty when it can be built)."""
    missing = []
    for tool, path in (("iproute2 (ip)", shutil.which("ip")), ("openssh-server (sshd)", SSHD),
                       ("openssh-client (ssh)", shutil.which("ssh")),
                       ("openssh-client (ssh-keygen)", shutil.which("ssh-keygen")),
                       ("passwd (useradd)", shutil.which("useradd"))):
        if not path or not os.path.exists(path):
            missing.append(tool)
    return missing


@dataclass
class Host:
    """One testbed host: a namespace with an sshd, reached as its own user."""

    bed: Testbed = field(repr=False)
    index: int
    name: str  # short logical name: h1, h2, ...
    namespace: str
    address: str
    user: str
    home: Path
    veth: str  # the bridge-side leg, in the test machine's namespace
    port: int = 22
    sshd: subprocess.Popen | None = field(default=None, repr=False)
    kind: str = "host"  # host (on the bridge), node (execution node: on both bridges), behind (inner bridge only)
    inner_address: str | None = None  # a node's address on the inner bridge
    inner_veth: str | None = None  # a node's bridge-side leg on the inner bridge

    @property
    def key(self) -> Path:
        """The private key that logs in as this host's user."""
        return self.bed.key

    @property
    def sshd_dir(self) -> Path:
        return self.bed.dir / "sshd" / self.name

    def worker(self, **overrides) -> dict:
        """This host as an fdl.cluster.yml worker entry (override or add keys freely). With via: NODE it has no
        identity: unless given one (a path on the node): the node's own ssh setup reaches it."""
        entry = {"host": self.name, "address": self.address, "user": self.user, "port": self.port,
                 "identity": str(self.key)}
        if overrides.get("via"):
            del entry["identity"]
        entry.update(overrides)
        return entry

    def execution_node(self, **overrides) -> dict:
        """This host as an fdl.cluster.yml execution node entry (cluster.execution_nodes)."""
        entry = {"host": self.name, "address": self.address, "user": self.user, "port": self.port,
                 "identity": str(self.key)}
        entry.update(overrides)
        return entry

    def ssh_argv(self, *, key: Path | None = None, extra: tuple[str, ...] = ()) -> list[str]:
        """`ssh ... user@address` with this testbed's key and known_hosts (append a command)."""
        return ["ssh", "-i", str(key or self.key), "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.bed.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "IdentitiesOnly=yes",
                "-F", "/dev/null", *extra, f"{self.user}@{self.address}"]

    def ssh(self, command: str, *, check: bool = True, timeout: float = 30,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run command on the host over real SSH, as its user."""
        self.bed.verify()
        return _sh(*self.ssh_argv(), command, check=check, timeout=timeout, input=input)

    def run(self, command: str, *, as_user: bool = True, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess:
        """Run command inside the host's namespace (no SSH), as its user unless as_user=False."""
        argv = ["ip", "netns", "exec", self.namespace]
        if as_user:
            # The user's own home and base directories, not those of the run that set the host up
            argv += ["setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups",
                     "env", *(f"--unset={name}" for name in XDG_DIRS),
                     f"HOME={self.home}", f"USER={self.user}", f"LOGNAME={self.user}"]
        return _sh(*argv, "sh", "-c", command, check=check, timeout=timeout)

    def pids(self) -> list[int]:
        """Every process running in the host's namespace (sshd and whatever it started)."""
        out = _sh("ip", "netns", "pids", self.namespace, check=False).stdout
        return [int(p) for p in out.split()]

    def user_pids(self) -> list[int]:
        """Processes in the namespace owned by the host's user (what a login left behind)."""
        uid = pwd.getpwnam(self.user).pw_uid
        found = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    found.append(pid)
        return found

    def link_down(self) -> None:
        """Cut the host off its bridges: packets to and from it are dropped from now on."""
        for veth in (self.veth, self.inner_veth):
            if veth:
                _sh("ip", "link", "set", veth, "down")

    def link_up(self) -> None:
        for veth in (self.veth, self.inner_veth):
            if veth:
                _sh("ip", "link", "set", veth, "up")

    def stop_sshd(self) -> None:
        """Kill the host's sshd and every session it serves (each session's sshd and sftp-server): what a crash or
        a restart of a door does to the connections its clients hold (an sshfs mount from here goes stale)."""
        for _ in range(2):  # a session may fork once more while the first pass kills
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() in ("sshd", "sftp-server"):
                        os.kill(pid, signal.SIGKILL)
        if self.sshd is not None:
            self.sshd.wait(10)
            self.sshd = None

    def start_sshd(self) -> None:
        """Start the host's sshd again (after stop_sshd), with the configuration and host key it had."""
        self.bed._launch_sshd(self)
        self.bed._wait_listening(self)

    def authorize(self, public_key: str) -> None:
        """Append a public key line to the host user's authorized_keys."""
        path = self.home / ".ssh" / "authorized_keys"
        with path.open("a") as fh:
            fh.write(public_key.strip() + "\n")


class Testbed:
    """N namespace hosts on a bridge; build with `Testbed.up(n)` (a context manager)."""

    __test__ = False

    def __init__(self, size: int, *, prefix: str | None = None, net: str | None = None,
                 workdir: Path | None = None, nodes: int = 0, behind: int = 0, inner_net: str | None = None):
        prefix = prefix or os.environ.get("FDL_TESTBED_PREFIX") or DEFAULT_PREFIX
        net = net or os.environ.get("FDL_TESTBED_NET") or DEFAULT_NET
        inner_net = inner_net or os.environ.get("FDL_TESTBED_INNER_NET") or DEFAULT_INNER_NET
        if not _PREFIX_RE.match(prefix):
            raise TestbedError(f"testbed prefix {prefix!r}: use 2-8 lowercase letters/digits, starting "
                               f"with a letter (it names users, namespaces and links)")
        for name, value in (("net", net), ("inner net", inner_net)):
            if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", value) or max(int(p) for p in value.split(".")) > 255:
                raise TestbedError(f"testbed {name} {value!r}: expected the first three octets of a 10.x /24, "
                                   f"e.g. 10.231.0")
        if inner_net == net:
            raise TestbedError(f"testbed inner net {inner_net!r} is the net itself: pick another /24")
        if not 1 <= size + nodes + behind <= MAX_HOSTS or min(size, nodes, behind) < 0 or size < 0:
            raise TestbedError(f"testbed size {size} + {nodes} nodes + {behind} behind: expected 1 to {MAX_HOSTS} "
                               f"hosts in all")
        if behind and not nodes:
            raise TestbedError("hosts behind execution nodes need at least one node (nodes=1 or more)")
        self.size = size
        self.node_count = nodes
        self.behind_count = behind
        self.inner_net = inner_net
        self.inner_bridge = f"{prefix}br1"
        self.inner_network = ipaddress.ip_network(f"{inner_net}.0/24")
        self.prefix = prefix
        self.net = net
        self.bridge = f"{prefix}br0"
        self.gateway = f"{net}.1"
        self.network = ipaddress.ip_network(f"{net}.0/24")
        self.dir = workdir or Path(f"/tmp/{prefix}-testbed")
        self.shared = self.dir / "shared"
        self.storage = self.dir / "storage"  # a tmpfs every host sees mounted (shared storage, world-writable)
        self.key = self.dir / "client" / "id_ed25519"
        self.known_hosts = self.dir / "client" / "known_hosts"
        self.hosts: list[Host] = []  # on the bridge, reachable from this machine
        self.nodes: list[Host] = []  # execution nodes: on the bridge (and on the inner bridge when hosts are behind)
        self.behind: list[Host] = []  # on the inner bridge only: reachable from the nodes, not from this machine
        self._lock_fd: int | None = None

    @property
    def every_host(self) -> list[Host]:
        """hosts, nodes and the hosts behind them."""
        return [*self.hosts, *self.nodes, *self.behind]

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    @contextlib.contextmanager
    def up(cls, size: int, **kwargs) -> Iterator[Testbed]:
        """Build a testbed of `size` hosts (plus `nodes=` execution nodes and `behind=` hosts behind them), yield it,
        and always tear it down."""
        bed = cls(size, **kwargs)
        bed._lock()
        try:
            bed.clean_leftovers()
            bed._build()
            yield bed
        finally:
            try:
                bed.down()
            finally:
                bed._unlock()

    def _lock(self) -> None:
        lock_dir = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")
        fd = flock_waiting(lock_dir / f"{self.prefix}-testbed.lock", 600)
        if fd is None:
            raise TestbedError(f"another testbed with prefix {self.prefix!r} held the lock for 10 "
                               f"minutes; set FDL_TESTBED_PREFIX to run beside it")
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _host_names(self) -> list[tuple[int, str, str, str]]:
        out = []
        for i in range(1, self.size + self.node_count + self.behind_count + 1):
            out.append((i, f"{self.prefix}-h{i}", f"{self.prefix}{i}", f"{self.prefix}v{i}"))
        return out

    def _kind(self, index: int) -> tuple[str, str]:
        """(kind, logical name) of host `index`: h1.., then n1.. (nodes), then b1.. (behind)."""
        if index <= self.size:
            return "host", f"h{index}"
        if index <= self.size + self.node_count:
            return "node", f"n{index - self.size}"
        return "behind", f"b{index - self.size - self.node_count}"

    def inner_address_of(self, index: int) -> str:
        return f"{self.inner_net}.{10 + index}"

    def address_of(self, index: int) -> str:
        """Host i (1-based) lives at <net>.<10 + i>."""
        return f"{self.net}.{10 + index}"

    def _build(self) -> None:
        if missing := missing_tools():
            raise TestbedError("the testbed needs " + ", ".join(missing) + " (scripts/apt-test.txt)")
        for sub in ("client", "shared", "sshd", "home"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        os.chmod(self.shared, 0o755)
        os.chmod(self.dir / "home", 0o755)
        # Mounted before any sshd starts: `ip netns exec` gives each sshd a copy of the mount table taken then.
        self.storage.mkdir(exist_ok=True)
        _sh("mount", "-t", "tmpfs", "-o", "size=64m,mode=1777", f"{self.prefix}-storage", str(self.storage))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.prefix}-testbed", "-f", str(self.key))
        public = self.key.with_suffix(".pub").read_text()

        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        if self.behind_count:
            # The inner bridge: no address here, and no route to its /24 from here either (not even the default).
            _sh("ip", "link", "add", self.inner_bridge, "type", "bridge")
            _sh("ip", "link", "set", self.inner_bridge, "up")
            (self.dir / "route").write_text(f"{self.inner_network}\n")
            _sh("ip", "route", "add", "unreachable", str(self.inner_network))
        for i, namespace, user, veth in self._host_names():
            kind, name = self._kind(i)
            address = self.inner_address_of(i) if kind == "behind" else self.address_of(i)
            host = Host(bed=self, index=i, name=name, namespace=namespace, address=address, user=user,
                        home=self.dir / "home" / user, veth=veth, kind=kind)
            {"host": self.hosts, "node": self.nodes, "behind": self.behind}[kind].append(host)
            _sh("ip", "netns", "add", namespace)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _sh("ip", "link", "set", veth, "master", self.inner_bridge if kind == "behind" else self.bridge, "up")
            _sh("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            _sh("ip", "-n", namespace, "link", "set", "eth0", "up")
            if kind == "node" and self.behind_count:
                host.inner_address = self.inner_address_of(i)
                host.inner_veth = f"{self.prefix}w{i}"
                _sh("ip", "link", "add", host.inner_veth, "type", "veth", "peer", "name", "eth1", "netns", namespace)
                _sh("ip", "link", "set", host.inner_veth, "master", self.inner_bridge, "up")
                _sh("ip", "-n", namespace, "addr", "add", f"{host.inner_address}/24", "dev", "eth1")
                _sh("ip", "-n", namespace, "link", "set", "eth1", "up")
            _sh("ip", "-n", namespace, "link", "set", "lo", "up")
            self._add_user(host, public)
        known = []
        for host in self.every_host:
            known.append(self._start_sshd(host))
        self.known_hosts.write_text("".join(known))
        for node in self.nodes:
            self._give_client(node)
        self.verify()
        for host in self.every_host:
            if host.kind != "behind":
                self._wait_listening(host)
        for host in self.behind:  # from a node: this machine has no route there
            self.nodes[0].run(f"python3 -c 'import socket, time\nfor _ in range(100):\n    try:\n"
                              f"        socket.create_connection((\"{host.address}\", {host.port}), 1).close(); break\n"
                              f"    except OSError: time.sleep(0.1)'", as_user=False)

    def _give_client(self, node: Host) -> None:
        """A node's own ssh setup: the testbed's key as its user's default identity, and every host's key known."""
        entry = pwd.getpwnam(node.user)
        ssh_dir = node.home / ".ssh"
        for name, text, mode in (("id_ed25519", self.key.read_text(), 0o600),
                                 ("id_ed25519.pub", self.key.with_suffix(".pub").read_text(), 0o644),
                                 ("known_hosts", self.known_hosts.read_text(), 0o644)):
            path = ssh_dir / name
            path.write_text(text)
            os.chmod(path, mode)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _add_user(self, host: Host, public_key: str) -> None:
        for attempt in range(50):  # /etc/passwd is locked while other useradd runs finish
            proc = _sh("useradd", "-M", "-d", str(host.home), "-s", "/bin/sh", "-U", "-p", "*", host.user,
                       check=False)
            if proc.returncode == 0:
                break
            if "lock" not in proc.stderr or attempt == 49:
                raise TestbedError(f"useradd {host.user} failed: {proc.stderr.strip()}")
            time.sleep(0.1)
        entry = pwd.getpwnam(host.user)
        ssh_dir = host.home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700)
        (ssh_dir / "authorized_keys").write_text(public_key)
        os.chmod(ssh_dir / "authorized_keys", 0o600)
        for path in (host.home, ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(host.home, 0o750)

    def _start_sshd(self, host: Host) -> str:
        """Write the host's sshd config and key, start sshd in its namespace; return its known_hosts line."""
        d = host.sshd_dir
        d.mkdir(parents=True, exist_ok=True)
        key = d / "ssh_host_ed25519_key"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(key))
        conf = d / "sshd_config"
        conf.write_text("\n".join([
            f"# testbed host {host.name}: {host.user}@{host.address}",
            f"ListenAddress {host.address}",
            *([f"ListenAddress {host.inner_address}"] if host.inner_address else []),
            f"Port {host.port}",
            f"HostKey {key}",
            f"PidFile {d / 'sshd.pid'}",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin no",
            f"AllowUsers {host.user}",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "StrictModes yes",
            "MaxStartups 200:30:400",
            "MaxSessions 100",
            "AllowTcpForwarding yes",
            f"Subsystem sftp {SFTP_SERVER}",
            "LogLevel VERBOSE",
            "",
        ]))
        _sh(SSHD, "-t", "-f", str(conf))
        self._launch_sshd(host)
        kind, blob = key.with_suffix(".pub").read_text().split()[:2]
        names = host.address + (f",{host.inner_address}" if host.inner_address else "")
        return f"{names} {kind} {blob}\n"

    def _launch_sshd(self, host: Host) -> None:
        conf, log = host.sshd_dir / "sshd_config", host.sshd_dir / "sshd.log"
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, SSHD, "-D", "-f", str(conf), "-E", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def _wait_listening(self, host: Host, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if host.sshd is not None and host.sshd.poll() is not None:
                log = (host.sshd_dir / "sshd.log")
                raise TestbedError(f"sshd of {host.name} exited (rc {host.sshd.returncode}): "
                                   f"{log.read_text() if log.exists() else ''}")
            try:
                with socket.create_connection((host.address, host.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TestbedError(f"sshd of {host.name} is not listening on {host.address}:{host.port}"
                                       ) from None
                time.sleep(0.05)

    def verify(self) -> None:
        """Check the bridges and every namespace exist (call before sending traffic)."""
        if not self.every_host:
            raise TestbedError("the testbed has no hosts (was it torn down?)")
        for bridge in (self.bridge, *([self.inner_bridge] if self.behind else [])):
            if _sh("ip", "link", "show", bridge, check=False).returncode != 0:
                raise TestbedError(f"bridge {bridge} does not exist")
        have = set(_sh("ip", "netns", "list").stdout.split())
        missing = [h.namespace for h in self.every_host if h.namespace not in have]
        if missing:
            raise TestbedError(f"namespaces missing: {', '.join(missing)}")
        for host in self.every_host:
            network = self.inner_network if host.kind == "behind" else self.network
            if ipaddress.ip_address(host.address) not in network:  # never aim outside the testbed
                raise TestbedError(f"{host.name}: {host.address} is outside {network}")

    def down(self) -> None:
        """Stop every sshd and remove namespaces, links, users and files (errors collected, not fatal)."""
        problems: list[str] = []
        for host in self.every_host:
            if host.sshd is not None and host.sshd.poll() is None:
                host.sshd.terminate()
                try:
                    host.sshd.wait(5)
                except subprocess.TimeoutExpired:
                    host.sshd.kill()
                    host.sshd.wait(5)
        self.hosts, self.nodes, self.behind = [], [], []
        problems += self.clean_leftovers()
        if problems:
            raise TestbedError("testbed teardown left things behind: " + "; ".join(problems))

    def clean_leftovers(self) -> list[str]:
        """Remove everything carrying this prefix: processes in its namespaces, namespaces, links, users, files."""
        problems: list[str] = []
        ns_re = re.compile(rf"^{re.escape(self.prefix)}-h\d+$")
        namespaces = [n for n in _sh("ip", "netns", "list", check=False).stdout.split() if ns_re.match(n)]
        for namespace in namespaces:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = [int(p) for p in _sh("ip", "netns", "pids", namespace, check=False).stdout.split()]
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
                if pids:
                    time.sleep(0.2)
            proc = _sh("ip", "netns", "del", namespace, check=False)
            if proc.returncode != 0:
                problems.append(f"ip netns del {namespace}: {proc.stderr.strip()}")
        link_re = re.compile(rf"^({re.escape(self.prefix)}[vw]\d+|{re.escape(self.prefix)}br[01])$")
        links = _sh("ip", "-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if link_re.match(name):
                proc = _sh("ip", "link", "del", name, check=False)
                if proc.returncode != 0 and "Cannot find" not in proc.stderr:
                    problems.append(f"ip link del {name}: {proc.stderr.strip()}")
        user_re = re.compile(rf"^{re.escape(self.prefix)}\d+$")
        for entry in pwd.getpwall():
            if user_re.match(entry.pw_name):
                for pid in _pids_of_uid(entry.pw_uid):  # a login that escaped its namespace
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                for _attempt in range(50):
                    proc = _sh("userdel", "-f", entry.pw_name, check=False)
                    if proc.returncode in (0, 6) or "lock" not in proc.stderr:
                        break
                    time.sleep(0.1)
                if proc.returncode not in (0, 6):
                    problems.append(f"userdel {entry.pw_name}: {proc.stderr.strip()}")
        for group in grp.getgrall():
            if user_re.match(group.gr_name):
                proc = _sh("groupdel", group.gr_name, check=False)
                if proc.returncode != 0:
                    problems.append(f"groupdel {group.gr_name}: {proc.stderr.strip()}")
        route = self.dir / "route"
        if route.is_file():  # the unreachable route for the inner /24, recorded when it was added
            network = route.read_text().strip()
            proc = _sh("ip", "route", "del", "unreachable", network, check=False)
            if proc.returncode != 0 and "No such process" not in proc.stderr:
                problems.append(f"ip route del unreachable {network}: {proc.stderr.strip()}")
        for mount in reversed(_mounts_under(self.dir)):
            proc = _sh("umount", "-l", mount, check=False)
            if proc.returncode != 0:
                problems.append(f"umount {mount}: {proc.stderr.strip()}")
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.dir.exists():
                problems.append(f"could not remove {self.dir}")
        return problems

    # ------------------------------------------------------------------ helpers for tests

    def host(self, name: str) -> Host:
        for host in self.every_host:
            if host.name == name:
                return host
        raise KeyError(name)

    def workers(self, **overrides) -> list[dict]:
        """Every host as an fdl.cluster.yml worker entry (after checking the bridge and namespaces exist)."""
        self.verify()
        return [h.worker(**overrides) for h in self.hosts]

    def cluster(self, workers: list[dict] | None = None, *, controller: str | None = None,
                nodes: list[dict] | None = None) -> dict:
        """An fdl.cluster.yml document for these hosts (or `workers`), trusting exactly their host keys; `nodes`:
        its cluster.execution_nodes (Host.execution_node() entries).

        ssh reads known_hosts from the passwd home, not $HOME, so the file is
        named explicitly (cluster.ssh.known_hosts) instead of relying on ~/.ssh.
        With nodes, cluster.ssh.identity is the testbed's key: what this
        machine's own ssh authenticates with to a worker behind a node (its
        rank session, through ProxyJump).
        Checks the bridge and namespaces first: a cluster file leads to traffic.
        """
        self.verify()
        doc: dict = {"cluster": {
            "controller": {"host": controller or self.gateway},
            "ssh": {"known_hosts": str(self.known_hosts)},
            "workers": self.workers() if workers is None else workers,
        }}
        if nodes:
            doc["cluster"]["ssh"]["identity"] = str(self.key)
            doc["cluster"]["execution_nodes"] = nodes
        return doc

    def home_env(self, home: Path) -> dict:
        """Environment overrides giving a controller-side process (fdl, ansible) its own HOME, cache and runtime
        directory.

        fdl's cache (runner data) follows XDG_CACHE_HOME and its SSH control sockets XDG_RUNTIME_DIR: both
        are the home's own, so no test rides a master another test opened (with another key, say). Keep
        `home` short, since control socket paths must fit in 104 bytes.
        """
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        runtime = home / "run"
        runtime.mkdir(exist_ok=True, mode=0o700)
        return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_RUNTIME_DIR": str(runtime)}

    def new_key(self, name: str) -> Path:
        """A fresh key pair under the testbed directory that no host trusts (yet)."""
        path = self.dir / "client" / name
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path))
        return path


def _mounts_under(directory: Path) -> list[str]:
    """Mount points at or below directory, outermost first."""
    prefix = str(directory).rstrip("/")
    found = []
    with open("/proc/self/mounts") as handle:
        for line in handle:
            point = line.split()[1].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len)


def _pids_of_uid(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
    return found
