"""Token rules from a real non-loopback peer: a network namespace on a veth pair (needs root)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from fdl.controller import auth
from fdl.controller.client import ControllerClient
from fdl.controller.policy import RunPolicy
from tests.conftest import REPO, fdl_env, need_root_or_skip
from tests.controller_util import PeerNamespace, serving

TOKEN = "3bdf2b3b0a746622f538443aade3307762fffcff51a34b745cc7bbbb0bd916d4"  # fdl refuses a token under 128 bits
PROBE = r"""
import json, sys, urllib.request, urllib.error
url, body = sys.argv[1], sys.argv[2]
headers = {"Content-Type": "application/json", **json.loads(sys.argv[3])}
req = urllib.request.Request(url, data=body.encode() if body != "-" else None, method="POST" if body != "-" else "GET",
                             headers=headers)
try:
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw, status, answer = resp.read(), resp.status, resp.headers
except urllib.error.HTTPError as err:
    raw, status, answer = err.read(), err.code, err.headers
print(json.dumps({"status": status, "body": json.loads(raw), "raw": raw.decode(),
                  "proof": answer.get("X-Fdl-Answer-Proof")}))
"""


@pytest.fixture(scope="module")
def peer():
    need_root_or_skip("creates a network namespace and a veth pair for a non-loopback peer")
    ns = PeerNamespace(f"{os.getpid() % 100000:x}").create()
    try:
        yield ns
    finally:
        ns.destroy()


def from_peer(peer: PeerNamespace, server, path: str, body: dict | None,
              headers: dict | None = None, *, token: str | None = None) -> tuple[int, dict]:
    """A request from the namespace; signed with token when given, for the server's controller instance (and
    then its answer's proof is checked)."""
    port = server.port
    text = "-" if body is None else json.dumps(body)
    headers = dict(headers or {})
    keys = None
    if token is not None:
        keys = auth.derive(token, server.machine.controller_id)
        headers.update(auth.sign_request(keys, "POST", path, text.encode()))
    result = peer.run([sys.executable, "-c", PROBE, f"http://{peer.HOST_ADDR}:{port}{path}", text,
                       json.dumps(headers)], timeout=60)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    if keys is not None and answer["status"] < 500:
        proved = auth.answer_ok(keys, headers[auth.NONCE_HEADER], answer["status"], answer["raw"].encode(),
                                {auth.ANSWER_HEADER: answer["proof"] or ""})
        answer["body"]["_proved"] = proved
    return answer["status"], answer["body"]


def test_start_from_a_remote_peer_needs_the_right_token(peer: PeerNamespace) -> None:
    policy = RunPolicy(start="manual", quorum_hosts=1, window_s=120, token=TOKEN)
    with serving(policy, host=peer.HOST_ADDR) as server:
        status, body = from_peer(peer, server, "/join",
                                 {"host": "walkin", "devices": "cpu:1", "address": peer.PEER_ADDR}, token=TOKEN)
        assert status == 200 and body["admitted"] and body["_proved"]  # the answer proves the token back
        status, body = from_peer(peer, server, "/start", {})
        assert (status, body["reason"]) == (403, "bad_token") and "no proof of the run's token" in body["message"]
        status, body = from_peer(peer, server, "/start", {}, token="0" * 32)
        assert (status, body["reason"]) == (403, "bad_token") and "does not match" in body["message"]
        assert not body["_proved"]  # a controller never signs an answer to a request it could not verify
        spoof = {"X-Forwarded-For": "127.0.0.1", "Forwarded": "for=127.0.0.1", "X-Real-IP": "127.0.0.1",
                 "Host": "127.0.0.1"}
        status, body = from_peer(peer, server, "/start", {}, spoof)  # headers never make a peer loopback
        assert (status, body["reason"]) == (403, "bad_token")
        assert server.state()["phase"] == "staging"  # refusals are never queued
        status, body = from_peer(peer, server, "/start", {}, token=TOKEN)
        assert status == 200 and body["armed"] is True and body["_proved"]
        state = server.state()
        assert state["phase"] == "forming" and state["start"]["fired_by"] == peer.PEER_ADDR
        # same: not repeated
        assert state["roster"][0]["address"] == peer.PEER_ADDR and "peer" not in state["roster"][0]


def test_join_from_a_remote_peer_needs_the_token(peer: PeerNamespace) -> None:
    policy = RunPolicy(start="manual", quorum_hosts=1, window_s=120, token=TOKEN)
    with serving(policy, host=peer.HOST_ADDR) as server:
        status, body = from_peer(peer, server, "/join", {"host": "a", "devices": "0"})
        assert (status, body["reason"], body["admitted"]) == (403, "bad_token", False)
        status, body = from_peer(peer, server, "/join", {"host": "a", "devices": "0"}, token="nope")
        assert (status, body["reason"]) == (403, "bad_token")
        status, body = from_peer(peer, server, "/join", {"host": "a", "devices": "0", "token": TOKEN})
        assert (status, body["reason"]) == (400, "bad_request")  # regression: the token went in clear and admitted
        status, body = from_peer(peer, server, "/state.json", None)
        assert status == 200 and body["roster"] == [] and body["refusals"] == {"bad_token": 2}


def test_a_replayed_or_stale_request_is_refused(peer: PeerNamespace) -> None:
    """regression: a recorded hello (the token in clear) could be replayed by anyone; a signed one cannot."""
    import time

    policy = RunPolicy(start="manual", quorum_hosts=2, window_s=120, token=TOKEN)
    with serving(policy, host=peer.HOST_ADDR) as server:
        keys = auth.derive(TOKEN, server.machine.controller_id)
        body = json.dumps({"host": "a", "devices": "cpu:1"})
        headers = auth.sign_request(keys, "POST", "/join", body.encode())
        status, answer = from_peer(peer, server, "/join", json.loads(body), headers)
        assert status == 200 and answer["admitted"]
        server.call(lambda m: m.report_exit(answer["ticket"], 0))  # it leaves: only the nonce stops a replay now
        status, answer = from_peer(peer, server, "/join", json.loads(body), headers)
        assert (status, answer["reason"]) == (403, "stale_request") and "seen before" in answer["message"]
        old = auth.sign_request(keys, "POST", "/join", body.encode(), wall=lambda: time.time() - 3600)
        status, answer = from_peer(peer, server, "/join", json.loads(body), old)
        assert (status, answer["reason"]) == (403, "stale_request") and "behind" in answer["message"]
        other_path = auth.sign_request(keys, "POST", "/start", body.encode())
        status, answer = from_peer(peer, server, "/join", json.loads(body), other_path)
        assert (status, answer["reason"]) == (403, "bad_token")


def test_ten_thousand_forged_requests_from_a_remote_peer_admit_nobody(peer: PeerNamespace) -> None:
    policy = RunPolicy(start="manual", quorum_hosts=1, window_s=600, token=TOKEN, run_id="pinned")
    with serving(policy, host=peer.HOST_ADDR) as server:
        result = peer.run([sys.executable, "-m", "tests.integration.controller.forge", peer.HOST_ADDR,
                           str(server.port), "10000", "5", "token"], env=fdl_env(), cwd=REPO, timeout=600)
        assert result.returncode == 0, result.stderr
        statuses = {int(k): v for k, v in json.loads(result.stdout)["statuses"].items()}
        assert sum(statuses.values()) == 10_000
        assert 200 not in statuses and 0 not in statuses, statuses
        assert statuses.get(403, 0) > 2000, statuses  # the token forgeries were refused as such
        state = server.state()
        assert state["roster"] == [] and state["start"]["switch"] == "unarmed" and state["phase"] == "waiting"
        status, body = from_peer(peer, server, "/join", {"host": "real", "devices": "cpu:1", "run_id": "pinned"},
                                 token=TOKEN)
        assert status == 200 and body["admitted"]  # still serving, and the real token still works
        assert ControllerClient(f"{peer.HOST_ADDR}:{server.port}").state()["quorum"]["met"] is True

