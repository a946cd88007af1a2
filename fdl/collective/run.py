"""Run the all-reduce smoke test: ranks under the rank supervisor, bounded by a time limit.

`run_local` starts every rank on this host (what `fdl probe --collective`
does): one rank per GPU with nccl, or N CPU ranks with gloo. The launcher's
multi-host dispatch runs the same script (allreduce.py) under the same
supervisor on every host, with the world's torch.distributed environment;
`script_argv` and `aggregate` are the parts it shares.

The time limit bounds the whole test: the ranks get 3/4 of it as their own
budget (they stop early, in agreement, when it runs out), and whatever is
still running when the limit strikes is torn down and the result marked
abandoned.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fdl.collective.results import CollectiveResult, aggregate, parse_line
from fdl.hostside.envvars import FDL_BACKEND, FDL_HOST
from fdl.hostside.supervisor import Supervisor

SCRIPT = Path(__file__).with_name("allreduce.py")
BUDGET_SHARE = 0.75  # of the time limit, for the ranks' own measuring; the rest is start-up and slack
DEFAULT_CPU_RANKS = 2


@dataclass(frozen=True)
class CollectiveOptions:
    """How to run the test; every field has a user-facing flag or config key."""

    time_limit_s: float = 120.0
    min_bytes: int = 8 << 10
    max_bytes: int = 64 << 20
    max_iters: int = 20
    exchange_bytes: int = 4 << 20
    python: str = sys.executable  # the interpreter that has PyTorch


def script_argv(options: CollectiveOptions, script: str | None = None) -> list[str]:
    """The rank command line (the script path defaults to this install's allreduce.py)."""
    budget = max(1.0, options.time_limit_s * BUDGET_SHARE)
    return [options.python, script or str(SCRIPT), "--min-bytes", str(options.min_bytes),
            "--max-bytes", str(options.max_bytes), "--budget-s", f"{budget:.1f}",
            "--max-iters", str(options.max_iters), "--exchange-bytes", str(options.exchange_bytes)]


LOCAL_RENDEZVOUS_TRIES = 3  # a local world on a port of our choosing: attempts at its rendezvous


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def local_ranks(gpus: list[int] | None, cpu_ranks: int, *, host: str, port: int) -> list[dict]:
    """Rank specs for the supervisor: one per GPU (nccl) when gpus are given, else cpu_ranks CPU ranks (gloo)."""
    count = len(gpus) if gpus else cpu_ranks
    ranks = []
    for rank in range(count):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(count), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(count), FDL_HOST: host,
               FDL_BACKEND: "nccl" if gpus else "gloo",
               "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)) if gpus else "",
               "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        ranks.append({"rank": rank, "env": env})
    return ranks


class Collector:
    """Supervisor line sink: events parsed, other output kept (the last lines per rank) for failure reports."""

    def __init__(self, echo=None) -> None:
        self.events: list[dict] = []
        self.tails: dict[int, list[str]] = {}
        self.lock = threading.Lock()
        self.echo = echo

    def __call__(self, rank: int, line: str) -> None:
        event = parse_line(line)
        with self.lock:
            if event is not None:
                self.events.append(event)
            elif line.strip():
                tail = self.tails.setdefault(rank, [])
                tail.append(line.strip())
                del tail[:-5]
        if self.echo is not None:
            self.echo(rank, line)


def run_ranks(ranks: list[dict], options: CollectiveOptions, *, script: str | None = None,
              echo=None) -> CollectiveResult:
    """Run the given ranks of one host under the supervisor, within options.time_limit_s; aggregate."""
    started = time.monotonic()
    collector = Collector(echo)
    # the supervisor's notes (OMP_NUM_THREADS defaulted) are not the smoke test's: its report says what counts
    supervisor = Supervisor(script_argv(options, script), ranks, grace_s=2.0, on_line=collector,
                            on_note=lambda _text: None)
    abandoned = threading.Event()

    def strike() -> None:
        abandoned.set()
        supervisor.stop("terminated")

    timer = threading.Timer(options.time_limit_s, strike)
    timer.daemon = True
    timer.start()
    try:
        group = supervisor.run()
    finally:
        timer.cancel()
    result = aggregate(collector.events, abandoned=abandoned.is_set(), time_limit_s=options.time_limit_s,
                       elapsed_s=round(time.monotonic() - started, 3))
    quiet_skip = bool(result.skipped_hosts) and not result.world_size  # PyTorch missing: a skip, not a failure
    if not result.finished and not result.errors and not result.abandoned and group.first_failure is not None \
            and not quiet_skip:
        rank = group.first_failure
        last = (collector.tails.get(rank) or ["no output"])[-1]
        result.failure = f"rank {rank} exited with code {group.codes.get(rank)} ({last})"
    return result


def run_local(gpus: list[int] | None = None, cpu_ranks: int = DEFAULT_CPU_RANKS,
              options: CollectiveOptions | None = None, *, host: str | None = None, port: int | None = None,
              echo=None) -> CollectiveResult:
    """The smoke test across this host's ranks (GPUs with nccl, or CPU ranks with gloo)."""
    options = options or CollectiveOptions()
    host = host or socket.gethostname()
    if port is not None:
        return run_ranks(local_ranks(gpus, cpu_ranks, host=host, port=port), options, echo=echo)
    # A port picked here was free when picked, but any process on the box may take it before rank 0 listens on
    # it: a rendezvous that fails at init on a port of our choosing is tried again on a fresh one.
    for _attempt in range(LOCAL_RENDEZVOUS_TRIES - 1):
        result = run_ranks(local_ranks(gpus, cpu_ranks, host=host, port=free_port()), options, echo=echo)
        if not any(event.get("kind") == "init" for event in result.errors):
            return result
    return run_ranks(local_ranks(gpus, cpu_ranks, host=host, port=free_port()), options, echo=echo)


def parse_size(text: str) -> int:
    """"64M", "8K", "1G", "4096" -> bytes (a power of two from 8 KiB to 1 GiB); ValueError otherwise."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    shift = {"K": 10, "M": 20, "G": 30}.get(value[-1:], 0)
    number = value[:-1] if shift else value
    if not number.isdigit():
        raise ValueError("expected a size like 8K, 64M or 1G")
    size = int(number) << shift
    if size < (8 << 10) or size > (1 << 30) or size & (size - 1):
        raise ValueError("the size must be a power of two from 8K to 1G")
    return size


def selected_gpus(report: dict) -> list[int] | None:
    """The GPU ids a probe report (dict form) selected, or None when it found no GPU."""
    gpu = next((c for c in report.get("checks", []) if c.get("name") == "gpu"), None)
    if gpu is None:
        return None
    ids = [d["index"] for d in gpu.get("data", {}).get("devices", []) if d.get("selected")]
    return ids or None
