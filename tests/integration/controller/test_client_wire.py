"""What the one controller client does on the wire: one deadline for a whole answer, no redirect followed; and the
documented way for curl to read state.json, with the key pinned.

The stand-ins are real HTTP servers on loopback that answer over TLS with a key of their own (or over plain HTTP to
a client that speaks plain HTTP), so each test exercises the client as it was before TLS too.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from fdl.controller import auth
from fdl.controller.client import ControllerClient, ControllerError
from fdl.controller.policy import RunPolicy
from tests.controller_util import TEST_TOKEN, free_port, https_stand_in, serving

ID = "d1" * 16


def stand_in(answer_post, *, token: str | None = None, answer_state=None) -> type[BaseHTTPRequestHandler]:
    """A handler that answers GET /join/id (signed when given the token, naming its own key: a token holder turned
    hostile), GET /state.json with answer_state(handler) and every POST with answer_post(handler, body)."""

    class StandIn(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/state.json" and answer_state is not None:
                answer_state(self)
                return
            raw = json.dumps({"ok": True, "controller_id": ID, "now": time.time(),
                              "tls_spki_sha256": self.server.spki}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            challenge = self.headers.get(auth.CHALLENGE_HEADER)
            if token and challenge:
                self.send_header(auth.ANSWER_HEADER,
                                 auth.identity_proof(auth.derive(token, ID).answer, challenge, 200, raw))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self) -> None:
            answer_post(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def log_message(self, *args) -> None:
            pass

    return StandIn


def drip(handler: BaseHTTPRequestHandler, *_: object) -> None:
    """An answer that never ends: a header, then one byte of body every 0.2 s, for a minute."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    for _ in range(300):
        try:
            handler.wfile.write(b" ")
            handler.wfile.flush()
        except OSError:
            return
        time.sleep(0.2)


def test_an_answer_dripped_byte_by_byte_is_cut_at_the_deadline() -> None:
    """regression (issue 36 finding 7): a timeout bounded each read, not the answer: a stand-in dripping a byte
    every 0.2 s held a worker in one attempt for as long as it liked."""
    port = free_port(pairs=False)
    outcome: list = []
    with https_stand_in(stand_in(drip, answer_state=drip), port):
        def ask() -> None:
            with ControllerClient(f"127.0.0.1:{port}", timeout=2) as client:
                try:
                    outcome.append(client.state())
                except ControllerError as exc:
                    outcome.append(exc)

        worker = threading.Thread(target=ask, daemon=True)
        worker.start()
        worker.join(30)  # a guard only: the deadline is 2 s
        cut = not worker.is_alive()
    assert cut, "the client was still reading the dripped answer"
    assert isinstance(outcome[0], ControllerError) and "did not answer within 2 s" in outcome[0].message


def test_a_redirect_is_never_followed(tmp_path) -> None:
    """regression (issue 36 finding 7): the client followed redirects, so a 307 made a worker re-POST its signed
    hello (and a `fdl start` its signed start) to any URL the answer named. Here the one that redirects holds the
    token (a token holder turned hostile can do no better); the target records whatever reaches it."""
    from tests.conftest import run_fdl

    target_port, port = free_port(pairs=False), free_port(pairs=False)
    reached: list[str] = []

    def record(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        reached.append(handler.path)
        handler.send_response(200)
        handler.send_header("Content-Length", "2")
        handler.end_headers()
        handler.wfile.write(b"{}")

    def redirect(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(307)
        handler.send_header("Location", f"http://127.0.0.1:{target_port}{handler.path}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    with https_stand_in(stand_in(record, answer_state=lambda h: record(h, b"")), target_port), \
            https_stand_in(stand_in(redirect, token=TEST_TOKEN, answer_state=lambda h: redirect(h, b"")), port):
        with ControllerClient(f"127.0.0.1:{port}", timeout=5, token=TEST_TOKEN) as client, \
                pytest.raises(ControllerError) as hello:
            client.hello({"host": "w", "devices": "cpu:1"})
        status = run_fdl("status", "--addr", f"127.0.0.1:{port}", cwd=tmp_path, env={"FDL_JOIN_TOKEN": ""})
        start = run_fdl("start", "--addr", f"127.0.0.1:{port}", cwd=tmp_path, env={"FDL_JOIN_TOKEN": TEST_TOKEN})
    assert reached == [], reached  # nothing followed the redirect
    assert status.returncode == 1 and start.returncode == 1, (status.stderr, start.stderr)
    assert "redirect" in hello.value.message or "could not prove" in hello.value.message
    assert "fdl follows none" in status.stderr


def test_curl_reads_state_json_and_pins_the_key_the_launcher_names(tmp_path) -> None:
    """The documented curl lines: `curl -k https://HOST:PORT/state.json` reads the state; with --pinnedpubkey and
    the key the launcher prints (and the signed GET /join/id names), curl refuses any other key."""
    curl = "/usr/bin/curl"
    with serving(RunPolicy(window_s=60)) as server:
        url = f"https://127.0.0.1:{server.port}/state.json"
        plain = subprocess.run([curl, "-sS", "-k", url], capture_output=True, text=True, timeout=30)
        pinned = subprocess.run([curl, "-sS", "-k", "--pinnedpubkey", server.tls_pin, url], capture_output=True,
                                text=True, timeout=30)
        other = subprocess.run([curl, "-sS", "-k", "--pinnedpubkey", "sha256//" + "A" * 43 + "=", url],
                               capture_output=True, text=True, timeout=30)
        http = subprocess.run([curl, "-sS", f"http://127.0.0.1:{server.port}/state.json"], capture_output=True,
                              text=True, timeout=30)
        ident = json.loads(subprocess.run([curl, "-sS", "-k", f"https://127.0.0.1:{server.port}/join/id"],
                                          capture_output=True, text=True, timeout=30).stdout)
    assert plain.returncode == 0 and json.loads(plain.stdout)["phase"] == "waiting"
    assert pinned.returncode == 0 and json.loads(pinned.stdout)["controller_id"] == ident["controller_id"]
    assert other.returncode == 90, other.stderr  # CURLE_SSL_PINNEDPUBKEYNOTMATCH
    assert http.returncode != 0  # the port speaks TLS only
    import base64

    assert server.tls_pin == "sha256//" + base64.b64encode(bytes.fromhex(ident["tls_spki_sha256"])).decode()
