"""The controller endpoint: plain HTTP/1.1 + JSON on the training port, served by aiohttp.

A thin shell around `RunMachine`: it parses bodies, decides whether a peer is
loopback, holds world long-polls on one shared event, ticks the machine's
clock, and turns `Refused`/`BadRequest` into JSON errors. Everything is
bounded (`Limits`): body size and read time, request line and header sizes
and count, the time a connection may take to send a complete request head
(slowloris), and the number of open connections (in all, and per stranger's
address). Requests that prove the run's token are checked here and their
answers signed (fdl.controller.auth).

aiohttp's public API only: a `web.Application` whose router holds every
endpoint and whose middlewares turn errors into the JSON envelope and sign
answers, run by `web.AppRunner`; connections are admitted by `_Gate`, the
protocol factory handed to asyncio, before aiohttp's handler (a public
`web.RequestHandler` subclass that keeps malformed HTTP in the JSON envelope)
sees a byte.

Two ways to run it::

    async with-style, inside a running loop:   await server.start_async() ... await server.stop_async()
    in a background thread (launcher, tests):  with ControllerServer(policy, port=1337) as server: ...
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextvars
import errno
import functools
import gc
import gzip
import hashlib
import importlib.resources
import ipaddress
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from aiohttp import web

from fdl.controller import auth
from fdl.controller.machine import OPEN, TERMINAL, Refused, RunMachine
from fdl.controller.policy import RunPolicy, normalize_ip
from fdl.controller.protocol import MAX_BODY, BadRequest, decode, parse_hello, parse_start, parse_ticketed
from fdl.errors import FdlError

JSON_TYPE = "application/json"
GC_GEN0 = 50_000  # the cyclic GC's youngest-generation threshold while a controller serves (default 700)
GZIP_FROM = 16 * 1024  # state.json bodies this large go gzipped to clients that accept it (a big roster)
log = logging.getLogger("fdl.controller")


@dataclass(frozen=True)
class Limits:
    """Bounds on what any peer can make the server hold."""

    max_body: int = MAX_BODY  # bytes in a request body
    max_line: int = 4096  # request line / header line length
    max_field: int = 4096  # one header value
    max_headers: int = 32  # header count
    head_timeout_s: float = 10.0  # a connection's complete request head must arrive within this (also idle)
    body_timeout_s: float = 10.0  # a request's body must arrive within this
    max_connections: int = 10_000  # open connections from strangers; more are answered 503 and closed
    max_per_peer: int = 64  # open connections one non-member, non-loopback address may hold
    member_reserve: int = 1024  # connections beyond max_connections kept for members and loopback
    backlog: int = 4096


class _Auth(NamedTuple):
    """What the request being handled proved: whether its proof of the token matched, and its nonce."""

    authed: bool
    nonce: str | None


_NO_AUTH = _Auth(False, None)
_AUTH: contextvars.ContextVar[_Auth] = contextvars.ContextVar("fdl_controller_auth", default=_NO_AUTH)


class _Unsupported(Exception):
    """A request body the controller does not decode (HTTP 400, connection closed)."""


class _TooLarge(Exception):
    pass


def is_loopback(remote: str | None) -> bool:
    """Whether a peer address is this machine's loopback (IPv4 127/8, ::1, or IPv4-mapped 127/8)."""
    if not remote:
        return False
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _body(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json(obj: Any, status: int = 200, *, close: bool = False, raw: bytes | None = None) -> web.Response:
    resp = web.Response(body=raw if raw is not None else _body(obj), status=status, content_type=JSON_TYPE,
                        headers={"Cache-Control": "no-store"})
    if close:
        resp.force_close()
    return resp


def _error(status: int, reason: str, message: str, *, close: bool = False, **extra: Any) -> web.Response:
    return _json({"ok": False, "reason": reason, "message": message, **extra}, status, close=close)


class _Handler(web.RequestHandler):
    """aiohttp's connection handler, answering HTTP-level errors (bad request line, oversized
    headers) with the same JSON envelope as every other error, and without logging tracebacks."""

    released: Callable[[], None] | None = None  # the gate's release, called once the connection is gone

    def connection_lost(self, exc: BaseException | None) -> None:
        release, self.released = self.released, None
        try:
            super().connection_lost(exc)
        finally:
            if release is not None:
                release()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A peer's malformed input (a body that does not decode as it claims, cut connections) is the peer's
        problem: one line at debug level, never a traceback per request."""
        exc = kw.get("exc_info")
        what = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}" \
            if isinstance(exc, BaseException) else ""
        log.debug("controller: connection ended by a malformed request (%s)", what[:200])

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        text = (exc.message if isinstance(getattr(exc, "message", None), str) else None) or message
        text = (text or "").strip().splitlines()[0].rstrip(":") if text and text.strip() else None
        if status >= 500:
            log.error("controller: request failed", exc_info=exc)
            reason, text = "internal", "the controller failed to handle this request"
        else:
            reason = "bad_request"
            text = f"malformed HTTP request: {text or 'could not be parsed'}"
        text = text if len(text) <= 200 else text[:197] + "..."
        return _error(status, reason, text, close=True)


class _Overloaded:
    """Answers a connection over its limit with 503 and closes it (drives the transport it is handed)."""

    BODY = _body({"ok": False, "reason": "overloaded",
                  "message": "the controller holds its maximum number of connections; retry shortly."})
    RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Retry-After: 1\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)

    def __init__(self, transport: asyncio.Transport):
        transport.write(self.RESPONSE)
        transport.write_eof()
        # Closing with the peer's request still unread would reset the connection and lose the answer:
        # read and drop what it sends for a moment, then close.
        self._close = asyncio.get_running_loop().call_later(0.5, transport.close)
        self._transport = transport

    def eof_received(self) -> bool:
        self._close.cancel()
        self._transport.close()
        return False

    def connection_lost(self) -> None:
        self._close.cancel()


class _Gate:
    """The protocol factory asyncio calls per connection: admits it to aiohttp's handler, or answers 503.

    Fairness under flood: a peer address may hold at most `per_peer` connections, and strangers together at
    most `max_connections`; loopback peers and the addresses of admitted members are never held to the
    per-peer share and may use `reserve` connections beyond the total, so a flood from other addresses
    cannot crowd out a member's heartbeats, world polls and exit reports."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], *, max_connections: int, per_peer: int,
                 reserve: int, priority: Callable[[str | None], bool], shed: Callable[[str | None], None]):
        self.factory = factory
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.reserve = reserve
        self.priority = priority
        self.shed = shed
        self.total = 0
        self.by_peer: dict[str | None, int] = {}
        self.overloaded = 0

    def __call__(self) -> asyncio.Protocol:
        return _Gated(self)

    def admit(self, peer: str | None) -> bool:
        if self.priority(peer):
            ok = self.total < self.max_connections + self.reserve
        else:
            ok = self.total < self.max_connections and self.by_peer.get(peer, 0) < self.per_peer
        if not ok:
            self.overloaded += 1
            self.shed(peer)
            return False
        self.total += 1
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        return True

    def release(self, peer: str | None) -> None:
        self.total -= 1
        left = self.by_peer.get(peer, 1) - 1
        if left > 0:
            self.by_peer[peer] = left
        else:
            self.by_peer.pop(peer, None)


class _Gated(asyncio.Protocol):
    """One new connection: once the gate admits it, the transport is handed to aiohttp's handler
    (`set_protocol`, public asyncio API), which releases the gate's count when the connection is lost; a
    refused one is answered 503 here."""

    __slots__ = ("gate", "refused")

    def __init__(self, gate: _Gate):
        self.gate = gate
        self.refused: _Overloaded | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        name = transport.get_extra_info("peername")
        peer = normalize_ip(name[0]) if isinstance(name, tuple) and name else None
        if not self.gate.admit(peer):
            self.refused = _Overloaded(transport)  # type: ignore[arg-type]
            return
        handler = self.gate.factory()
        handler.released = functools.partial(self.gate.release, peer)
        transport.set_protocol(handler)
        handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return self.refused.eof_received() if self.refused is not None else False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.refused is not None:
            self.refused.connection_lost()


class ControllerServer:
    """The controller endpoint for one run: owns a `RunMachine`, serves it over HTTP."""

    def __init__(self, policy: RunPolicy | RunMachine, *, host: str = "127.0.0.1", port: int = 1337,
                 limits: Limits | None = None):
        self.machine = policy if isinstance(policy, RunMachine) else RunMachine(policy)
        self.policy = self.machine.policy
        self.host = host
        self.port = port
        self.limits = limits or Limits()
        self.tick_s = min(0.25, self.policy.silence_s / 4)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._runner: web.AppRunner | None = None
        self._gate: _Gate | None = None
        self._ticker: asyncio.Task | None = None
        self._formed: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._stop_requested: asyncio.Event | None = None
        self._cv = threading.Condition()
        self._deadline_seen: float | None = None
        self._gzip: tuple[bytes | None, bytes] = (None, b"")
        self._gc_saved: tuple[int, ...] | None = None
        self._registry: Any = None  # prometheus_client's CollectorRegistry, made at the first scrape
        self.requests: dict[tuple[str, int], int] = {}  # (endpoint, status) -> answered requests
        self._verifier = auth.Verifier(self.policy.token) if self.policy.token else None
        self.machine.listeners.append(self._on_change)

    @classmethod
    def for_cluster(cls, cluster: Any, *, run_id: str | None = None, args: tuple[str, ...] = (),
                    limits: Limits | None = None) -> ControllerServer:
        """The controller a `cluster:` block describes: its policy, on its bind address and port
        (loopback when tunnel_only)."""
        ctl = cluster.controller
        limits = limits or Limits(max_per_peer=ctl.peer_connections)
        return cls(RunPolicy.from_cluster(cluster, run_id=run_id, args=args), host=ctl.bind, port=ctl.port,
                   limits=limits)

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start_async(self) -> None:
        """Bind and serve inside the running loop; raises FdlError when the port cannot be had."""
        loop = asyncio.get_running_loop()
        if self.policy.token is None and not is_loopback(self.host) and self.host != "localhost":
            if not self.policy.insecure_no_token:
                raise FdlError(
                    f"the controller would listen on {self.address} without a token: anyone who can reach that "
                    f"address could join the run, read its arguments and run code as a rank.",
                    hint="Set cluster.controller.join.token (fdl join-config makes one), bind loopback "
                         "(tunnel_only: true), or, knowingly, set cluster.controller.join.insecure_no_token: true.")
            log.warning("controller: %s listens without a token (insecure_no_token): anyone who can reach it may "
                        "join", self.address)
        self._loop = loop
        await asyncio.to_thread(self.machine.resolve_roster)  # names resolved once, off the loop
        self._formed = asyncio.Event()
        self._wake = asyncio.Event()
        self._on_change(self.machine)
        _raise_fd_limit(self.limits.max_connections + self.limits.member_reserve + 256)
        lim = self.limits
        handler_kwargs = dict(keepalive_timeout=lim.head_timeout_s, max_line_size=lim.max_line,
                              max_field_size=lim.max_field, max_headers=lim.max_headers, access_log=None,
                              lingering_time=1.0)
        self._runner = web.AppRunner(self._application(), handler_cancellation=True, **handler_kwargs)
        await self._runner.setup()
        web_server = self._runner.server
        assert web_server is not None
        self._gate = _Gate(lambda: _Handler(web_server, loop=loop, **handler_kwargs),
                           max_connections=lim.max_connections, per_peer=lim.max_per_peer, reserve=lim.member_reserve,
                           priority=self._priority, shed=self.machine.shed)
        try:
            self._server = await loop.create_server(self._gate, self.host, self.port, backlog=lim.backlog,
                                                    reuse_address=True)
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            why = "the address is already in use (another run, or another program, holds it)" \
                if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise FdlError(f"the controller cannot listen on {self.address}: {why}.",
                           hint="Stop whatever holds the port, or set cluster.controller.port.") from None
        self.port = self._server.sockets[0].getsockname()[1]
        self._tune_gc()
        self._ticker = loop.create_task(self._tick_loop())

    def _tune_gc(self) -> None:
        """Collect the youngest generation less often while serving: thousands of open connections are
        long-lived objects every full collection walks, and the default threshold (700) collects several
        times per request burst. About a quarter less CPU per join request; restored on stop."""
        current = gc.get_threshold()
        if current[0] < GC_GEN0:
            self._gc_saved = current
            gc.set_threshold(GC_GEN0, *current[1:])

    def _restore_gc(self) -> None:
        if self._gc_saved is not None and gc.get_threshold()[0] == GC_GEN0:
            gc.set_threshold(*self._gc_saved)
        self._gc_saved = None

    async def stop_async(self) -> None:
        self._restore_gc()
        if self._ticker is not None:
            self._ticker.cancel()
            try:
                await self._ticker
            except asyncio.CancelledError:
                pass
            self._ticker = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            if self._runner.server is not None:
                self._runner.server.pre_shutdown()
                await self._runner.server.shutdown(0.5)
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> ControllerServer:
        """Serve from a background thread; returns once listening (or raises why it could not)."""
        if self._thread is not None:
            raise RuntimeError("controller already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = new_event_loop()
            try:
                self._stop_requested = asyncio.Event()
                loop.run_until_complete(self.start_async())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_until_complete(self._stop_requested.wait())
                loop.run_until_complete(self.stop_async())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"fdl-controller-{self.port}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with start(); open long-polls are cut."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if self._stop_requested is not None:
            loop.call_soon_threadsafe(self._stop_requested.set)
        thread.join(timeout)
        self._thread = None

    def __enter__(self) -> ControllerServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ in-process API (any thread)

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
        """Run fn(machine, *args) on the server's loop and return its result (re-raising its error)."""
        loop = self._loop
        if loop is None:
            return fn(self.machine, *args)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return fn(self.machine, *args)
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(self.machine, *args))
            except BaseException as exc:
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def state(self) -> dict:
        """state.json, as a dict."""
        return self.call(lambda m: m.state())

    @property
    def overloaded(self) -> int:
        """Connections answered 503 because the connection limit was reached."""
        return self._gate.overloaded if self._gate is not None else 0

    @property
    def open_connections(self) -> int:
        return self._gate.total if self._gate is not None else 0

    def _priority(self, peer: str | None) -> bool:
        """Loopback peers and admitted members' addresses: never held to a stranger's share."""
        return peer is not None and (peer in self.machine.peers or is_loopback(peer))

    def wait_phase(self, *phases: str, timeout: float | None = None) -> bool:
        """Block until the run reaches one of phases; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self.machine.phase in phases, timeout)

    # ------------------------------------------------------------------ internals

    def _on_change(self, machine: RunMachine) -> None:
        if self._formed is not None and (machine.world is not None or machine.phase in TERMINAL):
            self._formed.set()
        if self._wake is not None and machine.deadline != self._deadline_seen:
            self._deadline_seen = machine.deadline  # the ticker sleeps until the new deadline
            self._wake.set()
        with self._cv:
            self._cv.notify_all()

    async def _tick_loop(self) -> None:
        assert self._wake is not None
        while True:
            left = self.machine.next_deadline_in()
            delay = self.tick_s if left is None else min(self.tick_s, left + 0.001)
            self._wake.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self.machine.tick()

    async def _read_json(self, request: web.BaseRequest) -> dict:
        """The request's JSON body, after its proof of the token (if any) was checked (see `_authenticate`)."""
        body = await self._read_body(request)
        self._authenticate(request, body)
        return decode(body)

    def _authenticate(self, request: web.BaseRequest, body: bytes) -> None:
        """Check a signed request's proof; remember whether it proved the token (_AUTH.get().authed) and its
        nonce, which the answer's own proof is bound to. An unsigned request is left to the machine's rules."""
        _AUTH.set(_Auth(False, None))
        if not auth.has_proof(request.headers):
            return
        if self._verifier is None:
            if is_loopback(request.remote):
                return  # a loopback peer needs no proof, and this run has no token to check one against
            raise self.machine._refuse("bad_token", "this run has no token, so a proof cannot be checked here; "
                                                    "the controller admits no signed request from another host.",
                                       status=403)
        try:
            nonce = self._verifier.verify(request.method, request.path, request.headers, body)
        except auth.BadProof as exc:
            raise self.machine._refuse(exc.reason, exc.message, status=403) from None
        except auth.Overloaded:
            raise Refused("overloaded", "the controller is answering too many signed requests at once; retry "
                                        "shortly.", status=503) from None
        _AUTH.set(_Auth(True, nonce))

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        limit = self.limits.max_body
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # Nothing fdl sends is compressed; decoding a stranger's body (a bomb, or not what it claims) is
            # work the controller never does. regression: a non-gzip body labelled gzip was a 500 + traceback.
            raise _Unsupported(f"request bodies are accepted uncompressed only (Content-Encoding: identity), "
                               f"not {encoding[:40]!r}.")
        length = request.content_length
        if length is not None and length > limit:
            raise _TooLarge()
        content = request.content
        if content.is_eof():  # the whole body came with the head (the usual case): no timer needed
            data = content.read_nowait()
            if len(data) > limit:
                raise _TooLarge()
            return data
        data = bytearray()
        async with asyncio.timeout(self.limits.body_timeout_s):
            while True:
                chunk = await request.content.read(limit + 1 - len(data))
                if not chunk:
                    break
                data += chunk
                if len(data) > limit:
                    raise _TooLarge()
        return bytes(data)

    _ROUTES: ClassVar[dict[str, tuple[str, str]]] = {
        "/": ("GET", "_index"),
        "/state.json": ("GET", "_state"),
        "/metrics": ("GET", "_metrics"),
        "/start": ("POST", "_start"),
        "/join": ("POST", "_hello"),
        "/join/world": ("POST", "_world"),
        "/join/heartbeat": ("POST", "_heartbeat"),
        "/join/exit": ("POST", "_exit"),
    }

    def _application(self) -> web.Application:
        """aiohttp's Application: every endpoint through its router, errors and proofs in middlewares."""
        app = web.Application(middlewares=[self._count_and_sign, self._errors], handler_args=None)
        for path, (method, name) in self._ROUTES.items():
            handler = getattr(self, name)
            if method == "GET":
                app.router.add_get(path, handler)  # HEAD too
            else:
                app.router.add_route(method, path, handler)
        return app

    @web.middleware
    async def _count_and_sign(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Signs the answer to a request whose proof matched (bound to its nonce), and counts answers."""
        _AUTH.set(_NO_AUTH)  # this handler's task: set by _authenticate while the request is read
        resp = await handler(request)
        nonce = _AUTH.get().nonce
        if nonce is not None and self._verifier is not None and isinstance(resp, web.Response):
            resp.headers[auth.ANSWER_HEADER] = self._verifier.sign_answer(nonce, resp.status, resp.body or b"")
        key = (request.path if request.path in self._ROUTES else "other", resp.status)
        self.requests[key] = self.requests.get(key, 0) + 1  # GET /metrics reports these
        return resp

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every refusal and error as the one JSON envelope."""
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(m for m in exc.allowed_methods if m != "HEAD"))
            resp = _error(405, "method_not_allowed", f"{request.path[:100]} answers {allowed} only.")
            resp.headers["Allow"] = allowed
            return resp
        except web.HTTPNotFound:
            return _error(404, "not_found", f"no such endpoint {request.path[:100]!r}; GET / with Accept: "
                                            f"application/json lists them.")
        except Refused as refused:
            body = refused.to_dict()
            if request.path == "/join":
                body["admitted"] = False
            return _json(body, refused.status)
        except BadRequest as exc:
            return _error(400, "bad_request", str(exc))
        except _Unsupported as exc:
            return _error(400, "bad_request", str(exc), close=True)
        except _TooLarge:
            return _error(413, "too_large", f"the request body is larger than {self.limits.max_body} bytes.",
                          close=True)
        except TimeoutError:
            return _error(408, "timeout", f"the request body did not arrive within "
                                          f"{self.limits.body_timeout_s:g} s.", close=True)

    async def _member_json(self, request: web.BaseRequest) -> dict:
        """A member's request body: from another host, a run with a token takes only signed ones (the ticket
        travels in clear, so it alone proves nothing)."""
        obj = await self._read_json(request)
        if self._verifier is not None and not _AUTH.get().authed and not is_loopback(request.remote):
            raise self.machine._refuse("bad_token", "no proof of the run's token: a member's requests from another "
                                                    "host must be signed with it.", status=403)
        return obj

    @staticmethod
    def _peer(request: web.BaseRequest) -> tuple[str, bool]:
        remote = request.remote or ""
        return remote, is_loopback(remote)

    async def _index(self, request: web.BaseRequest) -> web.Response:
        """The status page; a client that asks for JSON only gets the list of endpoints."""
        accept = request.headers.get("Accept", "")
        if "application/json" in accept and "text/html" not in accept:
            return _json({"ok": True, "service": "fdl controller", "endpoints": ENDPOINTS})
        page = status_page()
        return web.Response(body=page.body, content_type="text/html", charset="utf-8", headers={
            "Cache-Control": "no-cache", "Content-Security-Policy": page.csp, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"})

    async def _metrics(self, request: web.BaseRequest) -> web.Response:
        if self._registry is None:
            # prometheus_client takes ~0.1 s to import: done off the loop, once, at the first scrape
            registry = await asyncio.to_thread(_new_registry, self)
            self._registry = self._registry or registry
        from fdl.controller.metrics import render

        body, content_type = render(self._registry, request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})

    async def _state(self, request: web.BaseRequest) -> web.Response:
        body = self.machine.state_json()
        if len(body) >= GZIP_FROM and "gzip" in request.headers.get("Accept-Encoding", ""):
            if self._gzip[0] is not body:  # compressed once per snapshot, however many pollers ask
                self._gzip = (body, gzip.compress(body, compresslevel=1, mtime=0))
            resp = _json(None, raw=self._gzip[1])
            resp.headers["Content-Encoding"] = "gzip"
            resp.headers["Vary"] = "Accept-Encoding"
            return resp
        return _json(None, raw=body)

    async def _start(self, request: web.BaseRequest) -> web.Response:
        parse_start(await self._read_json(request))
        peer, trusted = self._peer(request)
        self.machine.fire(peer=peer, trusted=trusted or _AUTH.get().authed)
        m = self.machine
        return _json({"ok": True, "armed": True, "phase": m.phase, "world": m.world.summary() if m.world else None,
                      "message": f"start armed: the world formed with {m.quorum_text()}; watch fdl status."})

    async def _hello(self, request: web.BaseRequest) -> web.Response:
        hello = parse_hello(await self._read_json(request))
        peer, trusted = self._peer(request)
        m = self.machine
        member = m.hello(hello, peer=peer, trusted=trusted, authed=_AUTH.get().authed)
        p = m.policy
        return _json({"ok": True, "admitted": True, "ticket": member.ticket, "host": member.host,
                      "ranks": member.ranks, "phase": m.phase, "run_id": m.cohort_run_id,
                      "seconds_left": m.seconds_left(), "quorum": m.quorum(), "heartbeat_s": p.heartbeat_s,
                      "silence_s": p.silence_s, "poll_s": p.poll_s})

    async def _world(self, request: web.BaseRequest) -> web.Response:
        msg = parse_ticketed(await self._member_json(request), kind="world")
        m = self.machine
        member = m.poll_begin(msg.ticket)
        try:
            wait = m.policy.poll_s if msg.wait_s is None else min(msg.wait_s, m.policy.poll_s)
            if m.world is None and m.phase in OPEN and wait > 0:
                assert self._formed is not None
                try:
                    async with asyncio.timeout(wait):
                        await self._formed.wait()
                except TimeoutError:
                    pass
        finally:
            m.poll_end(member)
        body = m.world_reply(member)
        if body is not None:
            return _json(None, raw=body)
        if m.phase not in OPEN:
            raise Refused("window_closed", m.closed_text())
        return _json({"ok": True, "formed": False, "phase": m.phase, "seconds_left": m.seconds_left(),
                      "quorum": m.quorum()})

    async def _heartbeat(self, request: web.BaseRequest) -> web.Response:
        msg = parse_ticketed(await self._member_json(request), kind="heartbeat")
        m = self.machine
        m.heartbeat(msg.ticket, running=msg.running)
        return _json({"ok": True, "phase": m.phase, "formed": m.world is not None,
                      "stop": m.phase == "failed", "reason": m.reason, "heartbeat_s": m.policy.heartbeat_s})

    async def _exit(self, request: web.BaseRequest) -> web.Response:
        msg = parse_ticketed(await self._member_json(request), kind="exit")
        m = self.machine
        assert msg.code is not None
        m.report_exit(msg.ticket, msg.code, msg.detail)
        return _json({"ok": True, "phase": m.phase, "reason": m.reason})


ENDPOINTS = {
    "GET /": "this run's status page (HTML; JSON with Accept: application/json)",
    "GET /state.json": "the run's live state", "GET /metrics": "Prometheus metrics",
    "POST /start": "fire the start switch", "POST /join": "hello: ask to join the window",
    "POST /join/world": "long-poll for your world", "POST /join/heartbeat": "stay on the roster",
    "POST /join/exit": "report your exit code"}


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


def _new_registry(server: ControllerServer) -> Any:
    from fdl.controller.metrics import new_registry

    return new_registry(server)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (about twice the requests per CPU second), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _raise_fd_limit(wanted: int) -> None:
    """Lift the soft open-files limit towards wanted (never above the hard limit, never lower it)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
