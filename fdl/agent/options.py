"""`fdl join` options: every JoinArgs field, from flags over the `join:` block, checked once.

`resolve_options` merges the command line over the configured defaults field
by field (a flag wins; `bin`/`source` are one choice, so a flag naming either
drops the other from the block) and validates the options themselves.
Whatever does not parse here is a UsageError (exit 2, like every command
line that does not parse): re-dialing with the same options cannot fix it,
so a `--persist` box stops instead of looping on it. The rest of what is
permanent (the source spec, this box's GPUs, tools, keys and stage) is
checked by fdl.agent.permanent, before the first dial.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from fdl.config.join_fields import CLI_FIELDS, SETTINGS, JoinDefaults, flag_of
from fdl.config.parse import DEFAULT_PORT, is_login_name, is_valid_host, split_host_port
from fdl.config.schema import LibtorchDefaults
from fdl.errors import FdlError, UsageError
from fdl.hostside.checks.devices import Devices, parse_devices
from fdl.hostside.envvars import FDL_JOIN_TOKEN
from fdl.hostside.libtorch.variants import CHOICES
from fdl.hostside.paths import DEFAULT_DATA_PATH
from fdl.libtorch.source import Source, choose_source

TUNNEL_DEFAULT_CONTROLLER = ("127.0.0.1", DEFAULT_PORT)
_SECRET = frozenset(name for name, setting in SETTINGS if setting.secret)


class SshHop(NamedTuple):
    """`--ssh [user@]host[:port]`: where the tunnel's sshd is."""

    host: str
    user: str | None = None
    port: int | None = None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


class SshfsSource(NamedTuple):
    """`--data-source sshfs://[user@]host[:port]:/path`."""

    host: str
    path: str
    user: str | None = None
    port: int | None = None
    spec: str = ""

    @property
    def remote(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.path}"


class JoinOptions(NamedTuple):
    """The resolved options of one `fdl join` (valid by construction).

    One field per join setting (fdl.config.join_fields, in its order), each in
    its parsed type, then `args_given`; a unit test holds the two together.
    """

    controller: tuple[str, int]  # as seen from the ssh host with --ssh, else as dialled
    ssh: SshHop | None = None
    identity: str | None = None
    known_hosts: str | None = None  # the door's host key is checked against this file alone (no first-use trust)
    token: str | None = None
    token_file: str | None = None  # where the token was read from (None: the block, the flag or the environment)
    bin: str | None = None
    source: str | None = None
    source_cwd: str | None = None
    source_build: str | None = None
    source_bin: str | None = None
    libtorch: str | None = None  # one of fdl.hostside.libtorch.variants.CHOICES, None: whatever is active here
    host: str | None = None  # None: this machine's hostname
    devices: Devices = Devices()
    persist: bool = False
    data_path: str | None = None  # None with data_source None: no data plane at all
    data_source: SshfsSource | None = None
    gpu_ram_share: float | None = None
    no_sig_probe: bool = False
    args: tuple[str, ...] | None = None  # None: nothing given (the manifest or the world may fill in)
    libtorch_source: Source = Source()  # where --libtorch downloads from, with the libtorch: block's pins
    args_given: bool = False  # args came from the command line (a `--` tail, even an empty one)

    def __repr__(self) -> str:
        """Secret settings (the token) show as '(set)': options end up in notes and tracebacks."""
        shown = (f"{name}={'(set)' if name in _SECRET and value is not None else repr(value)}"
                 for name, value in zip(self._fields, self, strict=True))
        return f"JoinOptions({', '.join(shown)})"

    @property
    def controller_text(self) -> str:
        host, port = self.controller
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def data_root(self) -> str | None:
        """The dataset root ranks are told about, or None when no data plane is configured."""
        if self.data_path is None and self.data_source is None:
            return None
        return self.data_path or DEFAULT_DATA_PATH


def _bad(message: str, hint: str | None = None) -> UsageError:
    return UsageError(message, hint=hint)


def _token(flags: Mapping[str, Any], merged: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(token, the file it came from): --token-file wins over FDL_JOIN_TOKEN (both reach the flags); the join:
    block's token_file: was read when the configuration was checked. A token under 128 bits is refused."""
    from pathlib import Path

    from fdl.config.tokens import read_token_file, strength_problem

    token, token_file = merged["token"] or None, merged["token_file"]
    if flags.get("token_file") is not None:
        token_file = os.path.abspath(os.path.expanduser(str(flags["token_file"])))
        try:
            token = read_token_file(Path(token_file))
        except ValueError as exc:
            raise _bad(f"--token-file: {exc}.") from None
    if token is not None:
        problem = strength_problem(token)
        if problem is not None:
            raise _bad(f"the join token is too weak: {problem}.",
                       f"Give the run's real token ({FDL_JOIN_TOKEN}, --token-file or join.token_file).")
    return token, token_file


def parse_ssh_hop(text: str) -> SshHop:
    """`[user@]host[:port]`; raises UsageError naming what was wrong."""
    raw = text.strip()
    user = None
    rest = raw
    if "@" in raw:
        user, _, rest = raw.rpartition("@")
        if not is_login_name(user):
            raise _bad(f"--ssh {text!r}: {user!r} is not a login name.", "Spell it [user@]host[:port].")
    try:
        host, port = split_host_port(rest, default_port=0)
    except ValueError as exc:
        raise _bad(f"--ssh {text!r}: {exc}.", "Spell it [user@]host[:port], e.g. op@10.0.0.1:2222.") from None
    return SshHop(host=host, user=user, port=port or None)


def parse_sshfs_source(text: str) -> SshfsSource:
    """`sshfs://[user@]host[:port]:/abs/path`; raises UsageError naming what was wrong."""
    form = f"sshfs://[user@]host[:port]:/abs/path, e.g. sshfs://op@10.0.0.1:{DEFAULT_DATA_PATH}"
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme.lower() != "sshfs":
        raise _bad(f"--data-source {text!r} does not parse: the only transport fdl mounts is sshfs://.",
                   f"The form is {form}.")
    user = None
    at = rest.find("@")
    if at != -1 and at < rest.find(":"):
        user, rest = rest[:at], rest[at + 1:]
        if not is_login_name(user):
            raise _bad(f"--data-source {text!r} does not parse: {user!r} is not a login name.", f"The form is {form}.")
    if rest.startswith("["):
        host, close, after = rest[1:].partition("]")
        if not close or not after.startswith(":"):
            raise _bad(f"--data-source {text!r} does not parse: a bracketed address needs ']:' after it.",
                       f"The form is {form}.")
        after = after[1:]
    else:
        host, colon, after = rest.partition(":")
        if not colon:
            raise _bad(f"--data-source {text!r} does not parse: the ':' before the remote path is missing.",
                       f"The form is {form}.")
    if not host or not is_valid_host(host):
        raise _bad(f"--data-source {text!r} does not parse: {host!r} is not a host name or address.",
                   f"The form is {form}.")
    port = None
    head, colon, tail = after.partition(":")
    if colon and head and not head.startswith("/"):
        if not head.isdigit() or not 1 <= int(head) <= 65535:
            raise _bad(f"--data-source {text!r} does not parse: port {head!r} is not a number from 1 to 65535.",
                       f"The form is {form}.")
        port, after = int(head), tail
    if not after.startswith("/") or "/../" in after + "/" or any(ord(c) < 32 for c in after):
        raise _bad(f"--data-source {text!r} does not parse: the remote path must be absolute (host:/path).",
                   f"The form is {form}.")
    return SshfsSource(host=host, path=after, user=user, port=port, spec=raw)


def _absolute(value: str, flag: str) -> str:
    if not value.startswith("/") or any(ord(c) < 32 for c in value):
        raise _bad(f"{flag} {value!r} must be an absolute path on this box (starting with '/').")
    return value


def resolve_options(defaults: JoinDefaults | None, flags: dict[str, Any], tail: list[str] | None, *,
                    environ: Mapping[str, str] | None = None,
                    libtorch_block: LibtorchDefaults | None = None) -> JoinOptions:
    """Merge command-line flags over the `join:` block and validate the result.

    `libtorch_block` is the configuration's `libtorch:` block (its mirror and sha256 pins), if any.

    `flags` maps join fields that are flags (join_fields.CLI_FIELDS) to the
    flag's value, None when the flag was not given; `devices` may be text (a
    --devices flag, parsed here) or an already parsed Devices. `tail` is what
    followed a standalone `--` (None: no `--`).
    """
    import os

    env: Mapping[str, str] = os.environ if environ is None else environ
    block = defaults or JoinDefaults()
    unknown = set(flags) - set(CLI_FIELDS)
    if unknown:
        raise ValueError(f"unknown join fields: {sorted(unknown)}")
    merged: dict[str, Any] = {}
    for name in CLI_FIELDS:
        value = flags.get(name)
        merged[name] = getattr(block, name) if value is None else value

    if flags.get("bin") is not None and flags.get("source") is not None:
        raise _bad("--bin and --source are mutually exclusive: run a binary that is already on this box (--bin), "
                   "or fetch and build one here (--source), not both.")
    if flags.get("bin") is not None:
        merged["source"] = None  # a flag naming one of the pair replaces the block's choice
    elif flags.get("source") is not None:
        merged["bin"] = None
    if merged["bin"] is not None and merged["source"] is not None:
        raise _bad("the join: block sets both bin: and source:, which are mutually exclusive.",
                   "Keep one of them (or choose on the command line with --bin or --source).")
    if merged["bin"] is None and merged["source"] is None:
        raise _bad("nothing to run: give the training binary with --bin PATH, or a source to build here with "
                   "--source SPEC (or set bin: / source: in the join: block of fdl.yml).")
    if merged["source"] is None:
        for name in ("source_cwd", "source_build", "source_bin"):
            if flags.get(name) is not None:
                raise _bad(f"{flag_of(name)} applies to a --source build, and no --source is set.")
            merged[name] = None

    ssh = parse_ssh_hop(str(merged["ssh"])) if merged["ssh"] else None
    if merged["controller"]:
        try:
            controller = split_host_port(str(merged["controller"]))
        except ValueError as exc:
            raise _bad(f"controller address {merged['controller']!r} does not parse: {exc}.",
                       "Spell it host[:port] (default port 1337).") from None
    elif ssh is not None:
        controller = TUNNEL_DEFAULT_CONTROLLER  # the sshd-on-the-controller-box convention
    else:
        raise _bad("no controller to dial: give its address (fdl join HOST[:PORT]), or --ssh [user@]host to "
                   "reach it through the controller box's sshd (or set controller: / ssh: in the join: block).")

    identity = merged["identity"]
    if identity is not None:
        identity = os.path.expanduser(str(identity))
    known_hosts = merged["known_hosts"]
    if known_hosts is not None:
        known_hosts = os.path.abspath(os.path.expanduser(str(known_hosts)))
    token, token_file = _token(flags, merged)
    devices = Devices()
    if merged["devices"] is not None:
        try:
            devices = parse_devices(merged["devices"])  # a Devices (the join: block, --gpus) passes through
        except ValueError as exc:
            raise _bad(f"--devices {merged['devices']!r}: {exc}.",
                       "Offer GPU ids like 0,1, 'all', or cpu:N for N CPU ranks.") from None
    libtorch = merged["libtorch"]
    if libtorch is not None and libtorch not in CHOICES:
        raise _bad(f"--libtorch {libtorch!r} is not a variant fdl acquires.",
                   f"Choose one of: {', '.join(CHOICES)}.")
    try:
        source = choose_source(None, env, libtorch_block.mirror if libtorch_block else None, block.libtorch_mirror,
                               libtorch_block.sha256 if libtorch_block else ())
    except FdlError as exc:
        raise _bad(exc.message, exc.hint) from None
    host = merged["host"]
    if host is not None and not is_valid_host(str(host)):
        raise _bad(f"--host {host!r} is not a host name (letters, digits, '.', '-', '_').")
    share = merged["gpu_ram_share"]
    if share is not None:
        share = float(share)
        if not 0 < share <= 1:
            raise _bad(f"--gpu-ram-share {share:g} is not a fraction of this box's RAM.",
                       "Give a number above 0 and at most 1, e.g. 0.5.")
    data_path = merged["data_path"]
    if data_path is not None:
        data_path = _absolute(str(data_path), "--data-path")
    data_source = parse_sshfs_source(str(merged["data_source"])) if merged["data_source"] else None
    if merged["bin"] is not None:
        merged["bin"] = os.path.expanduser(str(merged["bin"]))

    if tail is not None:
        args, given = tuple(tail), True
    elif block.args is not None:
        args, given = tuple(block.args), False
    else:
        args, given = None, False
    return JoinOptions(
        controller=controller, ssh=ssh, identity=identity, known_hosts=known_hosts, token=token,
        token_file=token_file, bin=merged["bin"],
        source=merged["source"], source_cwd=merged["source_cwd"], source_build=merged["source_build"],
        source_bin=merged["source_bin"], libtorch=libtorch, host=host, devices=devices,
        persist=bool(merged["persist"]), data_path=data_path, data_source=data_source, gpu_ram_share=share,
        no_sig_probe=bool(merged["no_sig_probe"]), args=args, args_given=given, libtorch_source=source,
    )
