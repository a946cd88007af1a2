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
# The door refused this box's credential: re-dialing with the same key cannot fix that.
_PERMANENT_MARKERS = ("Permission denied", "Too many authentication failures")


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
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
                local = str(sock.getsockname()[0])
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
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: tempfile.SpooledTemporaryFile[bytes] | None = None

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
                                             preexec_fn=die_with_parent)  # noqa: PLW1509 (PDEATHSIG is set in the child)
                listening = self._wait_listening()
            except BaseException:  # a stop signal while it comes up: no ssh may outlive us
                self.close()
                raise
            if listening:
                self.note(f"tunnel: 127.0.0.1:{self.local_port} -> {self.hop} -> "
                          f"{self.target[0]}:{self.target[1]}")
                return
            text = self._stderr_text()
            self.close()
            if attempt < 2 and not _port_free(self.local_port):  # another process took the port we asked for
                continue
            raise self._failure(text)

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
        data: bytes = self._stderr.read()
        return data.decode("utf-8", "replace")

    def _failure(self, text: str) -> TunnelError:
        lines = [line for line in text.strip().splitlines() if line.strip()][-6:]
        detail = "\n    ".join(lines) if lines else "(ssh said nothing; it did not come up in time)"
        permanent = any(marker in text for marker in _PERMANENT_MARKERS)
        hint = ("The sshd refused this box's key: check --identity and that its public key is in the authorized "
                "keys of the controller box's door." if "Permission denied" in text else
                "Check the host, port and key, and that this box knows the host's key (ssh to it once by hand, "
                "or add it to ~/.ssh/known_hosts).")
        return TunnelError(f"the ssh tunnel through {self.hop} could not be brought up:\n    {detail}", hint=hint,
                           exit_code=ExitCode.PERMANENT if permanent else ExitCode.FAILURE)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            stop_process_group(proc)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
