"""Controller under load, measured in one run.

    python bench/controller.py [--joiners 4096] [--pollers 64] [--poll-seconds 5]

The controller runs in its own process (as under a launcher); this process is
one asyncio client (aiohttp) that plays every peer. Every connection is TLS 1.3
(the controller's per-instance key, fdl.controller.tls):

1. walk-ins: N simulated `fdl join` agents dial a discovery window with
   `start: auto` whose capacity is N, each asking the controller's id
   (`GET /join/id` with a challenge; with a token it checks the answer's proof
   and the key it names, as every worker does: here against the key the
   controller reported when it started, since aiohttp's client hands out no
   pooled connection's certificate), sending a signed hello and then holding a signed world
   long-poll. Timed from the first request to the moment every joiner holds
   its world. Also run with N/8 joiners: the ratio of the two times shows how
   the cost grows (8 is linear; 64 would be quadratic). The walk-ins come from
   N/16 loopback addresses, sixteen each, every address in a /24 of its own, as
   N machines would (one address, one /24 and, on loopback, one account hold a
   stranger's share of the connections).
2. TLS handshakes alone: N connections opened, handshaken and closed, for the
   controller's CPU per handshake (what each walk-in's first connection costs
   beyond its requests).
3. state.json: 64 concurrent pollers (keep-alive) hammer GET /state.json while a
   window stays open (start: manual, quorum not met) with a small roster (16
   hosts) and with the full N-host roster.
4. the controller's peak RSS (VmHWM from /proc) over all of the above.

Authentication is on (the window has a token; every join request carries its
HMAC proof, made for this controller instance, and every answer is signed
back, fdl.controller.auth), and the walk-ins are also run without a token
(`insecure_no_token`), to print the controller CPU per request with and
without it. --no-auth measures only the tokenless run.

The machine is shared, so each figure is the best of --repeat runs, and the
controller's own CPU time is printed beside the wall times. The client runs
with Python's cyclic GC paused (it stands in for thousands of machines; its
own bookkeeping is not what is measured); the controller runs as it would
under a launcher.

Targets: walk-ins <= 4 s for 4096 joiners (TLS and authentication on), >= 3000 state.json req/s,
<= 150 MB peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_JOIN_S = 4.0
TARGET_RPS = 3000.0
TARGET_RSS_MB = 150.0


# ---------------------------------------------------------------- the controller process


def serve(port: int, policy_json: str) -> int:
    """Child mode: run a controller on 127.0.0.1:port until stdin closes."""
    from fdl.controller.policy import RunPolicy
    from fdl.controller.server import ControllerServer, new_event_loop

    token = os.environ.get("FDL_BENCH_TOKEN") or None
    policy = RunPolicy(**json.loads(policy_json), token=token, insecure_no_token=token is None)
    if token is None:  # the tokenless comparison run: its warning is known and says nothing here
        import logging

        logging.getLogger("fdl.controller").setLevel(logging.ERROR)

    async def main() -> None:
        server = ControllerServer(policy, host="127.0.0.1", port=port)
        await server.start_async()
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(done.set)),
                         daemon=True).start()
        print(f"ready {server.port} {server.key.spki_hex if server.key else '-'}", flush=True)
        await done.wait()
        await server.stop_async()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
    return 0


class Controller:
    """A controller child process; peak_rss_mb() reads its VmHWM."""

    def __init__(self, token: str | None = None, **policy):
        secret = {"FDL_BENCH_TOKEN": token} if token else {}  # never on the command line
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(policy)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO), **secret})
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise SystemExit("bench: the controller did not start")
        self.port = int(line[1])
        self.spki = line[2]  # the key the controller made (hex SPKI SHA-256)
        self.url = f"https://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """User + system CPU time the controller process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()


# ---------------------------------------------------------------- the client process


def run(coro):
    """Run a client coroutine on the same kind of loop the controller uses, with the cyclic GC paused.

    The client stands in for thousands of machines; its own bookkeeping for thousands of connections
    (every full collection walks them all) is not what is measured, and pausing the GC halves its CPU.
    """
    import gc

    from fdl.controller.server import new_event_loop

    gc.disable()
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(coro)
    finally:
        gc.enable()
        gc.collect()


WALKINS_PER_ADDRESS = 16
RESENT = [0]  # walk-in requests re-sent after the controller closed a pooled connection as idle


def source(group: int) -> str:
    """The loopback address of a group of simulated machines, each group in a /24 of its own."""
    return f"127.{1 + group // 256}.{group % 256}.1"


def no_port_socket(addr_info):
    """A client socket whose source port is chosen at connect(), not at bind() (IP_BIND_ADDRESS_NO_PORT): binding
    thousands of sockets to a source address with port 0 makes the kernel search for a free port each time, a cost
    of the client playing machines, not of the controller."""
    import socket

    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24), 1)
    return sock


_CONTEXT = None


def tls_context():
    """The client's TLS 1.3 context (no CA: the key is checked against the signed GET /join/id), shared."""
    global _CONTEXT
    if _CONTEXT is None:
        from fdl.controller.tls import client_context

        _CONTEXT = client_context()
    return _CONTEXT


def session(aiohttp, local: str | None = None):
    extra = {"local_addr": (local, 0), "socket_factory": no_port_socket} if local else {}
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False, ttl_dns_cache=None,
                                     ssl=tls_context(), **extra)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120),
                                 skip_auto_headers=("User-Agent",))


class Signer:
    """Signs requests with a token at the controller instance a client asked about (GET /join/id), the way every
    `fdl join` does: the id answer must prove the token for this client's challenge and name the TLS key its
    connection presented. Keys are made once per instance (the client plays many machines, its cost is not
    measured)."""

    def __init__(self, token: str | None, spki: str = ""):
        from fdl.controller.auth import extract

        self.prk = extract(token) if token else None
        self.spki = spki
        self._keys: dict[str, object] = {}

    async def identify(self, s, url: str) -> str:
        import aiohttp

        from fdl.controller import auth

        for attempt in range(4):
            challenge = auth.new_challenge()
            try:
                async with s.get(url + "/join/id", headers={auth.CHALLENGE_HEADER: challenge}) as resp:
                    raw = await resp.read()
                    status, answer_headers = resp.status, resp.headers
                break
            except aiohttp.ClientConnectionError:
                if attempt == 3:
                    raise
                RESENT[0] += 1
        answer = json.loads(raw)
        if self.prk is not None:
            keys = self._keys_for(answer["controller_id"])
            if not auth.identity_ok(keys, challenge, status, raw, answer_headers) \
                    or answer["tls_spki_sha256"] != self.spki:
                raise SystemExit("bench: the controller's GET /join/id did not prove its key")
        return str(answer["controller_id"])

    def _keys_for(self, controller_id: str):
        from fdl.controller.auth import expand

        keys = self._keys.get(controller_id)
        if keys is None:
            keys = self._keys[controller_id] = expand(self.prk, controller_id)
        return keys

    def headers(self, controller_id: str, path: str, body: bytes, headers: dict) -> dict:
        """headers plus the request's proof (a fresh nonce each time), or headers when there is no token."""
        if self.prk is None:
            return headers
        from fdl.controller.auth import sign_request

        return {**headers, **sign_request(self._keys_for(controller_id), "POST", path, body)}


async def walk_ins(url: str, n: int, signer: Signer) -> tuple[float, int]:
    """n joiners: id, hello, then world long-poll. Returns (seconds from the first request to the last world,
    world size)."""
    import aiohttp
    from yarl import URL

    hellos = [json.dumps({"host": f"walkin-{i:05d}", "devices": "cpu:1", "run_id": "bench",
                          "signature": "5eed"}).encode() for i in range(n)]
    headers = {"Content-Type": "application/json"}
    join_url, world_url = URL(url + "/join"), URL(url + "/join/world")  # parsed once, not per request
    groups = [session(aiohttp, source(g)) for g in range((n + WALKINS_PER_ADDRESS - 1) // WALKINS_PER_ADDRESS)]
    try:
        async def post(s, target, path: str, body: bytes, ident: str) -> dict:
            """One signed POST; re-sent (signed anew) on a fresh connection when the controller had closed the
            pooled one as an idle stranger's, as an agent re-dials (the sixteen walk-ins of one address share a
            pool here, where each agent has its own)."""
            for attempt in range(4):
                try:
                    async with s.post(target, data=body, headers=signer.headers(ident, path, body, headers)) as resp:
                        return json.loads(await resp.read())
                except aiohttp.ClientConnectionError:
                    if attempt == 3:
                        raise
                    RESENT[0] += 1
            raise AssertionError("unreachable")

        async def one(i: int) -> tuple[float, int]:
            s = groups[i // WALKINS_PER_ADDRESS]
            ident = await signer.identify(s, url)
            answer = await post(s, join_url, "/join", hellos[i], ident)
            if not answer.get("admitted"):
                raise SystemExit(f"bench: walkin-{i} refused: {answer}")
            poll = json.dumps({"ticket": answer["ticket"], "wait_s": 60}).encode()
            while True:
                world = await post(s, world_url, "/join/world", poll, ident)
                if world.get("formed"):
                    return time.perf_counter(), world["world"]["size"]

        start = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for s in groups:
            await s.close()
    sizes = {size for _, size in results}
    if sizes != {n}:
        raise SystemExit(f"bench: joiners saw world sizes {sizes}, expected {n}")
    return max(t for t, _ in results) - start, n


async def fill(url: str, n: int, signer: Signer) -> None:
    """n hosts join (no world polls: a manual window below quorum stays open), sixteen per loopback address."""
    import aiohttp

    groups = [session(aiohttp, source(g)) for g in range((n + WALKINS_PER_ADDRESS - 1) // WALKINS_PER_ADDRESS)]
    try:
        ident = await signer.identify(groups[0], url)
        sem = asyncio.Semaphore(256)

        async def one(i: int) -> None:
            body = json.dumps({"host": f"host-{i:05d}", "devices": "cpu:1"}).encode()
            headers = signer.headers(ident, "/join", body, {"Content-Type": "application/json"})
            async with sem, groups[i // WALKINS_PER_ADDRESS].post(url + "/join", data=body, headers=headers) as resp:
                if (await resp.json()).get("admitted") is not True:
                    raise SystemExit("bench: fill refused")

        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for s in groups:
            await s.close()


async def handshakes(port: int, n: int) -> None:
    """n TLS connections to the controller, each handshaken and closed (sixteen per loopback address)."""
    sem = asyncio.Semaphore(256)

    async def one(i: int) -> None:
        async with sem:
            import socket

            sock = no_port_socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", ()))
            sock.bind((source(i // WALKINS_PER_ADDRESS), 0))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            _, writer = await asyncio.open_connection(sock=sock, ssl=tls_context(), server_hostname="")
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    await asyncio.gather(*(one(i) for i in range(n)))


async def pollers(url: str, count: int, seconds: float) -> tuple[float, int]:
    """count concurrent GET /state.json loops for seconds; returns (requests/s, body bytes, bytes on the wire)."""
    import aiohttp

    done = 0
    size = wire = 0
    places = [session(aiohttp, f"127.250.{i}.1") for i in range(4)]  # a stranger's share each: 64 connections
    try:
        stop = time.perf_counter() + seconds

        async def loop(s) -> None:
            nonlocal done, size, wire
            while time.perf_counter() < stop:
                async with s.get(url + "/state.json") as resp:
                    body = await resp.read()  # decompressed by aiohttp when the answer came gzipped
                    if resp.status != 200:
                        raise SystemExit(f"bench: state.json answered {resp.status}")
                    size = len(body)
                    wire = int(resp.headers.get("Content-Length", size))
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop(places[i % len(places)]) for i in range(count)))
        elapsed = time.perf_counter() - start
    finally:
        for s in places:
            await s.close()
    return done / elapsed, size, wire


# ---------------------------------------------------------------- the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joiners", type=int, default=4096)
    parser.add_argument("--pollers", type=int, default=64)
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs (the machine is shared)")
    parser.add_argument("--no-auth", action="store_true", help="measure only without a token")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(0, args.serve)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.joiners + 512)), hard))
    n = args.joiners
    small = max(1, n // 8)
    peak = 0.0
    lines = [f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; best of "
             f"{args.repeat} runs"]

    token = None if args.no_auth else os.urandom(32).hex()
    lines[0] += "; authentication " + ("off (--no-auth)" if token is None else
                                       "on (every join request proven, loopback included; answers signed)")

    def walk(count: int, token: str | None = token) -> tuple[float, float]:
        """Best (seconds, controller CPU seconds) of args.repeat fresh windows of count joiners."""
        nonlocal peak
        best = (float("inf"), float("inf"))
        for _ in range(args.repeat):
            ctl = Controller(discovery=True, start="auto", quorum_hosts=count, max_hosts=count, window_s=120,
                             silence_s=120, poll_s=60, token=token)
            try:
                cpu0 = ctl.cpu_seconds()
                seconds, _ = run(walk_ins(ctl.url, count, Signer(token, ctl.spki)))
                best = min(best, (seconds, ctl.cpu_seconds() - cpu0))
                peak = max(peak, ctl.peak_rss_mb())
            finally:
                ctl.close()
        return best

    t_small, cpu_small = walk(small)
    t_full, cpu_full = walk(n)
    lines.append(f"walk-ins: {n} joiners, first request -> every world held: {t_full:.2f} s "
                 f"({n / t_full:.0f} joiners/s); target <= {TARGET_JOIN_S:g} s: "
                 f"{'met' if t_full <= TARGET_JOIN_S else 'MISSED'}")
    lines.append(f"walk-ins, controller CPU: {cpu_full:.2f} s for {3 * n} requests (id, hello, world) "
                 f"({cpu_full / (3 * n) * 1e6:.0f} us each); the rest of the wall time is the client and the "
                 f"machine")
    lines.append(f"walk-ins scaling: {small} joiners {t_small:.2f} s; x{n / small:.0f} joiners took "
                 f"x{t_full / t_small:.1f} the wall time and x{cpu_full / cpu_small:.1f} the controller CPU "
                 f"(linear: x{n / small:.0f}, quadratic: x{(n / small) ** 2:.0f})")
    lines.append(f"walk-ins, controller CPU per walk-in: {cpu_full / n * 1e6:.0f} us (its TLS handshake, id, hello "
                 f"and world); requests re-sent after an idle stranger's connection was closed, all runs: {RESENT[0]}")
    if token is not None:
        t_plain, cpu_plain = walk(n, None)
        lines.append(f"walk-ins without a token: {t_plain:.2f} s, controller CPU {cpu_plain / (3 * n) * 1e6:.0f} us "
                     f"per request; with authentication {cpu_full / (3 * n) * 1e6:.0f} us "
                     f"(x{cpu_full / cpu_plain:.2f})")

    best_handshake = float("inf")
    for _ in range(args.repeat):
        ctl = Controller(discovery=True, start="manual", quorum_hosts=n, max_hosts=n, window_s=600, token=token)
        try:
            cpu0 = ctl.cpu_seconds()
            run(handshakes(ctl.port, n))
            best_handshake = min(best_handshake, (ctl.cpu_seconds() - cpu0) / n)
            peak = max(peak, ctl.peak_rss_mb())
        finally:
            ctl.close()
    lines.append(f"TLS handshakes alone ({n} connections: accept, shares, handshake, close): controller CPU "
                 f"{best_handshake * 1e6:.0f} us per handshake, {best_handshake / (cpu_full / n) * 100:.0f} % of a "
                 f"walk-in's")

    rps = {}
    for hosts in (16, n):
        best = (0.0, 0.0, 0, 0)
        for _ in range(args.repeat):
            ctl = Controller(discovery=True, start="manual", quorum_hosts=n, max_hosts=n, window_s=600,
                             silence_s=600, token=token)
            try:
                run(fill(ctl.url, hosts, Signer(token, ctl.spki)))
                cpu0 = ctl.cpu_seconds()
                rate, size, wire = run(pollers(ctl.url, args.pollers, args.poll_seconds))
                cpu = ctl.cpu_seconds() - cpu0
                best = max(best, (rate, cpu / (rate * args.poll_seconds), size, wire))
                peak = max(peak, ctl.peak_rss_mb())
            finally:
                ctl.close()
        rate, per_request, size, wire = best
        rps[hosts] = rate
        lines.append(f"state.json, window open, {hosts} hosts joined ({size / 1024:.1f} KiB, "
                     f"{wire / 1024:.1f} KiB on the wire): {rate:.0f} req/s with {args.pollers} pollers; "
                     f"controller CPU {per_request * 1e6:.0f} us per request")
    lines.append(f"state.json target >= {TARGET_RPS:.0f} req/s (16-host roster): "
                 f"{'met' if rps[16] >= TARGET_RPS else 'MISSED'}; the {n}-host roster serves "
                 f"x{rps[n] / rps[16]:.2f} the rate of the 16-host one")
    lines.append(f"controller peak RSS (VmHWM): {peak:.1f} MB; target <= {TARGET_RSS_MB:.0f} MB: "
                 f"{'met' if peak <= TARGET_RSS_MB else 'MISSED'}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
