"""Helpers for the `fdl join` tests: free ports in this suite's range, a loopback sshd, tiny programs on disk."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import random
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import descendants

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
        kind, blob = host_key.with_suffix(".pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[{self.listen}]:{self.port} {kind} {blob}\n")
        self.start()
        return self

    def start(self) -> None:
        """Start (or, after stop(), restart) the daemon with its configuration, key and port."""
        argv = [SSHD, "-D", "-f", str(self.dir / "sshd_config"), "-E", str(self.dir / "sshd.log")]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.listen, self.port), 0.5):
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"test sshd did not come up: {(self.dir / 'sshd.log').read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill the daemon and every session it serves (each session's sshd sets up a session of its own, so its
        process group is not the daemon's): what a crash or a restart of the door does to its clients."""
        if self.proc is None:
            return
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


@contextlib.contextmanager
def local_account(tag: str) -> Iterator[pwd.struct_passwd]:
    """A real, locked-password account of this machine for the test's length (useradd, no home), named after the
    testbed prefix so that parallel runs do not collide; removed with its group afterwards."""
    name = f"{os.environ.get('FDL_TESTBED_PREFIX') or 'fdlj'}{tag}"[:32]
    subprocess.run(["userdel", name], capture_output=True)  # a crashed run's leftover
    subprocess.run(["groupdel", name], capture_output=True)
    for attempt in range(50):  # /etc/passwd is locked while other useradd runs finish
        made = subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", "-U", name],
                              capture_output=True, text=True)
        if made.returncode == 0:
            break
        if attempt == 49:
            raise RuntimeError(f"useradd {name}: {made.stderr.strip()}")
        time.sleep(0.1)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


def user_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


class SmallDisk:
    """A small tmpfs of its own (root mounts it, mode 1777), which another real account can fill to the last block
    and, with `inodes`, to the last inode: a full file system that nobody on the worker's side filled."""

    def __init__(self, where: Path, *, size_kb: int = 1024, inodes: int | None = None, read_only: bool = False):
        self.path = Path(where)
        self.options = f"size={size_kb}k,mode=1777" + (f",nr_inodes={inodes}" if inodes else "") + \
            (",ro" if read_only else "")
        self.inodes = inodes

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", self.options, "fdl-test-small", str(self.path)], check=True,
                       capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def fill(self, account: pwd.struct_passwd) -> None:
        """As `account` (setpriv: its uid, gid and groups only), write until the disk refuses (ENOSPC), then make
        empty files until it refuses those too when the disk has an inode limit."""
        script = "dd if=/dev/zero of=filler/blocks bs=16k 2>/dev/null; "
        if self.inodes:
            script += "i=0; while touch filler/inode-$i 2>/dev/null; do i=$((i+1)); done; "
        setpriv = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups"]
        subprocess.run([*setpriv, "sh", "-c", f"mkdir -p filler; {script}exit 0"], cwd=self.path, check=True,
                       capture_output=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(self.path)})
        assert os.stat(self.path / "filler").st_uid == account.pw_uid
        try:  # full for everyone: root too (tmpfs keeps no reserve)
            with open(self.path / "probe", "wb") as handle:
                handle.write(b"x" * 4096)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        else:
            raise AssertionError(f"{self.path} is not full after {account.pw_name} filled it")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path / "probe")

    def free(self) -> None:
        """What its owner (or an operator) does once someone notices: the filler's files go."""
        subprocess.run(["rm", "-rf", str(self.path / "filler")], check=True)
