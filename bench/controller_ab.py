"""Two controller builds side by side: per-request controller CPU of this checkout against another.

    python bench/controller_ab.py OTHER_CHECKOUT [--hosts 512] [--rounds 10]

Both controllers (each run by its own checkout's bench/controller.py, a
window with a token, start: manual so it stays open) serve at once; HOSTS
hosts join each; then, in ROUNDS rounds, every host sends one signed
heartbeat and 64 pollers send HOSTS GET /state.json, to one controller and
then the other (the order alternates per round). The load of a shared
machine falls on both alike, so the ratio of their CPU time is steadier than
two separate runs of bench/controller.py.
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


def bench_of(checkout: Path, name: str) -> ModuleType:
    """A checkout's bench/controller.py, loaded under its own name (its Controller runs that checkout)."""
    spec = importlib.util.spec_from_file_location(name, checkout / "bench" / "controller.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench: no bench/controller.py in {checkout}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def join(bench: ModuleType, url: str, hosts: int, keys: object) -> list[str]:
    import aiohttp

    tickets = []
    async with bench.session(aiohttp) as s:
        for i in range(hosts):
            body = json.dumps({"host": f"ab-{i:05d}", "devices": "cpu:1"}).encode()
            headers = bench.signed(keys, "/join", body, {"Content-Type": "application/json"})
            async with s.post(url + "/join", data=body, headers=headers) as resp:
                answer = await resp.json()
            if answer.get("admitted") is not True:
                raise SystemExit(f"bench: ab-{i:05d} refused: {answer}")
            tickets.append(answer["ticket"])
    return tickets


async def heartbeats(bench: ModuleType, url: str, tickets: list[str], keys: object) -> None:
    import aiohttp

    left = iter(tickets)
    async with bench.session(aiohttp) as s:
        async def worker() -> None:
            for ticket in left:
                body = json.dumps({"ticket": ticket}).encode()
                headers = bench.signed(keys, "/join/heartbeat", body, {"Content-Type": "application/json"})
                async with s.post(url + "/join/heartbeat", data=body, headers=headers) as resp:
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
    from fdl.controller.auth import derive

    keys = derive(TOKEN)
    builds = {"other": bench_of(args.other.resolve(), "bench_other"), "this": bench_of(REPO, "bench_this")}
    policy = {"discovery": True, "start": "manual", "quorum_hosts": 4096, "max_hosts": 4096, "window_s": 3600,
              "silence_s": 600, "heartbeat_s": 60}
    controllers = {name: bench.Controller(token=TOKEN, **policy) for name, bench in builds.items()}
    run = builds["this"].run
    try:
        tickets = {name: run(join(builds[name], c.url, args.hosts, keys)) for name, c in controllers.items()}
        cpu = {name: {"heartbeat": 0.0, "state.json": 0.0} for name in controllers}
        for round_ in range(args.rounds):
            order = list(controllers) if round_ % 2 == 0 else list(reversed(controllers))
            for kind in ("heartbeat", "state.json"):
                for name in order:
                    c, bench = controllers[name], builds[name]
                    before = c.cpu_seconds()
                    if kind == "heartbeat":
                        run(heartbeats(bench, c.url, tickets[name], keys))
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
