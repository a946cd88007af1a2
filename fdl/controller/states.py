"""The run's vocabulary: its phases, the start switch, refusals and admitted members.

Records only; the transitions between phases are `fdl.controller.machine.RunMachine`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fdl.hostside.checks.devices import Devices


class Phase(StrEnum):
    """Where a run is (state.json `phase`); members compare equal to their names as plain strings."""

    WAITING = "waiting"
    STAGING = "staging"
    FORMING = "forming"
    TRAINING = "training"
    DONE = "done"
    FAILED = "failed"


class Switch(StrEnum):
    """The start switch (state.json `start.switch`): none on auto runs, else unarmed until fired."""

    NONE = "none"
    UNARMED = "unarmed"
    FIRED = "fired"


WAITING, STAGING, FORMING, TRAINING, DONE, FAILED = (Phase.WAITING, Phase.STAGING, Phase.FORMING, Phase.TRAINING,
                                                     Phase.DONE, Phase.FAILED)
PHASES = tuple(Phase)
OPEN = (WAITING, STAGING)
TERMINAL = (DONE, FAILED)
STATE_SCHEMA = 1
SNAPSHOT_S = 0.25  # state.json's time-derived fields (now, seconds_left) may be this old


class Refused(Exception):
    """A request the run turns down: `reason` is a stable code, `message` a sentence for people."""

    def __init__(self, reason: str, message: str, *, status: int = 409, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status
        self.extra = extra or {}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": False, "reason": self.reason, "message": self.message, **self.extra}


@dataclass(eq=False)
class Member:
    """An admitted host."""

    id: str
    secret: str
    host: str
    address: str
    peer: str
    devices: Devices
    ranks: int
    run_id: str | None
    signature: str | None
    data_path: str
    gpu_ram_share: float | None
    gpu_names: tuple[str, ...]
    agent: str | None
    admitted_at: float
    last_seen: float
    peer_ip: str | None = None  # the peer address in one spelling (fairness, silence under load)
    polls: int = 0  # world long-polls in flight: a member holding one is alive
    fetched: bool = False  # has received its world
    running: bool = False  # its ranks are up
    exit_code: int | None = None
    detail: str | None = None
    frag: bytes | None = field(default=None, repr=False)  # its serialized roster entry

    @property
    def ticket(self) -> str:
        return f"{self.id}.{self.secret}"

    @property
    def status(self) -> str:
        if self.exit_code is not None:
            return "exited"
        if self.running:
            return "running"
        if self.fetched:
            return "assigned"
        return "joined"

    def to_dict(self, epoch: float, first_rank: int | None) -> dict[str, Any]:
        """The roster entry. Optional fields are left out when empty, so a big roster stays small."""
        entry = {
            "host": self.host, "address": self.address, "devices": str(self.devices), "ranks": self.ranks,
            "signature": self.signature, "run_id": self.run_id, "admitted_at": round(self.admitted_at + epoch, 3),
            "last_seen": round(self.last_seen + epoch, 3), "status": self.status, "exit_code": self.exit_code,
        }
        if self.peer != self.address:
            entry["peer"] = self.peer
        if self.gpu_names:
            entry["gpu_names"] = list(self.gpu_names)
        if self.agent:
            entry["agent"] = self.agent
        if first_rank is not None:
            entry["first_rank"] = first_rank
        if self.detail is not None:
            entry["detail"] = self.detail
        return entry
