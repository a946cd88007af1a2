"""The three farm doors: what a worker's key may do once it reaches the controller's sshd.

Shared by `fdl join-config` and the `fdl_join_door` Ansible role, which runs
it on the host: host-side (fdl/hostside/), standard library only.

Every door refuses a shell and permits exactly one forward, to the
controller's training port on the controller box's loopback. On top of that:

- door a ("mount"): a jail. The key belongs to an account of the door's own
  (`fdl-<label>`: no shell, no password), never to the controller's account,
  and the drop-in's `Match User fdl-<label>` block chroots it into a
  root-owned directory holding only a read-only bind mount of the served
  directory, where sshd's built-in sftp server runs read-only
  (`ForceCommand internal-sftp -R`): what sshfs needs to mount a dataset, and
  no path (`..`, absolute, or a link planted in the served tree) that reaches
  anything else. sftp cannot be confined any other way: `-d` only picks the
  starting directory, and a `Match LocalPort` block does not tie a key to a
  port (the same key logs in on port 22), so the confinement hangs on the
  account, on every port;
- door b ("source"): the key runs `rrsync -ro -munge <served>` behind a guard,
  so rsync can pull the published run tree and nothing else. rrsync re-roots
  every path under <served>, refuses `..`, writes, and (below `/`) `-L`, `-k`
  and `-K`; but Debian 12's release rrsync (3.2.7) lets `--copy-unsafe-links`
  through, and its rsync follows a directory link named inside a
  `--files-from` list: either sends what a link out of the tree points at.
  The guard, a POSIX sh `case` in the key's own command, refuses every
  request that carries one of the options that follow links or take a file
  list before rrsync runs, on every rsync release (`-munge` only rewrites
  links a server receives, so it does nothing for what door b sends);
- tunnel-only: the forward and nothing more; the drop-in adds a ForceCommand
  that ends any session at once.

On the door port, only the tunnel-only door uses ForceCommand: a daemon-level
forced command would override the command the b key carries, leaving the
tunnel up while the pull failed. Door a's ForceCommand sits in the block of
its own account, which runs nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOOR_A, DOOR_B, DOOR_TUNNEL = "a", "b", "tunnel-only"
DOORS = (DOOR_A, DOOR_B, DOOR_TUNNEL)
TITLES = {
    DOOR_A: "read-only sftp for mounting data (sshfs)",
    DOOR_B: "read-only rsync of the served run tree (rrsync)",
    DOOR_TUNNEL: "a forward to the controller port, nothing else",
}
DEFAULT_DOOR_PORT = 2222
DEFAULT_CONTROLLER_PORT = 1337
CONTROLLER_LOOPBACK = "127.0.0.1"
# sshd runs the key's command through the account's shell and the option is a
# double-quoted string: keep served paths to characters that need no quoting.
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._/@+-]*")
_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Door a's jail: <JAIL_BASE>/<label> is the account's home (its key file in .ssh), <home>/jail the root-owned
# directory sshd chroots into, <home>/jail/data the mount point of the served directory (bound read-only).
JAIL_BASE = "/var/lib/fdl-doors"
JAIL_DATA = "/data"  # the served tree as the jailed account sees it
_ACCOUNT_PREFIX = "fdl-"
_MAX_ACCOUNT = 32  # useradd's limit on Linux


class DoorError(ValueError):
    """Input that cannot make a door (the message says which and why)."""


def check_served(path: str) -> str:
    if not _SAFE_PATH_RE.fullmatch(path) or "/../" in path + "/" or path.endswith("/.."):
        raise DoorError(
            f"the served directory {path!r} must be an absolute path of letters, digits and . _ / @ + - "
            f"(it is written into a quoted command in the key line, so spaces, quotes and '..' are refused)")
    return path.rstrip("/") or "/"


def check_label(label: str) -> str:
    if not _LABEL_RE.fullmatch(label):
        raise DoorError(f"farm label {label!r} must be letters, digits, '-' and '_' (it names fdl.{label}.yml)")
    return label


def door_account(label: str) -> str:
    """Door a's own account: the key logs in as it, and sshd jails it."""
    account = _ACCOUNT_PREFIX + check_label(label)
    if len(account) > _MAX_ACCOUNT or label.lower() != label:
        raise DoorError(f"door a needs an account named {account!r}, which must be lower case and at most "
                        f"{_MAX_ACCOUNT} characters: pick a shorter, lower-case farm label")
    return account


@dataclass(frozen=True)
class Jail:
    """Where door a's account lives and what sshd chroots it into."""

    account: str
    home: str  # root-owned; holds .ssh/authorized_keys (owned by the account)
    root: str  # the ChrootDirectory: root-owned, 0755, like every directory above it
    data: str  # mount point inside root; the served directory is bound here read-only

    @property
    def authorized_keys(self) -> str:
        return f"{self.home}/.ssh/authorized_keys"


def jail(label: str, base: str = JAIL_BASE) -> Jail:
    home = f"{check_served(base)}/{check_label(label)}"
    return Jail(account=door_account(label), home=home, root=f"{home}/jail", data=f"{home}/jail{JAIL_DATA}")


# rsync options door b refuses before rrsync sees the request: those that make the sending side follow a link
# (rrsync 3.2.7 passes --copy-unsafe-links; the others it refuses itself, refused here too on every release) and
# --files-from, whose list 3.2.7's rsync resolves through directory links that leave the tree. A worker's pull
# (fdl.publish.fetch) uses none of them.
REFUSED_RSYNC_OPTIONS = ("--copy-unsafe-links", "--copy-links", "--copy-dirlinks", "--keep-dirlinks", "--files-from")


def rrsync_command(served: str, rrsync: str = "rrsync") -> str:
    """Door b's forced command: a guard that refuses REFUSED_RSYNC_OPTIONS, then `rrsync -ro -munge <served>`.

    rrsync splits the client's command at white space and passes an option through only when the word is
    exactly a name in its table, so the request can carry one of these options only as that very text: a
    substring match over the whole request is a sound refusal (it also refuses a file name holding the text,
    which no published run needs). The guard is `/bin/sh -c '...'`: sshd runs the key's command through the
    account's login shell, and a single-quoted word without quotes, backslashes or '!' reads the same in sh,
    bash, zsh, fish and tcsh. It holds no double quote, so it sits in the key line's command="..." as is.
    """
    if not _SAFE_PATH_RE.fullmatch(rrsync) and rrsync != "rrsync":
        raise DoorError(f"rrsync path {rrsync!r} needs quoting; install rrsync somewhere plainer")
    patterns = "|".join(f"*{option}*" for option in REFUSED_RSYNC_OPTIONS)
    return (f"/bin/sh -c 'case $SSH_ORIGINAL_COMMAND in {patterns}) echo fdl door b: rsync options that follow "
            f"links or read a file list are refused >&2; exit 1;; esac; exec {rrsync} -ro -munge "
            f"{check_served(served)}'")


def key_options(door: str, *, controller_port: int, served: str | None = None, rrsync: str = "rrsync") -> str:
    """The option list that confines a farm key to its door."""
    permit = f'restrict,port-forwarding,permitopen="{CONTROLLER_LOOPBACK}:{int(controller_port)}"'
    if door == DOOR_A:
        if served is None:
            raise DoorError("door a needs the served directory")
        # The key sits in the jailed account's file; sshd's ForceCommand says the same and wins anyway.
        return f'{permit},command="internal-sftp -R -d {JAIL_DATA}"'
    if door == DOOR_B:
        if served is None:
            raise DoorError("door b needs the served directory")
        return f'{permit},command="{rrsync_command(served, rrsync)}"'
    if door == DOOR_TUNNEL:
        return permit
    raise DoorError(f"unknown door {door!r}: choose one of {', '.join(DOORS)}")


def key_line(door: str, public_key: str, *, label: str, controller_port: int, served: str | None = None,
             rrsync: str = "rrsync") -> str:
    """The complete authorized_keys line for a farm's public key (`TYPE BLOB [comment]`)."""
    fields = public_key.split()
    if len(fields) < 2:
        raise DoorError("the public key must read 'TYPE BASE64 [comment]'")
    options = key_options(door, controller_port=controller_port, served=served, rrsync=rrsync)
    return f"{options} {fields[0]} {fields[1]} fdl-farm-{check_label(label)}"


@dataclass(frozen=True)
class PortLine:
    port: int
    why: str


def port_lines(door_port: int, explicit_ports: list[int], default_port: int = 22) -> list[PortLine]:
    """The Port directives the drop-in must carry so that sshd listens on the door AND keeps its old ports.

    sshd listens on the implicit 22 only while no Port directive exists at all:
    a drop-in that adds `Port 2222` alone would silently close 22.
    """
    out = []
    if not explicit_ports:
        out.append(PortLine(default_port, "keeps sshd on its default port: once any Port line exists, the "
                                          "implicit one is gone"))
    if door_port not in explicit_ports:
        out.append(PortLine(door_port, "the door workers dial"))
    return out


def dropin_vars(door: str, *, label: str, door_port: int, controller_port: int,
                explicit_ports: list[int], jail_base: str = JAIL_BASE) -> dict[str, object]:
    """Everything the sshd drop-in template needs, computed once for both callers."""
    if door not in DOORS:
        raise DoorError(f"unknown door {door!r}: choose one of {', '.join(DOORS)}")
    cell = jail(label, jail_base) if door == DOOR_A else None
    return {
        "jail": None if cell is None else {"account": cell.account, "home": cell.home, "root": cell.root,
                                           "mountpoint": cell.data, "data": JAIL_DATA,
                                           "authorized_keys": cell.authorized_keys},
        "label": check_label(label),
        "door": door,
        "door_title": TITLES[door],
        "door_port": int(door_port),
        "controller_host": CONTROLLER_LOOPBACK,
        "controller_port": int(controller_port),
        "ports": [{"port": p.port, "why": p.why} for p in port_lines(int(door_port), explicit_ports)],
        "force_command": (f'echo "fdl farm {label}: this door only forwards to the controller port; no shell, '
                          f'no commands" >&2; exit 1') if door == DOOR_TUNNEL else None,
    }


def dropin_scan_lines(values: dict[str, object]) -> list[str]:
    """What of the drop-in (dropin_vars' values) sshd's reading order depends on, as lines a scan can take for
    the file (sshd_config.scan's virtual=): its Port lines, then its Match block. The doctor and the
    fdl_join_door_plan module ask "what if it were installed?" with these."""
    ports = values.get("ports") or []
    lines = [f"Port {item['port']}" for item in ports]  # type: ignore[attr-defined]
    return lines + [f"Match LocalPort {values['door_port']}"]


def known_hosts_lines(host: str, port: int, public_keys: list[str]) -> list[str]:
    """The known_hosts lines that pin a door: `[host]:port TYPE BLOB` for each of its public host keys
    (`TYPE BLOB [comment]` lines; the comment is dropped), the name ssh looks up for a door off port 22."""
    name = host if int(port) == 22 else f"[{host}]:{int(port)}"
    out = []
    for key in public_keys:
        fields = key.split()
        if len(fields) >= 2:
            line = f"{name} {fields[0]} {fields[1]}"
            if line not in out:
                out.append(line)
    return out


def dropin_name(label: str) -> str:
    """File name in sshd_config.d: sorts early, since for most keywords sshd keeps the first value it reads."""
    return f"01-fdl-{check_label(label)}.conf"
