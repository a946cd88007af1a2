"""Helpers for controller tests: a fake clock, free ports in this suite's range, a running server."""

from __future__ import annotations

import contextlib
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

FIRST_PORT, LAST_PORT = 21000, 21999
#: The token of a test window that names none: every window has one (loopback is not a credential).
TEST_TOKEN = "7bb9f2ab5311017a3befdfcc378eff301b4171e0ad8055ffefc14122a94b07c9"  # fdl refuses a token under 128 bits


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def free_port(host: str = "127.0.0.1", pairs: bool = True, span: tuple[int, int] = (FIRST_PORT, LAST_PORT)) -> int:
    """A TCP port in span (default 21000-21999) that nothing listens on (and, with pairs, whose next port is
    free too). A suite sharing the machine with others passes its own span."""
    ports = list(range(span[0], span[1]))
    random.shuffle(ports)
    for port in ports:
        if all(_bindable(host, p) for p in ((port, port + 1) if pairs else (port,))):
            return port
    raise RuntimeError(f"no free port in {span[0]}-{span[1]}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def serving(policy, *, host: str = "127.0.0.1", limits=None, span: tuple[int, int] = (FIRST_PORT, LAST_PORT)
            ) -> Iterator:
    """A real controller on host:<free port in span> in a background thread, stopped afterwards. A policy
    without a token (and without the insecure_no_token opt-out) gets TEST_TOKEN: `server.policy.token`."""
    from fdl.controller.server import ControllerServer

    if policy.token is None and not policy.insecure_no_token:
        policy = policy.with_token(TEST_TOKEN)
    for _ in range(5):
        server = ControllerServer(policy, host=host, port=free_port(host, span=span), limits=limits)
        try:
            server.start()
        except Exception as exc:  # lost a race for the port: try another
            if "already in use" not in str(exc):
                raise
            continue
        try:
            yield server
        finally:
            server.stop()
        return
    raise RuntimeError("could not bind a controller port")


class PeerNamespace:
    """A network namespace joined to the host by a veth pair: a real non-loopback peer.

    Host side HOST_ADDR, namespace side PEER_ADDR: .1 and .2 of a /24 in 10.213.0.0/16 (this suite's own)
    that no interface of this machine holds, picked under a lock, so runs of two clones at once each get
    their own. Needs root.
    """

    LOCK = Path("/run/lock" if Path("/run/lock").is_dir() else tempfile.gettempdir()) / "fdl-test-peer-subnets.lock"

    def __init__(self, tag: str):
        self.name = f"fdlc5-{tag}"
        self.host_if = f"fdlc5h{tag}"[:15]
        self.peer_if = f"fdlc5n{tag}"[:15]
        self.HOST_ADDR = self.PEER_ADDR = ""

    def _ip(self, *args: str, ns: bool = False) -> None:
        import subprocess

        cmd = (["ip", "netns", "exec", self.name] if ns else []) + ["ip", *args]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)

    def create(self) -> PeerNamespace:
        import fcntl
        import subprocess

        self.destroy()
        with open(self.LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held until this namespace's subnet is on an interface
            held = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                                  check=True).stdout
            third = next((n for n in range(5, 255) if f" 10.213.{n}." not in held), None)
            if third is None:
                raise RuntimeError("every /24 of 10.213.0.0/16 is in use on this machine")
            self.HOST_ADDR, self.PEER_ADDR = f"10.213.{third}.1", f"10.213.{third}.2"
            self._ip("netns", "add", self.name)
            self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
            self._ip("link", "set", self.peer_if, "netns", self.name)
            self._ip("addr", "add", f"{self.HOST_ADDR}/24", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        self._ip("addr", "add", f"{self.PEER_ADDR}/24", "dev", self.peer_if, ns=True)
        self._ip("link", "set", self.peer_if, "up", ns=True)
        self._ip("link", "set", "lo", "up", ns=True)
        # Check before any traffic: the namespace exists and both ends hold their addresses.
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert self.name in listed.split(), listed
        here = subprocess.run(["ip", "-o", "addr", "show", "dev", self.host_if], capture_output=True, text=True,
                              check=True).stdout
        there = subprocess.run(["ip", "netns", "exec", self.name, "ip", "-o", "addr", "show", "dev", self.peer_if],
                               capture_output=True, text=True, check=True).stdout
        assert f"{self.HOST_ADDR}/24" in here and f"{self.PEER_ADDR}/24" in there, (here, there)
        return self

    def destroy(self) -> None:
        import subprocess

        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)

    def run(self, argv: list[str], *, env: dict | None = None, cwd=None, timeout: float = 300):
        """Run argv inside the namespace (same file system, its own network)."""
        import subprocess

        return subprocess.run(["ip", "netns", "exec", self.name, *argv], env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)
