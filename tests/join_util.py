"""Helpers for the `fdl join` tests: free ports in this suite's range, a loopback sshd, tiny programs on disk."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import stat
import subprocess
import time
from pathlib import Path

PORTS = range(23000, 24000)  # the range the join tests may listen on
SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def free_port(host: str = "127.0.0.1") -> int:
    """A port in PORTS nobody listens on right now (in every family a controller bound to host holds)."""
    from fdl.controller.listen import port_free

    candidates = list(PORTS)
    random.shuffle(candidates)
    for port in candidates:
        if port_free(host, port):
            return port
    raise RuntimeError("no free port in 23000-23999")


def write_program(path: Path, body: str, python: str | None = None) -> Path:
    """An executable script: body under a shebang for this suite's Python (or `python`)."""
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{python or sys.executable}\n{body.lstrip()}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def reworded_ssh(path: Path, command: str, words: str) -> str:
    """`command` (an FDL_SSH_COMMAND starting with ssh) behind a wrapper at path that runs the real ssh, passes
    its exit status and stdout through, and replaces each line ssh writes on stderr by `words`: ssh as another
    locale, LogLevel or OpenSSH release might word it."""
    write_program(path, f"""
import subprocess, sys
done = subprocess.run(["ssh", *sys.argv[1:]], stderr=subprocess.PIPE)
for _ in done.stderr.splitlines():
    sys.stderr.write({words!r} + "\\n")
sys.exit(done.returncode)
""")
    words_of = command.split(" ", 1)
    assert words_of[0] == "ssh", command
    return " ".join([str(path), *words_of[1:]])


class LoopbackSshd:
    """A real OpenSSH daemon on 127.0.0.1 that lets the current (root) user in with a key made for it.

    `ssh_command` is what FDL_SSH_COMMAND must say for a client to trust it
    without touching anyone's ~/.ssh.
    """

    def __init__(self, workdir: Path, *, listen: str = "127.0.0.1", extra: tuple[str, ...] = ()):
        self.dir = Path(workdir)
        self.listen = listen
        self.port = free_port(listen)
        self.key = self.dir / "client_key"
        self.known_hosts = self.dir / "known_hosts"
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    @property
    def ssh_command(self) -> str:
        return f"ssh -F /dev/null -o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes"

    def __enter__(self) -> LoopbackSshd:
        self.dir.mkdir(parents=True, exist_ok=True)
        host_key = self.dir / "host_key"
        for key in (host_key, self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        authorized = self.dir / "authorized_keys"
        authorized.write_text(self.key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        conf = self.dir / "sshd_config"
        conf.write_text("\n".join([
            f"ListenAddress {self.listen}", f"Port {self.port}", f"HostKey {host_key}",
            f"PidFile {self.dir / 'sshd.pid'}", "UsePAM no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "PermitRootLogin prohibit-password",
            f"AuthorizedKeysFile {authorized}", "StrictModes no", "AllowTcpForwarding yes",
            f"Subsystem sftp {SFTP_SERVER}", "LogLevel VERBOSE", *self.extra, ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd -t needs its privilege separation directory
        subprocess.run([SSHD, "-t", "-f", str(conf)], check=True, capture_output=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(self.dir / "sshd.log")],
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        kind, blob = host_key.with_suffix(".pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[{self.listen}]:{self.port} {kind} {blob}\n")
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.listen, self.port), 0.5):
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"test sshd did not come up: {(self.dir / 'sshd.log').read_text()}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
