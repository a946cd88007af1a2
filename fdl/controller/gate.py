"""Connections: which ones aiohttp gets to serve, and how it answers HTTP it cannot parse.

`Gate` is the protocol factory handed to asyncio: it admits a new connection
to aiohttp's handler (`ConnectionHandler`, a public `web.RequestHandler`
subclass) or answers it 503 and closes it (`Overloaded`), before aiohttp sees a
byte. Fairness under flood: a stranger's address holds a bounded share, and
members and loopback peers keep a reserve beyond the total.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from fdl.controller.policy import normalize_ip
from fdl.controller.wire import error_response, json_bytes

log = logging.getLogger("fdl.controller")


class ConnectionHandler(web.RequestHandler):
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
        said = getattr(exc, "message", None)
        text = (said if isinstance(said, str) else None) or message
        text = (text or "").strip().splitlines()[0].rstrip(":") if text and text.strip() else None
        if status >= 500:
            log.error("controller: request failed", exc_info=exc)
            reason, text = "internal", "the controller failed to handle this request"
        else:
            reason = "bad_request"
            text = f"malformed HTTP request: {text or 'could not be parsed'}"
        text = text if len(text) <= 200 else text[:197] + "..."
        return error_response(status, reason, text, close=True)


class Overloaded:
    """Answers a connection over its limit with 503 and closes it (drives the transport it is handed)."""

    BODY = json_bytes({"ok": False, "reason": "overloaded",
                       "message": "the controller holds its maximum number of connections; retry shortly."})
    RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Retry-After: 1\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)

    def __init__(self, transport: asyncio.WriteTransport):
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


class Gate:
    """The protocol factory asyncio calls per connection: admits it to aiohttp's handler, or answers 503.

    Fairness under flood: a peer address may hold at most `per_peer` connections, and strangers together at
    most `max_connections`; loopback peers and the addresses of admitted members are never held to the
    per-peer share and may use `reserve` connections beyond the total, so a flood from other addresses
    cannot crowd out a member's heartbeats, world polls and exit reports."""

    def __init__(self, factory: Callable[[], ConnectionHandler], *, max_connections: int, per_peer: int,
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
        return Gated(self)

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


class Gated(asyncio.Protocol):
    """One new connection: once the gate admits it, the transport is handed to aiohttp's handler
    (`set_protocol`, public asyncio API), which releases the gate's count when the connection is lost; a
    refused one is answered 503 here."""

    __slots__ = ("gate", "refused")

    def __init__(self, gate: Gate):
        self.gate = gate
        self.refused: Overloaded | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        name = transport.get_extra_info("peername")
        peer = normalize_ip(name[0]) if isinstance(name, tuple) and name else None
        if not self.gate.admit(peer):
            self.refused = Overloaded(cast(asyncio.WriteTransport, transport))  # a TCP server's transport
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


def raise_fd_limit(wanted: int) -> None:
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
