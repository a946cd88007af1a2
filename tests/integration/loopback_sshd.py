"""A real OpenSSH sshd of the test's own, on loopback, for the farm door tests.

Its own host key, its own sshd_config (which Includes an sshd_config.d/ the
test controls, the way Debian's does), UsePAM no, its own AuthorizedKeysFile;
ports from 22900-22999 that are free right now. Nothing under /etc/ssh is
read or written. The directory lives under the account's home because sshd's
StrictModes refuses a key file below a world-writable directory such as /tmp.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
PORT_RANGE = range(22900, 23000)


def free_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """Ports in 22900-22999 nothing is bound to at this moment."""
    out: list[int] = []
    for port in PORT_RANGE:
        if taken and port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
        if len(out) == count:
            return out
    raise RuntimeError("no free ports left in 22900-22999")


class LoopbackSshd:
    def __init__(self, prefix: str = "fdlf9-"):
        self.base = Path(tempfile.mkdtemp(prefix=prefix, dir=Path.home()))
        os.chmod(self.base, 0o700)
        self.dropins = self.base / "sshd_config.d"
        self.dropins.mkdir()
        self.keys_dir = self.base / "keys"
        self.keys_dir.mkdir(mode=0o700)
        self.authorized_keys = self.keys_dir / "authorized_keys"
        self.host_key = self.base / "host_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key)], check=True)
        self.port = free_ports(1)[0]
        self.config = self.base / "sshd_config"
        self.pidfile = self.base / "sshd.pid"
        self.log = self.base / "sshd.log"
        self.config.write_text(
            f"Include {self.dropins}/*.conf\n"
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.pidfile}\n"
            "UsePAM no\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
            "LogLevel VERBOSE\n"
        )
        self.user = pwd.getpwuid(os.getuid()).pw_name

    # ---- lifecycle

    def check(self) -> subprocess.CompletedProcess:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd -t needs its privilege separation directory
        return subprocess.run([SSHD, "-t", "-f", str(self.config)], capture_output=True, text=True, timeout=30)

    def start(self) -> None:
        done = subprocess.run([SSHD, "-f", str(self.config), "-E", str(self.log)], capture_output=True, text=True,
                              timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"sshd did not start: {done.stderr}")
        self._wait_pid()

    def reload(self, ports: list[int]) -> None:
        """SIGHUP (sshd re-executes itself and rereads its configuration), then wait for the ports."""
        os.kill(self.pid(), signal.SIGHUP)
        self.wait_listening(ports)

    def pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def _wait_pid(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.pidfile.exists() and self.pidfile.read_text().strip():
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd wrote no pid file; log: {self.log.read_text() if self.log.exists() else ''}")

    def wait_listening(self, ports: list[int], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        pending = list(ports)
        while pending and time.monotonic() < deadline:
            port = pending[0]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pending.pop(0)
                    continue
            except OSError:
                time.sleep(0.1)
        if pending:
            raise RuntimeError(f"sshd does not listen on {pending}; log:\n{self.log.read_text()}")

    def stop(self) -> None:
        try:
            os.kill(self.pid(), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        deadline = time.monotonic() + 5
        while self.pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- clients

    def ssh_opts(self, key: Path, port: int) -> list[str]:
        return ["-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "ConnectTimeout=10", "-p", str(port)]

    def ssh(self, key: Path, port: int, *args: str, input: str | None = None, timeout: float = 30):
        return subprocess.run(["ssh", *self.ssh_opts(key, port), *args], capture_output=True, text=True,
                              input=input if input is not None else "", timeout=timeout)


class Listener:
    """A stand-in for the controller's training port: greets every connection with one line."""

    def __init__(self, port: int, greeting: bytes = b"fdl-controller-hello\n"):
        self.port = port
        self.greeting = greeting
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.sendall(self.greeting)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()
