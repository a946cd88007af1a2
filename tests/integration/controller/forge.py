"""Forged and fuzzed requests against a controller, from a seeded generator.

Used in-process (loopback) and as a script inside a network namespace (a
non-loopback peer):

    python -m tests.integration.controller.forge HOST PORT COUNT SEED MODE

prints one JSON line: {"statuses": {status: count}, "sent": COUNT}.

MODE "roster": the target is a roster run pinned to run id "pinned" with hosts
node-a and node-b, and the peer is loopback (no token needed), so the
forgeries are hosts outside the roster, wrong run ids, forged tickets, an
early start and garbage. MODE "token": the target requires a token and the
peer is not loopback, so well-formed hellos and starts carry forged tokens.
Nothing either mode sends may be admitted or arm the switch.
"""

from __future__ import annotations

import json
import random
import socket
import sys


def request(method: str, path: str, body: bytes, *, close: bool = True, headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: fdl\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    head += headers
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def forged_proof(rng: random.Random) -> str:
    """Proof headers that are not a token's: random, truncated, or missing parts (token mode)."""
    import time

    stamp = rng.choice([str(int(time.time())), "0", "x", str(int(time.time()) + 10 ** 6)])
    nonce = f"{rng.getrandbits(128):032x}"
    proof = rng.choice([f"{rng.getrandbits(256):064x}", "", "0" * 63, "g" * 64])
    lines = [f"X-Fdl-Time: {stamp}", f"X-Fdl-Nonce: {nonce}", f"X-Fdl-Proof: {proof}"]
    return "".join(line + "\r\n" for line in lines if rng.random() < 0.9)


def forged(rng: random.Random, i: int, mode: str) -> bytes:
    """One request that must never admit a host nor fire the switch."""
    kind = rng.randrange(9)
    if mode == "token" and kind in (0, 1, 3):  # well-formed requests with forged proofs (the token is never sent)
        path = "/start" if kind == 3 else "/join"
        body = {} if kind == 3 else {"host": f"walkin-{i}", "devices": "cpu:1", "run_id": "pinned"}
        return request("POST", path, json.dumps(body).encode(), headers=forged_proof(rng))
    ticket = f"m{rng.randrange(5)}.{rng.getrandbits(128):032x}"
    token = rng.choice([None, "", f"{rng.getrandbits(128):032x}", "s3cret-but-not-quite", "x" * rng.randrange(1, 600)])
    devices = rng.choice(["0", "0,1", "cpu:2", [0, 1, 2]])
    if kind == 0:
        if mode == "token":  # a perfect hello but for the token
            body: object = {"host": f"walkin-{i}", "devices": devices, "run_id": "pinned"}
            if token is not None:
                body["token"] = token
        else:  # a host the roster does not list
            body = {"host": f"intruder-{i}", "devices": devices, "run_id": "pinned"}
    elif kind == 1:
        body = {"host": "node-a", "devices": "cpu:1", "run_id": f"r{rng.randrange(1000)}"}
        if mode == "token":
            body["token"] = f"{rng.getrandbits(64):016x}"
    elif kind == 2:  # forged tickets on every member endpoint
        path = rng.choice(["/join/world", "/join/heartbeat", "/join/exit"])
        return request("POST", path, json.dumps({"ticket": ticket, "code": 0, "running": True, "wait_s": 0}).encode())
    elif kind == 3:  # the start switch with a forged (or no) token
        return request("POST", "/start", b"" if token is None else json.dumps({"token": token}).encode())
    elif kind == 4:  # random bytes as a body
        return request("POST", rng.choice(["/join", "/start"]), rng.randbytes(rng.randrange(1, 300)))
    elif kind == 5:  # JSON of the wrong shapes
        body = rng.choice([[], 1, "s", None, {"host": [1]}, {"devices": "0"}, {"host": "h", "devices": -1},
                           {"host": "x" * 300, "devices": "0"}, {"host": "h", "devices": "cpu:99999"},
                           {"host": "h", "devices": "0", "protocol": 2}, {"token": 5}])
    elif kind == 6:  # truncated JSON
        full = json.dumps({"host": "node-a", "devices": "cpu:1", "run_id": "pinned", "token": "abc"})
        return request("POST", "/join", full[: rng.randrange(1, len(full) - 1)].encode())
    elif kind == 7:  # a wrong path or method
        method, path = rng.choice([("GET", "/join"), ("GET", "/start"), ("PUT", "/"), ("DELETE", "/state.json"),
                                   ("POST", "/x"), ("GET", "/start/"), ("PATCH", "/join/world")])
        return request(method, path, b"")
    else:  # random bytes as a whole request (never a complete head that would wait for a body)
        noise = rng.randbytes(rng.randrange(1, 200)).replace(b"\r", b"").replace(b"\n", b"")
        return b"X" + noise + b"\r\n\r\n"
    path = "/start" if kind == 5 and rng.random() < 0.2 else "/join"
    return request("POST", path, json.dumps(body).encode())


def read_status(sock: socket.socket) -> int:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return 0
        buffer += chunk
    head = buffer.split(b"\r\n", 1)[0]
    return int(head.split(b" ", 2)[1])


def send_all(host: str, port: int, count: int, seed: int, mode: str) -> dict[int, int]:
    """count forged requests, each on a TLS connection of its own (the controller's port speaks only TLS)."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    rng = random.Random(seed)
    statuses: dict[int, int] = {}
    for i in range(count):
        data = forged(rng, i, mode)
        with socket.create_connection((host, port), timeout=10) as raw:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK wait after the handshake
            with context.wrap_socket(raw) as sock:
                sock.sendall(data)
                status = read_status(sock)
        statuses[status] = statuses.get(status, 0) + 1
    return statuses


if __name__ == "__main__":
    host, port, count, seed, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    print(json.dumps({"statuses": send_all(host, port, count, seed, mode), "sent": count}))
