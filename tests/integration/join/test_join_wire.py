"""The join channel on the wire, across network-namespace hosts.

- Two walk-ins join, train (gloo) and exit while every frame on their bridge legs is captured with
  AF_PACKET sockets: the token's bytes appear nowhere (regression: the hello carried it in clear).
- A third host floods the controller with more than 10,000 connections while the window stages and
  again while the ranks train: nobody admitted is dropped and the run completes (regression: one peer
  could fill the connection cap, members' heartbeats got 503 and went "silent").

The controller runs in this test process on the testbed's gateway; the agents are real `fdl join`
processes inside their hosts' namespaces (as root there, like test_join_testbed.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.conftest import run_fdl
from tests.integration.join.helpers import controller, finish, policy, results, spawn_join, wait_for
from tests.join_util import free_port, write_program

pytestmark = [pytest.mark.testbed(hosts=3), pytest.mark.slow]
TOKEN = "3fb74f4757c33d83dfbf5e53c40bda0358474a27cf7485347fa5fa6bf5ae40dc"  # fdl refuses a token under 128 bits
ETH_P_ALL = 0x0003

# A rank that trains for TEST_TRAIN_S seconds (all-reduce after all-reduce), so a flood can hit a live run.
TRAIN = r'''
import os, sys, time
if os.environ.get("FDL_SIGNATURE_PROBE") == "1":
    print("fdl-signature: ab12cd34ef56ab12", flush=True)
    sys.exit(0)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
if rank == 0:
    open(os.environ["TEST_TRAINING_MARK"], "w").close()
end = time.time() + float(os.environ.get("TEST_TRAIN_S", "0"))
steps = 0
while True:
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    steps += 1
    done = torch.tensor([1.0 if time.time() >= end else 0.0])
    dist.all_reduce(done, op=dist.ReduceOp.MIN)
    if done.item():
        break
    time.sleep(0.05)
print(f"RESULT rank={rank} size={size} sum={value.item():g} steps={steps}", flush=True)
dist.barrier()
dist.destroy_process_group()
'''

# Opens connection after connection to HOST:PORT from CONCURRENCY workers, each holding its connection until
# the controller answers or cuts it, until TARGET connections were opened or LIMIT_S passed (bounded: it stops
# by itself). Prints {"opened": N, "shed": N (503 answers), "errors": N}.
FLOOD = r'''
import asyncio, json, sys, time
host, port, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
limit_s, concurrency = float(sys.argv[4]), int(sys.argv[5])
counts = {"opened": 0, "shed": 0, "errors": 0}
async def worker(deadline):
    while counts["opened"] < target and time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        except (OSError, asyncio.TimeoutError):
            counts["errors"] += 1
            await asyncio.sleep(0.05)
            continue
        counts["opened"] += 1
        try:
            data = await asyncio.wait_for(reader.read(64), 15)
            if b" 503 " in data:
                counts["shed"] += 1
        except (OSError, asyncio.TimeoutError):
            pass
        writer.close()
async def main():
    deadline = time.monotonic() + limit_s
    await asyncio.gather(*(worker(deadline) for _ in range(concurrency)))
asyncio.run(main())
print(json.dumps(counts))
'''


class Capture:
    """Every frame crossing the given links (AF_PACKET, ETH_P_ALL), kept in memory."""

    def __init__(self, links: list[str]):
        self.frames = bytearray()
        self.count = 0
        self._stop = threading.Event()
        self._socks = []
        for link in links:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.bind((link, 0))
            sock.settimeout(0.2)
            self._socks.append(sock)
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True) for s in self._socks]

    def _read(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                frame = sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self.frames += frame
            self.count += 1

    def __enter__(self) -> Capture:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        for sock in self._socks:
            sock.close()


def join_on(bed, host, *args: str, env: dict | None = None):
    bed.verify()  # the bridge and the namespaces exist before any traffic
    extra = {"GLOO_SOCKET_IFNAME": "eth0", **(env or {})}
    return spawn_join(*args, home=bed.dir / "agents" / host.name, env=extra,
                      prefix=("ip", "netns", "exec", host.namespace))


def trainer(bed):
    return write_program(bed.shared / "wire-bin" / "train", TRAIN, python=sys.executable)


def test_the_token_never_crosses_the_wire(testbed):
    bed = testbed
    h1, h2 = bed.hosts[0], bed.hosts[1]
    binary = trainer(bed)
    port = free_port(bed.gateway)
    mark = bed.shared / "wire-training-1"
    with (Capture([h.veth for h in bed.hosts]) as capture,
          controller(policy(max_hosts=2, window_s=120, token=TOKEN), host=bed.gateway, port=port) as server):
        agents = [join_on(bed, h, f"{bed.gateway}:{port}", "--bin", str(binary), "--host", h.name, "--devices",
                          "cpu:1", env={"FDL_JOIN_TOKEN": TOKEN, "TEST_TRAINING_MARK": str(mark)})
                  for h in (h1, h2)]
        outcome = [finish(proc, timeout=240) for proc in agents]
        state = server.state()
    for code, _, err in outcome:
        assert code == 0, err
    assert state["phase"] == "done" and state["world"]["size"] == 2
    wire = bytes(capture.frames)
    assert b"POST /join HTTP/1.1" in wire and b"X-Fdl-Proof" in wire  # the capture saw the join channel ...
    assert b"POST /join/exit" in wire
    assert TOKEN.encode() not in wire and bytes.fromhex(TOKEN) not in wire  # ... and never the token
    assert TOKEN[:16].encode() not in wire


def test_a_flood_from_a_third_host_drops_nobody_while_staging_and_training(testbed):
    bed = testbed
    h1, h2, h3 = bed.hosts
    binary = trainer(bed)
    port = free_port(bed.gateway)
    mark = bed.shared / "wire-training-2"
    mark.unlink(missing_ok=True)

    def flood(target: int, limit_s: float) -> subprocess.Popen:
        bed.verify()
        return subprocess.Popen(["ip", "netns", "exec", h3.namespace, sys.executable, "-c", FLOOD, bed.gateway,
                                 str(port), str(target), str(limit_s), "200"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def flooded(proc: subprocess.Popen) -> dict:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        return json.loads(out)

    run_policy = policy(start="manual", quorum_hosts=2, window_s=300, token=TOKEN, heartbeat_s=0.5, silence_s=5.0,
                        poll_s=2.0)
    with controller(run_policy, host=bed.gateway, port=port) as server:
        agents = {h.name: join_on(bed, h, f"{bed.gateway}:{port}", "--bin", str(binary), "--host", h.name,
                                  "--devices", "cpu:1", env={"FDL_JOIN_TOKEN": TOKEN, "TEST_TRAIN_S": "25",
                                                             "TEST_TRAINING_MARK": str(mark)})
                  for h in (h1, h2)}
        try:
            wait_for(lambda: server.state()["phase"] == "staging" or any(p.poll() is not None for p in agents.values()),
                     timeout=120, what="two admissions")
            staging = flooded(flood(10_500, 120))  # the window holds in staging (manual start) all along
            state = server.state()
            assert state["phase"] == "staging" and state["departed"] == [], state
            started = run_fdl("start", "--addr", f"{bed.gateway}:{port}",
                              env={"FDL_JOIN_TOKEN": TOKEN})  # signed, over the bridge
            assert started.returncode == 0, started.stderr
            wait_for(lambda: mark.exists() or any(p.poll() is not None for p in agents.values()), timeout=120,
                     what="the ranks training")
            training_flood = flood(10_500, 120)
            outcome = {name: finish(proc, timeout=300) for name, proc in agents.items()}
            training = flooded(training_flood)
        finally:
            for proc in agents.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        state = server.state()
    for name, (code, _, err) in outcome.items():
        assert code == 0, f"{name}: {err}"
    assert state["phase"] == "done" and state["departed"] == [] and state["reason"] is None
    assert sorted(m["host"] for m in state["roster"]) == ["h1", "h2"]
    assert all(m["exit_code"] == 0 for m in state["roster"])
    ranks = [r for _, out, _ in outcome.values() for r in results(out)]
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1] and {r["sum"] for r in ranks} == {"3"}
    assert staging["opened"] + training["opened"] >= 10_000, (staging, training)
    assert staging["shed"] > 0, staging  # the flood hit its share and was answered 503
