"""Run the all-reduce smoke test: the options, this host's one-host world, and a cluster's results combined.

`run_local` starts every rank on this host (what `fdl probe --collective` does): one rank per GPU with
nccl, or N CPU ranks with gloo. Across a cluster the ranks run on every host at once from the fdl_probe
role's collective step (fdl.cluster.probe), and `combine` turns what each host's step returned into one
result. Both take the host side from fdl.hostside.collective (the rank program, rank numbering, the
supervised run), the one library the role's modules run too.

The time limit bounds the ranks: they get BUDGET_SHARE of it as their own budget (they stop early, in
agreement, when it runs out), and whatever is still running when the limit strikes is torn down and the
result marked abandoned.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdl.collective.results import CollectiveResult, aggregate
from fdl.hostside.collective import allreduce
from fdl.hostside.collective.offer import DEFAULT_CPU_RANKS
from fdl.hostside.collective.ranks import program_argv, run_ranks, world_ranks

SCRIPT = Path(allreduce.__file__)
LOCAL_RENDEZVOUS_TRIES = 3  # a local world on a port of our choosing: attempts at its rendezvous


@dataclass(frozen=True)
class CollectiveOptions:
    """How to run the test; every field has a user-facing flag or config key."""

    time_limit_s: float = 120.0
    min_bytes: int = 8 << 10
    max_bytes: int = 64 << 20
    max_iters: int = 20
    exchange_bytes: int = 4 << 20
    python: str = sys.executable  # the interpreter that has PyTorch (this host's test)


def script_argv(options: CollectiveOptions) -> list[str]:
    """This install's rank command line for a test on this host."""
    return program_argv(options.python, str(SCRIPT), time_limit_s=options.time_limit_s,
                        min_bytes=options.min_bytes, max_bytes=options.max_bytes, max_iters=options.max_iters,
                        exchange_bytes=options.exchange_bytes)


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def local_ranks(gpus: list[int] | None, cpu_ranks: int, *, host: str, port: int) -> list[dict]:
    """Rank specs for a world of this host alone: one per GPU (nccl) when gpus are given, else cpu_ranks CPU
    ranks (gloo), talking over loopback."""
    world = [{"host": host, "gpus": gpus or None, "ranks": len(gpus) if gpus else cpu_ranks}]
    return world_ranks(world, host, master_addr="127.0.0.1", master_port=port,
                       extra_env={"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"})


def rank_failure(host: str | None, outcome: dict[str, Any]) -> str | None:
    """"rank R exited with code C (its last line)" for a host's outcome (Outcome.to_dict()) whose rank failed."""
    rank = outcome.get("first_failure")
    if rank is None:
        return None
    codes = outcome.get("codes") or {}
    last = ((outcome.get("tails") or {}).get(str(rank)) or ["no output"])[-1]
    where = f" on {host}" if host else ""
    return f"rank {rank}{where} exited with code {codes.get(str(rank))} ({last})"


def _explained(result: CollectiveResult) -> bool:
    """The events say how the test ended (finished, a rank's error, abandoned), or nothing was meant to run
    (every host skipped: PyTorch missing is a skip, not a failure)."""
    nothing_ran = bool(result.skipped_hosts) and not result.world_size
    return result.finished or bool(result.errors) or result.abandoned or nothing_ran


def run_ranks_here(ranks: list[dict], options: CollectiveOptions,
                   echo: Callable[[int, str], None] | None = None) -> CollectiveResult:
    """Run the given ranks of this host under the supervisor, within options.time_limit_s; aggregate."""
    outcome = run_ranks(script_argv(options), ranks, time_limit_s=options.time_limit_s, echo=echo)
    result = aggregate(outcome.events, abandoned=outcome.abandoned, time_limit_s=options.time_limit_s,
                       elapsed_s=outcome.elapsed_s)
    if not _explained(result):
        result.failure = rank_failure(None, outcome.to_dict())
    return result


def run_local(gpus: list[int] | None = None, cpu_ranks: int = DEFAULT_CPU_RANKS,
              options: CollectiveOptions | None = None, *, host: str | None = None, port: int | None = None,
              echo: Callable[[int, str], None] | None = None) -> CollectiveResult:
    """The smoke test across this host's ranks (GPUs with nccl, or CPU ranks with gloo)."""
    options = options or CollectiveOptions()
    host = host or socket.gethostname()
    if port is not None:
        return run_ranks_here(local_ranks(gpus, cpu_ranks, host=host, port=port), options, echo=echo)
    # A port picked here was free when picked, but any process on the box may take it before rank 0 listens on
    # it: a rendezvous that fails at init on a port of our choosing is tried again on a fresh one.
    for _attempt in range(LOCAL_RENDEZVOUS_TRIES - 1):
        result = run_ranks_here(local_ranks(gpus, cpu_ranks, host=host, port=free_port()), options, echo=echo)
        if not any(event.get("kind") == "init" for event in result.errors):
            return result
    return run_ranks_here(local_ranks(gpus, cpu_ranks, host=host, port=free_port()), options, echo=echo)


def combine(offers: dict[str, dict[str, Any]], outcomes: dict[str, dict[str, Any]], *, hosts: list[str],
            time_limit_s: float) -> CollectiveResult:
    """One result from a cluster's collective step: each host's offer (from its probe) and outcome (from the
    step: its module return, or {"msg": why} when the task failed without one), by host, for the hosts the
    test was meant to span (in roster order).

    A host without PyTorch is a skipped host (a warning); a host whose PyTorch check could not run, that did
    not take part, or whose rank failed without saying why makes the test fail.
    """
    events: list[dict] = []
    skipped: dict[str, str] = {}
    problems: list[str] = []
    for host in hosts:
        offer = offers.get(host)
        if offer is None:
            problems.append(f"{host} did not take part (its probe did not finish)")
            continue
        if offer.get("skipped"):
            skipped[host] = str(offer["skipped"])
        elif offer.get("error"):
            problems.append(f"{host}: {offer['error']}")
        outcome = outcomes.get(host) or {}
        if "events" not in outcome:  # its task failed before its ranks ran, or never came
            if offer.get("ranks"):
                problems.append(f"{host} did not run its ranks ({outcome.get('msg') or 'its task did not finish'})")
            continue
        events.extend(outcome["events"])
    ran = [o for h, o in outcomes.items() if h in hosts and "events" in o]
    result = aggregate(events, skipped_hosts=skipped, abandoned=any(o.get("abandoned") for o in ran),
                       time_limit_s=time_limit_s,
                       elapsed_s=max((float(o.get("elapsed_s") or 0.0) for o in ran), default=0.0))
    if not problems and not _explained(result):
        problems += [f for f in (rank_failure(h, o) for h, o in outcomes.items() if h in hosts) if f]
    if problems:
        result.failure = "; ".join(problems)
    return result


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
