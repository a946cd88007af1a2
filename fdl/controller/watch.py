"""`fdl status --watch`: follow a run until its controller goes away.

A terminal gets a live view drawn with rich (imported here only, so a plain
`fdl status` never pays for it); anything else (a pipe, a log file, CI) gets
one plain line per look. The data shaping is `fdl.controller.render`'s, the
same `fdl status` prints. The watch ends when the endpoint goes away (the
run ended: the controller lives as long as its launcher), on Ctrl-C, or when
the controller stops answering for `lost_after_s`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TextIO

from fdl.controller.client import ControllerClient, ControllerError, NoRunListening
from fdl.controller.render import (
    ROSTER_SHOWN,
    clean_state,
    deadlines,
    duration,
    headline,
    printable,
    quorum_counts,
    roster_rows,
    roster_totals,
    status_line,
    switch_text,
    window_text,
    world_text,
)

PHASE_STYLE = {"waiting": "yellow", "staging": "cyan", "forming": "blue", "training": "green", "done": "green",
               "failed": "red"}


@dataclass
class WatchEnd:
    """How a watch ended: `how` is ended | interrupted | lost; `state` the last one seen."""

    how: str
    state: dict[str, Any] | None
    message: str


def outcome(end: WatchEnd, kept: Callable[[str | None], dict[str, Any] | None] = lambda _: None) -> tuple[str, int]:
    """The run's outcome once a watch ended: (one line to print, exit code: 0 done, 1 failed or unknown).

    The last state seen tells it when the watch saw the run finish; otherwise `kept` may hold the
    final state the run's launcher kept on this machine (fdl.launch.live.kept_state).
    """
    state = end.state or {}
    run = state.get("run_id")
    final = state if state.get("phase") in ("done", "failed") else (kept(run) or state)
    phase, label = final.get("phase"), f"run {run}" if run else "the run"
    if phase == "done":
        return f"{label} succeeded: every rank exited 0.", 0
    if phase == "failed":
        return f"{label} failed: {final.get('reason') or 'see its launcher for why'}.", 1
    return (f"{label}: outcome unknown: its controller went away while the run was {phase or 'not yet seen'} "
            f"(its launcher's output says how it ended).", 1)


class Watcher:
    """Polls one controller every `interval` seconds and draws what it sees."""

    def __init__(self, client: ControllerClient, *, interval: float = 1.0, start_cmd: str | None = None,
                 lost_after_s: float = 30.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.address = client.address
        self.interval = interval
        self.start_cmd = start_cmd
        self.lost_after_s = max(lost_after_s, 3 * interval)
        self._sleep = sleep
        self._clock = clock

    def _looks(self) -> Generator[tuple[dict[str, Any] | None, str | None], None, WatchEnd]:
        """Yield (state, problem) per look; returns a WatchEnd once the endpoint is gone or lost."""
        last: dict[str, Any] | None = None
        failing_since: float | None = None
        while True:
            try:
                state = self.client.state()
            except NoRunListening:
                phase = (last or {}).get("phase", "?")
                return WatchEnd("ended", last, f"run ended: the controller at {self.address} is gone "
                                               f"(last phase: {phase})")
            except ControllerError as exc:
                now = self._clock()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.lost_after_s:
                    return WatchEnd("lost", last, f"lost the controller at {self.address}: {exc.message} "
                                                  f"(no answer for {duration(now - failing_since)})")
                yield last, f"no answer: {exc.message}; retrying"
            else:
                failing_since = None
                last = state
                yield state, None
            self._sleep(self.interval)

    def _follow(self, draw: Callable[[dict[str, Any] | None, str | None], None]) -> WatchEnd:
        looks = self._looks()
        last: dict[str, Any] | None = None
        try:
            while True:
                try:
                    state, problem = next(looks)
                except StopIteration as stop:
                    end: WatchEnd = stop.value  # the generator's return value
                    return end
                last = state if state is not None else last
                draw(state, problem)
        except KeyboardInterrupt:
            return WatchEnd("interrupted", last, "stopped watching")

    def run_plain(self, out: TextIO) -> WatchEnd:
        """One line per look: `HH:MM:SS run R at ADDR: phase ...`."""
        def draw(state: dict[str, Any] | None, problem: str | None) -> None:
            stamp = time.strftime("%H:%M:%S")
            if state is None:
                out.write(f"{stamp} {self.address}: {problem}\n")
            else:
                text = status_line(state, self.start_cmd)
                run = printable(state.get("run_id") or "(no run id)")
                out.write(f"{stamp} run {run} at {self.address}: {text}"
                          + (f"; {printable(problem)}" if problem else "") + "\n")
            out.flush()

        end = self._follow(draw)
        out.write(f"{time.strftime('%H:%M:%S')} {end.message}\n")
        out.flush()
        return end

    def run_json(self, out: TextIO) -> WatchEnd:
        """One state.json per look, one per line (NDJSON); nothing is written for a look that failed."""
        def draw(state: dict[str, Any] | None, problem: str | None) -> None:
            if state is not None and problem is None:
                out.write(json.dumps(state, separators=(",", ":")) + "\n")
                out.flush()

        return self._follow(draw)

    def run_live(self, out: TextIO) -> WatchEnd:
        """A live rich view, redrawn at every look; the last one stays on screen."""
        from rich.console import Console
        from rich.live import Live

        console = Console(file=out, highlight=False)
        with Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False,
                  vertical_overflow="crop") as live:
            def draw(state: dict[str, Any] | None, problem: str | None) -> None:
                live.update(self.view(state, problem, console.size.height), refresh=True)

            end = self._follow(draw)
            if end.state is not None:
                live.update(self.view(end.state, None, console.size.height, ended=end), refresh=True)
        style = "bold" if end.how == "ended" else "yellow"
        console.print(end.message, style=style, markup=False)
        return end

    # ------------------------------------------------------------------ the rich view

    def view(self, state: dict[str, Any] | None, problem: str | None, height: int = 40, *,
             ended: WatchEnd | None = None) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        if state is None:
            return Text(f"{self.address}: {printable(problem or 'waiting for the first answer')}", style="yellow")
        # Everything a peer sent is data: made printable, and handed to rich as Text (never parsed as markup).
        state = clean_state(state)
        problem = None if problem is None else printable(problem)
        parts: list[Any] = []
        phase = state.get("phase", "?")
        title = Text(headline(state, self.address))
        title.highlight_words([f": {phase} "], style=f"bold {PHASE_STYLE.get(phase, '')}")
        parts.append(title)
        if state.get("reason"):
            parts.append(Text(f"  reason: {state['reason']}", style="red"))

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()

        def with_bar(bar: Any, text: Any) -> Any:
            pair = Table.grid(padding=(0, 2))
            pair.add_row(bar, text)
            return pair
        open_deadlines = deadlines(state)
        if not open_deadlines:
            grid.add_row("window", Text(window_text(state)))
        for deadline in open_deadlines:  # a bar that fills up as the deadline nears
            done = max(0.0, deadline.total - deadline.seconds_left)
            grid.add_row(deadline.name, with_bar(ProgressBar(total=deadline.total or 1.0, completed=done, width=40),
                                                 Text(f"{deadline.label} in {duration(deadline.seconds_left)}")))
        have_h, need_h, have_r, need_r, met = quorum_counts(state)
        quorum = Text(f"hosts {have_h}/{need_h}" + (f", ranks {have_r}/{need_r}" if need_r else f", {have_r} ranks"))
        quorum.append("  met" if met else "  not met", style="green" if met else "yellow")
        grid.add_row("quorum", with_bar(ProgressBar(total=need_h, completed=min(have_h, need_h), width=40,
                                                    complete_style="green" if met else "yellow"), quorum))
        switch = switch_text(state)
        if (state.get("start") or {}).get("startable") and self.start_cmd and ended is None:
            grid.add_row("switch", Text.assemble("roster startable, fire it with  ",
                                                 (self.start_cmd, "bold reverse")))
        elif switch:
            grid.add_row("switch", Text(switch))
        world = world_text(state)
        if world:
            grid.add_row("world", Text(world))
        parts.append(grid)

        hosts, ranks = roster_totals(state)
        shown = max(3, min(ROSTER_SHOWN, height - 16))
        table = Table(title=Text(f"roster: {hosts} host(s), {ranks} rank(s)"), title_justify="left", expand=False,
                      show_edge=False, pad_edge=False, header_style="bold")
        for column in ("HOST", "DEVICES", "RANKS", "HARDWARE", "SIGNATURE", "STATUS", "EXIT", "HEARTBEAT"):
            table.add_column(column, no_wrap=True, justify="right" if column in ("RANKS", "EXIT") else "left")
        for row in roster_rows(state, limit=shown):
            exit_style = "" if row.exit == "-" else ("green" if row.exit == "0" else "bold red")
            table.add_row(Text(row.host), Text(row.devices), Text(row.ranks), Text(row.hardware),
                          Text(row.signature), Text(row.status), Text(row.exit, style=exit_style),
                          Text(row.last_seen))
        if hosts:
            parts.append(table)
            if hosts > shown:
                parts.append(Text(f"  ... and {hosts - shown} more (fdl status --json lists every host)",
                                  style="dim"))
        else:
            parts.append(Text("  nobody has joined yet", style="dim"))
        expected = state.get("expected") or []
        if expected:
            parts.append(Text(f"  expected, not joined yet: {', '.join(expected[:16])}"
                              + (f" and {len(expected) - 16} more" if len(expected) > 16 else "")))
        for gone in (state.get("departed") or [])[-3:]:
            parts.append(Text(f"  left: {gone.get('host')}: {gone.get('reason')}", style="dim"))
        if problem:
            parts.append(Text(f"  {problem}", style="yellow"))
        elif ended is None:
            parts.append(Text(f"  updated {time.strftime('%H:%M:%S')}, every {self.interval:g} s; Ctrl-C stops "
                              f"watching (the run goes on)", style="dim"))
        return Group(*parts)
