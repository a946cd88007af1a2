"""`fdl status` and `fdl start` against a real controller: output, exit codes, address resolution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from fdl.controller.policy import RunPolicy
from fdl.controller.protocol import Hello
from fdl.hostside.checks.devices import parse_devices
from tests.conftest import REPO, fdl_env, need_root_or_skip, run_fdl
from tests.controller_util import TEST_TOKEN, PeerNamespace, free_port, https_stand_in, serving

TOKEN = "6af98521f67cd26e30c6c69fcf1e7b9d79088ef3422149f408ff3551c65f16b7"  # fdl refuses a token under 128 bits


def join(server, host: str, devices: str = "cpu:1", **kw) -> None:
    hello = Hello(host=host, devices=parse_devices(devices), **kw)
    server.call(lambda m: m.hello(hello, peer="127.0.0.1", trusted=True))


def addr(server) -> str:
    return f"127.0.0.1:{server.port}"


def with_token(server) -> dict:
    """The environment that hands `fdl start` the run's token (never its command line)."""
    return {"FDL_JOIN_TOKEN": server.policy.token}


# ---------------------------------------------------------------- fdl status


def test_status_shows_phase_hardware_countdown_and_switch(tmp_path: Path) -> None:
    with serving(RunPolicy(start="manual", quorum_hosts=2, window_s=600)) as server:
        join(server, "node-a", "0,1", gpu_names=("NVIDIA H100", "NVIDIA H100"), run_id="r1")
        result = run_fdl("status", "--addr", addr(server), cwd=tmp_path, env=with_token(server))
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert f"run r1 at {addr(server)}: waiting" in out and "start: manual" in out
        assert "closes in 9m5" in out or "closes in 10m00s" in out  # a countdown from the 600 s window
        assert "quorum: not met: 1 host(s), 2 rank(s) joined; needs 2 host(s)" in out
        assert "node-a" in out and "2 x NVIDIA H100" in out
        assert result.stderr == "" and "UNVERIFIED" not in out  # the run's token proved this state
        join(server, "node-b", "cpu:2", run_id="r1")
        out = run_fdl("status", "--addr", addr(server), cwd=tmp_path, env=with_token(server)).stdout
        assert ": staging" in out and "roster startable, fire with fdl start" in out and "2 CPU rank(s)" in out


def test_plain_status_does_not_present_a_stand_ins_state_as_fact(tmp_path: Path) -> None:
    """regression (issue 37 finding 8): `fdl status` without a token printed whatever answered at the address as
    the run's state; with the run's token it asked unsigned and did the same. Now a tokenless look is labelled
    unverified, and with a token only a state that proves it is shown."""
    forged = {"schema": 1, "version": 1, "now": 1.0, "phase": "done", "reason": None, "run_id": "forged",
              "start": {"mode": "auto", "switch": "none"}, "window": {}, "quorum": {"need": {}, "have": {}},
              "roster": [{"host": "ghost", "status": "exited", "exit_code": 0}]}

    class StandIn(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(forged if self.path == "/state.json" else
                              {"ok": True, "controller_id": "ab" * 16}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    port = free_port(pairs=False)
    with https_stand_in(StandIn, port):
        plain = run_fdl("status", "--addr", f"127.0.0.1:{port}", cwd=tmp_path, env={"FDL_JOIN_TOKEN": ""})
        plain_json = run_fdl("status", "--addr", f"127.0.0.1:{port}", "--json", cwd=tmp_path,
                             env={"FDL_JOIN_TOKEN": ""})
        holder = run_fdl("status", "--addr", f"127.0.0.1:{port}", cwd=tmp_path, env={"FDL_JOIN_TOKEN": TOKEN})
    assert plain.returncode == 0 and "ghost" in plain.stdout
    assert "UNVERIFIED: no token proved this answer" in plain.stdout and "unverified" in plain.stderr
    assert json.loads(plain_json.stdout)["run_id"] == "forged" and "unverified" in plain_json.stderr
    assert holder.returncode == 1 and "could not prove it holds the run's token" in holder.stderr
    assert "ghost" not in holder.stdout + holder.stderr


def test_status_json_is_the_raw_state(tmp_path: Path) -> None:
    with serving(RunPolicy(quorum_hosts=2, window_s=600)) as server:
        join(server, "node-a")
        result = run_fdl("status", "--addr", addr(server), "--json", cwd=tmp_path)
        assert result.returncode == 0
        state = json.loads(result.stdout)
        assert state["phase"] == "waiting" and [e["host"] for e in state["roster"]] == ["node-a"]
        assert state["start"] == server.state()["start"]


def test_status_with_no_run_says_no_run_listening_and_exits_1(tmp_path: Path) -> None:
    port = free_port()
    for extra in ((), ("--json",)):
        result = run_fdl("status", "--addr", f"127.0.0.1:{port}", *extra, cwd=tmp_path)
        assert result.returncode == 1
        assert f"fdl: no run listening at 127.0.0.1:{port} (connection refused)" in result.stderr
        assert "error" not in result.stderr
        if not extra:
            assert result.stdout == ""
            continue
        # the JSON twin of the answer (regression: --json printed nothing, so a script read an empty string)
        doc = json.loads(result.stdout)
        assert doc["ok"] is False and doc["reason"] == "no_run_listening" and doc["exit_code"] == 1
        assert doc["message"].startswith(f"no run listening at 127.0.0.1:{port} (connection refused)")


def test_status_reads_the_controller_from_the_active_env(tmp_path: Path) -> None:
    with serving(RunPolicy(quorum_hosts=1, window_s=600)) as server:
        (tmp_path / "fdl.yml").write_text("commands:\n  hello: {run: echo hi}\n")
        (tmp_path / "fdl.farm.yml").write_text(f"cluster:\n  controller:\n    host: 127.0.0.1\n"
                                               f"    port: {server.port}\n    join: {{token: {server.policy.token}}}\n")
        (tmp_path / "fdl.farm.yml").chmod(0o600)  # a literal token, readable by this account only: no warning
        result = run_fdl("@farm", "status", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"at 127.0.0.1:{server.port}: waiting" in result.stdout and result.stderr == ""


def test_status_refuses_a_bad_address_and_names_a_foreign_server(tmp_path: Path) -> None:
    result = run_fdl("status", "--addr", "node b:99", cwd=tmp_path)
    assert result.returncode == 2 and "controller address 'node b:99' is not host[:port]" in result.stderr

    class Html(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>not a controller</html>")

        def log_message(self, *args) -> None:
            pass

    port = free_port()
    httpd = HTTPServer(("127.0.0.1", port), Html)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        result = run_fdl("status", "--addr", f"127.0.0.1:{port}", cwd=tmp_path)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.returncode == 1
    assert f"something answers at 127.0.0.1:{port} but not with TLS 1.3" in result.stderr
    assert "Traceback" not in result.stderr
    with https_stand_in(Html, port):
        result = run_fdl("status", "--addr", f"127.0.0.1:{port}", cwd=tmp_path, env={"FDL_JOIN_TOKEN": ""})
    assert result.returncode == 1
    assert f"fdl: error: 127.0.0.1:{port} answered HTTP 200 but not with the controller's JSON" in result.stderr


# ---------------------------------------------------------------- fdl start


def test_start_refusals_name_their_reason_and_arming_exits_0(tmp_path: Path) -> None:
    with serving(RunPolicy(start="manual", quorum_hosts=2, window_s=600)) as server:
        join(server, "node-a")
        result = run_fdl("start", "--addr", addr(server), cwd=tmp_path, env=with_token(server))
        assert result.returncode == 1
        assert (f"fdl: start refused by {addr(server)}: quorum not met: 1 of 2 hosts have joined. "
                f"[quorum_not_met]") in result.stderr
        assert server.state()["phase"] == "waiting"
        join(server, "node-b")
        token_file = tmp_path / "token"
        token_file.write_text(server.policy.token + "\n")
        result = run_fdl("start", "--addr", addr(server), "--token-file", str(token_file), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"start armed at {addr(server)}: the world formed (2 rank(s) on 2 host(s))" in result.stdout
        assert server.state()["phase"] == "forming"
        result = run_fdl("start", "--addr", addr(server), "--json", cwd=tmp_path, env=with_token(server))
        assert result.returncode == 1 and "window already closed" in result.stderr
        assert json.loads(result.stdout)["reason"] == "window_closed"
    with serving(RunPolicy(start="auto", quorum_hosts=2, window_s=600)) as server:
        result = run_fdl("start", "--addr", addr(server), cwd=tmp_path, env=with_token(server))
        assert result.returncode == 1 and "start: auto" in result.stderr and "[auto_mode]" in result.stderr


def test_start_from_loopback_without_the_token_is_refused(tmp_path: Path) -> None:
    # regression: loopback was the credential, so every account on the controller box could fire the switch
    with serving(RunPolicy(start="manual", quorum_hosts=1, window_s=600)) as server:
        join(server, "node-a")
        result = run_fdl("start", "--addr", addr(server), cwd=tmp_path, env={"FDL_JOIN_TOKEN": ""})
        assert result.returncode == 1 and "[bad_token]" in result.stderr
        assert "--token-file" in result.stderr and "FDL_JOIN_TOKEN" in result.stderr  # where a token comes from
        assert server.state()["phase"] == "staging" and server.state()["start"]["switch"] == "unarmed"


def test_start_with_no_run_listening(tmp_path: Path) -> None:
    port = free_port()
    result = run_fdl("start", "--addr", f"127.0.0.1:{port}", "--token", "ab", cwd=tmp_path)
    assert result.returncode == 1 and f"no run listening at 127.0.0.1:{port}" in result.stderr
    assert "error" not in result.stderr


# ---------------------------------------------------------------- from another host (netns; root)


@pytest.fixture(scope="module")
def peer():
    need_root_or_skip("creates a network namespace and a veth pair for a non-loopback peer")
    ns = PeerNamespace(f"c{os.getpid() % 100000:x}").create()
    try:
        yield ns
    finally:
        ns.destroy()


def test_start_from_another_host_uses_the_env_token_and_refuses_without_it(peer: PeerNamespace,
                                                                           tmp_path: Path) -> None:
    policy = RunPolicy(start="manual", quorum_hosts=1, window_s=600, token=TOKEN)
    with serving(policy, host=peer.HOST_ADDR) as server:
        join(server, "node-a")
        address = f"{peer.HOST_ADDR}:{server.port}"
        (tmp_path / "fdl.yml").write_text("commands:\n  hello: {run: echo hi}\n")
        (tmp_path / "fdl.farm.yml").write_text(textwrap.dedent(f"""\
            cluster:
              controller:
                host: {peer.HOST_ADDR}
                port: {server.port}
                join: {{discovery: true, start: manual, token: "{TOKEN}"}}
            """))
        fdl = [sys.executable, "-m", "fdl"]
        result = peer.run([*fdl, "start", "--addr", address], env=fdl_env(), cwd=tmp_path)
        assert result.returncode == 1 and "no proof of the run's token" in result.stderr \
            and "[bad_token]" in result.stderr
        # regression: an answer that could not be verified (a wrong token included) exited 2; start's contract
        # is 0 armed, 1 otherwise
        result = peer.run([*fdl, "start", "--addr", address], env=fdl_env({"FDL_JOIN_TOKEN": "0" * 32}),
                          cwd=tmp_path)
        assert result.returncode == 1 and "could not prove it holds the run's token" in result.stderr
        assert "GET /join/id" in result.stderr and "0" * 32 not in result.stderr  # refused before any request
        result = peer.run([*fdl, "start", "--addr", address, "--token", "1" * 32], env=fdl_env(), cwd=tmp_path)
        assert result.returncode == 1 and "could not prove it holds the run's token" in result.stderr  # was 2
        result = peer.run([*fdl, "@farm", "start"], env=fdl_env(), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"start armed at {address}" in result.stdout
        assert server.state()["start"]["fired_by"] == peer.PEER_ADDR
        result = peer.run([*fdl, "@farm", "status"], env=fdl_env(), cwd=tmp_path)
        assert result.returncode == 0 and ": forming" in result.stdout and f"fired by {peer.PEER_ADDR}" in result.stdout


def test_status_retries_the_controller_port_on_loopback(peer: PeerNamespace, tmp_path: Path) -> None:
    """cluster.controller names the namespace's address, where nothing listens (a tunnelled run seen from
    the controller box); the run is found on 127.0.0.1 at the same port."""
    with serving(RunPolicy(quorum_hosts=1, window_s=600)) as server:
        (tmp_path / "fdl.yml").write_text(f"cluster:\n  controller: {peer.PEER_ADDR}:{server.port}\n")
        result = run_fdl("status", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"at 127.0.0.1:{server.port}: waiting" in result.stdout
        assert (f"fdl: note: {peer.PEER_ADDR}:{server.port} did not answer; found the run on "
                f"127.0.0.1:{server.port}") in result.stderr
    result = run_fdl("status", cwd=tmp_path)
    assert result.returncode == 1
    assert f"no run listening at {peer.PEER_ADDR}:{server.port} or 127.0.0.1:{server.port}" in result.stderr


def test_status_defaults_to_loopback_1337_noted_on_stderr(peer: PeerNamespace, tmp_path: Path) -> None:
    """Inside the namespace 127.0.0.1:1337 is ours alone, so the convention default can be tested both ways."""
    fdl = [sys.executable, "-m", "fdl"]
    result = peer.run([*fdl, "status"], env=fdl_env(), cwd=tmp_path)
    assert result.returncode == 1
    assert "fdl: note: no --addr and no cluster.controller in the active configuration; asking the convention " \
           "default 127.0.0.1:1337" in result.stderr
    assert "fdl: no run listening at 127.0.0.1:1337 (connection refused)" in result.stderr
    serve = ("import sys; from fdl.controller.server import ControllerServer; from fdl.controller.policy import "
             f"RunPolicy; s = ControllerServer(RunPolicy(window_s=60, token={TEST_TOKEN!r}), port=1337).start(); "
             "print('ready', flush=True); sys.stdin.read(); s.stop()")
    child = subprocess.Popen(["ip", "netns", "exec", peer.name, sys.executable, "-c", serve], env=fdl_env(),
                             cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        result = peer.run([*fdl, "status"], env=fdl_env(), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "at 127.0.0.1:1337: waiting" in result.stdout and "convention default" in result.stderr
    finally:
        child.stdin.close()
        child.wait(30)
        child.stdout.close()


def test_status_and_start_import_neither_ansible_nor_the_server(tmp_path: Path) -> None:
    port = free_port()
    probe = ("import sys; from fdl.cli.main import main; "
             f"codes = [main(['status', '--addr', '127.0.0.1:{port}']), "
             f"main(['start', '--addr', '127.0.0.1:{port}'])]; "
             "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ansible', 'ansible_runner', 'aiohttp', "
             "'pynvml', 'uvloop'}); print(codes, heavy)")
    result = subprocess.run([sys.executable, "-c", probe], env=fdl_env(), cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "[1, 1] []", (result.stdout, result.stderr)


def test_start_takes_no_unproved_answer_for_armed(tmp_path: Path) -> None:
    """regression: an impostor's unsigned answer exited 2 (permanent, against start's contract); and before the
    token was proved to the loopback fallback it went there bare. The env names 127.0.0.2 (nothing listens
    there); a stand-in on 127.0.0.1:PORT (TLS with a key of its own) answers every request "armed" without a
    proof and records every byte. `fdl start` asks its id with a challenge, gets no proof back, and sends it
    nothing more: exit 1, nothing said armed."""
    from fdl.controller import auth

    received = bytearray()

    class Record(BaseHTTPRequestHandler):
        def answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            received.extend(self.requestline.encode() + b"\r\n" + bytes(self.headers))
            self.answer(b'{"ok": true, "controller_id": "' + b"ab" * 16 + b'"}')

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.extend(self.requestline.encode() + b"\r\n" + bytes(self.headers) + body)
            self.answer(b'{"ok": true, "armed": true, "phase": "forming", "world": null, "message": "armed"}')

        def log_message(self, *args) -> None:
            pass

    port = free_port(pairs=False)
    (tmp_path / "fdl.yml").write_text("commands:\n  hello: {run: echo hi}\n")
    (tmp_path / "fdl.farm.yml").write_text(textwrap.dedent(f"""\
        cluster:
          controller:
            host: 127.0.0.2
            port: {port}
            join: {{discovery: true, start: manual, token: "{TOKEN}"}}
        """))
    with https_stand_in(Record, port):
        result = run_fdl("@farm", "start", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "could not prove it holds the run's token" in result.stderr and "armed" not in result.stdout
    # its GET /join/id answer proved nothing, so nothing that matters followed: not even a signed start
    assert received.count(b"GET /join/id") == 1 and b"POST /start" not in received
    assert auth.CHALLENGE_HEADER.lower().encode() in bytes(received).lower()
    assert TOKEN.encode() not in received and TOKEN not in result.stdout + result.stderr
