"""The --ssh hop: a real `ssh -N -L` through a real sshd on loopback, torn down on exit."""

from __future__ import annotations

import contextlib
import functools
import http.server
import socket
import subprocess
import threading
import urllib.request

import pytest

from fdl.agent.options import SshHop
from fdl.agent.tunnel import Tunnel, TunnelError, ssh_server_answers
from fdl.errors import PermanentError
from tests.conftest import need_root_or_skip
from tests.join_util import LoopbackSshd, free_port, reworded_ssh, user_name


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


def test_an_unknown_host_key_is_permanent_and_says_so(sshd, tmp_path, web):
    # the door answered and this box refused its host key: re-dialing with the same known_hosts cannot help
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    command = f"ssh -F /dev/null -o UserKnownHostsFile={empty} -o StrictHostKeyChecking=yes"
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": command}).open()
    assert err.value.exit_code == 2 and "Host key verification failed" in err.value.message
    assert "known_hosts" in err.value.hint


def test_no_sshd_listening_is_transient(sshd):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=free_port())
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", 1337), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": sshd.ssh_command},
               connect_timeout_s=3).open()
    assert err.value.exit_code == 1 and "Connection refused" in err.value.message
    assert "No ssh server answered" in err.value.hint


# regression: the decision permanent/transient used to read ssh's "Permission denied" wording. A wrapper that
# execs the real ssh but says other words on stderr (as another locale, LogLevel or OpenSSH release would) must
# not change it; ssh's exit status and what the server at the resolved address answers decide.

def _lying_ssh(tmp_path, sshd, words: str) -> str:
    return reworded_ssh(tmp_path / "bin" / "ssh-words", sshd.ssh_command, words)


def test_a_refused_key_is_permanent_whatever_ssh_says(sshd, tmp_path, web):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    for command, shown in ((_lying_ssh(tmp_path, sshd, "Connection refused"), "Connection refused"),
                           (f"{sshd.ssh_command} -o LogLevel=QUIET", "ssh said nothing")):
        with pytest.raises(TunnelError) as err:
            Tunnel(hop, ("127.0.0.1", web), identity=str(stranger), environ={"FDL_SSH_COMMAND": command}).open()
        assert err.value.exit_code == 2, command
        assert "Permission denied" not in err.value.message and "--identity" in err.value.hint
        assert shown in err.value.message  # ssh's words are shown, never used to decide


def test_nothing_listening_is_transient_whatever_ssh_says(sshd, tmp_path):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=free_port())
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", 1337), identity=str(sshd.key), connect_timeout_s=3,
               environ={"FDL_SSH_COMMAND": _lying_ssh(tmp_path, sshd, "Permission denied (publickey).")}).open()
    assert err.value.exit_code == 1 and "Permission denied (publickey)." in err.value.message


@pytest.fixture
def silent_listener():
    """A TCP listener that accepts and never says a word (no SSH identification line)."""
    server = socket.create_server(("127.0.0.1", free_port()))
    held: list[socket.socket] = []

    def serve():
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in held:
        conn.close()


def test_a_listener_that_sends_no_banner_is_transient(sshd, tmp_path, silent_listener):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=silent_listener)
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", 1337), identity=str(sshd.key), connect_timeout_s=2,
               environ={"FDL_SSH_COMMAND": _lying_ssh(tmp_path, sshd, "Permission denied (publickey).")}).open()
    assert err.value.exit_code == 1 and "No ssh server answered" in err.value.hint


def test_the_banner_check_reads_the_identification_line():
    # RFC 4253 4.2: other lines may come before the version string; a non-SSH answer is no SSH server
    def serve(payload: bytes) -> int:
        server = socket.create_server(("127.0.0.1", 0))

        def answer():
            conn = server.accept()[0]
            with conn:
                conn.sendall(payload)
            server.close()

        threading.Thread(target=answer, daemon=True).start()
        return server.getsockname()[1]

    assert ssh_server_answers("127.0.0.1", serve(b"welcome\r\nSSH-2.0-OpenSSH_9.2\r\n"), 5)
    assert not ssh_server_answers("127.0.0.1", serve(b"HTTP/1.1 400 Bad Request\r\n\r\n"), 5)
    assert not ssh_server_answers("127.0.0.1", serve(b"SSH-2.0-cut"), 5)  # no whole line before the close
    assert not ssh_server_answers("127.0.0.1", free_port(), 5)


def test_behind_a_proxy_the_door_is_not_probed():
    hop = SshHop(host="door.example", port=2222)
    assert Tunnel(hop, ("127.0.0.1", 1), environ={"FDL_SSH_COMMAND": "ssh -F /dev/null"}).endpoint() == \
        ("door.example", 2222)
    behind = Tunnel(hop, ("127.0.0.1", 1), environ={"FDL_SSH_COMMAND": "ssh -F /dev/null -o ProxyJump=op@jump"})
    assert behind.endpoint() is None


def test_a_missing_identity_file_is_permanent(tmp_path):
    with pytest.raises(PermanentError, match="no such key file"):
        Tunnel(SshHop(host="127.0.0.1"), ("127.0.0.1", 1), identity=str(tmp_path / "none")).open()
