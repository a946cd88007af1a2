"""What the launcher tells its user about a run: where its controller is and how to watch it, how a walk-in
joins, what it waits for, and the world once it formed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fdl.hostside.envvars import FDL_JOIN_TOKEN
from fdl.launch.plan import SINGLE, LaunchPlan
from fdl.launch.printer import Printer
from fdl.launch.tokens import RunToken

if TYPE_CHECKING:
    from fdl.controller.server import ControllerServer
    from fdl.controller.world import World

__all__ = ["RunNotes"]


class RunNotes:
    """The launcher's notes about its run (never the token itself: a made token is named by its file)."""

    def __init__(self, plan: LaunchPlan, printer: Printer, token: RunToken, *, env_name: str | None = None):
        self.plan = plan
        self.printer = printer
        self.token = token
        self.env_name = env_name

    def walk_in_line(self) -> str | None:
        """How a walk-in joins this run's discovery window (None: a roster run admits none): the command a box
        runs, token included by reference (never the token itself), arguments left to the run."""
        plan = self.plan
        if not plan.discovery or plan.cluster is None:
            return None
        if plan.cluster.controller.join.tunnel_only:
            dial = f"--ssh USER@THIS_BOX --identity KEY {plan.controller_addr}"  # the door: docs/join.md, Trust
        else:
            dial = plan.controller_addr
        minted = self.token.shown
        token = f"{FDL_JOIN_TOKEN}=\"$(cat {minted})\"" if minted else f"{FDL_JOIN_TOKEN}=<the run's token>"
        return f"{token} fdl join {dial} --bin PROGRAM --devices DEVICES"

    def announce(self, server: ControllerServer) -> None:
        plan = self.plan
        hosts = len(plan.hosts)
        what = (f"{plan.ranks} rank(s) on this machine" if plan.mode == SINGLE else
                f"{plan.ranks} rank(s) on {hosts} host(s)" + (" plus walk-ins" if plan.discovery else ""))
        if plan.mode == SINGLE:
            watch = "fdl status"  # the live record (or the default port) finds it
        else:
            watch = f"fdl @{self.env_name} status" if self.env_name else f"fdl status --addr {plan.controller_addr}"
        self.printer.note(f"run {plan.run_id} of '{plan.command.name}': {what}; controller on "
                          f"{server.address} (watch with `{watch}`)")
        line = self.walk_in_line()
        if line is not None:
            assert plan.cluster is not None  # a discovery window is a cluster run's
            start = (f"; once quorum is met, `{watch.replace(' status', ' start')}` fires the start"
                     if plan.cluster.controller.join.start != "auto" else "")
            self.printer.note(f"PROGRAM is what a walk-in's ranks run (a script's wrapper will do), DEVICES what "
                              f"it offers (0,1 or cpu:N); its ranks get the run's arguments{start}")
            self.printer.note(f"a walk-in joins with: {line}")
        if plan.mode != SINGLE:  # for curl: the key a token-proved GET /join/id names too
            self.printer.note(f"controller TLS key (this run only): {server.tls_pin}; curl reads the state "
                              f"with `curl --insecure --pinnedpubkey '{server.tls_pin}' "
                              f"https://{plan.controller_addr}/state.json`")

    def waiting(self, state: dict[str, Any]) -> None:
        self.printer.note(f"waiting for the world to form: phase {state['phase']}, quorum "
                          f"{state['quorum']['have']['hosts']}/{state['quorum']['need']['hosts']} hosts"
                          + (", start switch: fdl start" if state["start"]["mode"] != "auto" else ""))

    def world_formed(self, world: World) -> None:
        self.printer.note(f"world formed: {world.size} ranks on {world.nodes} host(s), backend "
                          f"{world.backend}, master {world.master_addr}:{world.master_port}")
