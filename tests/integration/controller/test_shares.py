"""Fair shares of the controller's connections (regressions, issue 37 finding 6): one local account's 64 keep-alive
status pollers shut out every ssh-door worker and the operator's own `fdl start`/`fdl status`; one LAN host with
four addresses in a flat /24 shut out every not-yet-admitted walk-in of that /24; unadmitted keep-alive
`GET /join/id` connections filled every slot; and strangers' idle keep-alive connections were kept as long as a
member's.

The pollers run as another real account (nobody); the LAN host is a network namespace with five addresses in one
/24; the workers and the operator are real `fdl join`, `fdl status` and `fdl start` processes.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest

from fdl.controller import auth
from fdl.controller.client import ControllerClient
from fdl.controller.policy import RunPolicy
from fdl.controller.wire import Limits
from tests.conftest import need_root_or_skip, run_fdl
from tests.controller_util import PeerNamespace, serving, tls_socket
from tests.integration.join.helpers import finish, spawn_join, wait_for
from tests.join_util import write_program

TOKEN = secrets.token_hex(32)  # as strong as fdl join asks
HOLD = r'''
import os, sys
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    sys.exit(0)
print("RAN rank", os.environ.get("RANK"), flush=True)
'''

# COUNT keep-alive HTTPS connections to 127.0.0.1:PORT from this account, each polling GET /state.json as fast as
# it is answered; then EXTRA more attempts, counted as refused when the controller closes them before TLS. Prints
# "ready" once the COUNT are up, runs until stdin closes, then prints {"polls": N, "refused": N, "errors": N}.
# (The peers in this module speak plain HTTP to a port that does not speak TLS, as controllers did before: each
# test shows the shut-out it guards against on such a controller too.)
POLLERS = r'''
import http.client, json, ssl, sys, threading
port, count, extra = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
counts = {"polls": 0, "refused": 0, "errors": 0}
stop = threading.Event()
up = threading.Barrier(count + 1, timeout=60)
def connected():
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.connect()
    except ssl.SSLError:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.connect()
    return conn
def poll():
    try:
        conn = connected()
    except OSError as err:
        print("cannot connect:", err, file=sys.stderr, flush=True)
        up.abort()
        return
    up.wait()
    while not stop.is_set():
        try:
            conn.request("GET", "/state.json")
            conn.getresponse().read()
            counts["polls"] += 1
        except (OSError, http.client.HTTPException):
            counts["errors"] += 1
            conn.close()
            try:
                conn = connected()
            except OSError:
                pass
threads = [threading.Thread(target=poll, daemon=True) for _ in range(count)]
for t in threads:
    t.start()
try:
    up.wait()
except threading.BrokenBarrierError:
    print("not ready", flush=True)
    sys.exit(1)
for _ in range(extra):
    try:
        connected().close()
    except OSError:
        counts["refused"] += 1
print("ready", flush=True)
sys.stdin.read()
stop.set()
for t in threads:
    t.join(15)
print(json.dumps(counts), flush=True)
'''


def test_64_keep_alive_pollers_of_another_account_shut_out_neither_a_worker_nor_the_operator(tmp_path) -> None:
    binary = write_program(tmp_path / "bin" / "hold", HOLD)
    with serving(RunPolicy(start="manual", quorum_hosts=1, max_hosts=1, window_s=120, token=TOKEN)) as server:
        line = " ".join(shlex.quote(a) for a in ["exec", "/usr/bin/python3", "-c", POLLERS, str(server.port), "64",
                                                 "16"])
        pollers = subprocess.Popen(["su", "nobody", "-s", "/bin/sh", "-c", line], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert pollers.stdout.readline().strip() == "ready", pollers.stderr.read()
            address = f"127.0.0.1:{server.port}"
            worker = spawn_join(address, "--bin", str(binary), "--devices", "cpu:1", "--host", "door-worker",
                                home=tmp_path / "worker", env={"FDL_JOIN_TOKEN": TOKEN})
            wait_for(lambda: server.state()["roster"] or worker.poll() is not None, timeout=60, what="admission")
            status = run_fdl("status", "--addr", address, cwd=tmp_path, env={"FDL_JOIN_TOKEN": TOKEN})
            start = run_fdl("start", "--addr", address, cwd=tmp_path, env={"FDL_JOIN_TOKEN": TOKEN})
            code, _, err = finish(worker, timeout=120)
        finally:
            out, perr = pollers.communicate(timeout=60)
        state = server.state()
    assert status.returncode == 0 and ": staging" in status.stdout, status.stderr
    assert start.returncode == 0 and "start armed" in start.stdout, start.stderr
    assert code == 0, err
    assert state["phase"] == "done" and [m["host"] for m in state["roster"]] == ["door-worker"]
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["polls"] > 64, (counts, perr)  # they polled all along ...
    assert counts["refused"] + counts["errors"] > 0, counts  # ... held to their share: more cost them their own


def test_unadmitted_keep_alive_id_connections_cannot_fill_the_slots() -> None:
    """Sixteen /24s hold every stranger's slot with keep-alive GET /join/id connections asked again and again; a
    walk-in from another /24 still gets in, and is admitted."""
    limits = Limits(max_connections=64, max_per_peer=4, max_per_net=4)
    with serving(RunPolicy(start="manual", quorum_hosts=2, window_s=120), limits=limits) as server:
        stop = threading.Event()
        held: list = []

        def hold(source: str) -> None:
            try:
                sock = tls_socket(server.port, source=source)
            except ssl.SSLError:  # a controller that does not speak TLS: plain HTTP then
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
            held.append(sock)
            while not stop.is_set():
                try:
                    sock.sendall(b"GET /join/id HTTP/1.1\r\nHost: x\r\n\r\n")
                    sock.recv(65536)
                except OSError:
                    return
                time.sleep(0.2)

        threads = [threading.Thread(target=hold, args=(f"127.50.{n}.{1 + i}",), daemon=True)
                   for n in range(16) for i in range(4)]
        try:
            for thread in threads:
                thread.start()
            wait_for(lambda: server.open_connections >= 64, timeout=60, what="the table full of strangers")
            with ControllerClient(f"127.0.0.1:{server.port}", timeout=10, token=server.policy.token) as client:
                admitted = client.hello({"host": "walk-in", "devices": "cpu:1"})
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
            for sock in held:
                sock.close()
        assert admitted["admitted"] is True
        assert server.evicted >= 1  # a slot was taken from the heaviest


def test_a_strangers_idle_keep_alive_connection_goes_before_a_token_holders() -> None:
    """Both connections idle after an answer; the token holder's answer came first. The stranger's connection is
    closed while the token holder's is still open."""
    with serving(RunPolicy(window_s=120)) as server:
        ident = server.machine.controller_id
        proved = tls_socket(server.port)
        stranger = tls_socket(server.port, source="127.0.0.9")
        try:
            signed = auth.sign_request(auth.derive(server.policy.token, ident), "GET", "/state.json", b"")
            proved.sendall(b"GET /state.json HTTP/1.1\r\nHost: x\r\n" + b"".join(
                f"{k}: {v}\r\n".encode() for k, v in signed.items()) + b"\r\n")
            assert proved.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(1.0)  # the stranger's answer comes later than the token holder's
            stranger.sendall(b"GET /join/id HTTP/1.1\r\nHost: x\r\n\r\n")
            assert stranger.recv(65536).startswith(b"HTTP/1.1 200")
            stranger.settimeout(30)  # a guard only
            assert closed_by_peer(stranger)
            proved.sendall(b"GET /join/id HTTP/1.1\r\nHost: x\r\n\r\n")  # the token holder's is still there
            assert proved.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            proved.close()
            stranger.close()


def closed_by_peer(sock) -> bool:
    """Whether the peer closes the socket (a read returning nothing, or a reset) before the socket's timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# ---------------------------------------------------------------- a LAN host with four addresses (netns; root)

# Opens PER connections from each source address in argv[3:] to HOST:PORT over TLS, each with a request head under
# way (never finished), re-opening any the controller cuts, until stdin closes. Prints "ready" once it held them.
HOLDERS = r'''
import json, socket, ssl, sys, threading, time
host, port, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sources = sys.argv[4:]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
stop = threading.Event()
opened = {"held": 0, "refused": 0}
def holder(source):
    while not stop.is_set():
        try:
            raw = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
            try:
                sock = context.wrap_socket(raw)
            except ssl.SSLError:  # a port that does not speak TLS: plain HTTP then
                sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
            sock.sendall(b"GET /state.json HTTP/1.1\r\nHost: x\r\n")
            opened["held"] += 1
            sock.settimeout(0.5)
            while not stop.is_set():
                try:
                    if sock.recv(1) == b"":
                        break
                except socket.timeout:
                    continue
            sock.close()
        except OSError:
            opened["refused"] += 1
            time.sleep(0.05)
threads = [threading.Thread(target=holder, args=(s,), daemon=True) for s in sources for _ in range(per)]
for t in threads:
    t.start()
deadline = time.monotonic() + 60
while opened["held"] < per * len(sources) and time.monotonic() < deadline:
    time.sleep(0.05)
print("ready" if opened["held"] >= per * len(sources) else "not ready", flush=True)
sys.stdin.read()
stop.set()
print(json.dumps(opened), flush=True)
'''


@pytest.fixture
def lan():
    need_root_or_skip("creates a network namespace with five addresses in one /24")
    ns = PeerNamespace(f"s{os.getpid() % 100000:x}").create()
    try:
        base = ns.PEER_ADDR.rsplit(".", 1)[0]
        extra = [f"{base}.{n}" for n in (3, 4, 5, 6)]
        for address in extra:
            ns._ip("addr", "add", f"{address}/24", "dev", ns.peer_if, ns=True)
        yield ns, extra
    finally:
        ns.destroy()


def test_four_addresses_of_one_24_cannot_shut_out_a_neighbours_walk_in(lan, tmp_path) -> None:
    ns, extra = lan
    binary = write_program(tmp_path / "bin" / "hold", HOLD)
    with serving(RunPolicy(start="auto", max_hosts=1, window_s=120, token=TOKEN), host=ns.HOST_ADDR) as server:
        holders = subprocess.Popen(["ip", "netns", "exec", ns.name, sys.executable, "-c", HOLDERS, ns.HOST_ADDR,
                                    str(server.port), "64", *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            assert holders.stdout.readline().strip() == "ready", holders.stderr.read()
            assert server.open_connections >= 250  # the /24's whole share (256), held by one host
            walk_in = spawn_join(f"{ns.HOST_ADDR}:{server.port}", "--bin", str(binary), "--devices", "cpu:1",
                                 "--host", "neighbour", home=tmp_path / "neighbour", env={"FDL_JOIN_TOKEN": TOKEN},
                                 prefix=("ip", "netns", "exec", ns.name))  # from the namespace's first address
            code, _, err = finish(walk_in, timeout=120)
        finally:
            out, herr = holders.communicate(timeout=60)
        state = server.state()
    assert json.loads(out.strip().splitlines()[-1])["held"] >= 256, herr
    assert code == 0, err
    assert [(m["host"], m["peer"] if "peer" in m else m["address"]) for m in state["roster"]] == \
        [("neighbour", ns.PEER_ADDR)]
    assert state["phase"] == "done"
