"""The --ssh hop: a real `ssh -N -L SOCKET:...` through a real sshd on loopback, torn down on exit; a failed
forward is transient, and says what this box can tell about it (its known_hosts), never what the network said
(regression: an sshd dropping unauthenticated connections under its default MaxStartups, or refusing the key,
made a --persist worker exit 2 and power off). What is permanent about a door (no known_hosts entry, an
unreadable identity) is decided before the first dial: tests/unit/agent/test_permanent.py."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import socket
import stat
import subprocess
import threading
import time

import pytest

from fdl.agent.options import SshHop
from fdl.agent.tunnel import Tunnel, TunnelError
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


def _http_get(socket_path: str, path: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(socket_path)
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1]


def _tcp_listeners(pid: int) -> list[int]:
    """Inodes of TCP sockets in LISTEN state that process pid holds."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    listening.add(int(fields[9]))
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and int(target[8:-1]) in listening:
                held.append(int(target[8:-1]))
    return held


def test_dials_through_a_private_unix_socket_and_tears_it_down(sshd, web):
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    tunnel = Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": sshd.ssh_command})
    argv = tunnel.argv("/x/controller.sock")
    assert "ExitOnForwardFailure=yes" in argv and "BatchMode=yes" in argv and "StreamLocalBindMask=0177" in argv
    assert argv[argv.index("-L") + 1] == f"/x/controller.sock:127.0.0.1:{web}"
    with tunnel:
        path = tunnel.socket_path
        assert _http_get(path, "/state.json") == b'{"phase": "waiting"}'
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700  # nobody else may enter ...
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0  # ... or connect
        assert _tcp_listeners(tunnel.proc.pid) == []  # no TCP port other accounts could reach
        pid = tunnel.proc.pid
    assert not os.path.exists(os.path.dirname(path))
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # ssh is gone


def test_another_account_cannot_reach_the_forward(sshd, web):
    # regression: the forward listened on 127.0.0.1:PORT, and every local account could reach the controller
    # through it (the port shows in /proc/net/tcp); a unix socket in a 0700 directory is this account's alone
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print('refused', e.errno); sys.exit(0)\n"
             "print('connected')\n")
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    with Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key),
                environ={"FDL_SSH_COMMAND": sshd.ssh_command}) as tunnel:
        line = f"/usr/bin/python3 -c \"$0\" {tunnel.socket_path}"
        done = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", line, probe], capture_output=True, text=True,
                              timeout=30)
        mine = _http_get(tunnel.socket_path, "/state.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused 13"), done.stdout  # EACCES: the directory is not theirs to enter
    assert mine == b'{"phase": "waiting"}'


def test_a_key_the_door_refuses_is_transient(sshd, tmp_path, web):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", web), identity=str(stranger),
               environ={"FDL_SSH_COMMAND": sshd.ssh_command}).open()
    assert err.value.exit_code == 1 and err.value.reason == "tunnel"  # what the door said is the network's
    assert "Permission denied" in err.value.message and "--identity" in err.value.hint
    assert "MaxStartups" in err.value.hint


def test_an_unknown_host_key_fails_the_dial_and_says_so(sshd, tmp_path, web):
    # this box's own known_hosts has no key for the door (any more: before the first dial it was permanent)
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    command = f"ssh -F /dev/null -o UserKnownHostsFile={empty} -o StrictHostKeyChecking=yes"
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": command}).open()
    assert err.value.exit_code == 1 and "holds no host key for the door" in err.value.message
    assert str(empty) in err.value.message and "known_hosts" in err.value.hint


def test_a_changed_host_key_is_transient_and_says_so(sshd, tmp_path, web):
    """A key that differs from known_hosts is what the door presents: the network's word, never a poweroff."""
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    command = f"ssh -F /dev/null -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": command}).open()
    assert err.value.exit_code == 1 and err.value.reason == "tunnel", err.value.message
    assert "none of which is in this box's known_hosts" in err.value.message
    assert "re-keyed" in err.value.message and "--persist keeps re-dialing" in err.value.hint


def _knowing(tmp_path, sshd, port: int) -> str:
    """An ssh command whose known_hosts holds the test door's host key for 127.0.0.1:port."""
    known = tmp_path / f"known_hosts_{port}"
    kind, blob = (sshd.dir / "host_key.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{port} {kind} {blob}\n")
    return f"ssh -F /dev/null -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"


def test_no_sshd_listening_is_transient(sshd, tmp_path):
    port = free_port()
    hop = SshHop(host="127.0.0.1", user=user_name(), port=port)
    with pytest.raises(TunnelError) as err:
        Tunnel(hop, ("127.0.0.1", 1337), identity=str(sshd.key),
               environ={"FDL_SSH_COMMAND": _knowing(tmp_path, sshd, port)}, connect_timeout_s=3).open()
    assert err.value.exit_code == 1 and "Connection refused" in err.value.message


def test_an_sshd_dropping_connections_under_maxstartups_is_transient(sshd, web):
    # regression: sshd's default MaxStartups 10:30:100 drops unauthenticated connections under load; ssh exits
    # 255 and the next connection to the door reads an SSH- banner again, which read as "the key was refused"
    # (exit 2: a --persist worker powered off). The door is flooded while ssh dials, and freed once ssh gave up.
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    tunnel = Tunnel(hop, ("127.0.0.1", web), identity=str(sshd.key), environ={"FDL_SSH_COMMAND": sshd.ssh_command},
                    connect_timeout_s=5)
    flood: list[socket.socket] = []
    attempts = 0
    while len(flood) < 100 and attempts < 20_000:  # MaxStartups' "full": sshd then drops every new connection
        attempts += 1  # past 10 unauthenticated connections sshd drops some at random: only live ones count
        conn = socket.create_connection(("127.0.0.1", sshd.port), timeout=5)
        try:
            banner = conn.recv(64)
        except OSError:
            banner = b""
        if banner.startswith(b"SSH-"):
            flood.append(conn)
        else:
            conn.close()
    assert len(flood) == 100, f"only {len(flood)} unauthenticated connections held after {attempts} attempts"

    def release() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            proc = tunnel.proc
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.002)
        for conn in flood:
            conn.close()

    freer = threading.Thread(target=release, daemon=True)
    freer.start()
    try:
        with pytest.raises(TunnelError) as err:
            tunnel.open()
    finally:
        tunnel.close()  # had it come up, nothing of it outlives the test
        freer.join(70)
        for conn in flood:
            conn.close()
    assert err.value.exit_code == 1, err.value.message
    assert "kex_exchange_identification" in err.value.message or "Connection closed" in err.value.message
    with tunnel:  # the door is fine again: the same key and known_hosts get through
        assert _http_get(tunnel.socket_path, "/state.json") == b'{"phase": "waiting"}'


# regression: the decision permanent/transient used to read ssh's "Permission denied" wording. A wrapper that
# execs the real ssh but says other words on stderr (as another locale, LogLevel or OpenSSH release would) must
# not change it.

def _lying_ssh(tmp_path, sshd, words: str) -> str:
    return reworded_ssh(tmp_path / "bin" / "ssh-words", sshd.ssh_command, words)


def test_ssh_wording_decides_nothing(sshd, tmp_path, web):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    hop = SshHop(host="127.0.0.1", user=user_name(), port=sshd.port)
    for command, shown in ((_lying_ssh(tmp_path, sshd, "Host key verification failed."),
                            "Host key verification failed."),
                           (f"{sshd.ssh_command} -o LogLevel=QUIET", "ssh said nothing")):
        with pytest.raises(TunnelError) as err:
            Tunnel(hop, ("127.0.0.1", web), identity=str(stranger), environ={"FDL_SSH_COMMAND": command}).open()
        assert err.value.exit_code == 1, command  # a refused key stays transient, whatever ssh says
        assert shown in err.value.message  # ssh's words are shown, never used to decide


def test_behind_a_proxy_the_door_is_not_checked():
    hop = SshHop(host="door.example", port=2222)
    assert Tunnel(hop, ("127.0.0.1", 1), environ={"FDL_SSH_COMMAND": "ssh -F /dev/null"}).endpoint() == \
        ("door.example", 2222)
    behind = Tunnel(hop, ("127.0.0.1", 1), environ={"FDL_SSH_COMMAND": "ssh -F /dev/null -o ProxyJump=op@jump"})
    assert behind.endpoint() is None and behind.host_key_problem() is None

