"""Proof of the run's token without sending it: request signing one way, answer signing the other.

The token is the one shared secret. Keys are derived from it (HKDF-SHA256, RFC
5869, with a fixed salt) together with the controller instance's identifier
(random at each controller start, published in `GET /join` and state.json),
one key per direction, so a proof made by a worker can never be passed off as
one made by the controller, and a proof made for one controller instance is
worth nothing at any other holding the same token (the next run, a restarted
launcher):

    prk         = HMAC-SHA256(salt="fdl join channel v1", token)
    request_key = HMAC-SHA256(prk, "fdl request " CONTROLLER_ID || 0x01)
    answer_key  = HMAC-SHA256(prk, "fdl answer "  CONTROLLER_ID || 0x01)

A signed request carries three headers (the body is sent as it is)::

    X-Fdl-Time:  Unix seconds (whole), the sender's clock
    X-Fdl-Nonce: 32 hex digits from the OS entropy source, never reused
    X-Fdl-Proof: hex HMAC-SHA256(request_key, "FDL2-REQUEST\\n" METHOD "\\n" PATH "\\n" TIME "\\n" NONCE "\\n"
                                 BODY)

The controller refuses a proof that does not match, a time more than
`WINDOW_S` away from its own clock, and a nonce it has already seen inside the
window (a bounded cache: a nonce is only remembered after its proof matched,
so only a token holder can fill it). Its answer to a request whose proof
matched (a refusal for a time outside the window included) carries::

    X-Fdl-Answer-Proof: hex HMAC-SHA256(answer_key, "FDL2-ANSWER\\n" NONCE "\\n" STATUS "\\n" BODY)

bound to the request's nonce, so a recorded answer cannot be replayed to
another request. A worker holding a token acts only on answers whose proof
matches.

`GET /join/id` comes before any key is known to the client (the keys name the
controller instance it answers with). A client sends a fresh challenge with
it (X-Fdl-Challenge: 32 hex digits), and the controller proves its answer,
which names its TLS key (fdl.controller.tls), under its own label so that it
can never stand for another answer::

    X-Fdl-Answer-Proof: hex HMAC-SHA256(answer_key, "FDL4-IDENTITY\n" CHALLENGE "\n" STATUS "\n" BODY)

docs/controller.md holds the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

TIME_HEADER = "X-Fdl-Time"
NONCE_HEADER = "X-Fdl-Nonce"
PROOF_HEADER = "X-Fdl-Proof"
ANSWER_HEADER = "X-Fdl-Answer-Proof"
CHALLENGE_HEADER = "X-Fdl-Challenge"
WINDOW_S = 60.0  # a request's time may be this far from the controller's clock
MAX_NONCES = 1 << 19  # remembered nonces (about 60 MB at worst); more in one window: refused as overload
_SALT = b"fdl join channel v1"
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_PROOF_RE = re.compile(r"[0-9a-f]{64}")
_TIME_RE = re.compile(r"[0-9]{1,12}")


class Keys(NamedTuple):
    """The two keys one token gives at one controller instance: workers sign requests with one, the controller
    answers with the other. Each is an HMAC-SHA256 object keyed once; a proof is made on a copy of it, so the
    key's hash states are not set up again for every message."""

    request: hmac.HMAC
    answer: hmac.HMAC


CONTROLLER_ID_RE = re.compile(r"[0-9a-f]{32}")


def new_controller_id() -> str:
    """A controller instance's identifier: 128 random bits, made at every start, never reused."""
    return secrets.token_hex(16)


def extract(token: str) -> bytes:
    """HKDF-SHA256's extract step: the pseudorandom key every instance's keys are expanded from. It stands
    for the token (whoever holds it can prove the token), so it is kept like the token."""
    return hmac.new(_SALT, token.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def expand(prk: bytes, controller_id: str) -> Keys:
    """HKDF-SHA256's expand step (one block per direction), naming the controller instance."""
    ident = controller_id.encode()
    request = hmac.new(prk, b"fdl request " + ident + b"\x01", hashlib.sha256).digest()
    answer = hmac.new(prk, b"fdl answer " + ident + b"\x01", hashlib.sha256).digest()
    return Keys(hmac.new(request, digestmod=hashlib.sha256), hmac.new(answer, digestmod=hashlib.sha256))


def derive(token: str, controller_id: str) -> Keys:
    """The keys of token at the controller instance controller_id."""
    return expand(extract(token), controller_id)


def _mac(key: hmac.HMAC, head: bytes, body: bytes) -> str:
    mac = key.copy()
    mac.update(head)
    mac.update(body)
    return mac.hexdigest()


def request_proof(key: hmac.HMAC, method: str, path: str, stamp: str, nonce: str, body: bytes) -> str:
    return _mac(key, f"FDL2-REQUEST\n{method.upper()}\n{path}\n{stamp}\n{nonce}\n".encode(), body)


def answer_proof(key: hmac.HMAC, nonce: str, status: int, body: bytes) -> str:
    return _mac(key, f"FDL2-ANSWER\n{nonce}\n{int(status)}\n".encode(), body)


def identity_proof(key: hmac.HMAC, challenge: str, status: int, body: bytes) -> str:
    return _mac(key, f"FDL4-IDENTITY\n{challenge}\n{int(status)}\n".encode(), body)


def new_challenge() -> str:
    return secrets.token_hex(16)


def challenge_of(headers: Mapping[str, str]) -> str | None:
    """The client's challenge on a GET /join/id, when well formed."""
    given = headers.get(CHALLENGE_HEADER) or ""
    return given if _NONCE_RE.fullmatch(given) else None


def identity_ok(keys: Keys, challenge: str, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
    """Whether a GET /join/id answer proves the token, for this client's challenge."""
    given = headers.get(ANSWER_HEADER) or ""
    if not _PROOF_RE.fullmatch(given):
        return False
    return hmac.compare_digest(given, identity_proof(keys.answer, challenge, status, body))


def sign_request(keys: Keys, method: str, path: str, body: bytes, *,
                 wall: Callable[[], float] = time.time) -> dict[str, str]:
    """The headers that prove a request; the nonce is returned under NONCE_HEADER (verify the answer with it)."""
    stamp = str(int(wall()))
    nonce = secrets.token_hex(16)
    return {TIME_HEADER: stamp, NONCE_HEADER: nonce,
            PROOF_HEADER: request_proof(keys.request, method, path, stamp, nonce, body)}


def answer_ok(keys: Keys, nonce: str, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
    """Whether an answer proves it came from a holder of the token, for the request sent with nonce."""
    given = headers.get(ANSWER_HEADER) or ""
    if not _PROOF_RE.fullmatch(given):
        return False
    return hmac.compare_digest(given, answer_proof(keys.answer, nonce, status, body))


def has_proof(headers: Mapping[str, str]) -> bool:
    """Whether a request claims to be signed (any of the three headers present)."""
    return any(name in headers for name in (TIME_HEADER, NONCE_HEADER, PROOF_HEADER))


class BadProof(Exception):
    """A signed request the controller refuses: `reason` is bad_token (wrong or malformed proof) or
    stale_request (outside the time window, or a nonce seen before). `nonce` is set when the proof itself
    matched and only its time is outside the window (a token holder whose clock is off): that refusal is
    signed, so the holder can tell it from an impostor's."""

    def __init__(self, reason: str, message: str, nonce: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.nonce = nonce


class Overloaded(Exception):
    """The nonce cache is full of live nonces: shed the request (503), it is not a bad proof."""


class Verifier:
    """The controller's side: checks request proofs, remembers nonces, signs answers."""

    def __init__(self, token: str, controller_id: str, *, window_s: float = WINDOW_S,
                 max_nonces: int = MAX_NONCES, wall: Callable[[], float] = time.time):
        self.keys = derive(token, controller_id)
        self.controller_id = controller_id
        self.window_s = window_s
        self.max_nonces = max_nonces
        self.wall = wall
        self._seen: dict[str, float] = {}  # nonce -> when it may be forgotten (insertion order ~ time order)

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> str:
        """The request's nonce when its proof holds; raises BadProof (or Overloaded) otherwise."""
        stamp = headers.get(TIME_HEADER) or ""
        nonce = headers.get(NONCE_HEADER) or ""
        proof = headers.get(PROOF_HEADER) or ""
        if not (_TIME_RE.fullmatch(stamp) and _NONCE_RE.fullmatch(nonce) and _PROOF_RE.fullmatch(proof)):
            raise BadProof("bad_token", "the request's proof headers are malformed (X-Fdl-Time, X-Fdl-Nonce, "
                                        "X-Fdl-Proof).")
        expected = request_proof(self.keys.request, method, path, stamp, nonce, body)
        if not hmac.compare_digest(proof, expected):
            raise BadProof("bad_token", "the request's proof does not match this run's token at this controller "
                                        "(a different token, or a proof made for another controller).")
        now = self.wall()
        skew = int(stamp) - now
        if abs(skew) > self.window_s:
            raise BadProof("stale_request", f"the request's time is {abs(skew):.0f} s "
                                            f"{'ahead of' if skew > 0 else 'behind'} the controller's clock (more "
                                            f"than {self.window_s:g} s): a replay, or clocks that need syncing "
                                            f"(NTP).", nonce)
        self._forget(now)
        if nonce in self._seen:
            # Not signed: the answer to a replay would be bound to the original request's nonce, and an on-path
            # replayer could hand it to the original sender in place of the real answer.
            raise BadProof("stale_request", "the request's nonce was seen before: a replayed request.")
        if len(self._seen) >= self.max_nonces:
            raise Overloaded()
        self._seen[nonce] = int(stamp) + self.window_s
        return nonce

    def _forget(self, now: float) -> None:
        seen = self._seen
        while seen:
            oldest = next(iter(seen))
            if seen[oldest] >= now:
                # Insertion order is only roughly time order (clocks differ by up to the window): entries behind a
                # younger one are forgotten a little late, never early.
                break
            del seen[oldest]

    def sign_answer(self, nonce: str, status: int, body: bytes) -> str:
        return answer_proof(self.keys.answer, nonce, status, body)

    def sign_identity(self, challenge: str, status: int, body: bytes) -> str:
        return identity_proof(self.keys.answer, challenge, status, body)
