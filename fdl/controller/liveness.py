"""Whether the members are alive: long-polls and heartbeats keep them so, silence drops or fails them, and
their exit reports end their part of the run."""

from __future__ import annotations

from collections.abc import Callable

from fdl.controller.lifecycle import Lifecycle
from fdl.controller.policy import RunPolicy
from fdl.controller.roster import Roster
from fdl.controller.states import FORMING, OPEN, TRAINING, Member
from fdl.controller.tally import Tally

__all__ = ["Liveness"]


class Liveness:
    """What the members say after admission (polls, heartbeats, exits) and what their silence means. Each
    method returns whether the run's state changed (the caller tells the listeners)."""

    def __init__(self, policy: RunPolicy, roster: Roster, lifecycle: Lifecycle, tally: Tally, *,
                 clock: Callable[[], float]):
        self.policy = policy
        self.roster = roster
        self.lifecycle = lifecycle
        self.tally = tally
        self.clock = clock

    def tick(self, now: float) -> bool:
        """Time-driven transitions: the window deadline and silent members. O(members)."""
        roster, lifecycle, silence_s = self.roster, self.lifecycle, self.policy.silence_s
        if lifecycle.phase in OPEN:
            silent = [m for m in roster.members.values()
                      if m.polls == 0 and now - m.last_seen > silence_s and roster.quiet_for(m, now) > silence_s]
            for member in silent:
                roster.remove(member, f"dropped: silent for {now - member.last_seen:.1f} s before the world "
                                      f"formed", now)
            if silent or (lifecycle.deadline is not None and now >= lifecycle.deadline):
                lifecycle.evaluate(now)
                return True
        elif lifecycle.phase in (FORMING, TRAINING):
            for member in roster.members.values():
                if member.exit_code is None and member.polls == 0 and now - member.last_seen > silence_s \
                        and roster.quiet_for(member, now) > silence_s:
                    lifecycle.fail(f"host {member.host} went silent: no heartbeat for "
                                   f"{now - member.last_seen:.1f} s after the world formed", now)
                    return True
        return False

    def poll_begin(self, member: Member, now: float) -> None:
        member.polls += 1
        self.roster.touch(member, now)

    def poll_end(self, member: Member) -> None:
        member.polls = max(0, member.polls - 1)
        if self.roster.holds(member):
            self.roster.touch(member, self.clock())

    def heartbeat(self, member: Member, now: float, *, running: bool) -> bool:
        self.roster.touch(member, now)
        if running and not member.running and self.lifecycle.world is not None:
            member.running = True
            self.lifecycle.ranks_running()
            return True
        return False

    def report_exit(self, member: Member, code: int, detail: str | None, now: float) -> bool:
        self.roster.touch(member, now)
        if member.exit_code is None:  # the first report of each member counts
            self.tally.exit_reported(code)
        lifecycle = self.lifecycle
        if lifecycle.world is None and lifecycle.phase in OPEN:
            self.roster.remove(member, f"left before the world formed (exit code {code})", now)
            lifecycle.evaluate(now)
            return True
        if member.exit_code is not None:
            return False
        member.exit_code = code
        member.detail = detail
        lifecycle.exited(member.host, code, detail, now)
        return True
