"""The controller endpoint over real HTTP on loopback: join channel, start modes, liveness, hostile clients."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest

from fdl.controller.client import ControllerClient, ControllerRefused, NoRunListening
from fdl.controller.policy import RunPolicy
from fdl.controller.server import ControllerServer
from fdl.controller.wire import Limits
from fdl.errors import FdlError
from tests.controller_util import TEST_TOKEN, free_port, serving
from tests.integration.controller.forge import send_all


def client(server: ControllerServer) -> ControllerClient:
    return ControllerClient(f"127.0.0.1:{server.port}", timeout=10, token=server.policy.token)


def hello(host: str, devices: str = "cpu:1", **extra) -> dict:
    return {"host": host, "devices": devices, **extra}


def raw(server: ControllerServer, data: bytes, *, timeout: float = 10.0) -> tuple[int, dict]:
    """Send raw bytes and read one answer; return (status, JSON body).

    No half-close: a peer's EOF makes asyncio drop the connection before an answer can be written."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_answer(sock)


def read_answer(sock: socket.socket) -> tuple[int, dict]:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}
        buffer += chunk
    head, _, body = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, json.loads(body[:length])


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode() + body


# ---------------------------------------------------------------- the join channel end to end


def test_join_channel_from_hello_to_done() -> None:
    policy = RunPolicy(start="manual", quorum_hosts=2, window_s=60, args=("--epochs", "1"))
    with serving(policy) as server, client(server) as c:
        a = c.hello(hello("node-a", "0,1", run_id="r1", gpu_names=["NVIDIA H100"] * 2))
        assert a["admitted"] and a["phase"] == "waiting" and a["ranks"] == 2
        assert c.wait_world(a["ticket"], wait_s=0) is None
        with pytest.raises(ControllerRefused) as refused:
            c.start()
        assert refused.value.reason == "quorum_not_met" and refused.value.status == 409
        assert refused.value.payload["have"] == {"hosts": 1, "ranks": 2}
        b = c.hello(hello("node-b", "cpu:2", run_id="r1"))
        assert c.state()["start"]["startable"] is True
        answer = c.start()
        assert answer["armed"] and answer["phase"] == "forming"
        world_a = c.wait_world(a["ticket"], wait_s=5)
        world_b = c.wait_world(b["ticket"], wait_s=5)
        assert world_a["world"]["size"] == 4 and world_a["world"]["args"] == ["--epochs", "1"]
        assert [r["env"]["RANK"] for r in world_b["ranks"]] == ["2", "3"]
        assert world_b["ranks"][0]["env"]["MASTER_PORT"] == str(policy.master_port)
        for ticket in (a["ticket"], b["ticket"]):
            assert c.heartbeat(ticket, running=True)["stop"] is False
        assert c.state()["phase"] == "training"
        c.report_exit(a["ticket"], 0)
        c.report_exit(b["ticket"], 0)
        state = c.state()
        assert state["phase"] == "done" and [e["exit_code"] for e in state["roster"]] == [0, 0]
        assert server.wait_phase("done", timeout=1)


def test_every_refusal_reason_over_http() -> None:
    policy = RunPolicy(start="manual", quorum_hosts=1, max_hosts=2, window_s=60)
    with serving(policy) as server, client(server) as c:
        c.hello(hello("a", run_id="r1", signature="aa11"))
        cases = [
            (hello("a", run_id="r1"), "host_joined"),
            (hello("b", run_id="r2"), "run_id_differs"),
            (hello("b", run_id="r1", signature="bb22"), "signature_differs"),
        ]
        for body, reason in cases:
            with pytest.raises(ControllerRefused) as info:
                c.hello(body)
            assert info.value.reason == reason and info.value.payload["admitted"] is False
            assert info.value.message  # a sentence for the operator
        c.hello(hello("b", run_id="r1"))
        with pytest.raises(ControllerRefused) as info:
            c.hello(hello("c", run_id="r1"))
        assert info.value.reason == "roster_full"
        c.start()
        with pytest.raises(ControllerRefused) as info:
            c.hello(hello("d", run_id="r1"))
        assert info.value.reason == "window_closed"
        with pytest.raises(ControllerRefused) as info:
            c.start()
        assert info.value.reason == "window_closed"
        with pytest.raises(ControllerRefused) as info:
            c.heartbeat("m1.forged")
        assert info.value.reason == "unknown_ticket" and info.value.status == 410
        refusals = c.state()["refusals"]
        assert refusals["host_joined"] == 1 and refusals["window_closed"] == 2


# ---------------------------------------------------------------- start modes on short windows


def test_auto_long_polls_all_wake_when_the_window_closes() -> None:
    policy = RunPolicy(start="auto", quorum_hosts=3, window_s=0.3)
    with serving(policy) as server:
        tickets = []
        with client(server) as c:
            for host in ("a", "b", "c"):
                tickets.append(c.hello(hello(host))["ticket"])
        results: dict = {}

        def wait(ticket: str) -> None:
            with client(server) as c:
                results[ticket] = c.wait_world(ticket, wait_s=20)

        threads = [threading.Thread(target=wait, args=(t,)) for t in tickets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(results[t] is not None for t in tickets), results
        assert sorted(r["node_rank"] for r in results.values()) == [0, 1, 2]
        state = server.state()
        assert state["phase"] == "forming" and state["world"]["formed_by"] == "window deadline"


def test_manual_window_closing_unfired_fails_and_start_says_window_closed() -> None:
    with serving(RunPolicy(start="manual", quorum_hosts=1, window_s=0.1)) as server, client(server) as c:
        ticket = c.hello(hello("a"))["ticket"]
        assert c.state()["phase"] == "staging"
        assert server.wait_phase("failed", timeout=10)
        with pytest.raises(ControllerRefused) as info:
            c.start()
        assert info.value.reason == "window_closed"
        with pytest.raises(ControllerRefused) as info:
            c.wait_world(ticket, wait_s=1)
        assert info.value.reason == "window_closed" and "before the start switch" in info.value.message


def test_hybrid_forms_on_the_clock_and_auto_refuses_the_switch() -> None:
    with serving(RunPolicy(start="hybrid", quorum_hosts=1, window_s=0.05)) as server, client(server) as c:
        ticket = c.hello(hello("a"))["ticket"]
        assert c.wait_world(ticket, wait_s=10) is not None
        assert c.state()["world"]["formed_by"] == "window deadline"
    with serving(RunPolicy(start="auto", quorum_hosts=2, window_s=30)) as server, client(server) as c:
        c.hello(hello("a"))
        with pytest.raises(ControllerRefused) as info:
            c.start()
        assert info.value.reason == "auto_mode"


# ---------------------------------------------------------------- liveness


def test_agent_silent_before_forming_is_dropped_and_after_forming_fails_the_run() -> None:
    policy = RunPolicy(start="manual", quorum_hosts=1, window_s=60, silence_s=0.4, heartbeat_s=0.1)
    with serving(policy) as server, client(server) as c:
        a = c.hello(hello("a"))["ticket"]
        c.hello(hello("b"))  # b never speaks again
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(c.state()["roster"]) > 1:
            c.heartbeat(a)
            time.sleep(0.1)
        state = c.state()
        assert [e["host"] for e in state["roster"]] == ["a"]
        assert state["departed"][0]["host"] == "b" and "silent" in state["departed"][0]["reason"]
        c2 = c.hello(hello("c"))["ticket"]
        c.start()
        assert c.wait_world(a, wait_s=5) is not None
        stop = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # c went silent after forming
            stop = c.heartbeat(a, running=True)
            if stop["stop"]:
                break
            time.sleep(0.1)
        assert stop["stop"] and stop["phase"] == "failed" and "host c went silent" in stop["reason"]
        assert c.state()["reason"] == stop["reason"]
        assert c2  # c's ticket existed; it was dropped for silence, not refused


# ---------------------------------------------------------------- malformed, oversized, slow, many


def test_malformed_and_oversized_requests_get_json_4xx_and_the_server_lives() -> None:
    limits = Limits(max_body=1024, max_headers=16, max_field=512, max_line=512, body_timeout_s=0.5)
    with serving(RunPolicy(window_s=60), limits=limits) as server:
        cases = [
            (b"GARBAGE\r\n\r\n", 400, "bad_request"),
            (b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
            (b"GET /state.json HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 2000 + b"\r\n\r\n", 400, "bad_request"),
            (b"GET /state.json HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(40)) + b"\r\n", 400,
             "bad_request"),
            (post("/join", b"{" * 50), 400, "bad_request"),
            (post("/join", b'{"host": 1}'), 400, "bad_request"),
            (post("/join", b"[]"), 400, "bad_request"),
            (post("/join", b"\xff" * 10), 400, "bad_request"),
            (post("/join", b"x" * 5000), 413, "too_large"),
            (b"POST /join HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", 413, "too_large"),
            (b"POST /join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"800\r\n" + b"y" * 2048
             + b"\r\n0\r\n\r\n", 413, "too_large"),
            (post("/join", b'{"host":"a"'[:5], extra="").replace(b"Content-Length: 5", b"Content-Length: 50"),
             408, "timeout"),
            (b"DELETE /state.json HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed"),
            (b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found"),
            # a member's request proves the token before anything else in it is read (loopback included)
            (post("/join/world", b'{"ticket": 5}'), 403, "bad_token"),
            (post("/join/exit", b'{"ticket": "m1.x", "code": "0"}'), 403, "bad_token"),
        ]
        for data, status, reason in cases:
            got_status, body = raw(server, data)
            assert (got_status, body["reason"]) == (status, reason), (data[:60], body)
            assert body["ok"] is False and body["message"]
        with client(server) as c:
            assert c.state()["phase"] == "waiting" and c.state()["roster"] == []


def test_slowloris_connections_are_cut_and_others_are_served() -> None:
    limits = Limits(head_timeout_s=0.5)
    with serving(RunPolicy(window_s=60), limits=limits) as server:
        slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        try:
            for sock in slow:
                sock.sendall(b"GET /state.json HTTP/1.1\r\nHost: x\r\n")  # ...and the rest never comes
            closed = False
            # Only a guard against a hung test (the head timeout is 0.5 s): no duration is asserted.
            guard = time.monotonic() + 120
            with client(server) as c:
                while not closed and time.monotonic() < guard:
                    assert c.state()["phase"] == "waiting"  # served all along
                    slow[0].settimeout(0.05)
                    try:
                        closed = slow[0].recv(1) == b""
                    except TimeoutError:
                        slow[0].sendall(b"X-Drip: 1\r\n")  # one header line now and then keeps nothing alive
            assert closed, "a connection that never completed its request head was kept open"
        finally:
            for sock in slow:
                sock.close()


def test_connections_over_the_limit_get_503_and_the_server_recovers() -> None:
    with serving(RunPolicy(window_s=60), limits=Limits(max_connections=8, member_reserve=0)) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
        try:
            time.sleep(0.2)
            status, body = raw(server, b"GET /state.json HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 503 and body["reason"] == "overloaded"
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            status, body = raw(server, b"GET /state.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200 and body["phase"] == "waiting"


def test_ten_thousand_forged_requests_admit_nobody() -> None:
    """Forgeries from loopback, which proves nothing: hosts outside the roster, wrong run ids, forged tickets, an
    early start, garbage, none with the token's proof. Token forgeries come from a real non-loopback peer in
    test_netns.py."""
    from fdl.controller.policy import RosterHost
    from fdl.hostside.checks.devices import parse_devices

    policy = RunPolicy(discovery=False, start="manual", run_id="pinned", window_s=600,
                       roster=(RosterHost("node-a", parse_devices("cpu:1"), "127.0.0.1"),
                               RosterHost("node-b", parse_devices("0"))))
    with serving(policy) as server:
        statuses = send_all("127.0.0.1", server.port, 10_000, 20_260_505, "roster")
        assert sum(statuses.values()) == 10_000
        assert 200 not in statuses, statuses
        assert set(statuses) <= {400, 403, 404, 405, 409, 410, 413}, statuses
        with client(server) as c:
            state = c.state()
            assert state["roster"] == [] and state["start"]["switch"] == "unarmed" and state["phase"] == "waiting"
            assert state["refusals"]["bad_token"] > 1000  # unsigned, from loopback: refused before anything else
            assert c.hello(hello("node-a", run_id="pinned"))["admitted"]  # and it still works


# ---------------------------------------------------------------- the Python API


def test_thread_api_bind_errors_and_restart() -> None:
    import gc

    port = free_port()
    before = gc.get_threshold()
    with ControllerServer(RunPolicy(window_s=60, token=TEST_TOKEN), port=port) as server:
        assert gc.get_threshold()[0] == 50_000  # tuned while serving
        assert server.address == f"127.0.0.1:{port}"
        with pytest.raises(FdlError, match=f"cannot listen on 127.0.0.1:{port}: the address is already in use"):
            ControllerServer(RunPolicy(window_s=60, token=TEST_TOKEN), port=port).start()
        assert server.call(lambda m: m.phase) == "waiting"
        server.call(lambda m: m.fail("launcher: build failed on node-a"))
        assert server.wait_phase("failed", timeout=1)
        assert server.state()["reason"] == "launcher: build failed on node-a"
    assert gc.get_threshold() == before  # and restored
    with pytest.raises(NoRunListening):
        ControllerClient(f"127.0.0.1:{port}", timeout=2).state()
    with ControllerServer(RunPolicy(window_s=60, token=TEST_TOKEN), port=port) as again:  # the port is free at once
        assert again.state()["phase"] == "waiting"


def test_from_cluster_reads_the_cluster_block(tmp_path) -> None:
    from fdl.config.project import load_config

    (tmp_path / "fdl.yml").write_text(
        "cluster:\n  controller:\n    host: 10.0.0.1\n    port: 2000\n    join: {discovery: true, start: hybrid,"
        f" token: {TEST_TOKEN}, quorum: {{hosts: 2, ranks: 4}}, window_s: 30, max_hosts: 8}}\n")
    config = load_config(tmp_path)
    policy = RunPolicy.from_cluster(config.cluster, run_id="r9", args=("--x",))
    assert (policy.start, policy.token, policy.need_hosts, policy.need_ranks, policy.capacity) == \
        ("hybrid", TEST_TOKEN, 2, 4, 8)
    assert (policy.controller_addr, policy.master_port, policy.window_s, policy.run_id) == \
        ("10.0.0.1:2000", 2001, 30, "r9")


def test_for_cluster_binds_loopback_when_tunnel_only(tmp_path) -> None:
    from fdl.config.project import load_config

    port = free_port()
    (tmp_path / "fdl.yml").write_text(
        f"cluster:\n  controller:\n    host: 10.0.0.1\n    port: {port}\n    join: {{discovery: true, "
        f"tunnel_only: true, token: {TEST_TOKEN}}}\n")
    with ControllerServer.for_cluster(load_config(tmp_path).cluster, run_id="r1") as server:
        assert server.host == "127.0.0.1" and server.port == port
        with client(server) as c:
            assert c.hello(hello("a", run_id="r1"))["admitted"]
            assert c.state()["controller"] == f"10.0.0.1:{port}"


def test_a_body_labelled_gzip_is_a_json_400_without_a_traceback(caplog) -> None:
    """regression: `Content-Encoding: gzip` with a body that is not gzip gave a 500 and a logged traceback per
    request."""
    import gzip
    import logging

    body = json.dumps(hello("a")).encode()
    caplog.set_level(logging.DEBUG)
    with serving(RunPolicy(window_s=60)) as server:
        for data in (body, gzip.compress(body)):
            status, answer = raw(server, b"POST /join HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                                         b"Content-Length: %d\r\n\r\n" % len(data) + data)
            assert (status, answer["reason"]) == (400, "bad_request") and "uncompressed" in answer["message"]
        time.sleep(1.5)  # past aiohttp's lingering read of the unread body
        assert server.state()["roster"] == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- peers that never read


def from_address(server, source: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """One request from a given loopback address, signed with the run's token when it has a body."""
    import http.client

    from fdl.controller import auth

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10, source_address=(source, 0))
    try:
        headers = {}
        data = None
        if body is not None:
            conn.request("GET", "/join/id")
            ident = json.loads(conn.getresponse().read())["controller_id"]
            data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json",
                       **auth.sign_request(auth.derive(server.policy.token, ident), method, path, data)}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def never_reading(port: int, source: str, requests: int = 300) -> socket.socket:
    """A client that pipelines requests for state.json and never reads an answer (a small receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        sock.send(b"GET /state.json HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
    return sock


def test_stalled_readers_on_ten_addresses_shut_nobody_out_and_are_cut() -> None:
    """regression: a client that pipelines requests and never reads kept its handler blocked on the write for
    good (no deadline), the connection's slot was never released and its socket pinned megabytes of kernel
    memory; ten addresses shut new walk-ins out, and loopback holders (no share at all) members' heartbeats
    too. Here ten loopback addresses (one /24, loopback being an address like any other) each try ten such
    connections at a controller that allows 80 (+16 for members)."""
    limits = Limits(max_connections=80, max_per_peer=8, member_reserve=16)
    with serving(RunPolicy(start="manual", quorum_hosts=4, window_s=600, silence_s=120), limits=limits) as server:
        status, admitted = from_address(server, "127.1.0.1", "POST", "/join", hello("member"))
        assert status == 200 and admitted["admitted"]
        stalled = [never_reading(server.port, f"127.0.0.{2 + i // 10}") for i in range(100)]
        try:
            time.sleep(1.0)  # the controller has taken what it takes of them
            held = server.open_connections
            assert held <= 30, held  # a /24's share, not the whole table
            status, beat = from_address(server, "127.1.0.1", "POST", "/join/heartbeat",
                                        {"ticket": admitted["ticket"]})
            assert status == 200 and beat["ok"], beat  # a member's heartbeat gets through ...
            status, walk_in = from_address(server, "127.2.0.1", "POST", "/join", hello("walk-in"))
            assert status == 200 and walk_in["admitted"], walk_in  # ... and so does a new walk-in's hello
            # The stalled ones are aborted once their answers have not drained for the write deadline (10 s);
            # the guard only keeps a broken build from hanging the suite.
            guard = time.monotonic() + 90
            while server.open_connections > 0 and time.monotonic() < guard:
                time.sleep(0.2)
            assert server.open_connections == 0, f"{server.open_connections} stalled connections still held"
        finally:
            for sock in stalled:
                sock.close()
        assert [m["host"] for m in server.state()["roster"]] == ["member", "walk-in"]
