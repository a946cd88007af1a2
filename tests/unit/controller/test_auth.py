"""Proof of the token: the documented formula, request proofs (tamper, replay, clock window) and answer proofs."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from fdl.controller import auth

TOKEN = "5f0c" * 16
ID = "c0" * 16
OTHER_ID = "d1" * 16
BODY = b'{"host":"a","devices":"cpu:1"}'


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


@pytest.mark.parametrize("token", [TOKEN, "", "x" * 300])
@pytest.mark.parametrize("body", [b"", BODY, b"y" * 5000])
def test_proofs_are_the_documented_hmacs(token: str, body: bytes) -> None:
    # the module docstring's formula, spelled out with nothing of auth.py: keys made once and copied per proof
    # must give exactly these bytes (the wire format a worker of another fdl version checks)
    prk = _hmac(b"fdl join channel v1", token.encode())
    request_key = _hmac(prk, b"fdl request " + ID.encode() + b"\x01")
    answer_key = _hmac(prk, b"fdl answer " + ID.encode() + b"\x01")
    nonce, stamp = "ab" * 16, "1700000000"
    keys = auth.derive(token, ID)
    for _ in range(2):  # the keyed state is copied, never consumed: the same proof twice
        assert auth.request_proof(keys.request, "post", "/join", stamp, nonce, body) == _hmac(
            request_key, f"FDL2-REQUEST\nPOST\n/join\n{stamp}\n{nonce}\n".encode() + body).hex()
        assert auth.answer_proof(keys.answer, nonce, 403, body) == _hmac(
            answer_key, f"FDL2-ANSWER\n{nonce}\n403\n".encode() + body).hex()


def test_each_direction_has_its_own_key_and_the_token_is_in_neither_header() -> None:
    keys = auth.derive(TOKEN, ID)
    headers = auth.sign_request(keys, "POST", "/join", BODY)
    assert TOKEN not in "".join(headers.values())
    proof = headers[auth.PROOF_HEADER]
    assert proof != auth.answer_proof(keys.answer, headers[auth.NONCE_HEADER], 200, BODY)
    assert auth.derive(TOKEN + "x", ID).request.hexdigest() != keys.request.hexdigest()
    expanded = auth.expand(auth.extract(TOKEN), ID)  # the client keeps the extract, expands per controller
    assert expanded.request.hexdigest() == keys.request.hexdigest()
    assert expanded.answer.hexdigest() == keys.answer.hexdigest()


def test_a_proof_is_good_at_one_controller_instance_only() -> None:
    # regression: a proof covered method, path, time, nonce and body but nothing naming the controller, so a
    # hello recorded at one controller was admitted by every other holding the same token (the next run)
    here, there = auth.Verifier(TOKEN, ID), auth.Verifier(TOKEN, OTHER_ID)
    headers = auth.sign_request(auth.derive(TOKEN, ID), "POST", "/join", BODY)
    with pytest.raises(auth.BadProof, match="does not match") as err:
        there.verify("POST", "/join", headers, BODY)
    assert err.value.reason == "bad_token" and err.value.nonce is None
    nonce = here.verify("POST", "/join", headers, BODY)
    answer = here.sign_answer(nonce, 200, b"{}")  # ... and an answer names its controller too
    assert auth.answer_ok(auth.derive(TOKEN, ID), nonce, 200, b"{}", {auth.ANSWER_HEADER: answer})
    assert not auth.answer_ok(auth.derive(TOKEN, OTHER_ID), nonce, 200, b"{}", {auth.ANSWER_HEADER: answer})


def test_only_a_stale_time_is_answered_signed() -> None:
    now = [1_700_000_000.0]
    verifier = auth.Verifier(TOKEN, ID, wall=lambda: now[0])
    keys = auth.derive(TOKEN, ID)
    late = auth.sign_request(keys, "POST", "/join", BODY, wall=lambda: now[0] - 90)
    with pytest.raises(auth.BadProof, match="90 s behind") as err:
        verifier.verify("POST", "/join", late, BODY)
    assert err.value.reason == "stale_request" and err.value.nonce == late[auth.NONCE_HEADER]  # a holder's clock
    fresh = auth.sign_request(keys, "POST", "/join", BODY, wall=lambda: now[0])
    verifier.verify("POST", "/join", fresh, BODY)
    with pytest.raises(auth.BadProof, match="seen before") as replay:
        verifier.verify("POST", "/join", fresh, BODY)
    assert replay.value.nonce is None  # a replay's answer is never signed for the original's nonce


def test_a_proof_is_checked_once_within_the_window() -> None:
    now = [1_700_000_000.0]
    verifier = auth.Verifier(TOKEN, ID, wall=lambda: now[0])
    keys = auth.derive(TOKEN, ID)
    headers = auth.sign_request(keys, "POST", "/join", BODY, wall=lambda: now[0])
    nonce = verifier.verify("POST", "/join", headers, BODY)
    with pytest.raises(auth.BadProof, match="seen before") as replay:
        verifier.verify("POST", "/join", headers, BODY)
    assert replay.value.reason == "stale_request"
    for method, path, body in (("POST", "/join", BODY + b" "), ("POST", "/start", BODY), ("GET", "/join", BODY)):
        with pytest.raises(auth.BadProof, match="does not match"):
            verifier.verify(method, path, auth.sign_request(keys, "POST", "/join", BODY, wall=lambda: now[0]), body)
    stranger = auth.sign_request(auth.derive("other", ID), "POST", "/join", BODY, wall=lambda: now[0])
    with pytest.raises(auth.BadProof, match="does not match"):
        verifier.verify("POST", "/join", stranger, BODY)
    late = auth.sign_request(keys, "POST", "/join", BODY, wall=lambda: now[0] - 61)
    with pytest.raises(auth.BadProof, match="behind"):
        verifier.verify("POST", "/join", late, BODY)
    with pytest.raises(auth.BadProof, match="malformed"):
        verifier.verify("POST", "/join", {**headers, auth.NONCE_HEADER: "zz"}, BODY)
    answer = verifier.sign_answer(nonce, 200, b"{}")
    assert auth.answer_ok(keys, nonce, 200, b"{}", {auth.ANSWER_HEADER: answer})
    assert not auth.answer_ok(keys, nonce, 403, b"{}", {auth.ANSWER_HEADER: answer})  # bound to the status ...
    assert not auth.answer_ok(keys, "0" * 32, 200, b"{}", {auth.ANSWER_HEADER: answer})  # ... and the nonce
    now[0] += 200
    assert verifier.verify("POST", "/join", auth.sign_request(keys, "POST", "/join", BODY, wall=lambda: now[0]), BODY)
    assert len(verifier._seen) == 1  # the old nonce was forgotten once its window passed


def test_a_full_nonce_cache_sheds_load_instead_of_forgetting_early() -> None:
    verifier = auth.Verifier(TOKEN, ID, max_nonces=2)
    keys = auth.derive(TOKEN, ID)
    for _ in range(2):
        verifier.verify("POST", "/join", auth.sign_request(keys, "POST", "/join", BODY), BODY)
    with pytest.raises(auth.Overloaded):
        verifier.verify("POST", "/join", auth.sign_request(keys, "POST", "/join", BODY), BODY)
