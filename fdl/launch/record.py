"""This machine's record of a launcher run: the live record `fdl status` and `fdl start` find it by, and the
final state.json kept in the run's directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fdl.controller import live
from fdl.controller.wire import is_loopback
from fdl.launch.plan import SINGLE, LaunchPlan
from fdl.launch.printer import Printer

if TYPE_CHECKING:
    from fdl.controller.server import ControllerServer

__all__ = ["RunRecord"]


class RunRecord:
    """Where this machine keeps what it knows of a run while it lives and after it ended."""

    def __init__(self, plan: LaunchPlan, printer: Printer):
        self.plan = plan
        self.printer = printer

    @property
    def run_dir(self) -> Path:
        """This machine's record of the run: its token, local rank logs and the final state.json."""
        return live.run_dir(self.plan.run_id)

    def record_live(self, server: ControllerServer) -> Path | None:
        """Say where this run's controller listens, for a plain `fdl status` and `fdl start` of this user on this
        machine (fdl.controller.live; they find the run's token beside it). A cluster run's controller is recorded as
        this machine reaches it: on loopback when it listens there or on every address."""
        plan = self.plan
        address = plan.controller_addr
        if plan.mode != SINGLE and (is_loopback(plan.bind) or plan.bind in ("0.0.0.0", "::", "localhost")):
            address = f"127.0.0.1:{server.port}"
        try:
            return live.write_record(address, plan.configured_addr or plan.controller_addr, plan.run_id)
        except OSError as exc:
            self.printer.note(f"could not record the live run for `fdl status` ({exc}); "
                              f"use fdl status --addr {plan.controller_addr}")
            return None

    def keep_state(self, server: ControllerServer) -> None:
        """The final state.json outlives the controller (it goes with the launcher): kept in the run's directory."""
        import json

        from fdl.hostside.fsio import atomic_write

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.run_dir / "state.json", json.dumps(server.state(), indent=1).encode(),
                         mode=0o600)
        except (OSError, RuntimeError, TimeoutError) as exc:
            self.printer.note(f"could not keep the final state in {self.run_dir}: {exc}")
