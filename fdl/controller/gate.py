"""Connections: which ones the controller accepts, TLS on each, and fair shares of the slots.

`Gate` accepts connections on the listening sockets itself (the loop's
`add_reader`, public asyncio API), decides from the peer's address whether
there is room for it (`Shares`) before any byte is read, and only then hands
the socket to asyncio's `connect_accepted_socket` with the controller's TLS
context. Once the handshake is done, `Connection` (a plain asyncio protocol)
passes the stream to aiohttp: it makes each connection's protocol with
`web.Server`, which aiohttp documents as a protocol factory for
`loop.create_server`, and feeds it through asyncio's public protocol methods
(`connection_made`, `data_received`, `eof_received`, `pause_writing`,
`resume_writing`, `connection_lost`). Nothing of aiohttp is subclassed.

Fair shares (`Shares`). A connection is a stranger until a request on it
proves the run's token; it then moves to the trusted pool, which strangers
cannot take: at most `per_peer` plus `per_member` for each admitted member
at its address, `max_trusted` in all. Strangers share `max_connections`:

- a peer (an address; on loopback an address and the local account that
  holds the other end, which the kernel tells: fdl.controller.owner) holds
  at most `per_peer`, and its network (/24, /64 for IPv6; on loopback per
  account too) at most `per_net`;
- when a cap is reached, a newcomer from a lighter group takes a slot from
  the heaviest group of that scope (the heaviest network, and its heaviest
  peer in it): an idle keep-alive connection first, the oldest otherwise; a
  group only one connection heavier gives up an idle one only (a swap of
  equals gains nothing). A newcomer from the heaviest group itself only
  takes its own group's oldest idle connection, or is refused. Several
  addresses of one /24 therefore cannot shut out a neighbour's walk-in, nor
  thousands of /24s a stranger from another one; one account's pollers on
  loopback are its own share;
- a stranger's keep-alive connection idle for `stranger_idle_s` after an
  answer is closed.

A refused connection is closed before the TLS handshake (the client sees a
reset and retries): a flood costs the controller an accept, no handshake.

Writes are bounded: an accepted socket gets a small send buffer, a pipelined
request is not read while an answer waits to go out, and an answer that has
not drained within `write_timeout_s` aborts its connection, so a peer that
never reads holds no slot and no memory for long.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import itertools
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, cast

from fdl.controller.owner import PeerOwners

log = logging.getLogger("fdl.controller")
ACCEPT_BATCH = 256  # connections accepted per wake-up of a listening socket
SCAN_NETS = 64  # heaviest networks looked through for an idle victim when the strangers' total is reached
SHUTDOWN_TIMEOUT_S = 2.0  # a TLS close waits this long for the peer's close_notify (asyncio's default: 30 s)
MAX_HANDSHAKES = 64  # TLS handshakes under way at once; more accepted connections wait for a slot, unread


def network_of(peer: str | None) -> str | None:
    """The network a stranger's share is also counted by: its /24 (IPv4) or /64 (IPv6). IPv4 needs no
    parsing: it is hot."""
    if peer is None:
        return None
    if ":" not in peer:
        head, dot, _ = peer.rpartition(".")
        return f"{head}.0/24" if dot else None
    try:
        return str(ipaddress.ip_network(f"{peer}/64", strict=False))
    except ValueError:
        return None


def _least_recent(a: Entry | None, b: Entry | None) -> Entry | None:
    if a is None or (b is not None and b.last < a.last):
        return b
    return a


def is_loopback_ip(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


class Entry:
    """One accepted connection as the shares see it."""

    __slots__ = ("address", "answered", "inflight", "key", "last", "net", "opened", "paused", "pending", "released",
                 "sock", "task", "transport", "trusted")

    def __init__(self, address: str, key: str, net: str, now: float):
        self.address = address  # the peer's IP address (what members are counted by)
        self.key = key  # the peer as shares count it: the address, plus the local account on loopback
        self.net = net
        self.trusted = False  # a request on it proved the run's token
        self.released = False
        self.inflight = 0  # requests being answered
        self.pending = False  # bytes came in since the last answer (a request under way)
        self.paused = False  # an answer waits for the peer to read
        self.last = now  # the last time a byte came in or an answer went out
        self.opened = now
        self.answered = False  # at least one answer went out (a keep-alive connection)
        self.transport: asyncio.BaseTransport | None = None  # set once TLS is up
        self.task: asyncio.Task[Any] | None = None  # the handshake
        self.sock: socket.socket | None = None  # the accepted socket while it waits for a handshake slot

    @property
    def idle(self) -> bool:
        """TLS is up and nothing is under way: no request arriving or answered, no answer waiting to drain."""
        return self.transport is not None and not (self.inflight or self.pending or self.paused)

    def close(self, *, gently: bool = False) -> None:
        """Cut the connection now (an eviction), or close it with a TLS goodbye (gently: idle for too long, so a
        client sees it go before it sends on it again; the goodbye waits at most SHUTDOWN_TIMEOUT_S)."""
        if self.transport is not None:
            if gently:
                self.transport.close()
            else:
                cast(asyncio.Transport, self.transport).abort()
        elif self.task is not None:
            self.task.cancel()
        elif self.sock is not None:  # still waiting for a handshake slot: nobody else owns the socket yet
            self.sock.close()
            self.sock = None


class Tally:
    """Counts per group with the heaviest group at hand (buckets by count, oldest first within one)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self._buckets: dict[int, dict[str, None]] = {}
        self.top = 0

    def add(self, group: str) -> None:
        old = self.count.get(group, 0)
        if old:
            del self._buckets[old][group]
        self.count[group] = old + 1
        self._buckets.setdefault(old + 1, {})[group] = None
        self.top = max(self.top, old + 1)

    def remove(self, group: str) -> None:
        old = self.count[group]
        del self._buckets[old][group]
        if old > 1:
            self.count[group] = old - 1
            self._buckets.setdefault(old - 1, {})[group] = None
        else:
            del self.count[group]
        while self.top and not self._buckets.get(self.top):
            self._buckets.pop(self.top, None)
            self.top -= 1

    def heaviest(self) -> str | None:
        return next(iter(self._buckets[self.top])) if self.top else None

    def heaviest_few(self, limit: int) -> list[str]:
        """Up to limit of the heaviest groups, the one that reached that weight first first."""
        return list(itertools.islice(self._buckets[self.top], limit)) if self.top else []


class Shares:
    """Who holds which connection (no I/O: `Entry.close` is how a victim goes)."""

    def __init__(self, *, max_connections: int, per_peer: int, per_net: int, max_trusted: int, per_member: int,
                 members_at: Callable[[str], int], shed: Callable[[str], None]):
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.per_net = per_net
        self.max_trusted = max_trusted
        self.per_member = per_member
        self.members_at = members_at
        self.shed = shed
        self.strangers = 0
        self.nets = Tally()  # strangers per network
        self.by_key: dict[str, dict[Entry, None]] = {}  # strangers per peer, oldest first
        self.keys_of_net: dict[str, dict[str, None]] = {}
        self.trusted = 0
        self.trusted_by_key: dict[str, int] = {}
        self.accepted = 0  # connections taken (TLS handshakes begun)
        self.refused = 0
        self.evicted = 0

    @property
    def total(self) -> int:
        return self.strangers + self.trusted

    # ------------------------------------------------------------------ strangers

    def admit(self, entry: Entry) -> bool:
        """Make room for a new stranger (evicting at most one connection per cap) or refuse it."""
        for _ in range(3):
            room, victim = self._victim(entry)
            if not room:
                self.refused += 1
                self.shed(entry.address)
                return False
            if victim is None:
                break
            self.evict(victim)
        self._count(entry)
        self.accepted += 1
        return True

    def _victim(self, entry: Entry) -> tuple[bool, Entry | None]:
        """(False, None): refuse the newcomer; (True, None): there is room; (True, victim): evict victim first."""
        key, net = entry.key, entry.net
        held = len(self.by_key.get(key, ()))
        if held >= self.per_peer:
            return self._found(self._oldest_idle(key))
        in_net = self.nets.count.get(net, 0)
        if in_net >= self.per_net:
            return self._found(self._from_heaviest_key(net, key, held))
        if self.strangers >= self.max_connections:
            if self.nets.top > in_net:
                return self._found(self._from_heaviest_nets(idle_only=self.nets.top == in_net + 1))
            return self._found(self._from_heaviest_key(net, key, held))
        return True, None

    def _from_heaviest_nets(self, *, idle_only: bool) -> Entry | None:
        """A victim in one of the heaviest networks (the first SCAN_NETS of them, oldest at that weight first):
        the least recently used idle connection of their heaviest peers, else (unless idle_only: a swap of equals,
        which only an idle connection pays for) the first one's oldest."""
        first = None
        best: Entry | None = None
        for net in self.nets.heaviest_few(SCAN_NETS):
            keys = self._heaviest_keys(net)
            first = first or keys[0]
            best = _least_recent(best, self._idle_among(keys))
        if best is not None or idle_only or first is None:
            return best
        return self._pick(first)

    @staticmethod
    def _found(victim: Entry | None) -> tuple[bool, Entry | None]:
        return victim is not None, victim

    def _from_heaviest_key(self, net: str, key: str | None, held: int) -> Entry | None:
        """A victim in net: from its heaviest peers when they hold more than the newcomer's peer (held), the
        least recently used idle connection among them first (only an idle one when they hold just one more:
        a swap of equals); else the newcomer's own oldest idle connection; None when there is none."""
        keys = self._heaviest_keys(net)
        most = len(self.by_key[keys[0]]) if keys else 0
        if keys and key not in keys and most > held:
            victim = self._idle_among(keys)
            if victim is not None or most == held + 1:
                return victim or (self._oldest_idle(key) if key is not None else None)
            return self._pick(keys[0])
        return self._oldest_idle(key) if key is not None else None

    def _heaviest_keys(self, net: str) -> list[str]:
        """The peers of net holding the most strangers' connections there (ties all listed)."""
        keys = list(self.keys_of_net.get(net, ()))
        most = max((len(self.by_key[k]) for k in keys), default=0)
        return [k for k in keys if len(self.by_key[k]) == most]

    def _idle_among(self, keys: list[str]) -> Entry | None:
        best: Entry | None = None
        for key in keys:
            best = _least_recent(best, self._oldest_idle(key))
        return best

    def _pick(self, key: str) -> Entry:
        """An idle connection of key (the least recently used), else its oldest."""
        return self._oldest_idle(key) or next(iter(self.by_key[key]))

    def _oldest_idle(self, key: str) -> Entry | None:
        best = None
        for entry in self.by_key.get(key, ()):
            if entry.idle and (best is None or entry.last < best.last):
                best = entry
        return best

    def _count(self, entry: Entry) -> None:
        self.strangers += 1
        self.nets.add(entry.net)
        self.by_key.setdefault(entry.key, {})[entry] = None
        self.keys_of_net.setdefault(entry.net, {})[entry.key] = None

    def _uncount(self, entry: Entry) -> None:
        self.strangers -= 1
        self.nets.remove(entry.net)
        held = self.by_key[entry.key]
        del held[entry]
        if not held:
            del self.by_key[entry.key]
            keys = self.keys_of_net[entry.net]
            del keys[entry.key]
            if not keys:
                del self.keys_of_net[entry.net]

    def evict(self, victim: Entry) -> None:
        self.evicted += 1
        self.release(victim)
        victim.close()

    # ------------------------------------------------------------------ trusted and gone

    def promote(self, entry: Entry) -> None:
        """A request on entry proved the run's token: it leaves the strangers for the trusted pool, if the
        pool and the peer's share of it have room (else it stays a stranger, and keeps working)."""
        if entry.trusted or entry.released:
            return
        held = self.trusted_by_key.get(entry.key, 0)
        if self.trusted >= self.max_trusted or held >= self.per_peer + self.per_member * self.members_at(entry.address):
            return
        self._uncount(entry)
        entry.trusted = True
        self.trusted += 1
        self.trusted_by_key[entry.key] = held + 1

    def release(self, entry: Entry) -> None:
        """The connection is gone (or going): its slot is free. Idempotent."""
        if entry.released:
            return
        entry.released = True
        if not entry.trusted:
            self._uncount(entry)
            return
        self.trusted -= 1
        left = self.trusted_by_key[entry.key] - 1
        if left:
            self.trusted_by_key[entry.key] = left
        else:
            del self.trusted_by_key[entry.key]

    def idle_strangers(self, older_than: float) -> list[Entry]:
        """Strangers' keep-alive connections idle since before older_than."""
        return [e for held in self.by_key.values() for e in held if e.answered and e.idle and e.last < older_than]


_NO_HANDLER = asyncio.Protocol()  # stands in until TLS is up (a failed handshake never makes aiohttp's)


class Connection(asyncio.Protocol):
    """One TLS connection handed to aiohttp: forwards the stream to the protocol `web.Server` made for it,
    tracks what the shares need (requests in flight, the last activity) and holds answers to a write
    deadline."""

    __slots__ = ("_deadline", "_held_reading", "entry", "gate", "handler", "transport")

    def __init__(self, gate: Gate, entry: Entry):
        self.gate = gate
        self.entry = entry
        self.handler: asyncio.Protocol = _NO_HANDLER  # aiohttp's, made once TLS is up
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._held_reading = False  # this connection paused reading for a waiting answer (only it resumes)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.entry.transport = transport
        self.gate.live.add(self)
        self.entry.last = time.monotonic()
        # Whatever the TLS layer cannot hand on at once (the socket's own buffer is full) pauses the writer: the
        # write deadline starts there. (The TLS layer pauses at or above `high`: 1 is "anything left over".)
        self.transport.set_write_buffer_limits(high=1, low=0)
        self.handler = self.gate.new_handler()
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        entry = self.entry
        entry.last, entry.pending = time.monotonic(), True
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self._cancel_deadline()
        self.entry.paused = True
        self._deadline = asyncio.get_running_loop().call_later(self.gate.write_timeout_s, self._write_timed_out)
        self.handler.pause_writing()
        transport = self.transport
        if transport is not None and transport.is_reading():  # no further (pipelined) request is read meanwhile
            transport.pause_reading()
            self._held_reading = True

    def resume_writing(self) -> None:
        self._cancel_deadline()
        self.entry.paused = False
        self.entry.last = time.monotonic()
        self.handler.resume_writing()
        held, self._held_reading = self._held_reading, False
        if held and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # only what this connection paused: aiohttp's own pauses stay its own

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _write_timed_out(self) -> None:
        self._deadline = None
        log.debug("controller: a peer did not read its answer within %g s; connection aborted",
                  self.gate.write_timeout_s)
        if self.transport is not None:
            self.transport.abort()  # close() would wait for the unread answer to drain, forever

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.gate.live.discard(self)
        try:
            self.handler.connection_lost(exc)
        finally:
            self.gate.shares.release(self.entry)
            # Drop the references that close cycles through the TLS layer: reference counting frees the
            # connection now (its TLS state is tens of KiB) instead of the cyclic GC, which runs seldom here.
            self.entry.transport = self.transport = None
            self.handler = _NO_HANDLER


class Gate:
    """Accepts on the listening sockets, applies the shares, runs the TLS handshake, hands over to aiohttp."""

    def __init__(self, shares: Shares, new_handler: Callable[[], asyncio.Protocol], context: ssl.SSLContext, *,
                 handshake_timeout_s: float, write_timeout_s: float, send_buffer: int, stranger_idle_s: float,
                 max_handshakes: int = MAX_HANDSHAKES):
        self.shares = shares
        self.max_handshakes = max_handshakes
        self._waiting: collections.deque[Entry] = collections.deque()  # accepted, waiting for a handshake slot
        self.new_handler = new_handler
        self.context = context
        self.handshake_timeout_s = handshake_timeout_s
        self.write_timeout_s = write_timeout_s
        self.send_buffer = send_buffer
        self.stranger_idle_s = stranger_idle_s
        self.owners = PeerOwners()
        self._listeners: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[Any]] = set()
        self.live: set[Connection] = set()  # connections whose TLS is up

    def start(self, loop: asyncio.AbstractEventLoop, listeners: list[socket.socket]) -> None:
        self._loop = loop
        self._listeners = listeners
        for listener in listeners:
            loop.add_reader(listener.fileno(), self._accept, listener)
        self._sweeper = loop.create_task(self._sweep())

    async def stop(self) -> None:
        loop = self._loop
        for listener in self._listeners:
            if loop is not None:
                loop.remove_reader(listener.fileno())
            listener.close()
        self._listeners = []
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None
        for entry in self._waiting:
            entry.close()
        self._waiting.clear()
        handshakes = list(self._handshakes)
        for task in handshakes:
            task.cancel()
        await asyncio.gather(*handshakes, return_exceptions=True)
        self.owners.close()

    async def close_all(self) -> None:
        """Cut every connection still open (the server is stopping: no TLS goodbye is waited for), and let their
        transports finish closing before the loop goes."""
        for connection in list(self.live):
            if connection.transport is not None:
                connection.transport.abort()
        for _ in range(3):
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ accepting

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, or the peer gave up meanwhile: the next wake-up retries
                log.debug("controller: accept failed: %s", exc)
                return
            try:
                self._accepted(sock, peer)
            except Exception:  # a fault of the controller's own: this connection goes, the others stay served
                log.exception("controller: could not take a connection from %s", peer)
                sock.close()

    def _accepted(self, sock: socket.socket, peer: Any) -> None:
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        key, net = address, network_of(address) or address
        if is_loopback_ip(address):
            uid = self.owners.uid(sock.family, (address, int(peer[1])), sock.getsockname()[:2])
            if uid is not None:  # on loopback, an address is every account's: the account is the peer
                key, net = f"{address}#uid{uid}", f"{net}#uid{uid}"
        entry = Entry(address, key, net, time.monotonic())
        if not self.shares.admit(entry):
            sock.close()
            return
        sock.setblocking(False)
        # no Nagle: an answer's TLS records would wait for the ACK of the previous one (delayed ACK: 40 ms)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.send_buffer:
            try:  # a fixed, small kernel buffer instead of one that autotunes to megabytes for a stalled reader
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
            except OSError:
                pass
        entry.sock = sock
        self._waiting.append(entry)
        self._start_handshakes()

    def _start_handshakes(self) -> None:
        """Start handshakes for waiting connections while fewer than max_handshakes run: a burst of thousands of
        dials costs the memory of max_handshakes handshakes at once, not of thousands (OpenSSL's handshake state
        is tens of KiB, and a heap that peaked does not shrink)."""
        assert self._loop is not None
        while self._waiting and len(self._handshakes) < self.max_handshakes:
            entry = self._waiting.popleft()
            sock, entry.sock = entry.sock, None
            if sock is None or entry.released:  # evicted or timed out while waiting
                continue
            task = self._loop.create_task(self._handshake(sock, entry))
            entry.task = task
            self._handshakes.add(task)
            task.add_done_callback(self._handshake_done)

    def _handshake_done(self, task: asyncio.Task[Any]) -> None:
        self._handshakes.discard(task)
        if self._waiting and self._loop is not None and not self._loop.is_closed():
            self._start_handshakes()

    async def _handshake(self, sock: socket.socket, entry: Entry) -> None:
        assert self._loop is not None
        try:
            # the socket belongs to the transport from here on, closed by it in every outcome
            await self._loop.connect_accepted_socket(lambda: Connection(self, entry), sock, ssl=self.context,
                                                     ssl_handshake_timeout=self.handshake_timeout_s,
                                                     ssl_shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        except asyncio.CancelledError:  # evicted during the handshake (the loop closes the transport)
            self.shares.release(entry)
        except Exception as exc:  # a failed handshake is the peer's problem: not TLS, too slow, gone
            log.debug("controller: TLS handshake with %s failed: %s", entry.address, type(exc).__name__)
            self.shares.release(entry)
        finally:
            entry.task = None

    # ------------------------------------------------------------------ idle strangers

    async def _sweep(self) -> None:
        every = max(0.05, min(0.5, self.stranger_idle_s / 4))
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for entry in self.shares.idle_strangers(now - self.stranger_idle_s):
                entry.close(gently=True)
            for entry in [e for e in self._waiting if e.opened < now - self.handshake_timeout_s]:
                self.shares.release(entry)  # waited a whole handshake's time for a slot: a flood, or a stall
                entry.close()

    # ------------------------------------------------------------------ from the endpoints

    @staticmethod
    def entry_of(transport: asyncio.BaseTransport | None) -> Entry | None:
        """The shares' entry of the connection a request came on (its transport's protocol is a Connection)."""
        protocol = transport.get_protocol() if transport is not None else None
        return protocol.entry if isinstance(protocol, Connection) else None


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
