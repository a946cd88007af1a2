"""`fdl status --watch`: follow a run until its controller goes away.

`Watcher` polls one controller and hands each look (a state, or the problem
that stood in its way) to a `draw` callback; what is drawn, and how, is the
command's (fdl.cli.render.status: a live view on a terminal, one line per
look elsewhere, NDJSON). The watch ends when the endpoint goes away (the run
ended: the controller lives as long as its launcher), on Ctrl-C, or when the
controller stops answering for `lost_after_s`.

A verdict needs a verified state: with the run's token the watch asks with
signed requests and takes only answers that prove the token back (an answer
that does not is a failed look, not a state); without one every state is
shown as unverified, and the watch's outcome is never "succeeded".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from fdl.controller.client import ControllerClient, ControllerError, NoRunListening
from fdl.hostside.envvars import FDL_JOIN_TOKEN

State = dict[str, Any]
Draw = Callable[[State | None, str | None], None]


@dataclass
class WatchEnd:
    """How a watch ended: `how` is ended | interrupted | lost; `state` the last one seen; `verified` whether
    it came in an answer that proved the run's token."""

    how: str
    state: State | None
    message: str
    verified: bool = False


def outcome(end: WatchEnd, kept: Callable[[str | None], State | None] = lambda _: None) -> tuple[str, int]:
    """The run's outcome once a watch ended: (one line to print, exit code: 0 done and proven, 1 otherwise).

    The last state seen tells it when the watch saw the run finish in an answer that proved the run's
    token; otherwise `kept` may hold the final state the run's launcher kept on this machine
    (fdl.controller.live.kept_state: this user's own file, local evidence), found by the launcher's own id
    (`launch_id`: a discovery cohort's run id is its walk-ins', or none) and taken only when it is the final
    state of the very controller watched (same `controller_id`).
    """
    state = end.state or {}
    run = state.get("run_id")
    final, proven = state, end.verified
    if not (proven and state.get("phase") in ("done", "failed")):
        local = _kept_for(state, kept)
        if local is not None and local.get("phase") in ("done", "failed"):
            final, proven = local, True
    phase, label = final.get("phase"), f"run {run}" if run else "the run"
    if phase == "done":
        if proven:
            return f"{label} succeeded: every rank exited 0.", 0
        return (f"{label} says it succeeded, but no answer proved the run's token, so that is unverified "
                f"(give the token with --token-file or {FDL_JOIN_TOKEN} for a verdict).", 1)
    if phase == "failed":
        return (f"{label} failed: {final.get('reason') or 'see its launcher for why'}."
                + ("" if proven else " (unverified: no answer proved the run's token)"), 1)
    return (f"{label}: outcome unknown: its controller went away while the run was {phase or 'not yet seen'} "
            f"(its launcher's output says how it ended).", 1)


def _kept_for(state: State, kept: Callable[[str | None], State | None]) -> State | None:
    """The kept final state of the controller `state` came from: by its launch id, else (a controller from
    before launch ids) by its run id; one of another controller instance is not this run's."""
    watched = state.get("controller_id")
    for key in ("launch_id", "run_id"):
        ident = state.get(key)
        if not isinstance(ident, str) or not ident:
            continue
        local = kept(ident)
        if local is not None and (watched is None or local.get("controller_id") == watched):
            return local
    return None


class Watcher:
    """Polls one controller every `interval` seconds and hands each look to a draw callback."""

    def __init__(self, client: ControllerClient, *, interval: float = 1.0, lost_after_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.address = client.address
        self.interval = interval
        self.lost_after_s = max(lost_after_s, 3 * interval)
        self._sleep = sleep
        self._clock = clock

    @property
    def verified(self) -> bool:
        """Whether the states this watcher hands on proved the run's token."""
        return self.client.proves

    def _looks(self) -> Generator[tuple[State | None, str | None], None, WatchEnd]:
        """Yield (state, problem) per look; returns a WatchEnd once the endpoint is gone or lost."""
        last: State | None = None
        failing_since: float | None = None
        proves = self.client.proves
        while True:
            try:
                state = self.client.state(prove=proves)  # an unproved answer raises (UnverifiedController)
            except NoRunListening:
                phase = (last or {}).get("phase", "?")
                return WatchEnd("ended", last, f"run ended: the controller at {self.address} is gone "
                                               f"(last phase: {phase})", proves)
            except ControllerError as exc:
                now = self._clock()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.lost_after_s:
                    return WatchEnd("lost", last, f"lost the controller at {self.address}: {exc.message} "
                                                  f"(no answer for {now - failing_since:.1f} s)", proves)
                yield last, f"no answer: {exc.message}; retrying"
            else:
                failing_since = None
                last = state
                yield state, None
            self._sleep(self.interval)

    def follow(self, draw: Draw) -> WatchEnd:
        """Look until the run ends, the controller is lost or Ctrl-C; draw every look; say how it ended."""
        looks = self._looks()
        last: State | None = None
        try:
            while True:
                try:
                    state, problem = next(looks)
                except StopIteration as stop:
                    end: WatchEnd = stop.value
                    return end
                last = state if state is not None else last
                draw(state, problem)
        except KeyboardInterrupt:
            return WatchEnd("interrupted", last, "stopped watching", self.verified)
