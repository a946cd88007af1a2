"""The all-reduce smoke test on one host: its ranks' place in the world, and running them.

One library, two callers. `fdl probe --collective` runs a one-host world on this machine
(fdl.collective.run). Across a cluster, the fdl_probe role's collective step runs on every host of one
play: its probe says what the host offers (offer.py), and the next task (module fdl_collective) hands every
host the same list of offers, from which each host takes its own ranks (`world_ranks`) and runs them at once
(`run_ranks`), bounded by the time limit. The rank program is allreduce.py; the controller aggregates the
events (fdl.collective.results).

Standard library only (the rank program imports PyTorch itself), Python 3.8: shipped to hosts as the
collection's module_utils.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, NamedTuple

from ..envvars import FDL_BACKEND, FDL_HOST
from ..supervisor import Supervisor
from .offer import Event, parse_line, write_program

BUDGET_SHARE = 0.75  # of the time limit, for the ranks' own measuring; the rest is start-up and slack
GRACE_S = 2.0  # SIGTERM to SIGKILL when the ranks are stopped
TAIL_LINES = 5  # other output kept per rank, for a failure's report


def program_argv(python: str, program: str, *, time_limit_s: float, min_bytes: int, max_bytes: int,
                 max_iters: int, exchange_bytes: int) -> list[str]:
    """Every rank's command line: the ranks measure within BUDGET_SHARE of the time limit."""
    budget = max(1.0, time_limit_s * BUDGET_SHARE)
    return [python, program, "--min-bytes", str(min_bytes), "--max-bytes", str(max_bytes), "--budget-s",
            f"{budget:.1f}", "--max-iters", str(max_iters), "--exchange-bytes", str(exchange_bytes)]


def world_ranks(world: list[dict[str, Any]], host: str, *, master_addr: str, master_port: int,
                extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`host`'s rank specs (for the Supervisor) in `world`: every host's offer, in one order all hosts share.

    Ranks are numbered host by host and, within a host, in the order of its devices (as the launcher's
    world numbers them, fdl.controller.world); hosts offering no rank take no place. CUDA_VISIBLE_DEVICES
    lists every GPU the host offers and LOCAL_RANK indexes into it. nccl when every host with ranks offers
    GPUs, else gloo.
    """
    members = [m for m in world if int(m.get("ranks") or 0) > 0]
    size = sum(int(m["ranks"]) for m in members)
    backend = "nccl" if members and all(m.get("gpus") for m in members) else "gloo"
    node_rank = next((i for i, m in enumerate(members) if m.get("host") == host), None)
    if node_rank is None:
        return []
    member = members[node_rank]
    first = sum(int(m["ranks"]) for m in members[:node_rank])
    gpus = member.get("gpus") or None
    count = int(member["ranks"])
    ranks = []
    for local in range(count):
        env = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "WORLD_SIZE": str(size),
               "RANK": str(first + local), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(count),
               "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(len(members)),
               "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)) if gpus else "", FDL_HOST: host,
               FDL_BACKEND: backend}
        env.update(extra_env or {})
        ranks.append({"rank": first + local, "env": env})
    return ranks


class Collector:
    """Supervisor line sink: events parsed, other output kept (the last lines per rank) for failure reports."""

    def __init__(self, echo: Callable[[int, str], None] | None = None) -> None:
        self.events: list[Event] = []
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
                del tail[:-TAIL_LINES]
        if self.echo is not None:
            self.echo(rank, line)


class Outcome(NamedTuple):
    """How one host's ranks ended: their events, the last other lines of each, exit codes."""

    events: list[Event]
    tails: dict[int, list[str]]
    codes: dict[int, int | None]
    first_failure: int | None  # the rank that failed first
    abandoned: bool  # the time limit struck before the ranks ended
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "tails": {str(k): v for k, v in self.tails.items()},
                "codes": {str(k): v for k, v in self.codes.items()}, "first_failure": self.first_failure,
                "abandoned": self.abandoned, "elapsed_s": self.elapsed_s}


def run_ranks(argv: list[str], ranks: list[dict[str, Any]], *, time_limit_s: float,
              base_env: dict[str, str] | None = None,
              echo: Callable[[int, str], None] | None = None) -> Outcome:
    """Run one host's ranks under the rank supervisor, stopped (abandoned) when time_limit_s strikes."""
    started = time.monotonic()
    collector = Collector(echo)
    # the supervisor's notes (OMP_NUM_THREADS defaulted) are not the smoke test's: its report says what counts
    supervisor = Supervisor(argv, ranks, grace_s=GRACE_S, base_env=base_env, on_line=collector,
                            on_note=lambda _text: None)
    abandoned = threading.Event()

    def strike() -> None:
        abandoned.set()
        supervisor.stop("terminated")

    timer = threading.Timer(time_limit_s, strike)
    timer.daemon = True
    timer.start()
    try:
        group = supervisor.run()
    finally:
        timer.cancel()
    return Outcome(events=collector.events, tails=collector.tails, codes=dict(group.codes),
                   first_failure=group.first_failure, abandoned=abandoned.is_set(),
                   elapsed_s=round(time.monotonic() - started, 3))


def smoke_test(host: str, world: list[dict[str, Any]], *, master_addr: str, master_port: int, time_limit_s: float,
               min_bytes: int, max_bytes: int, max_iters: int, exchange_bytes: int,
               forks: int | None = None) -> dict[str, Any]:
    """The fdl_collective module's work on one host: this host's ranks of `world` (every host's offer), run at
    once under this Python, bounded by the time limit. The result (less `changed`): ranks, ok, msg and the
    outcome's fields. ValueError when the play cannot run every host at once (forks below the hosts)."""
    if forks is not None and len(world) > forks:
        raise ValueError(f"the all-reduce smoke test runs on every host at once, but this play runs {forks} at a "
                         f"time and the test spans {len(world)} hosts: run it with forks {len(world)} or more "
                         f"(-f {len(world)})")
    mine = world_ranks(world, host, master_addr=master_addr, master_port=master_port)
    if not mine:
        return {"ranks": [], "events": [], "tails": {}, "codes": {}, "first_failure": None, "abandoned": False,
                "elapsed_s": 0.0, "ok": True, "msg": f"{host}: no rank in the smoke test"}
    directory = tempfile.mkdtemp(prefix="fdl-collective-")
    try:
        argv = program_argv(sys.executable, write_program(directory), time_limit_s=time_limit_s,
                            min_bytes=min_bytes, max_bytes=max_bytes, max_iters=max_iters,
                            exchange_bytes=exchange_bytes)
        outcome = run_ranks(argv, mine, time_limit_s=time_limit_s)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    done = sum(1 for event in outcome.events if event.get("event") == "done")
    ok = done == len(mine) and not outcome.abandoned and outcome.first_failure is None
    numbers = [r["rank"] for r in mine]
    what = "finished" if ok else ("abandoned at the time limit" if outcome.abandoned else "did not finish")
    return dict(outcome.to_dict(), ranks=numbers, ok=ok,
                msg=f"{host}: ranks {numbers[0]}-{numbers[-1]} {what} ({done} of {len(mine)} done)")
