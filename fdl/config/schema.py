"""Typed validation of the merged configuration.

Each block (`cluster:`, `commands:`, `join:`, `publish:`) is checked against
the schema in the design notes and turned into immutable records (NamedTuple) the rest of
fdl uses. An error names the file and line, the key path, what was expected
and what was found. Unknown keys are warnings, with a did-you-mean when a
known key is close, and are listed as ignored. Validation does not stop at the
first error: every error of the configuration is collected (Checker.errors)
and raised together, with the warnings, as one ConfigError.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from ..errors import ConfigError
from ..hostside.checks.devices import Devices, parse_devices
from ..hostside.redact import strip_userinfo
from .join_fields import SETTINGS as JOIN_SETTINGS
from .join_fields import JoinDefaults
from .keypath import Data, KeyPath, Origin, Origins, format_path
from .parse import (
    DEFAULT_PORT,
    is_login_name,
    is_sha256,
    is_valid_host,
    mirror_problem,
    split_host_port,
    unicast_problem,
)
from .tokens import literal_token_warning, read_token_file, strength_problem

START_MODES = ("auto", "manual", "hybrid")
# Every pattern here is used with fullmatch: `$` also matches before a trailing
# newline, so "node\n" would pass a `^...$` match.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ASCII_DIGITS_RE = re.compile(r"0|[1-9][0-9]{0,8}")  # a plain decimal: no sign, no leading zero
_PYTHON_RE = re.compile(r"/[A-Za-z0-9._+@%,=/-]*[A-Za-z0-9._+@%,=-]")  # an absolute path, not a directory
T = TypeVar("T")


# --------------------------------------------------------------------------- model
# Immutable records. NamedTuple rather than frozen dataclasses: a dataclass is
# built with exec() at import, and every fdl start would pay it for each class.


class JoinPolicy(NamedTuple):
    discovery: bool = False
    start: str = "auto"
    token: str | None = None  # the token itself, also when token_file names the file it was read from
    quorum_hosts: int | None = None
    quorum_ranks: int | None = None
    window_s: float = 600.0
    tunnel_only: bool = False
    max_hosts: int | None = None  # discovery: roster capacity (None: the hard bound, MAX_WORKERS)
    insecure_no_token: bool = False  # opt out of the rule that a non-loopback window has a token
    token_file: str | None = None  # the 0600 file the token was read from (absolute)


class ControllerSpec(NamedTuple):
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    bind: str = "0.0.0.0"
    join: JoinPolicy = JoinPolicy()
    master_port: int | None = None  # torch rendezvous port on rank 0's host (None: port + 1)
    peer_connections: int = 64  # strangers' connections one peer may hold (an address; on loopback, per account)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def rendezvous_port(self) -> int:
        """The torch rendezvous port on rank 0's host: master_port, else the next port after the controller's."""
        return self.master_port or (self.port + 1 if self.port < 65535 else self.port - 1)


class SshDefaults(NamedTuple):
    user: str | None = None
    port: int = 22
    identity: str | None = None
    known_hosts: str | None = None  # a known_hosts file for every worker (default: ssh's own, ~/.ssh/known_hosts)


class WorkerSpec(NamedTuple):
    host: str
    address: str
    user: str | None = None
    port: int = 22
    identity: str | None = None
    arch: str | None = None
    local_devices: Devices = Devices()
    env: tuple[tuple[str, str], ...] = ()
    data_path: str | None = None
    python: str | None = None  # None: /usr/bin/python3 over ssh, fdl's own interpreter on this machine
    via: str | None = None  # the execution node that reaches and drives this worker (None: this machine does)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


class ExecutionNodeSpec(NamedTuple):
    """A machine that runs the playbooks for the workers that name it in `via:` (ansible-runner's worker)."""

    host: str
    address: str
    user: str | None = None
    port: int = 22
    identity: str | None = None  # on this machine; on the via node when the node itself names via:
    python: str = "/usr/bin/python3"  # the node's interpreter: Ansible's when preparing it, and the venv's base
    via: str | None = None  # another execution node this one is reached through (ProxyJump)


class ClusterSpec(NamedTuple):
    controller: ControllerSpec
    ssh: SshDefaults
    workers: tuple[WorkerSpec, ...]
    execution_nodes: tuple[ExecutionNodeSpec, ...] = ()


class CommandSpec(NamedTuple):
    name: str
    run: str | None = None
    cluster: bool = False
    build: str | None = None
    bin: str | None = None
    args: tuple[str, ...] = ()
    description: str | None = None
    local_devices: Devices | None = None  # single-host launcher runs: what this box offers (cpu:N, GPU ids)
    env: tuple[tuple[str, str], ...] = ()  # extra environment for the command's processes (every rank)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


class PublishDefaults(NamedTuple):
    source: str | None = None
    cwd: str | None = None
    build: str | None = None
    bin: str | None = None
    args: tuple[str, ...] | None = None
    to: str | None = None
    identity: str | None = None
    gate: tuple[str, ...] = ()


class LibtorchDefaults(NamedTuple):
    """The libtorch: block: where `fdl libtorch download` and `fdl join --libtorch` fetch from, and pins."""

    mirror: str | None = None  # a base URL (FDL_LIBTORCH_MIRROR and --mirror win); None: PyTorch's location
    sha256: tuple[tuple[str, str], ...] = ()  # (variant, SHA-256 every box insists its archive has)


# --------------------------------------------------------------------------- checking


class Checker:
    """Checks values against the schema; collects warnings, ignored keys and (through soft) every error."""

    def __init__(self, origins: Origins, files: list[str], *, paths: dict[str, Path] | None = None,
                 read_files: bool = True):
        self.origins = origins
        self.files = files
        self.paths = paths or {}  # a file as origins spell it -> the file itself (relative paths resolve there)
        self.read_files = read_files  # False: check a document for another box (token files are not read here)
        self.warnings: list[str] = []
        self.errors: list[str] = []
        self.ignored: list[KeyPath] = []  # unknown keys: warned about, not in force
        self.error_paths: dict[str, KeyPath] = {}  # an error's message -> the key path it is about (fail())

    def soft(self, default: T, check: Callable[..., T], *args: Any) -> T:
        """check(*args); when it fails, its error is recorded and default stands in, so validation goes on
        and one run reports every error of the configuration."""
        try:
            return check(*args)
        except ConfigError as exc:
            self.errors.append(exc.message)
            return default

    def report(self, error: ConfigError) -> None:
        """Record an error and go on checking."""
        self.errors.append(error.message)

    def where(self, path: KeyPath) -> str:
        for cut in range(len(path), -1, -1):
            origin: Origin | None = self.origins.get(path[:cut])
            if origin is not None:
                return str(origin)
        return self.files[-1] if self.files else "configuration"

    def fail(self, path: KeyPath, expected: str, found: Any, fix: str = "") -> ConfigError:
        shown = _show(found)
        msg = f"{self.where(path)}: {format_path(path)}: expected {expected}, found {shown}."
        msg += f" {fix}" if fix else ""
        self.error_paths[msg] = path
        return ConfigError(msg)

    def mapping(self, value: Any, path: KeyPath, known: tuple[str, ...]) -> Data:
        if not isinstance(value, dict):
            raise self.fail(path, "a mapping of keys", value)
        for key in value:
            if not isinstance(key, str):
                self.report(self.fail(path + (key,), "a text key", key))
                continue
            if key not in known:
                self.ignored.append(path + (key,))
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                self.warnings.append(
                    f"{self.where(path + (key,))}: unknown key '{format_path(path + (key,))}'{hint}; it is "
                    f"ignored. Known keys here: {', '.join(known)}."
                )
        return value

    def string(self, value: Any, path: KeyPath, *, nonempty: bool = True) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(path, "text", value)
        text = str(value)
        if nonempty and not text.strip():
            raise self.fail(path, "non-empty text", value)
        return text

    def opt_string(self, block: Data, key: str, path: KeyPath) -> str | None:
        """block[key] as text; None when absent or (its error recorded) invalid."""
        return None if block.get(key) is None else self.soft(None, self.string, block[key], path + (key,))

    def file_path(self, value: Any, path: KeyPath) -> str:
        """A path to a file: ~ expanded, a relative one resolved against the directory of the file that set it."""
        text = os.path.expanduser(self.string(value, path))
        if os.path.isabs(text):
            return text
        origin = self.origins.get(path)
        base = self.paths.get(origin.file) if origin is not None else None
        return os.path.normpath(os.path.join(str(base.parent) if base is not None else os.getcwd(), text))

    def token(self, block: Data, path: KeyPath) -> tuple[str | None, str | None]:
        """(token, token_file) of a block that may set token: or token_file: (never both). The file is read
        (it must be this user's or root's, 0600) unless this document is checked for another box; a token of
        under 128 bits is refused. The token is never shown."""
        literal = self.opt_string(block, "token", path)
        if block.get("token_file") is None:
            if literal is not None:
                self._strong(literal, path + ("token",))
                self._literal(path + ("token",))
            return literal, None
        file = self.soft(None, self.file_path, block["token_file"], path + ("token_file",))
        if literal is not None:
            self.report(ConfigError(
                f"{self.where(path + ('token',))}: {format_path(path + ('token',))} and "
                f"{format_path(path + ('token_file',))} ({self.where(path + ('token_file',))}) are both set, and "
                f"they are two answers to one question. Keep token_file: (the token in a 0600 file) and remove "
                f"token:, or set token: null in the overlay that sets token_file:."))
            return None, file
        if file is None or not self.read_files:
            return None, file
        try:
            token = read_token_file(Path(file))
        except ValueError as exc:
            self.report(ConfigError(f"{self.where(path + ('token_file',))}: {format_path(path + ('token_file',))}: "
                                    f"{exc}."))
            return None, file
        self._strong(token, path + ("token_file",))
        return token, file

    def _strong(self, token: str, path: KeyPath) -> None:
        problem = strength_problem(token)
        if problem is not None:
            self.report(ConfigError(f"{self.where(path)}: {format_path(path)}: the token is too weak: {problem}."))

    def _literal(self, path: KeyPath) -> None:
        """Warn when the file that writes a literal token is tracked by git or readable by others."""
        origin = self.origins.get(path)
        file = self.paths.get(origin.file) if origin is not None else None
        if file is None or not self.read_files:
            return
        warning = literal_token_warning(file, origin.file if origin is not None else str(file))
        if warning is not None:
            self.warnings.append(warning)

    def boolean(self, value: Any, path: KeyPath) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, "true or false", value)
        return value

    def integer(self, value: Any, path: KeyPath, lo: int, hi: int, what: str = "a whole number") -> int:
        number: int
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _ASCII_DIGITS_RE.fullmatch(value):
            number = int(value)
        else:
            raise self.fail(path, f"{what} from {lo} to {hi}", value)
        if not lo <= number <= hi:
            raise self.fail(path, f"{what} from {lo} to {hi}", value)
        return number

    def port(self, value: Any, path: KeyPath) -> int:
        return self.integer(value, path, 1, 65535, "a TCP port")

    def number(self, value: Any, path: KeyPath, lo: float, hi: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise self.fail(path, f"a number from {lo:g} to {hi:g}", value)
        if not lo <= value <= hi:
            raise self.fail(path, f"a number from {lo:g} to {hi:g}", value)
        return float(value)

    def host(self, value: Any, path: KeyPath) -> str:
        text = self.string(value, path)
        if not is_valid_host(text):
            raise self.fail(
                path, "a host name or IP address (letters, digits, '.', '-', '_')", value,
                "Host names end up on ssh command lines and in inventories, so spaces and shell "
                "characters are refused.",
            )
        return text

    def user(self, value: Any, path: KeyPath) -> str:
        text = self.string(value, path)
        if not is_login_name(text):
            raise self.fail(path, "a login name (letters, digits, '.', '-', '_')", value)
        return text

    def str_list(self, value: Any, path: KeyPath) -> tuple[str, ...]:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            raise self.fail(path, "a list of arguments (YAML list, e.g. [--epochs, \"3\"])", value)
        if not isinstance(value, list):
            raise self.fail(path, "a list of arguments", value)
        return tuple(self.soft("", lambda v, p: self.string(v, p, nonempty=False), item, path + (i,))
                     for i, item in enumerate(value))

    def env_map(self, value: Any, path: KeyPath) -> tuple[tuple[str, str], ...]:
        if not isinstance(value, dict):
            raise self.fail(path, "a mapping of environment variables (NAME: value)", value)
        block = value
        out = []
        for key, val in block.items():
            if not isinstance(key, str) or not _ENV_NAME_RE.fullmatch(key):
                self.report(self.fail(path + (key,), "an environment variable name (letters, digits, '_')", key))
                continue
            out.append((key, self.soft("", lambda v, p: self.string(v, p, nonempty=False), val, path + (key,))))
        return tuple(out)


def _show(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(strip_userinfo(value) if isinstance(value, str) else value)  # before cutting: no half password
    return text if len(text) <= 60 else text[:57] + "...'"


# --------------------------------------------------------------------------- blocks

# The keys each block knows are its record's fields (the quorum: mapping holds quorum_hosts/quorum_ranks).
_CONTROLLER_KEYS = ControllerSpec._fields
_JOIN_POLICY_KEYS = tuple(dict.fromkeys("quorum" if f.startswith("quorum_") else f for f in JoinPolicy._fields))
_SSH_KEYS = SshDefaults._fields
_WORKER_KEYS = WorkerSpec._fields
_NODE_KEYS = ExecutionNodeSpec._fields
_COMMAND_KEYS = tuple(f for f in CommandSpec._fields if f != "name")
JOIN_KEYS = JoinDefaults._fields
PUBLISH_KEYS = PublishDefaults._fields
LIBTORCH_KEYS = LibtorchDefaults._fields
TOP_KEYS = ("cluster", "commands", "join", "libtorch", "publish")
MAX_WORKERS = 4096


def check_cluster(c: Checker, value: Any) -> ClusterSpec:
    path = ("cluster",)
    block = c.mapping(value, path, ClusterSpec._fields)
    controller = c.soft(ControllerSpec(), _controller, c, block.get("controller"), path + ("controller",))
    ssh_path = path + ("ssh",)
    ssh_block: Data = c.soft({}, c.mapping, block.get("ssh") or {}, ssh_path, _SSH_KEYS)
    ssh = SshDefaults(
        user=None if ssh_block.get("user") is None else c.soft(None, c.user, ssh_block["user"], ssh_path + ("user",)),
        port=22 if ssh_block.get("port") is None else c.soft(22, c.port, ssh_block["port"], ssh_path + ("port",)),
        identity=c.opt_string(ssh_block, "identity", ssh_path),
        known_hosts=c.opt_string(ssh_block, "known_hosts", ssh_path),
    )
    workers_value = block.get("workers") or []
    if not isinstance(workers_value, list):
        raise c.fail(path + ("workers",), "a list of worker entries (- host: ...)", workers_value)
    if len(workers_value) > MAX_WORKERS:
        raise c.fail(path + ("workers",), f"at most {MAX_WORKERS} workers", f"{len(workers_value)} workers")
    workers = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(workers_value):
        worker = c.soft(None, _worker, c, entry, path + ("workers", i), ssh)
        if worker is None:
            continue
        if worker.host in seen:
            c.report(c.fail(path + ("workers", i, "host"), "a host name used once",
                            worker.host, f"It is already worker {seen[worker.host]}."))
            continue
        seen[worker.host] = i
        workers.append(worker)
    no_nodes: tuple[ExecutionNodeSpec, ...] = ()
    nodes = c.soft(no_nodes, _execution_nodes, c, block.get("execution_nodes"), path + ("execution_nodes",), ssh, seen)
    names = {node.host for node in nodes}
    for worker in workers:
        if worker.via is not None and worker.via not in names:
            c.report(c.fail(path + ("workers", seen[worker.host], "via"),
                            "the host name of an entry under cluster.execution_nodes", worker.via,
                            _known_nodes(names)))
    return ClusterSpec(controller=controller, ssh=ssh, workers=tuple(workers), execution_nodes=nodes)


def _known_nodes(names: set[str]) -> str:
    if not names:
        return "cluster.execution_nodes lists no node; add the node there (host:, address:, user:) or drop via:."
    return f"Execution nodes: {', '.join(sorted(names))}."


def _execution_nodes(c: Checker, value: Any, path: KeyPath, ssh: SshDefaults,
                     workers: dict[str, int]) -> tuple[ExecutionNodeSpec, ...]:
    """cluster.execution_nodes: every entry checked, names unique among nodes and workers, every via: naming a
    node, and no via: chain that comes back to where it started."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise c.fail(path, "a list of execution node entries (- host: ...)", value)
    if len(value) > MAX_WORKERS:
        raise c.fail(path, f"at most {MAX_WORKERS} execution nodes", f"{len(value)} entries")
    nodes: dict[str, tuple[int, ExecutionNodeSpec]] = {}
    for i, entry in enumerate(value):
        node = c.soft(None, _execution_node, c, entry, path + (i,), ssh)
        if node is None:
            continue
        if node.host in nodes or node.host in workers:
            where = f"execution node {nodes[node.host][0]}" if node.host in nodes else \
                f"worker {workers[node.host]}"
            c.report(c.fail(path + (i, "host"), "a host name used once among workers and execution nodes",
                            node.host, f"It is already {where}."))
            continue
        nodes[node.host] = (i, node)
    for i, node in nodes.values():
        if node.via is not None and node.via not in nodes:
            c.report(c.fail(path + (i, "via"), "the host name of another entry under cluster.execution_nodes",
                            node.via, _known_nodes(set(nodes))))
    reported: set[str] = set()
    for name, (i, node) in nodes.items():
        chain = [name]
        hop = node.via
        while hop is not None and hop in nodes and hop not in chain:
            chain.append(hop)
            hop = nodes[hop][1].via
        if hop is not None and hop in chain and hop == name and not reported & set(chain):
            reported.update(chain)
            c.report(c.fail(path + (i, "via"), "a chain of via: that ends at a node this machine reaches directly",
                            f"the cycle {' -> '.join(chain + [name])}",
                            "Give one node of the cycle no via: (this machine reaches it over ssh)."))
    return tuple(entry[1] for entry in nodes.values())


def _host_and_address(c: Checker, block: dict[str, Any], path: KeyPath, host_is: str, needs: str,
                      reached: str) -> tuple[str | None, str | None, bool]:
    """A host entry's `host:` (required) and `address:` (default: the host), the address a unicast one; each
    problem reported on the key that gave it. Shared by workers and execution nodes."""
    host = None
    if block.get("host") is None:
        c.report(c.fail(path + ("host",), host_is, None, needs))
    else:
        host = c.soft(None, c.host, block["host"], path + ("host",))
    address = c.soft(None, c.host, block["address"], path + ("address",)) if block.get("address") is not None \
        else host
    problem = None if address is None else unicast_problem(address)
    if problem is not None:
        c.report(c.fail(path + ("address" if block.get("address") is not None else "host",),
                        f"a unicast address {reached} can be reached at, or a host name", address,
                        f"That is {problem}."))
    return host, address, problem is None


def _execution_node(c: Checker, value: Any, path: KeyPath, ssh: SshDefaults) -> ExecutionNodeSpec | None:
    """One execution node entry; None when its host or address is missing or invalid. Without via: it is reached
    from this machine (ssh defaults apply, identity included); with via:, from that node (its identity: is a
    path there, and cluster.ssh.identity, a path here, does not apply)."""
    block = c.mapping(value, path, _NODE_KEYS)
    host, address, unicast = _host_and_address(c, block, path, "the execution node's host name",
                                               "Every execution node needs host:.", "the node")
    via = c.soft(None, c.host, block["via"], path + ("via",)) if block.get("via") is not None else None
    spec = ExecutionNodeSpec(
        host=host or "",
        address=address or "",
        user=c.soft(None, c.user, block["user"], path + ("user",)) if block.get("user") is not None else ssh.user,
        port=c.soft(22, c.port, block["port"], path + ("port",)) if block.get("port") is not None else ssh.port,
        identity=c.opt_string(block, "identity", path) or (None if via is not None else ssh.identity),
        python=(c.soft("/usr/bin/python3", _python, c, block["python"], path + ("python",))
                if block.get("python") is not None else "/usr/bin/python3"),
        via=via,
    )
    return spec if host is not None and address is not None and unicast else None


def _controller(c: Checker, value: Any, path: KeyPath) -> ControllerSpec:
    if value is None:
        return ControllerSpec()
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            host, port = split_host_port(str(value))
        except ValueError as exc:
            raise c.fail(path, "host[:port] or a mapping with host:, port:", value, f"({exc})") from None
        return ControllerSpec(host=host, port=port)
    block = c.mapping(value, path, _CONTROLLER_KEYS)
    host = c.soft("127.0.0.1", c.host, block["host"], path + ("host",)) if block.get("host") is not None \
        else "127.0.0.1"
    # None: a port that did not check (its error is recorded), so nothing is compared with it
    own_port = c.soft(None, c.port, block["port"], path + ("port",)) if block.get("port") is not None \
        else DEFAULT_PORT
    join = c.soft(JoinPolicy(), _join_policy, c, block.get("join"), path + ("join",))
    if block.get("bind") is not None:
        bind = c.soft(None, c.host, block["bind"], path + ("bind",))
    else:
        bind = "127.0.0.1" if join.tunnel_only else "0.0.0.0"
    if join.tunnel_only and bind is not None and bind not in ("127.0.0.1", "::1", "localhost"):
        c.report(c.fail(path + ("bind",), "a loopback address (tunnel_only binds loopback)", bind,
                        "Remove bind: or set tunnel_only: false."))
    master_port: int | None = None
    if block.get("master_port") is not None:
        master_port = c.soft(None, c.port, block["master_port"], path + ("master_port",))
        if master_port is not None and master_port == own_port:
            c.report(c.fail(path + ("master_port",), "a port other than the controller's own", master_port,
                            "Rank 0 opens the torch rendezvous store there; leave it out to use port + 1."))
    peer_connections = 64
    if block.get("peer_connections") is not None:
        peer_connections = c.soft(64, c.integer, block["peer_connections"], path + ("peer_connections",), 1, 10_000)
    return ControllerSpec(host=host, port=DEFAULT_PORT if own_port is None else own_port, bind=bind or "0.0.0.0",
                          join=join, master_port=master_port, peer_connections=peer_connections)


def _join_policy(c: Checker, value: Any, path: KeyPath) -> JoinPolicy:
    if value is None:
        return JoinPolicy()
    block = c.mapping(value, path, _JOIN_POLICY_KEYS)
    start = block.get("start", "auto")
    if start not in START_MODES:
        c.report(c.fail(path + ("start",), "one of auto, manual, hybrid", start))
        start = "auto"
    quorum_hosts = quorum_ranks = None
    quorum = block.get("quorum")
    if quorum is not None:
        q: Data = c.soft({}, c.mapping, quorum, path + ("quorum",), ("hosts", "ranks"))
        if q.get("hosts") is not None:
            quorum_hosts = c.soft(None, c.integer, q["hosts"], path + ("quorum", "hosts"), 1, MAX_WORKERS)
        if q.get("ranks") is not None:
            quorum_ranks = c.soft(None, c.integer, q["ranks"], path + ("quorum", "ranks"), 1, 1 << 20)
    token, token_file = c.token(block, path)
    return JoinPolicy(
        discovery=c.soft(False, c.boolean, block.get("discovery", False), path + ("discovery",)),
        start=start,
        token=token,
        quorum_hosts=quorum_hosts,
        quorum_ranks=quorum_ranks,
        window_s=c.soft(600.0, c.number, block.get("window_s", 600), path + ("window_s",), 0.05, 7 * 24 * 3600),
        tunnel_only=c.soft(False, c.boolean, block.get("tunnel_only", False), path + ("tunnel_only",)),
        max_hosts=(None if block.get("max_hosts") is None
                   else c.soft(None, c.integer, block["max_hosts"], path + ("max_hosts",), 1, MAX_WORKERS)),
        insecure_no_token=c.soft(False, c.boolean, block.get("insecure_no_token", False),
                                 path + ("insecure_no_token",)),
        token_file=token_file,
    )


def _devices(c: Checker, value: Any, path: KeyPath, expected: str) -> Devices | None:
    """value parsed as devices; None (its error recorded) when it does not parse."""
    try:
        return parse_devices(value)
    except ValueError as exc:
        c.report(c.fail(path, expected, value, f"({exc})"))
        return None


def _worker(c: Checker, value: Any, path: KeyPath, ssh: SshDefaults) -> WorkerSpec | None:
    """The worker entry, every field checked; None when its host or address is missing or invalid."""
    block = c.mapping(value, path, _WORKER_KEYS)
    host, address, unicast = _host_and_address(c, block, path, "the worker's logical host name",
                                               "Every worker needs host:.", "a worker")
    devices = None
    if block.get("local_devices") is not None:
        devices = _devices(c, block["local_devices"], path + ("local_devices",),
                           "GPU ids like [0, 1], 'all' or 'cpu:N'")
    # A worker behind an execution node is reached from that node: its identity: is a path there, and
    # cluster.ssh.identity (a path on this machine) is not its default.
    via = c.soft(None, c.host, block["via"], path + ("via",)) if block.get("via") is not None else None
    spec = WorkerSpec(
        host=host or "",
        address=address or "",
        user=c.soft(None, c.user, block["user"], path + ("user",)) if block.get("user") is not None else ssh.user,
        port=c.soft(22, c.port, block["port"], path + ("port",)) if block.get("port") is not None else ssh.port,
        identity=c.opt_string(block, "identity", path) or (None if via is not None else ssh.identity),
        arch=c.opt_string(block, "arch", path),
        local_devices=Devices() if devices is None else devices,
        env=c.soft((), c.env_map, block["env"], path + ("env",)) if block.get("env") is not None else (),
        data_path=c.opt_string(block, "data_path", path),
        python=(c.soft(None, _python, c, block["python"], path + ("python",)) if block.get("python") is not None
                else None),
        via=via,
    )
    return spec if host is not None and address is not None and unicast else None


def _python(c: Checker, value: Any, path: KeyPath) -> str:
    """A worker's python: the absolute path of an interpreter on that host, checked when the file is read (a
    bare name or a word with spaces would only fail over ssh, mid-probe or mid-launch)."""
    text = c.string(value, path)
    if not _PYTHON_RE.fullmatch(text):
        raise c.fail(path, "the absolute path of a Python interpreter on that host, like /usr/bin/python3 or "
                           "/opt/venv/bin/python (no spaces or shell characters)", value,
                     "Ansible runs the probe module with it and the launcher the rank supervisor, over ssh; "
                     "`command -v python3` on the host prints the path.")
    return text


def check_commands(c: Checker, value: Any) -> dict[str, CommandSpec]:
    path = ("commands",)
    if not isinstance(value, dict):
        raise c.fail(path, "a mapping of command names to their definitions", value)
    out = {}
    for name, spec in value.items():
        here = path + (name,)
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            c.report(c.fail(here, "a command name (letters, digits, '.', '-', '_')", name))
            continue
        if isinstance(spec, str):  # shorthand: `test: cargo test`
            out[name] = CommandSpec(name=name, run=spec)
            continue
        command = c.soft(None, _command, c, name, spec, here)
        if command is not None:
            out[name] = command
    return out


def _command(c: Checker, name: str, spec: Any, here: KeyPath) -> CommandSpec:
    block = c.mapping(spec, here, _COMMAND_KEYS)
    # None: a cluster: value that did not check, so nothing that depends on it is judged
    cluster = c.soft(None, c.boolean, block.get("cluster", False), here + ("cluster",))
    run = c.opt_string(block, "run", here)
    binary = c.opt_string(block, "bin", here)
    if cluster is False and block.get("run") is None:
        c.report(c.fail(here, "run: (a shell command) or cluster: true with bin:", spec))
    if cluster and block.get("bin") is None and block.get("run") is None:
        c.report(c.fail(here + ("bin",), "the binary every rank runs (or run:)", None))
    devices = None
    if block.get("local_devices") is not None:
        if cluster is False:
            c.report(c.fail(here + ("local_devices",), "local_devices: only on a cluster: true command",
                            block["local_devices"], "It sets the ranks of a single-host launcher run; an "
                            "ordinary command runs once."))
        devices = _devices(c, block["local_devices"], here + ("local_devices",),
                           "GPU ids like [0, 1], 'all' or 'cpu:N'")
    return CommandSpec(
        name=name, run=run, cluster=bool(cluster), build=c.opt_string(block, "build", here), bin=binary,
        args=c.str_list(block["args"], here + ("args",)) if block.get("args") is not None else (),
        description=c.opt_string(block, "description", here), local_devices=devices,
        env=c.soft((), c.env_map, block["env"], here + ("env",)) if block.get("env") is not None else (),
    )


def check_join(c: Checker, value: Any) -> JoinDefaults:
    """The join: block, each key checked the way its declaration (fdl.config.join_fields) says."""
    path = ("join",)
    block = c.mapping(value, path, JOIN_KEYS)
    kwargs: dict[str, Any] = {}
    token, token_file = c.token(block, path)
    for key, setting in JOIN_SETTINGS:
        if key in ("token", "token_file"):
            continue
        if block.get(key) is not None:
            checked = c.soft(None, _join_value, c, setting.check, block[key], path + (key,))
            if checked is not None:
                kwargs[key] = checked
    if token is not None:
        kwargs["token"] = token
    if token_file is not None:
        kwargs["token_file"] = token_file
    return JoinDefaults(**kwargs)


def _join_value(c: Checker, check: str, value: Any, here: KeyPath) -> Any:
    if check == "bool":
        return c.boolean(value, here)
    if check == "fraction":
        return c.number(value, here, 0.0, 1.0)
    if check == "args":
        return c.str_list(value, here)
    if check == "host":
        return c.host(value, here)
    if check == "path":
        return c.file_path(value, here)
    if check == "devices":
        try:
            return parse_devices(value)
        except ValueError as exc:
            raise c.fail(here, "GPU ids like 0,1, 'all' or 'cpu:N'", value, f"({exc})") from None
    if check == "address":
        try:
            split_host_port(str(value))
        except ValueError as exc:
            raise c.fail(here, "host[:port]", value, f"({exc})") from None
        return str(value)
    return c.string(value, here)


def check_publish(c: Checker, value: Any) -> PublishDefaults:
    path = ("publish",)
    block = c.mapping(value, path, PUBLISH_KEYS)
    kwargs: dict[str, Any] = {}
    for key in PUBLISH_KEYS:
        if block.get(key) is None:
            continue
        checked = c.soft(None, _publish_value, c, key, block[key], path + (key,))
        if checked is not None:
            kwargs[key] = checked
    return PublishDefaults(**kwargs)


def check_libtorch_block(c: Checker, value: Any) -> LibtorchDefaults:
    """The libtorch: block: mirror: a base URL, sha256: {variant: hex} pins (docs/config.md)."""
    from ..hostside.libtorch.variants import DOWNLOADS

    path = ("libtorch",)
    block = c.mapping(value, path, LIBTORCH_KEYS)
    mirror = c.opt_string(block, "mirror", path)
    if mirror is not None:
        problem = mirror_problem(mirror.strip())
        if problem is not None:
            raise c.fail(path + ("mirror",), "an http:// or https:// base URL", mirror,
                         "Leave it out to download from PyTorch's own location (docs/cli.md).")
        mirror = mirror.strip()
    pins: list[tuple[str, str]] = []
    if block.get("sha256") is not None:
        here = path + ("sha256",)
        given = c.mapping(block["sha256"], here, tuple(DOWNLOADS))
        for variant, digest in given.items():
            if variant not in DOWNLOADS:
                continue  # warned about (did-you-mean) by mapping()
            text = c.string(digest, here + (variant,)).strip().lower()
            if not is_sha256(text):
                raise c.fail(here + (variant,), "a SHA-256 in hex (64 characters, as sha256sum prints)", digest)
            pins.append((variant, text))
    return LibtorchDefaults(mirror=mirror, sha256=tuple(pins))


def _publish_value(c: Checker, key: str, value: Any, here: KeyPath) -> Any:
    if key == "args":
        return c.str_list(value, here)
    if key == "gate":
        return (c.string(value, here),) if isinstance(value, str) else c.str_list(value, here)
    return c.string(value, here)
