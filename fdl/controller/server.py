"""The controller endpoint: HTTP/1.1 + JSON over TLS on the training port, served by aiohttp.

`ControllerServer` owns one run's `RunMachine` and serves it: it makes the
instance's TLS key, holds the port in every address family its bind implies,
ticks the machine's clock, wakes world long-polls when the world forms, and
runs either inside a running loop or in a background thread. The pieces it
assembles, each in its own module:

- `tls`: the per-instance key and self-signed certificate, the TLS 1.3
  contexts, the key's SPKI hash that the signed `GET /join/id` names;
- `listen`: which sockets a bind address holds (both families), bound all or
  nothing;
- `wire`: the bounds (`Limits`) on what any peer can make the server hold
  (body size and read time, request line and header sizes and count, the time
  a connection may take to send a complete request head, the time an answer
  may take to drain, the connections in all, per peer and per network, the
  idle time of a stranger's keep-alive connection), the loopback test and the
  JSON envelope;
- `gate`: accepts connections, keeps the fair shares (`Shares`), runs the TLS
  handshake and hands each connection to aiohttp through `web.Server`, the
  protocol factory aiohttp documents for `loop.create_server`;
- `routes`: aiohttp's public `web.Application` whose router holds every
  endpoint and whose one middleware turns errors into the JSON envelope, signs
  answers to requests that proved the run's token (fdl.controller.auth),
  promotes their connections and counts them, run here by `web.AppRunner`.

Two ways to run it::

    async with-style, inside a running loop:   await server.start_async() ... await server.stop_async()
    in a background thread (launcher, tests):  with ControllerServer(policy, port=1337) as server: ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from fdl.config.schema import ClusterSpec
from fdl.controller.gate import Gate, Shares, raise_fd_limit
from fdl.controller.listen import bind_all
from fdl.controller.machine import RunMachine
from fdl.controller.policy import RunPolicy
from fdl.controller.routes import Endpoints
from fdl.controller.states import TERMINAL
from fdl.controller.tls import ServerKey, make_server_key
from fdl.controller.wire import Limits
from fdl.errors import FdlError

__all__ = ["ControllerServer", "new_event_loop"]

GC_GEN0 = 50_000  # the cyclic GC's youngest-generation threshold while a controller serves (default 700)
log = logging.getLogger("fdl.controller")
T = TypeVar("T")


class _PeerFaults(logging.Filter):
    """aiohttp's own log lines (HTTP it cannot parse, a peer gone mid-answer) are the peer's problem: one line at
    debug level, without a traceback per request. The controller's own faults are logged by its middleware."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {type(record.exc_info[1]).__name__}"
            record.args = None
        record.exc_info = record.exc_text = None
        return True


HTTP_LOG = logging.getLogger("fdl.controller.http")  # the logger aiohttp's protocol writes to
HTTP_LOG.addFilter(_PeerFaults())


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
        self._runner: web.AppRunner | None = None
        self._gate: Gate | None = None
        self._held: list[socket.socket] = []  # sockets that only keep the port from others (listen.Hold.serve)
        self.key: ServerKey | None = None  # this instance's TLS key (made at start)
        self._ticker: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._stop_requested: asyncio.Event | None = None
        self._cv = threading.Condition()
        self._deadline_seen: float | None = None
        self._gc_saved: tuple[int, ...] | None = None
        self.endpoints = Endpoints(self.machine, self.limits, registry=self._new_registry)
        self.machine.listeners.append(self._on_change)

    @classmethod
    def for_cluster(cls, cluster: ClusterSpec, *, run_id: str | None = None, args: tuple[str, ...] = (),
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
        if self.policy.token is None:
            if not self.policy.insecure_no_token:
                raise FdlError(
                    f"the controller would listen on {self.address} without a token: anyone who can reach that "
                    f"address (on loopback: every account on this box) could join the run, read its arguments, "
                    f"fire its start switch and run code as a rank.",
                    hint="Set cluster.controller.join.token (fdl join-config makes one; a launcher makes one per run "
                         "when none is set), or, knowingly, set cluster.controller.join.insecure_no_token: true.")
            log.warning("controller: %s listens without a token (insecure_no_token): anyone who can reach it may "
                        "join and fire its start switch", self.address)
        self._loop = loop
        await asyncio.to_thread(self.machine.resolve_roster)  # names resolved once, off the loop
        self.endpoints.formed = asyncio.Event()
        self._wake = asyncio.Event()
        self._on_change(self.machine)
        lim = self.limits
        raise_fd_limit(lim.max_connections + lim.max_trusted + 256)
        self.key = key = await asyncio.to_thread(make_server_key, self.machine.controller_id)
        self.endpoints.tls_spki = key.spki_hex
        handler_kwargs: dict[str, Any] = dict(keepalive_timeout=lim.head_timeout_s, max_line_size=lim.max_line,
                                              max_field_size=lim.max_field, max_headers=lim.max_headers,
                                              access_log=None, lingering_time=1.0, logger=HTTP_LOG)
        self._runner = web.AppRunner(self.endpoints.application(), handler_cancellation=True, **handler_kwargs)
        await self._runner.setup()
        web_server = self._runner.server  # aiohttp's protocol factory: one protocol per connection
        assert web_server is not None
        shares = Shares(max_connections=lim.max_connections, per_peer=lim.max_per_peer,
                        per_net=min(lim.max_per_net, max(lim.max_per_peer, lim.max_connections // 4)),
                        max_trusted=lim.max_trusted, per_member=lim.per_member, members_at=self._members_at,
                        shed=self.machine.shed)
        self.endpoints.shares = shares
        self._gate = Gate(shares, web_server, key.context, handshake_timeout_s=lim.head_timeout_s,
                          write_timeout_s=lim.write_timeout_s, send_buffer=lim.send_buffer,
                          stranger_idle_s=lim.stranger_idle_s)
        try:
            bound = await asyncio.to_thread(bind_all, self.host, self.port, backlog=lim.backlog)
        except FdlError:
            await self._runner.cleanup()
            self._runner = None
            raise
        self.port = bound[0][1].getsockname()[1]
        self._held = [sock for hold, sock in bound if not hold.serve]
        self._gate.start(loop, [sock for hold, sock in bound if hold.serve])
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
        if self._gate is not None:
            await self._gate.stop()
        for sock in self._held:
            sock.close()
        self._held = []
        if self._runner is not None:
            if self._runner.server is not None:
                self._runner.server.pre_shutdown()
                await self._runner.server.shutdown(0.5)
            if self._gate is not None:
                await self._gate.close_all()
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

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 10.0) -> T:
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
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(self.machine, *args))
            except BaseException as exc:
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def state(self) -> dict[str, Any]:
        """state.json, as a dict."""
        return self.call(RunMachine.state)

    @property
    def requests(self) -> dict[tuple[str, int], int]:
        """Answered requests by (endpoint, status) (GET /metrics reports these)."""
        return self.endpoints.requests

    @property
    def accepted(self) -> int:
        """Connections taken (each one TLS handshake begun)."""
        return self._gate.shares.accepted if self._gate is not None else 0

    @property
    def overloaded(self) -> int:
        """Connections refused (closed before TLS) because their peer's or network's share was full."""
        return self._gate.shares.refused if self._gate is not None else 0

    @property
    def evicted(self) -> int:
        """Strangers' connections closed to make room for a newcomer from a lighter peer or network."""
        return self._gate.shares.evicted if self._gate is not None else 0

    @property
    def open_connections(self) -> int:
        return self._gate.shares.total if self._gate is not None else 0

    @property
    def tls_pin(self) -> str | None:
        """This instance's TLS key as curl pins it (`sha256//BASE64`), once started."""
        return self.key.pin if self.key is not None else None

    def _new_registry(self) -> Any:
        """prometheus_client's CollectorRegistry over this server (imported at the first scrape, not at start)."""
        from fdl.controller.metrics import new_registry

        return new_registry(self)

    def _members_at(self, peer: str) -> int:
        """How many admitted members a peer address holds (0: a stranger's address, loopback included)."""
        return self.machine.peers.get(peer, 0)

    def wait_phase(self, *phases: str, timeout: float | None = None) -> bool:
        """Block until the run reaches one of phases; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self.machine.phase in phases, timeout)

    # ------------------------------------------------------------------ internals

    def _on_change(self, machine: RunMachine) -> None:
        formed = self.endpoints.formed
        if formed is not None and (machine.world is not None or machine.phase in TERMINAL):
            formed.set()
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


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (about twice the requests per CPU second), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
