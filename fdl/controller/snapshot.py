"""state.json: the run rendered for `fdl status`, the page and the metrics, cached between changes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fdl.controller.lifecycle import Lifecycle
from fdl.controller.policy import RunPolicy
from fdl.controller.roster import Roster
from fdl.controller.states import SNAPSHOT_S, STAGING, STATE_SCHEMA
from fdl.controller.tally import Tally

__all__ = ["StateView"]

_JSON: dict[str, Any] = {"separators": (",", ":")}


class StateView:
    """Renders the run's parts as state.json; `version` counts the changes, and each change rebuilds it."""

    def __init__(self, policy: RunPolicy, roster: Roster, lifecycle: Lifecycle, tally: Tally, *,
                 clock: Callable[[], float], epoch: float, controller_id: str):
        self.policy = policy
        self.roster = roster
        self.lifecycle = lifecycle
        self.tally = tally
        self.clock = clock
        self._epoch = epoch  # mono + epoch = unix time, for display
        self.controller_id = controller_id
        self.version = 0
        self._roster_cache: bytes | None = None
        self._roster_built = 0.0
        self._state_cache: bytes | None = None
        self._state_key: tuple[int, int] = (-1, -1)

    def changed(self) -> None:
        """The run changed: a new version, and the roster is rebuilt on the next read."""
        self.version += 1
        self._roster_cache = None

    def _epoch_of(self, mono: float | None) -> float | None:
        return None if mono is None else round(mono + self._epoch, 3)

    def roster_json(self) -> bytes:
        """The roster as a JSON array, rebuilt only when it changed (last_seen: one-second granularity)."""
        now = self.clock()
        roster = self.roster
        if self._roster_cache is not None and (not roster.seen_dirty or now - self._roster_built < 1.0):
            return self._roster_cache
        parts = []
        world = self.lifecycle.world
        seats = world.seats if world is not None else None
        for member in roster.members.values():
            if member.frag is None:
                first = seats[member.host].first_rank if seats and member.host in seats else None
                member.frag = json.dumps(member.to_dict(self._epoch, first), **_JSON).encode()
            parts.append(member.frag)
        self._roster_cache = b"[" + b",".join(parts) + b"]"
        self._roster_built = now
        roster.seen_dirty = False
        return self._roster_cache

    def state_head(self) -> dict[str, Any]:
        """Everything in state.json but the roster (small; time-dependent fields computed now)."""
        now = self.clock()
        p, roster, lc, tally = self.policy, self.roster, self.lifecycle, self.tally
        left = lc.seconds_left(now)
        startable = (p.start != "auto" and lc.phase == STAGING and lc.window_open(now))
        return {
            "schema": STATE_SCHEMA,
            "version": self.version,
            "now": round(now + self._epoch, 3),
            "phase": lc.phase,
            "reason": lc.reason,
            "run_id": roster.cohort_run_id,
            "launch_id": p.launch_id,
            "controller_id": self.controller_id,
            "signature": roster.cohort_signature,
            "kind": "discovery" if p.discovery else "roster",
            "controller": p.controller_addr,
            "start": {"mode": p.start, "switch": lc.switch, "startable": startable,
                      "fired_at": self._epoch_of(lc.fired_at), "fired_by": lc.fired_by},
            "window": {"window_s": p.window_s, "open": lc.window_open(now),
                       "opened_at": self._epoch_of(lc.opened_at), "deadline": self._epoch_of(lc.deadline),
                       "seconds_left": None if left is None else round(left, 3)},
            "quorum": roster.quorum(),
            "expected": [h for h in p.roster_names if h not in roster.members] if not p.discovery else [],
            "world": None if lc.world is None else {
                **lc.world.summary(), "formed_at": self._epoch_of(lc.formed_at), "formed_by": lc.formed_by},
            "ended_at": self._epoch_of(lc.ended_at),
            "departed": list(roster.departed),
            "refusals": dict(tally.refusals),
            "admissions": roster.admissions,
            "exits": {str(code): n for code, n in sorted(tally.exits.items())},
            "limits": {"max_hosts": p.capacity, "max_ranks": p.max_ranks, "heartbeat_s": p.heartbeat_s,
                       "silence_s": p.silence_s},
        }

    def state_json(self) -> bytes:
        """state.json: a snapshot at most SNAPSHOT_S old, rebuilt at once whenever the state changes."""
        now = self.clock()
        key = (self.version, int(now / SNAPSHOT_S))
        if self._state_key != key or self._state_cache is None:
            head = json.dumps(self.state_head(), **_JSON).encode()
            self._state_cache = head[:-1] + b',"roster":' + self.roster_json() + b"}"
            self._state_key = key
        return self._state_cache
