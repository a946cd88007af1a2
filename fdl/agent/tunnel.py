"""The `--ssh` hop: an OpenSSH local forward of the controller port, for one dial.

    ssh -N -L 127.0.0.1:<local>:<controller as seen from the ssh host> \\
        -o ExitOnForwardFailure=yes -o BatchMode=yes ... [-p PORT] [-i KEY] [user@]host

The controller sees the connection coming from its own loopback, which is
the credential under `tunnel_only` (reachability through the guardrailed
sshd is the authentication). The forward lives as long as the `Tunnel`
context; leaving it stops ssh, whatever happened inside.

ssh reads the user's own ~/.ssh/config and known_hosts as usual, so host
keys and jump hosts are configured the OpenSSH way; BatchMode makes a
missing key or an unknown host key fail at once instead of prompting.
`FDL_SSH_COMMAND` replaces the plain `ssh` (e.g. `ssh -F /etc/fdl/ssh_config`
or `ssh -o UserKnownHostsFile=...`), for the tunnel and for sshfs alike, the
way RSYNC_RSH and GIT_SSH_COMMAND do for rsync and git.

A failed forward is classified from evidence, never from ssh's wording
(which changes with the OpenSSH version, the locale and LogLevel, and
with whatever FDL_SSH_COMMAND wraps). ssh exits 255 both when the door
refused the session and when the network failed, so after a failure fdl
asks `ssh -G` (the resolved configuration, one `key value` a line) where
ssh really connects, opens a plain TCP connection there and reads the
server's identification line (`SSH-2.0-...`, RFC 4253 section 4.2):
- an SSH server answered and ssh still exited 255 before the forward came
  up: the server refused this box's key, or this box refused the server's
  host key (BatchMode forbids every prompt), and re-dialing with the same
  key and known_hosts cannot change that: permanent (exit 2);
- no connection, or no identification line in time (host down, sshd not
  started, a firewall, a listener that is not sshd): transient (exit 1);
- ssh goes through a ProxyJump/ProxyCommand (the door itself cannot be
  reached directly), `ssh -G` fails, ssh did not exit 255 or never
  finished: fdl cannot tell, and treats it as transient, the side that
  never stops a `--persist` agent wrongly.
ssh's last stderr lines are still shown to the user, only never used to
decide. The check runs after the failure, so two rare orders are misread:
sshd coming up in the moment between ssh's refused connection and the
check, and a link dropping in the middle of the key exchange, both read as
refused (permanent).
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

from fdl.agent.options import SshHop
from fdl.agent.supervisor import die_with_parent, stop_process_group
from fdl.errors import ExitCode, FdlError, PermanentError

CONNECT_TIMEOUT_S = 15
SSH_FAILED = 255  # ssh's own exit status for every error of its own (connection, host key, login, forward)
_BANNER_MAX = 8192  # RFC 4253 4.2: lines before the version string are allowed; bound what is read


class TunnelError(FdlError):
    """The ssh forward could not be brought up (exit 1 unless the credential itself was refused)."""


def ssh_words(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ssh command to run: $FDL_SSH_COMMAND split like a shell would, else plain ssh."""
    environ = os.environ if environ is None else environ
    text = (environ.get("FDL_SSH_COMMAND") or "").strip()
    return shlex.split(text) if text else ["ssh"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ssh_server_answers(host: str, port: int, timeout_s: float) -> bool:
    """Whether an SSH server answers at host:port: a TCP connection and an `SSH-` identification line (RFC 4253 4.2).

    Nothing is sent; the connection is closed as soon as the line (or the limit) is read.
    """
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            data = b""
            while len(data) < _BANNER_MAX:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
                chunk = sock.recv(1024)
                if not chunk:
                    return False
                data += chunk
                lines = data.split(b"\n")
                if any(line.startswith(b"SSH-") for line in lines[:-1]):  # only whole lines count
                    return True
    except OSError:
        return False
    return False


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


class Tunnel:
    """A running `ssh -N -L` forward; `address` is the local end to dial."""

    def __init__(self, hop: SshHop, target: tuple[str, int], *, identity: str | None = None,
                 note: Callable[[str], None] = lambda _: None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 environ: Mapping[str, str] | None = None):
        self.hop = hop
        self.ssh = ssh_words(environ)
        self.target = target
        self.identity = identity
        self.note = note
        self.connect_timeout_s = connect_timeout_s
        self.local_port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._stderr: tempfile.SpooledTemporaryFile | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.local_port is not None
        return ("127.0.0.1", self.local_port)

    def argv(self, local_port: int) -> list[str]:
        host, port = self.target
        target_host = f"[{host}]" if ":" in host else host
        argv = [*self.ssh, "-N", "-L", f"127.0.0.1:{local_port}:{target_host}:{port}",
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
            raise PermanentError("--ssh needs the OpenSSH client (ssh), which is not installed on this box.",
                                 hint="Install it (Debian/Ubuntu: apt-get install openssh-client).")
        if self.identity and not os.path.isfile(self.identity):
            raise PermanentError(f"--identity {self.identity}: no such key file on this box.",
                                 hint="Point --identity at the private key the controller's sshd accepts.")
        for attempt in range(3):  # the free port can be taken between our probe and ssh's bind
            self.local_port = _free_port()
            self._stderr = tempfile.SpooledTemporaryFile(max_size=1 << 16)  # noqa: SIM115 - closed in close()
            try:
                self.proc = subprocess.Popen(self.argv(self.local_port), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True,
                                             preexec_fn=die_with_parent)  # noqa: PLW1509 - PR_SET_PDEATHSIG can only be set in the child between fork and exec
                listening = self._wait_listening()
            except BaseException:  # a stop signal while it comes up: no ssh may outlive us
                self.close()
                raise
            if listening:
                self.note(f"tunnel: 127.0.0.1:{self.local_port} -> {self.hop} -> "
                          f"{self.target[0]}:{self.target[1]}")
                return
            text = self._stderr_text()
            status = self.proc.poll() if self.proc is not None else None
            self.close()
            taken = not _port_free(self.local_port)  # another process took the port we asked for
            if taken and attempt < 2:
                continue
            raise self._failure(text, None if taken else status)  # a lost bind race says nothing of the door

    def _wait_listening(self) -> bool:
        assert self.proc is not None and self.local_port is not None
        deadline = time.monotonic() + self.connect_timeout_s + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.local_port), 0.5):
                return True
            time.sleep(0.05)
        return False

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def endpoint(self) -> tuple[str, int] | None:
        """Where ssh itself connects (HostName and Port after ~/.ssh/config), by `ssh -G`; None behind a proxy."""
        argv = [*self.ssh, "-G", *(["-p", str(self.hop.port)] if self.hop.port else []), "--", self.hop.destination]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        conf: dict[str, str] = {}
        for line in done.stdout.splitlines():
            key, _, value = line.strip().partition(" ")
            conf.setdefault(key.lower(), value.strip())
        if conf.get("proxyjump", "none") != "none" or conf.get("proxycommand", "none") != "none":
            return None
        try:
            return conf["hostname"], int(conf["port"])
        except (KeyError, ValueError):
            return None

    def _failure(self, text: str, status: int | None) -> TunnelError:
        lines = [line for line in text.strip().splitlines() if line.strip()][-6:]
        detail = "\n    ".join(lines) if lines else "(ssh said nothing; it did not come up in time)"
        where = self.endpoint() if status == SSH_FAILED else None
        wait_s = min(max(self.connect_timeout_s, 1.0), 10.0)
        shown = "" if where is None else f"[{where[0]}]:{where[1]}" if ":" in where[0] else f"{where[0]}:{where[1]}"
        if where is not None and ssh_server_answers(*where, wait_s):
            return TunnelError(
                f"the ssh tunnel through {self.hop} could not be brought up: the ssh server at {shown} answered, "
                f"but the session was refused before the forward came up:\n    {detail}",
                hint="Either the door does not accept this box's key (check --identity and that its public key is in "
                     "the authorized keys of the controller box's door), or this box does not accept the door's host "
                     "key (ssh to it once by hand, or fix ~/.ssh/known_hosts). Re-dialing cannot fix either, so fdl "
                     "stops here even under --persist.",
                exit_code=ExitCode.PERMANENT)
        if where is not None:
            hint = (f"No ssh server answered at {shown} (no connection, or no SSH identification within "
                    f"{wait_s:g} s): check that the controller box and its door are up and that the host and port "
                    "are right. This is transient: --persist re-dials.")
        else:
            hint = ("Check the host, port and key, and that this box knows the host's key (ssh to it once by hand, "
                    "or add it to ~/.ssh/known_hosts).")
        return TunnelError(f"the ssh tunnel through {self.hop} could not be brought up:\n    {detail}", hint=hint,
                           exit_code=ExitCode.FAILURE)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            stop_process_group(proc)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
