"""The run's state machine: join window, roster, start switch, liveness, exits.

Pure Python, no I/O and no asyncio: every method runs to completion, reads
time from the injected clock, and raises `Refused` when a request is turned
down. The HTTP layer (`fdl.controller.server`) is a thin shell around it; tests
drive it directly with a fake clock.

`RunMachine` is the façade the server calls; each job is a part of its own:
who is in the run (`roster.Roster`), where the run is (`lifecycle.Lifecycle`),
whether the members are alive (`liveness.Liveness`), what it counts
(`tally.Tally`) and how state.json renders it (`snapshot.StateView`).

Lifecycle::

    waiting --quorum met--> staging --(auto/hybrid: clock or roster complete;
       ^                       |       manual/hybrid: start switch)--> forming
       +----quorum lost--------+                                         |
                                       every member's ranks running --> training
    any open phase --window closes without what it needs--> failed       |
    forming/training --a member exits non-zero or goes silent--> failed  |
                                       every member exited 0 ----------> done
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from fdl.controller.auth import new_controller_id
from fdl.controller.lifecycle import Lifecycle
from fdl.controller.liveness import Liveness
from fdl.controller.policy import RunPolicy
from fdl.controller.protocol import Hello
from fdl.controller.roster import Roster
from fdl.controller.snapshot import StateView
from fdl.controller.states import TERMINAL, Member, Phase, Refused, Switch
from fdl.controller.tally import Tally
from fdl.controller.world import World

__all__ = ["RunMachine"]

T = TypeVar("T")


class _Held(Generic[T]):
    """An attribute of the machine that one of its parts holds: read here, changed only by that part."""

    def __init__(self, part: str):
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, machine: Any, owner: type | None = None) -> T:
        return cast(T, getattr(getattr(machine, self.part), self.name))

    def __set__(self, machine: Any, value: T) -> None:
        raise AttributeError(f"{self.name} belongs to the machine's {self.part}: it changes there")


class RunMachine:
    """One run's join window and lifecycle, composed of its parts. Not thread-safe: call it from one thread (the
    server's loop)."""

    phase = _Held[Phase]("lifecycle")
    reason = _Held[str | None]("lifecycle")
    deadline = _Held[float | None]("lifecycle")
    switch = _Held[Switch]("lifecycle")
    fired_by = _Held[str | None]("lifecycle")
    formed_by = _Held[str | None]("lifecycle")
    world = _Held[World | None]("lifecycle")
    members = _Held[dict[str, Member]]("roster")
    ranks = _Held[int]("roster")
    peers = _Held[dict[str, int]]("roster")
    cohort_run_id = _Held[str | None]("roster")
    cohort_signature = _Held[str | None]("roster")
    departed = _Held[deque[dict[str, Any]]]("roster")
    admissions = _Held[int]("roster")
    refusals = _Held[dict[str, int]]("tally")
    exits = _Held[dict[int, int]]("tally")
    version = _Held[int]("view")

    def __init__(self, policy: RunPolicy, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, controller_id: str | None = None):
        self.policy = policy
        self.clock = clock
        # This controller instance: random at every start, published in state.json and GET /join/id; every proof
        # of the token names it, so a request proved here is worth nothing at any other controller.
        self.controller_id = controller_id or new_controller_id()
        self._epoch = wall() - clock()  # mono + epoch = unix time, for display
        self.tally = Tally()
        self.roster = Roster(policy, self.tally, epoch=self._epoch)
        self.lifecycle = Lifecycle(policy, self.roster, self.tally, clock=clock)
        self.liveness = Liveness(policy, self.roster, self.lifecycle, self.tally, clock=clock)
        self.view = StateView(policy, self.roster, self.lifecycle, self.tally, clock=clock, epoch=self._epoch,
                              controller_id=self.controller_id)
        self.listeners: list[Callable[[RunMachine], None]] = []

    def shed(self, peer: str | None) -> None:
        """The server refused a connection from peer for load: a member there is not silent meanwhile."""
        self.roster.shed(peer, self.clock())

    def resolve_roster(self) -> None:
        """Resolve every roster address now (the server does it off its loop, before the first hello)."""
        self.roster.resolve()

    def _changed(self) -> None:
        self.view.changed()
        for listener in list(self.listeners):
            listener(self)

    def refuse(self, reason: str, message: str, *, status: int = 409, extra: dict[str, Any] | None = None) -> Refused:
        """A refusal, counted by reason (state.json `refusals`); the caller raises it."""
        return self.tally.refuse(reason, message, status=status, extra=extra)

    def now(self) -> float:
        """This controller's clock, as Unix time."""
        return self.clock() + self._epoch

    def _auth_ok(self, trusted: bool, *, what: str) -> None:
        """Requests that proved the run's token and the launcher in-process pass, whatever their address
        (loopback is not a credential: every account on the box shares it); anyone passes in a run without a
        token, which a server allows only under the explicit insecure_no_token opt-out."""
        if trusted or self.policy.token is None:
            return
        raise self.refuse("bad_token", f"no proof of the run's token: a {what} must be signed with the run's token "
                                        f"(from the controller box and through an ssh tunnel too).", status=403)

    def _check_clock(self, now: float) -> None:
        """Cheap (O(1)) deadline check, done on every request."""
        if self.lifecycle.overdue(now):
            self.lifecycle.evaluate(now)
            self._changed()

    # ------------------------------------------------------------------ requests

    def hello(self, hello: Hello, *, peer: str, trusted: bool, authed: bool = False,
              in_process: bool = False) -> Member:
        """Admit a host or raise Refused naming why not.

        trusted: the caller vouches for it (in-process callers); authed: its request proved the run's token;
        in_process: the launcher itself (the only caller that may admit the hosts it reserved)."""
        now = self.clock()
        self._check_clock(now)
        self._auth_ok(trusted or authed or in_process, what="join")
        self.roster.check_reserved(hello.host, in_process=in_process)
        if not self.lifecycle.window_open(now):
            raise self.refuse("window_closed", self.lifecycle.closed_text())
        member = self.roster.admit(hello, peer=peer, in_process=in_process, now=now)
        self.lifecycle.admitted(now)
        self._changed()
        return member

    def fire(self, *, peer: str, trusted: bool) -> None:
        """The start switch: form the world now, or raise Refused (never queued). trusted: the request proved
        the run's token (or an in-process caller)."""
        now = self.clock()
        self._check_clock(now)
        self._auth_ok(trusted, what="start")
        self.lifecycle.fire(peer=peer, now=now)
        self._changed()

    def tick(self) -> None:
        """Time-driven transitions: the window deadline and silent members. O(members)."""
        if self.liveness.tick(self.clock()):
            self._changed()

    def next_deadline_in(self) -> float | None:
        """Seconds until the window deadline, while it is open (the server wakes then)."""
        return self.lifecycle.seconds_left()

    def poll_begin(self, ticket: str) -> Member:
        now = self.clock()
        self._check_clock(now)
        member = self.roster.member(ticket)
        self.liveness.poll_begin(member, now)
        return member

    def poll_end(self, member: Member) -> None:
        self.liveness.poll_end(member)

    def world_reply(self, member: Member) -> bytes | None:
        """The member's serialized world once formed (None while the window is open)."""
        world = self.lifecycle.world
        if world is None or member.host not in world.seats:
            return None
        if not member.fetched:
            member.fetched = True
            member.frag = None
            self._changed()
        return world.assignment_json(member.host, {"ok": True, "formed": True,
                                                   "heartbeat_s": self.policy.heartbeat_s})

    def heartbeat(self, ticket: str, *, running: bool = False) -> Member:
        now = self.clock()
        self._check_clock(now)
        member = self.roster.member(ticket)
        if self.liveness.heartbeat(member, now, running=running):
            self._changed()
        return member

    def report_exit(self, ticket: str, code: int, detail: str | None = None) -> Member:
        now = self.clock()
        self._check_clock(now)
        member = self.roster.member(ticket)
        if self.liveness.report_exit(member, code, detail, now):
            self._changed()
        return member

    def fail(self, reason: str) -> None:
        """For a launcher: end the run as failed with a reason (a no-op once it has ended)."""
        if self.lifecycle.phase not in TERMINAL:
            self.lifecycle.fail(reason, self.clock())
            self._changed()

    # ------------------------------------------------------------------ state.json

    def roster_json(self) -> bytes:
        """The roster as a JSON array, rebuilt only when it changed (last_seen: one-second granularity)."""
        return self.view.roster_json()

    def state_head(self) -> dict[str, Any]:
        """Everything in state.json but the roster (small; time-dependent fields computed now)."""
        return self.view.state_head()

    def state_json(self) -> bytes:
        """state.json: a snapshot at most SNAPSHOT_S old, rebuilt at once whenever the state changes."""
        return self.view.state_json()

    def state(self) -> dict[str, Any]:
        """state.json as a dict (for in-process callers and tests)."""
        state: dict[str, Any] = json.loads(self.state_json())
        return state
