"""Connections: which ones aiohttp gets to serve, and how it answers HTTP it cannot parse.

`Gate` is the protocol factory handed to asyncio: it admits a new connection
to aiohttp's handler (`ConnectionHandler`, a public `web.RequestHandler`
subclass) or answers it 503 and closes it (`Overloaded`), before aiohttp sees a
byte. Fairness under flood: a stranger's address, and a stranger's network
(its /24, or /64 for IPv6: an IPv6 host has billions of addresses), hold a
bounded share; members' addresses keep a reserve beyond the total, sized by
the members there. Loopback is an address like any other.

Writes are bounded too (`ConnectionHandler`): an accepted socket gets a small
send buffer, pipelined requests are answered one at a time, an answer that
the kernel cannot take at once pauses the handler (it reads no further
request from that peer until the answer has gone out), and a connection whose
answer does not drain within the write deadline is aborted, so a peer that
never reads holds no handler, no slot and no memory for long.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from fdl.controller.policy import normalize_ip
from fdl.controller.wire import error_response, json_bytes

log = logging.getLogger("fdl.controller")


class ConnectionHandler(web.RequestHandler):
    """aiohttp's connection handler, answering HTTP-level errors (bad request line, oversized
    headers) with the same JSON envelope as every other error, and without logging tracebacks; and
    holding each connection to a write deadline (asyncio's public flow-control callbacks)."""

    released: Callable[[], None] | None = None  # the gate's release, called once the connection is gone
    write_timeout_s: float = 10.0  # an answer the peer does not drain within this aborts the connection
    send_buffer: int = 64 * 1024  # SO_SNDBUF of an accepted socket (the kernel doubles it for bookkeeping)
    _deadline: asyncio.TimerHandle | None = None
    _held_reading = False  # this handler paused reading for a waiting answer (and only it may resume it)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and self.send_buffer:
            try:  # a fixed, small kernel buffer instead of one that autotunes to megabytes for a stalled reader
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
            except OSError:
                pass
        # Whatever the kernel cannot take at once pauses the writer: the write deadline starts there.
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=0, low=0)
        super().connection_made(transport)

    def pause_writing(self) -> None:
        self._cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(self.write_timeout_s, self._write_timed_out)
        super().pause_writing()
        transport = self.transport
        if transport is not None and transport.is_reading():  # no further (pipelined) request is read meanwhile
            transport.pause_reading()
            self._held_reading = True

    def resume_writing(self) -> None:
        self._cancel_deadline()
        super().resume_writing()
        held, self._held_reading = self._held_reading, False
        if held and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # only what this handler paused: aiohttp's own pauses stay its own

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _write_timed_out(self) -> None:
        self._deadline = None
        log.debug("controller: a peer did not read its answer within %g s; connection aborted", self.write_timeout_s)
        if self.transport is not None:
            self.transport.abort()  # close() would wait for the unread answer to drain, forever

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_deadline()
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


def network_of(peer: str | None) -> str | None:
    """The network a stranger's share is also counted by: its /24 (IPv4) or /64 (IPv6). peer is an address in
    normalize_ip's spelling (IPv4 dotted, IPv4-mapped IPv6 as IPv4), so IPv4 needs no parsing: it is hot."""
    if peer is None:
        return None
    if ":" not in peer:
        head, dot, _ = peer.rpartition(".")
        return f"{head}.0/24" if dot else None
    try:
        return str(ipaddress.ip_network(f"{peer}/64", strict=False))
    except ValueError:
        return None


class Gate:
    """The protocol factory asyncio calls per connection: admits it to aiohttp's handler, or answers 503.

    Fairness under flood: a stranger (an address that holds no admitted member, loopback included) may hold
    at most `per_peer` connections, its network (/24, /64) at most `per_net`, and strangers together at most
    `max_connections`. An address that holds members may hold `per_peer` plus `per_member` for each member
    there, and such addresses together may use `reserve` connections beyond the total, so a flood from other
    addresses cannot crowd out a member's heartbeats, world polls and exit reports; an address shared with
    members (the loopback of an ssh door) gets no more than its members' due."""

    def __init__(self, factory: Callable[[], ConnectionHandler], *, max_connections: int, per_peer: int,
                 per_net: int, per_member: int, reserve: int, members_at: Callable[[str | None], int],
                 shed: Callable[[str | None], None]):
        self.factory = factory
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.per_net = per_net
        self.per_member = per_member
        self.reserve = reserve
        self.members_at = members_at
        self.shed = shed
        self.total = 0
        self.by_peer: dict[str | None, int] = {}
        self.by_net: dict[str | None, int] = {}  # strangers' connections per network
        self.overloaded = 0

    def __call__(self) -> asyncio.Protocol:
        return Gated(self)

    def admit(self, peer: str | None) -> tuple[bool, str | None]:
        """(admitted, the network it was counted under as a stranger, if any)."""
        members = self.members_at(peer)
        held = self.by_peer.get(peer, 0)
        net = None
        if members:
            ok = self.total < self.max_connections + self.reserve and held < self.per_peer + self.per_member * members
        else:
            net = network_of(peer)
            ok = (self.total < self.max_connections and held < self.per_peer
                  and self.by_net.get(net, 0) < self.per_net)
        if not ok:
            self.overloaded += 1
            self.shed(peer)
            return False, None
        self.total += 1
        self.by_peer[peer] = held + 1
        if net is not None:
            self.by_net[net] = self.by_net.get(net, 0) + 1
        return True, net

    def release(self, peer: str | None, net: str | None) -> None:
        self.total -= 1
        _drop(self.by_peer, peer)
        if net is not None:
            _drop(self.by_net, net)


def _drop(counts: dict[str | None, int], key: str | None) -> None:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


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
        address = name[0] if isinstance(name, tuple) and name else None
        # an IPv4 peer's address comes from the kernel already in normalize_ip's spelling (the hot case)
        peer = address if isinstance(address, str) and ":" not in address else normalize_ip(address)
        admitted, net = self.gate.admit(peer)
        if not admitted:
            self.refused = Overloaded(cast(asyncio.WriteTransport, transport))  # a TCP server's transport
            return
        handler = self.gate.factory()
        handler.released = functools.partial(self.gate.release, peer, net)
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
