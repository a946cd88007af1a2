"""Where the run is: its phase, the join window's clock, the start switch, and the world once it formed."""

from __future__ import annotations

from collections.abc import Callable

from fdl.controller.policy import RunPolicy
from fdl.controller.roster import Roster
from fdl.controller.states import DONE, FAILED, FORMING, OPEN, STAGING, TERMINAL, TRAINING, WAITING, Switch
from fdl.controller.tally import Tally
from fdl.controller.world import World, build_world

__all__ = ["Lifecycle"]


class Lifecycle:
    """The run's phase transitions (see fdl.controller.machine): the window's deadline, quorum and the start
    switch move an open window on; forming builds the world from the roster; exits end the run."""

    def __init__(self, policy: RunPolicy, roster: Roster, tally: Tally, *, clock: Callable[[], float]):
        self.policy = policy
        self.roster = roster
        self.tally = tally
        self.clock = clock
        self.phase = WAITING
        self.reason: str | None = None
        self.opened_at: float | None = None
        self.deadline: float | None = None
        self.switch = Switch.NONE if policy.start == "auto" else Switch.UNARMED
        self.fired_at: float | None = None
        self.fired_by: str | None = None
        self.world: World | None = None
        self.formed_at: float | None = None
        self.formed_by: str | None = None
        self.ended_at: float | None = None

    def window_open(self, now: float | None = None) -> bool:
        if self.phase not in OPEN:
            return False
        now = self.clock() if now is None else now
        return self.deadline is None or now < self.deadline

    def seconds_left(self, now: float | None = None) -> float | None:
        if self.deadline is None or self.phase not in OPEN:
            return None
        now = self.clock() if now is None else now
        return max(0.0, self.deadline - now)

    def closed_text(self) -> str:
        if self.phase in (FORMING, TRAINING):
            return f"the window already closed: the world formed ({self.formed_by}) and the run is {self.phase}."
        if self.phase in TERMINAL:
            return f"the window already closed: the run is {self.phase}" + (f" ({self.reason})." if self.reason
                                                                             else ".")
        return "the window already closed (its deadline passed)."

    def overdue(self, now: float) -> bool:
        """Whether an open window's deadline has passed (cheap, O(1): checked on every request)."""
        return self.phase in OPEN and self.deadline is not None and now >= self.deadline

    def admitted(self, now: float) -> None:
        """A host was admitted: the first one opens the window's clock; then see where the window stands."""
        if self.opened_at is None:
            self.opened_at = now
            self.deadline = now + self.policy.window_s
        self.evaluate(now)

    def evaluate(self, now: float) -> None:
        """Move an open window to where its members, its clock and its mode put it."""
        if self.phase not in OPEN:
            return
        roster = self.roster
        mode = self.policy.start
        if self.deadline is not None and now >= self.deadline:
            if mode == "manual":
                self.fail(f"the window closed before the start switch was fired ({roster.quorum_text()})", now)
            elif roster.quorum_met():
                self._form("window deadline", now)
            else:
                self.fail(f"the window closed without quorum ({roster.quorum_text()})", now)
            return
        if mode in ("auto", "hybrid") and roster.members and roster.complete() and roster.quorum_met():
            self._form("roster complete", now)
            return
        self.phase = STAGING if roster.quorum_met() else WAITING

    def _form(self, by: str, now: float) -> None:
        members = self.roster.in_order()
        p = self.policy
        self.world = build_world(members, run_id=self.roster.cohort_run_id, master_addr=p.master_addr,
                                 master_port=p.master_port, controller=p.controller_addr, args=p.args,
                                 launch_id=p.launch_id)
        self.phase = FORMING
        self.formed_at = now
        self.formed_by = by
        for member in members:
            member.frag = None

    def fail(self, reason: str, now: float) -> None:
        if self.phase in TERMINAL:
            return
        self.phase = FAILED
        self.reason = reason
        self.ended_at = now

    def fire(self, *, peer: str, now: float) -> None:
        """The start switch: form the world now, or raise Refused (never queued)."""
        if self.policy.start == "auto":
            raise self.tally.refuse("auto_mode", "this run starts on its own (start: auto): there is no switch to "
                                                 "fire. It forms when the roster is complete or the window closes.")
        if not self.window_open(now):
            raise self.tally.refuse("window_closed", self.closed_text())
        if not self.roster.quorum_met():
            q = self.roster.quorum()
            raise self.tally.refuse("quorum_not_met", f"quorum not met: {self.roster.quorum_text()} have joined.",
                                    extra={"have": q["have"], "need": q["need"]})
        self.switch = Switch.FIRED
        self.fired_at = now
        self.fired_by = peer
        self._form("start switch", now)

    def ranks_running(self) -> None:
        """A member's ranks run: the world trains once every member's run (or ended)."""
        if self.phase == FORMING and all(m.running or m.exit_code is not None for m in self.roster.members.values()):
            self.phase = TRAINING

    def exited(self, host: str, code: int, detail: str | None, now: float) -> None:
        """A member of the formed world exited: non-zero fails the run; the last clean exit ends it done."""
        if code != 0:
            self.fail(f"host {host} exited {code}" + (f": {detail}" if detail else ""), now)
        elif self.phase in (FORMING, TRAINING) and all(m.exit_code == 0 for m in self.roster.members.values()):
            self.phase = DONE
            self.ended_at = now
