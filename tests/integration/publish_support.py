"""Helpers for the publish tests: an isolated environment, tiny crates, a loopback sshd of our own."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI, need_root_or_skip, real_home

REAL_HOME = real_home()  # rustup's and cargo's, which live there; the tests' own HOME is the run's
PORTS = range(22800, 22900)  # this suite's loopback port range


def publish_env(home: Path, **extra: str) -> dict:
    """Environment for an fdl subprocess with its own HOME (so ~/.flodl/run is per test), cargo still usable."""
    env = {
        "HOME": str(home),
        "RUSTUP_HOME": os.environ.get("RUSTUP_HOME", str(REAL_HOME / ".rustup")),
        "CARGO_HOME": os.environ.get("CARGO_HOME", str(REAL_HOME / ".cargo")),
        "CARGO_NET_OFFLINE": "true",
        "PATH": os.pathsep.join(filter(None, [str(REAL_HOME / ".cargo" / "bin"), os.environ.get("PATH")])),
    }
    for name in ("LIBTORCH_PATH", "ROCM_PATH", "HIP_PATH", "HSA_PATH", "CARGO_TARGET_DIR", "RSYNC_RSH"):
        env[name] = ""
    env.update(extra)
    return env


def need_cargo_or_skip() -> None:
    if shutil.which("cargo", path=publish_env(REAL_HOME)["PATH"]) is None:
        if IN_CI:
            pytest.fail("CI must provide a Rust toolchain (cargo) for the publish build-gate tests")
        pytest.skip("needs cargo (a Rust toolchain) for a real build gate")


def make_crate(root: Path, name: str = "tiny", message: str = "hello") -> Path:
    """A dependency-free binary crate (builds offline)."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "Cargo.toml").write_text(
        f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n')
    (root / "src" / "main.rs").write_text(f'fn main() {{ println!("{message}"); }}\n')
    return root


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="fdl", GIT_AUTHOR_EMAIL="fdl@example.invalid",
               GIT_COMMITTER_NAME="fdl", GIT_COMMITTER_EMAIL="fdl@example.invalid", GIT_CONFIG_GLOBAL="/dev/null")
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


class LoopbackSshd:
    """An OpenSSH sshd of this test's own on 127.0.0.1 (own host key, config, key file; UsePAM no)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.host_key = self.dir / "host_ed25519"
        self.client_key = self.dir / "client_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.known_hosts = self.dir / "known_hosts"
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        for key in (self.host_key, self.client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fdlp8-test", "-f", str(key)],
                           check=True, stdin=subprocess.DEVNULL)
        self.authorized_keys.write_text("")
        self.authorized_keys.chmod(0o600)

    @property
    def client_public(self) -> str:
        return (self.dir / "client_ed25519.pub").read_text().strip()

    def authorize(self, options: str | None = None) -> None:
        """Install the client key, with authorized_keys options (e.g. a forced rrsync command) or none."""
        line = f"{options} {self.client_public}" if options else self.client_public
        self.authorized_keys.write_text(line + "\n")

    @property
    def rsync_rsh(self) -> str:
        """The remote shell for rsync/ssh clients: this sshd's host key pinned, no user config."""
        return (f"ssh -F /dev/null -o UserKnownHostsFile={self.known_hosts} -o GlobalKnownHostsFile=/dev/null "
                f"-o StrictHostKeyChecking=yes")

    def start(self) -> LoopbackSshd:
        need_root_or_skip("runs its own sshd that logs in as this user")
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd):
            pytest.fail("openssh-server is missing (scripts/apt-test.txt lists it)")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        for port in PORTS:
            if not _port_free(port):
                continue
            config = self.dir / "sshd_config"
            config.write_text("\n".join([
                f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {self.host_key}",
                f"PidFile {self.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.authorized_keys}",
                "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", f"AllowUsers {self.user}",
                "LogLevel ERROR", "",
            ]))
            process = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if _wait_listening(port, process):
                self.port, self.process = port, process
                host_pub = (self.dir / "host_ed25519.pub").read_text().split()
                self.known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
                return self
            process.kill()
            process.wait()
        pytest.fail("no free loopback port in 22800-22899 for the test sshd")

    def ssh(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.rsync_rsh.split(), "-p", str(self.port), "-i", str(self.client_key), "-o", "BatchMode=yes",
             "-o", "IdentitiesOnly=yes", f"{self.user}@127.0.0.1", *command],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def rsync(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        rsh = f"{self.rsync_rsh} -p {self.port} -i {self.client_key} -o BatchMode=yes -o IdentitiesOnly=yes"
        return subprocess.run(["rsync", "-e", rsh, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_listening(port: int, process: subprocess.Popen, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False
