"""Two controller builds side by side: per-request controller CPU of this checkout against another.

    python bench/controller_ab.py OTHER_CHECKOUT [--hosts 512] [--rounds 10]

Both controllers (each run by its own checkout's bench/controller.py, a
window with a token, start: manual so it stays open) serve at once; HOSTS
hosts join each; then, in ROUNDS rounds, every host sends one signed
heartbeat and 64 pollers send HOSTS GET /state.json, to one controller and
then the other (the order alternates per round). The load of a shared
machine falls on both alike, so the ratio of their CPU time is steadier than
two separate runs of bench/controller.py.

Each build's requests are signed with that build's own fdl/controller/auth.py
(loaded from its checkout): a build whose proofs name the controller instance
is asked its id first (GET /join/id), an older one is not.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TOKEN = "controller-ab-bench-token-0123456789"  # a bench window's token: loopback only
CONCURRENCY = 64


class Signing:
    """A build's proofs: its own auth module, and the keys for one of its controllers."""

    def __init__(self, checkout: Path, name: str):
        spec = importlib.util.spec_from_file_location(name, checkout / "fdl" / "controller" / "auth.py")
        if spec is None or spec.loader is None:
            raise SystemExit(f"bench: no fdl/controller/auth.py in {checkout}")
        self.auth = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.auth)
        self.keys: object = None

    async def connect(self, bench: ModuleType, url: str) -> None:
        import inspect

        import aiohttp

        if len(inspect.signature(self.auth.derive).parameters) == 1:  # proofs that name no controller
            self.keys = self.auth.derive(TOKEN)
            return
        async with bench.session(aiohttp) as s, s.get(url + "/join/id") as resp:
            self.keys = self.auth.derive(TOKEN, json.loads(await resp.read())["controller_id"])

    def headers(self, path: str, body: bytes) -> dict:
        return {"Content-Type": "application/json", **self.auth.sign_request(self.keys, "POST", path, body)}


def bench_of(checkout: Path, name: str) -> ModuleType:
    """A checkout's bench/controller.py, loaded under its own name (its Controller runs that checkout)."""
    spec = importlib.util.spec_from_file_location(name, checkout / "bench" / "controller.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench: no bench/controller.py in {checkout}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def join(bench: ModuleType, url: str, hosts: int, signing: Signing) -> list[str]:
    import aiohttp

    await signing.connect(bench, url)
    tickets = []
    async with bench.session(aiohttp) as s:
        for i in range(hosts):
            body = json.dumps({"host": f"ab-{i:05d}", "devices": "cpu:1"}).encode()
            async with s.post(url + "/join", data=body, headers=signing.headers("/join", body)) as resp:
                answer = await resp.json()
            if answer.get("admitted") is not True:
                raise SystemExit(f"bench: ab-{i:05d} refused: {answer}")
            tickets.append(answer["ticket"])
    return tickets


async def heartbeats(bench: ModuleType, url: str, tickets: list[str], signing: Signing) -> None:
    import aiohttp

    left = iter(tickets)
    async with bench.session(aiohttp) as s:
        async def worker() -> None:
            for ticket in left:
                body = json.dumps({"ticket": ticket}).encode()
                async with s.post(url + "/join/heartbeat", data=body,
                                  headers=signing.headers("/join/heartbeat", body)) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"bench: heartbeat answered {resp.status}")

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def states(bench: ModuleType, url: str, count: int) -> None:
    import aiohttp

    left = [count]
    async with bench.session(aiohttp) as s:
        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                async with s.get(url + "/state.json") as resp:
                    await resp.read()

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its fdl/ and bench/controller.py)")
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    checkouts = {"other": args.other.resolve(), "this": REPO}
    builds = {name: bench_of(path, f"bench_{name}") for name, path in checkouts.items()}
    signings = {name: Signing(path, f"auth_{name}") for name, path in checkouts.items()}
    policy = {"discovery": True, "start": "manual", "quorum_hosts": 4096, "max_hosts": 4096, "window_s": 3600,
              "silence_s": 600, "heartbeat_s": 60}
    controllers = {name: bench.Controller(token=TOKEN, **policy) for name, bench in builds.items()}
    run = builds["this"].run
    try:
        tickets = {name: run(join(builds["this"], c.url, args.hosts, signings[name]))
                   for name, c in controllers.items()}
        cpu = {name: {"heartbeat": 0.0, "state.json": 0.0} for name in controllers}
        for round_ in range(args.rounds):
            order = list(controllers) if round_ % 2 == 0 else list(reversed(controllers))
            for kind in ("heartbeat", "state.json"):
                for name in order:
                    c, bench = controllers[name], builds["this"]  # the client is this checkout's
                    before = c.cpu_seconds()
                    if kind == "heartbeat":
                        run(heartbeats(bench, c.url, tickets[name], signings[name]))
                    else:
                        run(states(bench, c.url, args.hosts))
                    cpu[name][kind] += c.cpu_seconds() - before
    finally:
        for c in controllers.values():
            c.close()
    requests = args.hosts * args.rounds
    for name in controllers:
        print(f"{name} ({args.other if name == 'other' else REPO}): "
              + ", ".join(f"{kind} {cpu[name][kind] / requests * 1e6:.0f} us/request" for kind in cpu[name]))
    print("this/other: " + ", ".join(f"{kind} x{cpu['this'][kind] / cpu['other'][kind]:.3f}"
                                     for kind in cpu["this"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
