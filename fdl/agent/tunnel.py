"""The `--ssh` hop: an OpenSSH local forward of the controller port onto a private unix socket, for one dial.

    ssh -N -L <private dir>/controller.sock:<controller as seen from the ssh host> \\
        -o StreamLocalBindMask=0177 -o ExitOnForwardFailure=yes -o BatchMode=yes ... [-p PORT] [-i KEY] [user@]host

The forward listens on a unix socket in a directory only this user can
enter (0700, made fresh per dial), with the socket itself 0600, never on a
TCP port: every local account could reach a loopback port (it shows in
/proc/net/tcp), and through it the controller. The door's sshd still sees a
plain `direct-tcpip` channel. The controller sees the connection arrive
from its own loopback, which proves nothing: the agent signs every request
with the run's token, through the tunnel as well. The forward lives as long
as the `Tunnel` context; leaving it stops ssh and removes the directory.

ssh reads the user's own ~/.ssh/config and known_hosts as usual, so host
keys and jump hosts are configured the OpenSSH way; BatchMode makes a
missing key or an unknown host key fail at once instead of prompting.
`FDL_SSH_COMMAND` replaces the plain `ssh` (e.g. `ssh -F /etc/fdl/ssh_config`
or `ssh -o UserKnownHostsFile=...`), for the tunnel and for sshfs alike, the
way RSYNC_RSH and GIT_SSH_COMMAND do for rsync and git.

A failed forward is transient (exit 1), whatever ssh said: what is
permanent about a door is decided before the first dial, from this box's
own files (fdl.agent.permanent: the ssh client installed, the identity
file readable, a known_hosts entry for the door), and nothing here adds to
it. ssh exits 255 when the door refused the key, when sshd dropped an
unauthenticated connection under load (its default `MaxStartups
10:30:100` drops at random, and the next connection still reads an `SSH-`
banner), when the network failed and when this box refused the door's host
key. To say which, fdl reads what this box can check itself, never ssh's
wording (which changes with the OpenSSH version, the locale and LogLevel,
and with whatever FDL_SSH_COMMAND wraps): `ssh -G` says which known_hosts
files and which host name ssh checks, `ssh-keygen -F` looks it up
(`door_keys`), and `ssh-keyscan` asks what the door presents:
- no key for the door's host name in this box's known_hosts while strict
  host key checking is on (the entry went away after the first dial);
- keys, none of them among those the door presents: the door was
  re-keyed, or something else answers at its address. A stand-in at the
  door's address must not be able to power a `--persist` worker off, so
  this says so plainly and `--persist` keeps re-dialing until the real door
  answers again or the operator puts the new key into known_hosts;
- anything else (a refused key, a dropped or reset connection, no answer,
  a door behind ProxyJump/ProxyCommand that cannot be checked from here).
ssh's last stderr lines are still shown to the user, only never used to
decide.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from fdl.agent.options import SshHop
from fdl.errors import ExitCode, FdlError
from fdl.hostside.envvars import FDL_SSH_COMMAND, read
from fdl.hostside.paths import runtime_dir
from fdl.hostside.supervisor import die_with_parent, stop_process_group

CONNECT_TIMEOUT_S = 15
SSH_FAILED = 255  # ssh's own exit status for every error of its own (connection, host key, login, forward)
SOCKET_NAME = "controller.sock"


class DoorKeys(NamedTuple):
    """What this box's own known_hosts files say about the door: the name ssh looks up, where it connects,
    the files, and the (type, key) pairs they hold for that name (empty: none)."""

    name: str
    host: str
    port: int
    files: tuple[str, ...]
    keys: frozenset[tuple[str, str]]


class TunnelError(FdlError):
    """The ssh forward could not be brought up (transient: the next dial tries again)."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None,
                 reason: str | None = None):
        super().__init__(message, hint=hint, exit_code=exit_code)
        self.reason = reason


def pin_options(known_hosts: str) -> list[str]:
    """ssh options that check a host against one known_hosts file, with no first-use trust."""
    value = f'"{known_hosts}"' if any(c.isspace() for c in known_hosts) else known_hosts
    return ["-o", f"UserKnownHostsFile={value}", "-o", "StrictHostKeyChecking=yes"]


def pinned_environ(environ: Mapping[str, str], known_hosts: str | None) -> dict[str, str]:
    """environ, with every ssh a dial starts (the tunnel and sshfs through FDL_SSH_COMMAND, an rsync:// pull
    through RSYNC_RSH, a git+ssh fetch through GIT_SSH_COMMAND) checking hosts against known_hosts alone:
    join.known_hosts, which a farm's worker.yml names (the door's host key, read when it was made)."""
    out = dict(environ)
    if not known_hosts:
        return out
    pin = pin_options(known_hosts)
    out[FDL_SSH_COMMAND] = shlex.join(ssh_words(environ) + pin)
    for name in ("RSYNC_RSH", "GIT_SSH_COMMAND"):
        out[name] = shlex.join(shlex.split(environ.get(name, "").strip() or "ssh") + pin)
    return out


def ssh_words(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ssh command to run: $FDL_SSH_COMMAND split like a shell would, else plain ssh."""
    text = read(FDL_SSH_COMMAND, environ).strip()
    return shlex.split(text) if text else ["ssh"]


def local_address_toward(host: str, port: int = 22) -> str | None:
    """The address of this box on the route to host (what peers there see), or None."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.connect(addr)  # UDP: no packet is sent, the kernel only picks a route
                local = sock.getsockname()[0]
        except OSError:
            continue
        if local and not local.startswith("127.") and local != "::1":
            return local
    return None


def _runtime_dir(environ: Mapping[str, str]) -> str | None:
    """Where the tunnel's private directory goes: $XDG_RUNTIME_DIR when it is private (fdl.hostside.paths.runtime_dir)
    and short, else the temp dir (a unix socket's path must stay short: 108 bytes on Linux)."""
    runtime = runtime_dir(environ)
    return str(runtime) if runtime is not None and len(str(runtime)) < 60 else None


class Tunnel:
    """A running `ssh -N -L SOCKET:...` forward; `socket_path` is the local end to dial."""

    def __init__(self, hop: SshHop, target: tuple[str, int], *, identity: str | None = None,
                 note: Callable[[str], None] = lambda _: None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 environ: Mapping[str, str] | None = None, known_hosts: str | None = None):
        self.hop = hop
        self.known_hosts = known_hosts  # the pinned known_hosts file (environ's ssh command carries the pin)
        self.environ = dict(os.environ if environ is None else environ)
        self.ssh = ssh_words(self.environ)
        self.target = target
        self.identity = identity
        self.note = note
        self.connect_timeout_s = connect_timeout_s
        self.directory: str | None = None
        self.proc: subprocess.Popen | None = None
        self._stderr: tempfile.SpooledTemporaryFile | None = None

    @property
    def socket_path(self) -> str:
        assert self.directory is not None
        return os.path.join(self.directory, SOCKET_NAME)

    def argv(self, socket_path: str) -> list[str]:
        host, port = self.target
        target_host = f"[{host}]" if ":" in host else host
        argv = [*self.ssh, "-N", "-L", f"{socket_path}:{target_host}:{port}",
                "-o", "StreamLocalBindMask=0177", "-o", "StreamLocalBindUnlink=yes",
                "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={int(self.connect_timeout_s)}",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
        if self.hop.port:
            argv += ["-p", str(self.hop.port)]
        if self.identity:
            argv += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        return argv + ["--", self.hop.destination]

    def __enter__(self) -> Tunnel:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        if shutil.which(self.ssh[0]) is None:
            raise TunnelError("--ssh needs the OpenSSH client (ssh), which is not installed on this box (any more).",
                              hint="Install it (Debian/Ubuntu: apt-get install openssh-client); the next dial "
                                   "tries again.")
        self.directory = tempfile.mkdtemp(prefix="fdl-tunnel-", dir=_runtime_dir(self.environ))  # 0700
        self._stderr = tempfile.SpooledTemporaryFile(max_size=1 << 16)  # noqa: SIM115 - closed in close()
        try:
            self.proc = subprocess.Popen(self.argv(self.socket_path), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True,
                                         preexec_fn=die_with_parent)  # noqa: PLW1509 - PR_SET_PDEATHSIG can only be set in the child between fork and exec
            listening = self._wait_listening()
        except BaseException:  # a stop signal while it comes up: no ssh may outlive us
            self.close()
            raise
        if listening:
            self.note(f"tunnel: {self.socket_path} -> {self.hop} -> {self.target[0]}:{self.target[1]}")
            return
        text = self._stderr_text()
        status = self.proc.poll() if self.proc is not None else None
        self.close()
        raise self._failure(text, status)

    def _wait_listening(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + self.connect_timeout_s + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.5)
                probe.connect(self.socket_path)
                return True
            time.sleep(0.05)
        return False

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def resolved(self) -> dict[str, str] | None:
        """ssh's own resolved configuration for the door (`ssh -G`: one `key value` a line, keys lowercase,
        the first value of each kept, known_hosts files whole), or None when it cannot say."""
        argv = [*self.ssh, "-G", *(["-p", str(self.hop.port)] if self.hop.port else []), "--", self.hop.destination]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15,
                                  env=self.environ)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        conf: dict[str, str] = {}
        for line in done.stdout.splitlines():
            key, _, value = line.strip().partition(" ")
            conf.setdefault(key.lower(), value.strip())
        return conf

    def endpoint(self) -> tuple[str, int] | None:
        """Where ssh itself connects (HostName and Port after ~/.ssh/config), by `ssh -G`; None behind a proxy."""
        conf = self.resolved()
        if conf is None or conf.get("proxyjump", "none") != "none" or conf.get("proxycommand", "none") != "none":
            return None
        try:
            return conf["hostname"], int(conf["port"])
        except (KeyError, ValueError):
            return None

    def door_keys(self) -> DoorKeys | None:
        """The host keys this box's own known_hosts files hold for the door, from its files alone (`ssh -G`,
        `ssh-keygen -F`); None when they do not decide whether ssh accepts it: a door behind a proxy, host key
        checking that is not strict, a KnownHostsCommand, a marker line, no ssh."""
        conf = self.resolved()
        if conf is None or conf.get("proxyjump", "none") != "none" or conf.get("proxycommand", "none") != "none":
            return None
        if conf.get("stricthostkeychecking", "ask").lower() not in ("yes", "true", "ask"):
            return None  # accept-new / no: an unknown or changed key does not stop ssh
        if conf.get("knownhostscommand", "none") != "none":
            return None  # keys come from a command too: this box's files are not the whole answer
        try:
            host, port = conf["hostname"], int(conf["port"])
        except (KeyError, ValueError):
            return None
        name = conf.get("hostkeyalias", "none")
        if name == "none":
            name = host if port == 22 else f"[{host}]:{port}"
        files = [_home_path(f) for key in ("userknownhostsfile", "globalknownhostsfile")
                 for f in shlex.split(conf.get(key) or "") if f != "none"]
        known = known_keys(name, files, self.environ)
        if known is None:
            return None
        return DoorKeys(name, host, port, tuple(files), frozenset(known))

    def host_key_problem(self) -> str | None:
        """Why ssh does not accept the door's host key, or None when nothing says so."""
        door = self.door_keys()
        if door is None:
            return None
        shown = ", ".join(door.files) or "(none)"
        if not door.keys:
            return (f"this box's known_hosts ({shown}) holds no host key for the door {door.name}, and ssh refuses "
                    f"an unknown host under BatchMode")
        offered = scanned_keys(door.host, door.port, self.environ)
        if offered and not (offered & door.keys):
            return (f"the door {door.name} presents host keys none of which is in this box's known_hosts ({shown}): "
                    f"the door was re-keyed, or something else answers at its address")
        return None

    def _failure(self, text: str, status: int | None) -> FdlError:
        lines = [line for line in text.strip().splitlines() if line.strip()][-6:]
        detail = "\n    ".join(lines) if lines else "(ssh said nothing; it did not come up in time)"
        found = self.host_key_problem() if status == SSH_FAILED else None
        if found is not None:
            return TunnelError(
                f"the ssh tunnel through {self.hop} could not be brought up: {found}.\n    {detail}",
                hint="If the door was re-keyed, put its new host key into this box's known_hosts (copied from the "
                     "door's /etc/ssh/*.pub over a path you trust). If it was not, something is impersonating it: "
                     "ssh refused to talk to it. What the network presents never stops this box for good, so "
                     "--persist keeps re-dialing until the real door answers.",
                exit_code=ExitCode.FAILURE, reason="tunnel")
        return TunnelError(
            f"the ssh tunnel through {self.hop} could not be brought up:\n    {detail}",
            hint="The door refused this box's key (check --identity and the door's authorized keys), dropped the "
                 "connection (sshd drops unauthenticated connections under load: MaxStartups), or could not be "
                 "reached. None of these can be told apart from here, and none is permanent: --persist re-dials.",
            exit_code=ExitCode.FAILURE, reason="tunnel")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            stop_process_group(proc)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        directory, self.directory = self.directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _home_path(path: str) -> str:
    """A path as ssh reads it: `~` is the account's home from the password database, not $HOME."""
    if path.startswith("~/") or path == "~":
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir + path[1:]
    return path


def known_keys(name: str, files: list[str], environ: Mapping[str, str]) -> set[tuple[str, str]] | None:
    """The (type, key) pairs known_hosts files hold for name (`ssh-keygen -F`, hashed entries included);
    None when that cannot decide: ssh-keygen cannot be run, or a marker line (@cert-authority, @revoked)
    matches, whose meaning is more than a key."""
    found: set[tuple[str, str]] = set()
    for path in files:
        if not os.path.isfile(path):
            continue
        try:
            done = subprocess.run(["ssh-keygen", "-F", name, "-f", path], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=15, env=dict(environ))
        except (OSError, subprocess.SubprocessError):
            return None
        if any(line.lstrip().startswith("@") for line in done.stdout.splitlines()):
            return None
        found |= _key_pairs(done.stdout)
    return found


def scanned_keys(host: str, port: int, environ: Mapping[str, str]) -> set[tuple[str, str]]:
    """The host keys the door presents (`ssh-keyscan`); empty when it cannot be asked (that decides nothing)."""
    try:
        done = subprocess.run(["ssh-keyscan", "-T", "10", "-p", str(port), "--", host], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30, env=dict(environ))
    except (OSError, subprocess.SubprocessError):
        return set()
    return _key_pairs(done.stdout)


def _key_pairs(text: str) -> set[tuple[str, str]]:
    pairs = set()
    for line in text.splitlines():
        words = line.split()
        if not words or line.startswith("#"):
            continue
        if len(words) >= 3:
            pairs.add((words[1], words[2]))
    return pairs
