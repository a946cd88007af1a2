"""The world assignment: which ranks each member runs, and the environment of each rank.

Ranks are numbered host by host (in the order the machine hands the members
over) and, within a host, in the order of its offered devices. Every rank gets
the torch.distributed environment that `init_process_group("env://")`
reads, plus fdl's own FDL_* variables.

CUDA_VISIBLE_DEVICES lists every device the host offers, in order, and
LOCAL_RANK indexes into that list (what torchrun does), so a script that
picks `cuda:LOCAL_RANK` lands on the right device. CPU ranks get an empty
CUDA_VISIBLE_DEVICES and the gloo backend.

Beyond what `init_process_group` needs, ranks get the rest of the environment
torchrun (`torch.distributed.run`) documents, with the values that mean the
same thing here: one role, `default`, spanning the world (ROLE_RANK = RANK,
ROLE_WORLD_SIZE = WORLD_SIZE), GROUP_WORLD_SIZE the number of hosts, and
TORCHELASTIC_RUN_ID the run's id (the cohort's, else the launch's). The part
of that contract only the host running the ranks can know (restart count and
maximum, OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING) is set by the rank
supervisor (fdl.hostside.supervisor.worker_env).

Building the world is O(members); each member's own share is computed and
serialized once, on first request, and is O(that member's ranks).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fdl.hostside.envvars import (
    FDL_BACKEND,
    FDL_CONTROLLER,
    FDL_DATA_PATH,
    FDL_DEVICE,
    FDL_GPU_RAM_SHARE,
    FDL_HOST,
    FDL_NODE_RANK,
    FDL_NUM_NODES,
    FDL_RUN_ID,
)

if TYPE_CHECKING:
    from fdl.controller.states import Member

#: The torchrun variables the controller hands every rank on top of the torch.distributed basics
#: (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK).
TORCHRUN_ENV = ("GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
#: torchrun's role when none is given (`--role`): fdl runs one role, every rank of the world.
ROLE_NAME = "default"


@dataclass
class Seat:
    """One member's place in the world."""

    host: str
    node_rank: int
    first_rank: int
    devices: tuple[int, ...] | None  # GPU ids, or None for CPU ranks
    count: int
    data_path: str
    gpu_ram_share: float | None = None
    _body: bytes | None = field(default=None, repr=False)


@dataclass
class World:
    run_id: str | None
    size: int
    master_addr: str
    master_port: int
    backend: str  # nccl when every member offers GPUs, gloo otherwise
    controller: str
    args: tuple[str, ...]
    seats: dict[str, Seat]
    rdzv_id: str = ""  # TORCHELASTIC_RUN_ID: run_id, else the launch's id

    @property
    def nodes(self) -> int:
        return len(self.seats)

    def summary(self) -> dict[str, Any]:
        return {"size": self.size, "nodes": self.nodes, "master_addr": self.master_addr,
                "master_port": self.master_port, "backend": self.backend}

    def rank_env(self, seat: Seat, local_rank: int) -> dict[str, str]:
        """The environment of one rank (all values strings, ready for a child process)."""
        rank = str(seat.first_rank + local_rank)
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.size),
            "RANK": rank,
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(seat.count),
            "GROUP_RANK": str(seat.node_rank),
            "GROUP_WORLD_SIZE": str(self.nodes),
            "ROLE_NAME": ROLE_NAME,
            "ROLE_RANK": rank,
            "ROLE_WORLD_SIZE": str(self.size),
            "TORCHELASTIC_RUN_ID": self.rdzv_id or self.run_id or "",
            "CUDA_VISIBLE_DEVICES": "" if seat.devices is None else ",".join(map(str, seat.devices)),
            FDL_RUN_ID: self.run_id or "",
            FDL_CONTROLLER: self.controller,
            FDL_DATA_PATH: seat.data_path,
            FDL_HOST: seat.host,
            FDL_NODE_RANK: str(seat.node_rank),
            FDL_NUM_NODES: str(self.nodes),
            FDL_BACKEND: self.backend,
            FDL_DEVICE: "cpu" if seat.devices is None else f"cuda:{seat.devices[local_rank]}",
        }
        if seat.gpu_ram_share is not None:
            env[FDL_GPU_RAM_SHARE] = repr(seat.gpu_ram_share)
        return env

    def assignment(self, host: str) -> dict[str, Any]:
        """What one member receives: the world's shape and its own ranks with their environment."""
        seat = self.seats[host]
        return {
            "world": {**self.summary(), "run_id": self.run_id, "args": list(self.args)},
            "node_rank": seat.node_rank,
            "ranks": [
                {"rank": seat.first_rank + i, "local_rank": i,
                 "device": None if seat.devices is None else seat.devices[i],
                 "env": self.rank_env(seat, i)}
                for i in range(seat.count)
            ],
        }

    def assignment_json(self, host: str, head: dict[str, Any]) -> bytes:
        """The serialized reply for one member (cached: the world never changes once formed)."""
        seat = self.seats[host]
        if seat._body is None:
            seat._body = json.dumps({**head, **self.assignment(host)}, separators=(",", ":")).encode()
        return seat._body


def build_world(members: Sequence[Member], *, run_id: str | None, master_addr: str | None, master_port: int,
                controller: str, args: tuple[str, ...], launch_id: str | None = None) -> World:
    """Assign ranks to members, in order. Each member needs .host, .devices, .data_path,
    .gpu_ram_share and .address (rank 0's address is MASTER_ADDR unless one is given).

    launch_id names the run when the cohort carries no run id (walk-ins without a published run):
    TORCHELASTIC_RUN_ID is run_id, else launch_id, else an id made here, the same for every rank."""
    seats: dict[str, Seat] = {}
    rank = 0
    all_gpu = True
    for node_rank, member in enumerate(members):
        devices = member.devices
        if devices.is_cpu:
            ids, count = None, devices.count
            all_gpu = False
        else:
            ids = tuple(devices.ids or ())
            count = len(ids)
        seats[member.host] = Seat(host=member.host, node_rank=node_rank, first_rank=rank, devices=ids,
                                  count=count, data_path=member.data_path, gpu_ram_share=member.gpu_ram_share)
        rank += count
    if master_addr is None:
        master_addr = members[0].address if members else "127.0.0.1"
    return World(run_id=run_id, size=rank, master_addr=master_addr, master_port=master_port,
                 backend="nccl" if all_gpu and members else "gloo", controller=controller, args=tuple(args),
                 seats=seats, rdzv_id=run_id or launch_id or uuid.uuid4().hex[:16])
