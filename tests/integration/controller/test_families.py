"""The controller holds its port in every address family its bind implies, and will not start beside a squatter.

regression (issue 37 finding 2): another account bound `[::]:PORT` IPv6-only before a run; the launcher bound
`0.0.0.0:PORT` and started without complaint, and every worker that dialed a dual-stack name (IPv6 first)
reached the squatter. The squatters here are real processes of another real account (nobody).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from fdl.controller.listen import holds
from fdl.controller.policy import RunPolicy
from fdl.controller.server import ControllerServer
from fdl.errors import FdlError
from tests.conftest import fdl_env
from tests.controller_util import TEST_TOKEN, free_port, tls_socket
from tests.integration.join.helpers import Squatter, agent_env

POLICY = RunPolicy(window_s=60, token=TEST_TOKEN)


def identify(host: str, port: int) -> dict:
    with tls_socket(port, host) as sock:
        sock.sendall(b"GET /join/id HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return json.loads(data.partition(b"\r\n\r\n")[2])


def test_what_a_bind_holds() -> None:
    shown = {bind: [(h.address, h.serve) for h in holds(bind)] for bind in ("0.0.0.0", "::", "127.0.0.1", "::1",
                                                                           "10.1.2.3", "localhost")}
    assert shown["0.0.0.0"] == [("0.0.0.0", True), ("::", True)]
    assert shown["::"] == [("::", True), ("0.0.0.0", True)]
    assert shown["127.0.0.1"] == [("127.0.0.1", True), ("::1", True)]
    assert shown["::1"] == [("::1", True), ("127.0.0.1", True)]
    assert shown["10.1.2.3"] == [("10.1.2.3", True)]
    assert set(shown["localhost"]) >= {("127.0.0.1", True), ("::1", True)}


@pytest.mark.parametrize("bind, other", [("0.0.0.0", "::1"), ("127.0.0.1", "::1"), ("::1", "127.0.0.1")])
def test_a_controller_answers_in_both_families(bind: str, other: str) -> None:
    port = free_port(bind)
    with ControllerServer(POLICY, host=bind, port=port) as server:
        first = identify("127.0.0.1" if bind != "::1" else "::1", port)
        second = identify(other, port)
    assert first["controller_id"] == second["controller_id"] == server.machine.controller_id


@pytest.mark.parametrize("bind, squat", [("0.0.0.0", "::"), ("127.0.0.1", "::1"), ("0.0.0.0", "::1")])
def test_an_ipv6_only_squatter_of_another_account_stops_the_controller(bind: str, squat: str) -> None:
    port = free_port(bind)
    squatter = Squatter(port, host=squat)
    try:
        owner = subprocess.run(["ss", "-Hltn6", f"sport = :{port}"], capture_output=True, text=True).stdout
        assert f":{port}" in owner  # another account really listens on IPv6 only ...
        with pytest.raises(FdlError) as refused:
            ControllerServer(POLICY, host=bind, port=port).start()
        with socket.socket() as probe:  # ... and the refused controller kept nothing
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("0.0.0.0" if bind == "0.0.0.0" else "127.0.0.1", port))
    finally:
        squatter.stop()
    held = {"0.0.0.0": "[::]", "127.0.0.1": "[::1]"}[bind]  # the IPv6 socket the bind implies
    assert f"cannot hold port {port} on {held}:{port} (IPv6, implied by the bind address): another process holds " \
           f"it" in refused.value.message
    assert "ss -ltnp" in (refused.value.hint or "")


def test_the_launcher_refuses_to_start_beside_an_ipv6_squatter(tmp_path) -> None:
    from tests.integration.launch.helpers import write_project

    port = free_port("0.0.0.0")
    cluster = {"cluster": {"controller": {"host": "127.0.0.1", "port": port, "bind": "0.0.0.0",
                                          "join": {"discovery": True, "max_hosts": 2, "window_s": 30}},
                           "workers": [{"host": "here", "address": "127.0.0.1", "local_devices": "cpu:1"}]}}
    project = write_project(tmp_path / "proj", {"train": {"cluster": True, "bin": "/bin/true"}}, cluster)
    squatter = Squatter(port, host="::")
    try:
        result = subprocess.run([sys.executable, "-m", "fdl", "@cluster", "train"], cwd=project,
                                env=fdl_env(agent_env(tmp_path / "home")), capture_output=True, text=True,
                                timeout=120)
    finally:
        squatter.stop()
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot hold port {port} on [::]:{port} (IPv6, implied by the bind address): another process " \
           f"holds it" in result.stderr
    assert "Traceback" not in result.stderr
