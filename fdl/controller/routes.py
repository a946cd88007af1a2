"""The endpoints: aiohttp's `web.Application` around one `RunMachine`.

Request handlers parse bodies, check proofs of the token (from every peer:
loopback is not a credential, other accounts share it) and hold world
long-polls on one shared event; one middleware turns `Refused`/`BadRequest`,
bounds exceeded and anything unexpected into the JSON envelope, signs the
answer to a request whose proof matched (bound to its nonce and to this
controller instance, fdl.controller.auth), moves the connection such a
request came on into the trusted pool (fdl.controller.gate), tells the
shares when a connection is busy, and counts answers for /metrics.
`GET /join/id` is signed for a client's challenge, naming the controller's
TLS key (fdl.controller.tls).
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import functools
import gzip
import hashlib
import importlib.resources
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web

from fdl.controller import auth
from fdl.controller.gate import Gate, Shares
from fdl.controller.machine import RunMachine
from fdl.controller.protocol import PROTOCOL, BadRequest, decode, parse_hello, parse_start, parse_ticketed
from fdl.controller.states import OPEN, Refused
from fdl.controller.wire import Limits, error_response, json_bytes, json_response

log = logging.getLogger("fdl.controller")
GZIP_FROM = 16 * 1024  # state.json bodies this large go gzipped to clients that accept it (a big roster)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ENDPOINTS = {
    "GET /": "this run's status page (HTML; JSON with Accept: application/json)",
    "GET /state.json": "the run's live state (signed back when the request is signed)",
    "GET /metrics": "Prometheus metrics",
    "GET /join/id": "this controller instance's id (every proof names it), its protocol, its clock and its TLS key "
                    "(signed for an X-Fdl-Challenge)",
    "POST /start": "fire the start switch", "POST /join": "hello: ask to join the window",
    "POST /join/world": "long-poll for your world", "POST /join/heartbeat": "stay on the roster",
    "POST /join/exit": "report your exit code"}


class Proof(NamedTuple):
    """What the request being handled proved: whether its proof of the token matched, and the nonce its answer
    is signed for (also set for a token holder's request refused for its time: see auth.BadProof)."""

    authed: bool
    nonce: str | None


NO_PROOF = Proof(False, None)
# The proof of the request the current task handles: reset by the middleware, set while its body is read.
PROOF: contextvars.ContextVar[Proof] = contextvars.ContextVar("fdl_controller_auth", default=NO_PROOF)


class Unsupported(Exception):
    """A request body the controller does not decode (HTTP 400, connection closed)."""


class TooLarge(Exception):
    """A request body over Limits.max_body (HTTP 413, connection closed)."""


@dataclass(frozen=True)
class StatusPage:
    body: bytes
    csp: str  # allows exactly the page's own inline script and style, and fetches from its origin


@functools.cache
def status_page() -> StatusPage:
    """fdl/controller/page.html, read once, with a Content-Security-Policy naming its inline parts' hashes."""
    body = importlib.resources.files("fdl.controller").joinpath("page.html").read_bytes()

    def hashes(tag: bytes) -> str:
        found = re.findall(rb"<" + tag + rb"[^>]*>(.*?)</" + tag + rb">", body, re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(part).digest()).decode()}'" for part in found)

    csp = (f"default-src 'none'; script-src {hashes(b'script')}; style-src {hashes(b'style')}; "
           f"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
           f"frame-ancestors 'none'")
    return StatusPage(body, csp)


class Endpoints:
    """The run's HTTP endpoints, their one middleware and the application that routes to them."""

    def __init__(self, machine: RunMachine, limits: Limits, *, registry: Callable[[], Any]):
        self.machine = machine
        self.limits = limits
        self.verifier = auth.Verifier(machine.policy.token, machine.controller_id) if machine.policy.token else None
        self.formed: asyncio.Event | None = None  # set once the world formed or the run ended (server-owned)
        self.shares: Shares | None = None  # the connections' shares (server-owned): proved ones are promoted
        self.tls_spki = ""  # hex SHA-256 of the controller's TLS key (server-owned), named in GET /join/id
        self.requests: dict[tuple[str, int], int] = {}  # (endpoint, status) -> answered requests
        self._new_registry = registry  # prometheus_client's CollectorRegistry maker, called at the first scrape
        self._registry: Any = None
        self._gzip: tuple[bytes | None, bytes] = (None, b"")
        self.routes: dict[str, tuple[str, Callable[[web.BaseRequest], Awaitable[web.Response]]]] = {
            "/": ("GET", self.index),
            "/state.json": ("GET", self.state),
            "/metrics": ("GET", self.metrics),
            "/join/id": ("GET", self.identity),
            "/start": ("POST", self.start),
            "/join": ("POST", self.hello),
            "/join/world": ("POST", self.world),
            "/join/heartbeat": ("POST", self.heartbeat),
            "/join/exit": ("POST", self.exit),
        }

    def application(self) -> web.Application:
        """aiohttp's Application: every endpoint through its router, errors and proofs in one middleware."""
        app = web.Application(middlewares=[self.middleware], handler_args=None)
        for path, (method, handler) in self.routes.items():
            if method == "GET":
                app.router.add_get(path, handler)  # HEAD too
            else:
                app.router.add_route(method, path, handler)
        return app

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every refusal and error as the one JSON envelope; the answer to a request whose proof matched
        signed (bound to its nonce); answers counted by endpoint and status."""
        PROOF.set(NO_PROOF)  # this handler's task: set by authenticate while the request is read
        entry = Gate.entry_of(request.transport)
        if entry is not None:
            entry.inflight += 1  # busy: not an idle keep-alive connection meanwhile
        try:
            resp = await self._answer(request, handler)
        finally:
            if entry is not None:
                entry.inflight -= 1
                entry.answered, entry.pending, entry.last = True, False, time.monotonic()
        proof = PROOF.get()
        if proof.authed and entry is not None and self.shares is not None:
            self.shares.promote(entry)  # a token holder's connection: capacity strangers cannot take
        nonce = proof.nonce
        if nonce is not None and self.verifier is not None and isinstance(resp, web.Response):
            raw = resp.body
            signed = bytes(raw) if isinstance(raw, bytes | bytearray) else b""  # every answer here is bytes
            resp.headers[auth.ANSWER_HEADER] = self.verifier.sign_answer(nonce, resp.status, signed)
        key = (request.path if request.path in self.routes else "other", resp.status)
        self.requests[key] = self.requests.get(key, 0) + 1  # GET /metrics reports these
        return resp

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The handler's answer, or the envelope of whatever it raised."""
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(m for m in exc.allowed_methods if m != "HEAD"))
            resp = error_response(405, "method_not_allowed", f"{request.path[:100]} answers {allowed} only.")
            resp.headers["Allow"] = allowed
        except web.HTTPNotFound:
            resp = error_response(404, "not_found", f"no such endpoint {request.path[:100]!r}; GET / with "
                                                    f"Accept: application/json lists them.")
        except auth.BadProof as bad:  # raised by authenticate; a token holder's stale time is answered signed
            PROOF.set(Proof(False, bad.nonce))
            resp = json_response(self.machine.refuse(bad.reason, bad.message, status=403).to_dict(), 403)
        except Refused as refused:
            body = refused.to_dict()
            if request.path == "/join":
                body["admitted"] = False
            resp = json_response(body, refused.status)
        except BadRequest as exc:
            resp = error_response(400, "bad_request", str(exc))
        except Unsupported as exc:
            resp = error_response(400, "bad_request", str(exc), close=True)
        except TooLarge:
            resp = error_response(413, "too_large", f"the request body is larger than {self.limits.max_body} "
                                                    f"bytes.", close=True)
        except TimeoutError:
            resp = error_response(408, "timeout", f"the request body did not arrive within "
                                                  f"{self.limits.body_timeout_s:g} s.", close=True)
        except web.HTTPException as exc:  # raised by aiohttp itself while reading a request
            resp = error_response(exc.status, "bad_request" if exc.status < 500 else "internal",
                                  (exc.reason or "the request could not be handled")[:200], close=True)
        except Exception:  # a fault of the controller's own: logged here, one envelope for the peer
            log.exception("controller: request failed")
            resp = error_response(500, "internal", "the controller failed to handle this request", close=True)
        return resp

    # ------------------------------------------------------------------ reading requests

    async def read_json(self, request: web.BaseRequest) -> dict[str, Any]:
        """The request's JSON body, after its proof of the token (if any) was checked (see `authenticate`)."""
        body = await self.read_body(request)
        self.authenticate(request, body)
        return decode(body)

    def authenticate(self, request: web.BaseRequest, body: bytes) -> None:
        """Check a signed request's proof; remember whether it proved the token (PROOF.get().authed) and its
        nonce, which the answer's own proof is bound to. An unsigned request is left to the machine's rules."""
        PROOF.set(NO_PROOF)
        if not auth.has_proof(request.headers):
            return
        if self.verifier is None:
            raise self.machine.refuse("bad_token", "this run has no token (insecure_no_token), so a proof cannot "
                                                   "be checked here and nothing it says back is signed.", status=403)
        try:
            nonce = self.verifier.verify(request.method, request.path, request.headers, body)
        except auth.Overloaded:
            raise Refused("overloaded", "the controller is answering too many signed requests at once; retry "
                                        "shortly.", status=503) from None
        PROOF.set(Proof(True, nonce))

    async def read_body(self, request: web.BaseRequest) -> bytes:
        limit = self.limits.max_body
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # Nothing fdl sends is compressed; decoding a stranger's body (a bomb, or not what it claims) is
            # work the controller never does. regression: a non-gzip body labelled gzip was a 500 + traceback.
            raise Unsupported(f"request bodies are accepted uncompressed only (Content-Encoding: identity), "
                              f"not {encoding[:40]!r}.")
        length = request.content_length
        if length is not None and length > limit:
            raise TooLarge()
        content = request.content
        if content.is_eof():  # the whole body came with the head (the usual case): no timer needed
            head = content.read_nowait()
            if len(head) > limit:
                raise TooLarge()
            return head
        data = bytearray()
        async with asyncio.timeout(self.limits.body_timeout_s):
            while True:
                chunk = await request.content.read(limit + 1 - len(data))
                if not chunk:
                    break
                data += chunk
                if len(data) > limit:
                    raise TooLarge()
        return bytes(data)

    async def member_json(self, request: web.BaseRequest) -> dict[str, Any]:
        """A member's request body: a run with a token takes only signed ones, from every peer, loopback
        included (the ticket travels in clear, so it alone proves nothing)."""
        obj = await self.read_json(request)
        if self.verifier is not None and not PROOF.get().authed:
            raise self.machine.refuse("bad_token", "no proof of the run's token: a member's requests must be "
                                                   "signed with it (from loopback too).", status=403)
        return obj

    # ------------------------------------------------------------------ handlers

    async def index(self, request: web.BaseRequest) -> web.Response:
        """The status page; a client that asks for JSON only gets the list of endpoints."""
        accept = request.headers.get("Accept", "")
        if "application/json" in accept and "text/html" not in accept:
            return json_response({"ok": True, "service": "fdl controller", "endpoints": ENDPOINTS})
        page = status_page()
        return web.Response(body=page.body, content_type="text/html", charset="utf-8", headers={
            "Cache-Control": "no-cache", "Content-Security-Policy": page.csp, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"})

    async def metrics(self, request: web.BaseRequest) -> web.Response:
        if self._registry is None:
            # prometheus_client is slow to import: done off the loop, once, at the first scrape
            registry = await asyncio.to_thread(self._new_registry)
            self._registry = self._registry or registry
        from fdl.controller.metrics import render

        body, content_type = render(self._registry, request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})

    async def identity(self, request: web.BaseRequest) -> web.Response:
        """Which controller instance answers here: the id every proof names (a client learns it before its first
        signed request), the protocol, the controller's clock (a worker compares its own with it) and its TLS
        key. Signed for the client's challenge when the run has a token: a client pins the key through it."""
        m = self.machine
        body = json_bytes({"ok": True, "service": "fdl controller", "protocol": PROTOCOL,
                           "controller_id": m.controller_id, "run_id": m.cohort_run_id, "now": round(m.now(), 3),
                           "tls_spki_sha256": self.tls_spki})
        resp = json_response(None, raw=body)
        challenge = auth.challenge_of(request.headers)
        if challenge is not None and self.verifier is not None:
            resp.headers[auth.ANSWER_HEADER] = self.verifier.sign_identity(challenge, 200, body)
        return resp

    async def state(self, request: web.BaseRequest) -> web.Response:
        body = self.machine.state_json()
        if auth.has_proof(request.headers):
            # A signed look (fdl status --watch with the run's token): proved, and answered signed, uncompressed.
            self.authenticate(request, b"")
            return json_response(None, raw=body)
        if len(body) >= GZIP_FROM and "gzip" in request.headers.get("Accept-Encoding", ""):
            if self._gzip[0] is not body:  # compressed once per snapshot, however many pollers ask
                self._gzip = (body, gzip.compress(body, compresslevel=1, mtime=0))
            resp = json_response(None, raw=self._gzip[1])
            resp.headers["Content-Encoding"] = "gzip"
            resp.headers["Vary"] = "Accept-Encoding"
            return resp
        return json_response(None, raw=body)

    async def start(self, request: web.BaseRequest) -> web.Response:
        parse_start(await self.read_json(request))
        m = self.machine
        m.fire(peer=request.remote or "", trusted=PROOF.get().authed)
        return json_response({
            "ok": True, "armed": True, "phase": m.phase, "world": m.world.summary() if m.world else None,
            "message": f"start armed: the world formed with {m.roster.quorum_text()}; watch fdl status."})

    async def hello(self, request: web.BaseRequest) -> web.Response:
        hello = parse_hello(await self.read_json(request))
        m = self.machine
        member = m.hello(hello, peer=request.remote or "", trusted=False, authed=PROOF.get().authed)
        p = m.policy
        return json_response({
            "ok": True, "admitted": True, "ticket": member.ticket, "host": member.host, "ranks": member.ranks,
            "phase": m.phase, "run_id": m.cohort_run_id, "seconds_left": m.lifecycle.seconds_left(),
            "quorum": m.roster.quorum(),
            "heartbeat_s": p.heartbeat_s, "silence_s": p.silence_s, "poll_s": p.poll_s})

    async def world(self, request: web.BaseRequest) -> web.Response:
        msg = parse_ticketed(await self.member_json(request), kind="world")
        m = self.machine
        member = m.poll_begin(msg.ticket)
        try:
            wait = m.policy.poll_s if msg.wait_s is None else min(msg.wait_s, m.policy.poll_s)
            if m.world is None and m.phase in OPEN and wait > 0:
                assert self.formed is not None
                try:
                    async with asyncio.timeout(wait):
                        await self.formed.wait()
                except TimeoutError:
                    pass
        finally:
            m.poll_end(member)
        body = m.world_reply(member)
        if body is not None:
            return json_response(None, raw=body)
        if m.phase not in OPEN:
            raise Refused("window_closed", m.lifecycle.closed_text())
        return json_response({"ok": True, "formed": False, "phase": m.phase,
                              "seconds_left": m.lifecycle.seconds_left(), "quorum": m.roster.quorum()})

    async def heartbeat(self, request: web.BaseRequest) -> web.Response:
        msg = parse_ticketed(await self.member_json(request), kind="heartbeat")
        m = self.machine
        m.heartbeat(msg.ticket, running=msg.running)
        return json_response({"ok": True, "phase": m.phase, "formed": m.world is not None,
                              "stop": m.phase == "failed", "reason": m.reason, "heartbeat_s": m.policy.heartbeat_s})

    async def exit(self, request: web.BaseRequest) -> web.Response:
        msg = parse_ticketed(await self.member_json(request), kind="exit")
        m = self.machine
        assert msg.code is not None
        m.report_exit(msg.ticket, msg.code, msg.detail)
        return json_response({"ok": True, "phase": m.phase, "reason": m.reason})
