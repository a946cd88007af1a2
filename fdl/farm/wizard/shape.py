"""Shape: the command line, the farm's own worker yml and a person's answers, turned into checked inputs.

Nothing here writes. Each field of the shape comes from a flag, else from what the farm's worker yml
records, else from a prompt (with a terminal) or its default (with --yes); a decision needed with neither
is a refusal, and so is every contradiction.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypeVar

import yaml

from fdl.config.parse import split_host_port
from fdl.errors import FdlError
from fdl.farm.doctor import DEFAULT_SSHD_CONFIG
from fdl.hostside.farm.doors import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_DOOR_PORT,
    DOOR_A,
    DOOR_B,
    DOOR_TUNNEL,
    DOORS,
    JAIL_BASE,
    DoorError,
    check_label,
    check_served,
    jail,
)
from fdl.hostside.paths import DEFAULT_DATA_PATH
from fdl.hostside.paths import served as served_dir

_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
_SHAPE_RE = re.compile(r"^# fdl-farm-shape: (.*)$", re.M)
T = TypeVar("T")


def refusal(message: str, hint: str | None = None) -> FdlError:
    """Every refusal of the wizard exits 1 (its documented contract)."""
    return FdlError(message, hint=hint, exit_code=1)


class Prompter(Protocol):
    """How the wizard asks a person; only used when Request.interactive is true."""

    def choose(self, question: str, choices: tuple[str, ...], default: str) -> str: ...

    def text(self, question: str, default: str) -> str: ...

    def confirm(self, question: str, default: bool) -> bool: ...


@dataclass(frozen=True)
class Request:
    """What the command line said (None: not given)."""

    label: str | None = None
    env_label: str | None = None  # the env selected with @NAME / --env / FDL_ENV
    env_source: str | None = None
    door: str | None = None
    controller: str | None = None
    port: int | None = None
    served: str | None = None
    inherit_from: str | None = None
    regen: bool = False
    install_key: bool | None = None
    authorized_keys: str | None = None
    cloud_init: bool = False
    sshd_config: str = DEFAULT_SSHD_CONFIG
    jail_base: str | None = None  # door a: where the jailed account's home and chroot go (default JAIL_BASE)
    assume_yes: bool = False
    interactive: bool = False
    cwd: Path = field(default_factory=Path.cwd)

    def asks(self, prompter: Prompter | None) -> Prompter | None:
        """The prompter to ask with, or None when there is no person to ask."""
        return prompter if self.interactive else None


@dataclass(frozen=True)
class Shape:
    """The farm's shape: which door, where workers dial, what it serves."""

    door: str
    user: str
    host: str
    door_port: int
    controller_port: int
    served: str | None
    jail_base: str = JAIL_BASE  # door a only

    @property
    def controller(self) -> str:
        return f"{self.user}@{self.host}:{self.door_port}"


class Origin(StrEnum):
    """Where a field of the shape came from."""

    FLAG = "flag"
    RECOVERED = "worker yml"
    PROMPT = "prompt"
    DEFAULT = "default"


@dataclass(frozen=True)
class Origins:
    """Where each field of the shape came from (served: doors a and b only)."""

    door: Origin
    controller: Origin
    port: Origin
    served: Origin | None = None

    def to_dict(self) -> dict[str, str]:
        pairs = (("door", self.door), ("controller", self.controller), ("port", self.port), ("served", self.served))
        return {name: origin.value for name, origin in pairs if origin is not None}

    def recovered(self) -> list[str]:
        return [name for name, origin in self.to_dict().items() if origin == Origin.RECOVERED]


@dataclass(frozen=True)
class Recovered:
    """The farm's shape as its own worker yml records it (every field None: no such file)."""

    door: str | None = None
    served: str | None = None
    jail: str | None = None
    user: str | None = None
    host: str | None = None
    door_port: int | None = None
    controller_port: int | None = None

    def __bool__(self) -> bool:
        return any(value is not None for value in vars(self).values())


# --------------------------------------------------------------------------- reading


def parse_controller(text: str, default_user: str) -> tuple[str, str, int]:
    """`[user@]host[:port]` -> (user, host, door port)."""
    user, _, rest = text.rpartition("@")
    user = user or default_user
    if not _USER_RE.fullmatch(user):
        raise refusal(f"--controller {text!r}: {user!r} is not a login name (letters, digits, '.', '-', '_').")
    try:
        host, port = split_host_port(rest, default_port=DEFAULT_DOOR_PORT)
    except ValueError as exc:
        raise refusal(f"--controller {text!r}: {exc}. Expected USER@HOST[:PORT], e.g. op@10.0.0.1:2222.") from None
    return user, host, port


def shape_marker(text: str) -> dict[str, str]:
    """door, served and jail from the `# fdl-farm-shape:` line the wizard writes."""
    found = _SHAPE_RE.search(text)
    out: dict[str, str] = {}
    for item in found.group(1).split() if found else ():
        key, _, value = item.partition("=")
        if key in ("door", "served", "jail") and value:
            out[key] = value
    return out


def _join_block(text: str) -> dict[str, object] | None:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return None
    join = doc.get("join") if isinstance(doc, dict) else None
    return join if isinstance(join, dict) else None


def recover_shape(worker_yml: Path) -> Recovered:
    """The farm's shape as its own worker yml records it (nothing recovered when there is no such file)."""
    try:
        text = worker_yml.read_text(encoding="utf-8")
    except OSError:  # no worker yml (a first run) or none readable: the shape comes from flags and defaults
        return Recovered()
    marker = shape_marker(text)
    join = _join_block(text)
    if join is None:
        return Recovered(door=marker.get("door"), served=marker.get("served"), jail=marker.get("jail"))
    user = host = None
    door_port = controller_port = None
    if isinstance(join.get("ssh"), str):
        try:
            user, host, door_port = parse_controller(str(join["ssh"]), getpass.getuser())
        except FdlError:
            pass  # a hand-edited address that does not parse: asked for again like a missing one
    if join.get("controller") is not None:
        try:
            controller_port = split_host_port(str(join["controller"]))[1]
        except ValueError:
            pass
    door = marker.get("door")
    if door is None:  # a hand-edited file lost its marker: read the door off what it fetches
        door = DOOR_B if "source" in join else DOOR_A if "data_source" in join else DOOR_TUNNEL
    return Recovered(door=door, served=marker.get("served"), jail=marker.get("jail"), user=user, host=host,
                     door_port=door_port, controller_port=controller_port)


def primary_address() -> str:
    """This box's outward address (a UDP connect sends nothing), else its host name."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed, nothing is sent
            address = str(sock.getsockname()[0])
            if address and not address.startswith("0."):
                return address
    except OSError:
        pass  # no route at all (an offline box): its host name is the best default there is
    return socket.gethostname()


# --------------------------------------------------------------------------- settling


def _ask(req: Request, prompter: Prompter | None, what: str, flag: str, default_text: str,
         question: Callable[[Prompter], T], default: Callable[[], T]) -> tuple[T, Origin]:
    """A decision with no flag and nothing recovered: a prompt, else the default with --yes, else a refusal."""
    if not req.interactive and not req.assume_yes:
        raise refusal(f"{what} needs deciding and there is no terminal to ask on (stdin is not a tty, or --json).",
                      hint=f"pass {flag}, or --yes to take the default ({default_text})")
    person = req.asks(prompter)
    if person is not None:
        return question(person), Origin.PROMPT
    return default(), Origin.DEFAULT


def settle_label(req: Request) -> str:
    """The farm's name, from the argument or the selected env (and they must agree)."""
    label = req.label or req.env_label
    if req.label and req.env_label and req.label != req.env_label:
        raise refusal(f"two farm names: {req.label!r} on the command line and {req.env_label!r} from "
                      f"{req.env_source}. Name one.")
    if not label:
        raise refusal("name the farm: fdl join-config LABEL (or fdl @LABEL join-config); it becomes the env "
                      "overlay fdl.LABEL.yml.")
    try:
        return check_label(label)
    except DoorError as exc:
        raise refusal(str(exc) + ".") from None


def _settle_door(req: Request, prompter: Prompter | None, recovered: Recovered) -> tuple[str, Origin]:
    if req.door is not None:
        door, origin = req.door, Origin.FLAG
    elif recovered.door is not None:
        door, origin = recovered.door, Origin.RECOVERED
    else:
        door, origin = _ask(
            req, prompter, "the door (a: sftp mount, b: source pull, tunnel-only)", "--door a|b|tunnel-only", "b",
            lambda p: p.choose("Door: a = read-only sftp for mounting data, b = read-only rsync of the published "
                               "run, tunnel-only = just the forward", DOORS, DOOR_B),
            lambda: DOOR_B)
    if door not in DOORS:
        raise refusal(f"unknown door {door!r}: choose one of {', '.join(DOORS)}.")
    return door, origin


def _settle_controller(req: Request, prompter: Prompter | None,
                       recovered: Recovered) -> tuple[tuple[str, str, int], Origin]:
    """(user, host, door port) as workers dial the controller box."""
    me = getpass.getuser()
    if req.controller is not None:
        return parse_controller(req.controller, me), Origin.FLAG
    if recovered.user is not None and recovered.host is not None and recovered.door_port is not None:
        return (recovered.user, recovered.host, recovered.door_port), Origin.RECOVERED
    default = f"{me}@{primary_address()}:{DEFAULT_DOOR_PORT}"
    text, origin = _ask(req, prompter, "the controller address workers dial", "--controller USER@HOST[:PORT]",
                        default, lambda p: p.text("Controller as workers reach its door (USER@HOST:PORT)", default),
                        lambda: default)
    return parse_controller(text, me), origin


def _settle_port(req: Request, recovered: Recovered) -> tuple[int, Origin]:
    if req.port is not None:
        return req.port, Origin.FLAG
    if recovered.controller_port is not None:
        return recovered.controller_port, Origin.RECOVERED
    return DEFAULT_CONTROLLER_PORT, Origin.DEFAULT


def _settle_served(req: Request, recovered: Recovered, door: str) -> tuple[str | None, Origin | None]:
    """What doors a and b serve (the tunnel-only door serves nothing)."""
    if door not in (DOOR_A, DOOR_B):
        if req.served is not None:
            raise refusal("--served names what doors a and b serve; the tunnel-only door serves nothing. "
                          "Drop --served or pick door a or b.")
        return None, None
    if req.served is not None:
        served, origin = os.path.abspath(os.path.expanduser(req.served)), Origin.FLAG
    elif recovered.served and recovered.door == door:
        served, origin = recovered.served, Origin.RECOVERED
    else:
        served = DEFAULT_DATA_PATH if door == DOOR_A else str(served_dir())
        origin = Origin.DEFAULT
    try:
        return check_served(served), origin
    except DoorError as exc:
        raise refusal(str(exc) + ".") from None


def _settle_jail(req: Request, recovered: Recovered, label: str, door: str, user: str, host: str,
                 door_port: int) -> tuple[str, str]:
    """(login account, jail base). Door a's key logs in as an account of its own, jailed; never as the
    controller's account."""
    if door != DOOR_A:
        if req.jail_base is not None:
            raise refusal("--jail-dir places door a's jail; this farm's door is not a. Drop --jail-dir.")
        return user, JAIL_BASE
    base = req.jail_base or (recovered.jail if recovered.door == DOOR_A else None) or JAIL_BASE
    try:
        cell = jail(label, base)
    except DoorError as exc:
        raise refusal(str(exc) + ".") from None
    if user != cell.account and "@" in (req.controller or ""):
        raise refusal(f"door a's workers log in as the door's own jailed account {cell.account}, not {user}: "
                      f"a key in {user}'s own key file could read everything {user} can.",
                      hint=f"name --controller {cell.account}@{host}:{door_port}")
    return cell.account, base


def _check_ports(door_port: int, controller_port: int) -> None:
    if door_port == 22:
        raise refusal(
            "the door cannot be port 22: the drop-in confines every connection arriving on the door port, "
            "so on 22 it would confine your own logins too.",
            hint="give the door a port of its own, e.g. --controller USER@HOST:2222")
    if door_port == controller_port:
        raise refusal(f"the door port and the training port are both {door_port}; they must differ.")
    if not 1 <= controller_port <= 65535:
        raise refusal(f"--port {controller_port}: expected a TCP port from 1 to 65535.")


def settle_shape(req: Request, prompter: Prompter | None, recovered: Recovered, label: str) -> tuple[Shape, Origins]:
    """The farm's shape and where each of its fields came from."""
    door, door_from = _settle_door(req, prompter, recovered)
    (user, host, door_port), controller_from = _settle_controller(req, prompter, recovered)
    controller_port, port_from = _settle_port(req, recovered)
    served, served_from = _settle_served(req, recovered, door)
    user, jail_base = _settle_jail(req, recovered, label, door, user, host, door_port)
    _check_ports(door_port, controller_port)
    shape = Shape(door, user, host, door_port, controller_port, served, jail_base)
    return shape, Origins(door_from, controller_from, port_from, served_from)
