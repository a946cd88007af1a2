"""The --ssh hop: a real `ssh -N -L` through a real sshd on loopback, torn down on exit."""

from __future__ import annotations

import functools
import http.server
import socket
import subprocess
import threading
import urllib.request

import pytest

from fdl.agent.options import SshHop
from fdl.agent.tunnel import Tunnel, TunnelError
from fdl.errors import PermanentError
from tests.conftest import need_root_or_skip
from tests.join_util import LoopbackSshd, free_port, user_name


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    need_root_or_skip("the test sshd logs the test user in with a key it generates (root login over loopback)")
    with LoopbackSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def web(tmp_path):
    (tmp_path / "state.json").write_text('{"phase": "waiting"}')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_dials_through_the_forward_and_tears_it_down(sshd, web):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    tunnel = Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": sshd.ssh_command})
    assert "ExitOnForwardFailure=yes" in tunnel.argv(1) and "BatchMode=yes" in tunnel.argv(1)
    with tunnel:
        host, port = tunnel.address
        body = urllib.request.urlopen(f"http://{host}:{port}/state.json", timeout=10).read()
        assert body == b'{"phase": "waiting"}'
        pid = tunnel.proc.pid
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2)
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # ssh is gone


def test_a_key_the_door_refuses_is_permanent(sshd, tmp_path, web):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", web), identity=str(stranger),
               environ={"FDL_SSH_COMMAND": sshd.ssh_command}).open()
    assert err.value.exit_code == 2
    assert "Permission denied" in err.value.message and "--identity" in err.value.hint


def test_an_unknown_host_key_is_transient_and_says_so(sshd, tmp_path, web):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    command = f"ssh -F /dev/null -o UserKnownHostsFile={empty} -o StrictHostKeyChecking=yes"
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": command}).open()
    assert err.value.exit_code == 1 and "Host key verification failed" in err.value.message


def test_no_sshd_listening_is_transient(sshd):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=free_port())
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", 1337), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": sshd.ssh_command},
               connect_timeout_s=3).open()
    assert err.value.exit_code == 1 and "Connection refused" in err.value.message


def test_a_missing_identity_file_is_permanent(tmp_path):
    with pytest.raises(PermanentError, match="no such key file"):
        Tunnel(SshHop(host="127.0.0.1"), ("127.0.0.1", 1), identity=str(tmp_path / "none")).open()
