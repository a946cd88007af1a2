"""What watching a run costs the controller, measured in one run.

    python bench/live_status.py [--hosts 4096] [--hellos 200] [--readers 8]

1. A /metrics scrape (collector + prometheus_client's text encoder) with a
   16-host and an N-host roster, against a state.json rebuild with the same
   rosters: the gauges come from one O(1) snapshot, so the scrape's ratio
   should stay near x1 while state.json grows with the roster.
2. Admission latency on a live controller (loopback HTTP), median of
   --hellos hellos, with no viewer and with --readers stalled viewers that
   asked for the page and the metrics hundreds of times and never read the
   answers: the ratio should stay near x1.
3. The one-time import of prometheus_client (done in a thread at the first
   scrape, never on the event loop), as a whole-process wall time difference.

Every figure is the best (or median) of a few repeats on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._timing import env_for_fdl, median_wall
from fdl.controller.client import ControllerClient
from fdl.controller.machine import RunMachine
from fdl.controller.metrics import new_registry, render
from fdl.controller.policy import RunPolicy
from fdl.controller.protocol import Hello
from fdl.controller.server import ControllerServer
from fdl.hostside.checks.devices import parse_devices


def filled(hosts: int) -> RunMachine:
    machine = RunMachine(RunPolicy(start="manual", quorum_hosts=1, window_s=3600, silence_s=1e6,
                                   max_hosts=4096))
    for i in range(hosts):
        machine.hello(Hello(host=f"h{i:05d}", devices=parse_devices("0,1"), gpu_names=("NVIDIA H100",) * 2),
                      peer="10.0.0.1", trusted=True)
    return machine


def best_us(fn, loops: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - start) / loops)
    return best * 1e6


def scrape_costs(hosts: int) -> tuple[float, float, int]:
    machine = filled(hosts)
    server = ControllerServer(machine, port=0)
    registry = new_registry(server)
    scrape = best_us(lambda: render(registry, None), 200)

    def rebuild() -> None:
        machine._changed()  # what any change does: the next state.json is built afresh
        machine.state_json()

    state = best_us(rebuild, 20 if hosts > 100 else 500)
    return scrape, state, len(render(registry, None)[0])


def stalled_reader(port: int, repeat: int) -> socket.socket:
    from fdl.controller.tls import client_context

    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", port))
    sock = client_context().wrap_socket(raw)  # every dial is TLS
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * repeat)
    return sock


TOKEN = "live-status-bench-token-0123456789"  # a bench window's token: loopback only


def hello_latency(port: int, count: int, prefix: str) -> float:
    samples = []
    with ControllerClient(f"127.0.0.1:{port}", timeout=30, token=TOKEN) as client:
        client.state()  # connection up
        for i in range(count):
            start = time.perf_counter()
            client.hello({"host": f"{prefix}-{i}", "devices": "cpu:1"})
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4096)
    parser.add_argument("--hellos", type=int, default=200)
    parser.add_argument("--readers", type=int, default=8)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")

    small = scrape_costs(16)
    big = scrape_costs(args.hosts)
    print(f"/metrics scrape, 16 hosts: {small[0]:.0f} us ({small[2]} bytes); {args.hosts} hosts: {big[0]:.0f} us "
          f"({big[2]} bytes); x{big[0] / small[0]:.2f} for x{args.hosts / 16:.0f} the roster")
    print(f"state.json rebuild, 16 hosts: {small[1]:.0f} us; {args.hosts} hosts: {big[1]:.0f} us; "
          f"x{big[1] / small[1]:.1f} (for comparison: it carries the roster)")

    policy = RunPolicy(start="manual", quorum_hosts=1, window_s=3600, silence_s=1e6,
                       max_hosts=4096, token=TOKEN)
    with ControllerServer(policy, port=0) as server:
        quiet = hello_latency(server.port, args.hellos, "quiet")
        readers = [stalled_reader(server.port, 300) for _ in range(args.readers)]
        try:
            def answered() -> int:
                return server.call(lambda m: sum(n for (e, _), n in server.requests.items() if e in ("/", "/metrics")))

            pending, steady = -1, 0
            while steady < 5:  # until their answers have filled the sockets and the writes stalled
                time.sleep(0.1)
                now = answered()
                steady, pending = (steady + 1 if now == pending else 0), now
            busy = hello_latency(server.port, args.hellos, "busy")
        finally:
            for sock in readers:
                sock.close()
    print(f"hello latency (median of {args.hellos}): {quiet * 1e3:.2f} ms with no viewer, {busy * 1e3:.2f} ms with "
          f"{args.readers} stalled page/metrics readers ({pending} of {args.readers * 600} of their answers "
          f"written); x{busy / quiet:.2f}")

    env = env_for_fdl()
    bare = median_wall([sys.executable, "-c", "pass"], runs=7, env=env)
    prom = median_wall([sys.executable, "-c", "import prometheus_client"], runs=7, env=env)
    print(f"prometheus_client import (once, off the event loop, at the first scrape): {(prom - bare) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
