"""`fdl status` for people: a run's state as a few lines, one line per look, a live view.

Everything a peer sent is data: each state is made printable (fdl.controller.view.clean_state) before
it is shown, and the live view hands it to rich as Text, never as markup. rich is imported only by the
live view, so a plain `fdl status` never pays for it.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from fdl.controller.view import clean_state, deadlines, printable, quorum_counts, roster_totals

if TYPE_CHECKING:
    from fdl.controller.watch import WatchEnd, Watcher

ROSTER_SHOWN = 64
PHASE_STYLE = {"waiting": "yellow", "staging": "cyan", "forming": "blue", "training": "green", "done": "green",
               "failed": "red"}

State = dict[str, Any]


def duration(seconds: float | None) -> str:
    """3725 -> '1h02m05s'; 75 -> '1m15s'; 4.2 -> '4.2s'."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def ago(now: float | None, then: float | None) -> str:
    if now is None or then is None:
        return "-"
    return duration(now - then) + " ago"


def table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def hardware(entry: State) -> str:
    devices = str(entry.get("devices", "?"))
    if devices.startswith("cpu:"):
        return f"{devices[4:]} CPU rank(s)"
    names = entry.get("gpu_names") or []
    if names:
        distinct = sorted(set(names))
        if len(distinct) == 1:
            return f"{len(names)} x {distinct[0]}"
        return ", ".join(names)
    return f"GPU {devices}"


def start_line(address: str, *, env: str | None = None, from_env: bool = False, token_found: bool = False,
               token_file: str | None = None) -> str:
    """The exact command that fires this run's switch, as seen from where we found it.

    An address taken from the env's cluster.controller is reached again through that env (whose join.token,
    or this user's own run's token file, `fdl start` presents); an address fdl found a token for (this
    user's own launcher run) needs nothing more; any other address needs the token from a file. The token
    itself is never part of a command line.
    """
    if from_env:
        return f"fdl @{env} start" if env else "fdl start"
    if token_file:
        return f"fdl start --addr {address} --token-file {token_file}"
    if token_found:
        return f"fdl start --addr {address}"
    return f"fdl start --addr {address} --token-file TOKEN_FILE"


def headline(state: State, address: str) -> str:
    run = state.get("run_id")
    start = state.get("start") or {}
    return (f"run {run or '(no run id)'} at {address}: {state.get('phase', '?')}  "
            f"({state.get('kind', '?')} window, start: {start.get('mode', '?')})")


def window_text(state: State) -> str:
    window = state.get("window") or {}
    if not window.get("open"):
        return "closed"
    if window.get("deadline") is None:
        return f"open; its {duration(window.get('window_s'))} start counting at the first admission"
    return (f"open, closes in {duration(window.get('seconds_left'))} "
            f"(opened {ago(state.get('now'), window.get('opened_at'))})")


def quorum_text(state: State) -> str:
    quorum = state.get("quorum") or {}
    need, have = quorum.get("need") or {}, quorum.get("have") or {}
    need_text = f"{need.get('hosts', 0)} host(s)" + (f", {need['ranks']} ranks" if need.get("ranks") else "")
    return (f"{'met' if quorum.get('met') else 'not met'}: {have.get('hosts', 0)} host(s), "
            f"{have.get('ranks', 0)} rank(s) joined; needs {need_text}")


def switch_text(state: State, start_cmd: str | None = None) -> str | None:
    """The start switch in words (None when there is nothing to say: an auto run past staging)."""
    now = state.get("now")
    phase = state.get("phase", "?")
    start = state.get("start") or {}
    mode = start.get("mode", "?")
    if mode == "auto":
        if phase in ("waiting", "staging"):
            return "none (start: auto); forms when the roster is complete or the window closes"
        return None
    if start.get("switch") == "fired":
        return f"fired by {start.get('fired_by') or '?'} {ago(now, start.get('fired_at'))}"
    if start.get("startable"):
        return "roster startable, fire with " + (start_cmd or "fdl start")
    if phase in ("waiting", "staging"):
        extra = " or the window closes" if mode == "hybrid" else ""
        return f"unarmed; fdl start fires it once quorum is met{extra}"
    return "not fired"


def world_text(state: State) -> str | None:
    world = state.get("world")
    if not world:
        return None
    return (f"{world.get('size')} rank(s) on {world.get('nodes')} host(s), backend {world.get('backend')}, "
            f"rendezvous {world.get('master_addr')}:{world.get('master_port')}; formed by "
            f"{world.get('formed_by')} {ago(state.get('now'), world.get('formed_at'))}")


class RosterRow(NamedTuple):
    """One roster entry, shaped for people."""

    host: str
    address: str
    devices: str
    ranks: str
    hardware: str
    signature: str
    status: str
    exit: str
    last_seen: str  # heartbeat age, "4.2s ago"


def roster_rows(state: State, limit: int = ROSTER_SHOWN) -> list[RosterRow]:
    now = state.get("now")
    rows = []
    for entry in (state.get("roster") or [])[:limit]:
        code = entry.get("exit_code")
        rows.append(RosterRow(str(entry.get("host")), str(entry.get("address")), str(entry.get("devices")),
                              str(entry.get("ranks")), hardware(entry), str(entry.get("signature") or "-"),
                              str(entry.get("status")), "-" if code is None else str(code),
                              ago(now, entry.get("last_seen"))))
    return rows


def render_state(state: State, address: str, start_cmd: str | None = None, *, verified: bool = True) -> str:
    """A few lines for people: phase, window, quorum, switch, world, roster; marked unverified when the answer
    proved no token (anything answering at that address could have sent it)."""
    state = clean_state(state)
    lines = [headline(state, address)]
    if not verified:
        lines.append("  UNVERIFIED: no token proved this answer; what follows is what the address claims")
    if state.get("reason"):
        lines.append(f"  reason: {state['reason']}")
    lines.append(f"  window: {window_text(state)}")
    lines.append(f"  quorum: {quorum_text(state)}")
    switch = switch_text(state, start_cmd)
    if switch:
        lines.append(f"  switch: {switch}")
    world = world_text(state)
    if world:
        lines.append(f"  world: {world}")

    roster = state.get("roster") or []
    if roster:
        hosts, ranks = roster_totals(state)
        lines.append(f"  joined: {hosts} host(s), {ranks} rank(s)")
        rows = [["HOST", "ADDRESS", "DEVICES", "RANKS", "HARDWARE", "STATUS", "EXIT", "LAST SEEN"]]
        for row in roster_rows(state):
            rows.append([row.host, row.address, row.devices, row.ranks, row.hardware, row.status, row.exit,
                         row.last_seen])
        lines.extend(table(rows, indent="    "))
        if len(roster) > ROSTER_SHOWN:
            lines.append(f"    ... and {len(roster) - ROSTER_SHOWN} more (fdl status --json lists every host)")
    else:
        lines.append("  joined: nobody yet")
    expected = state.get("expected") or []
    if expected:
        lines.append(f"  expected, not joined yet: {', '.join(expected[:ROSTER_SHOWN])}"
                     + (f" and {len(expected) - ROSTER_SHOWN} more" if len(expected) > ROSTER_SHOWN else ""))
    for gone in (state.get("departed") or [])[-5:]:
        lines.append(f"  left: {gone.get('host')}: {gone.get('reason')}")
    return "\n".join(lines) + "\n"


def status_line(state: State, start_cmd: str | None = None) -> str:
    """One line per look, for `fdl status --watch` when stdout is not a terminal (logs, CI)."""
    state = clean_state(state)
    q = quorum_counts(state)
    parts = [f"phase {state.get('phase', '?')}",
             f"quorum {q.have_hosts}/{q.need_hosts} hosts"
             + (f", {q.have_ranks}/{q.need_ranks} ranks" if q.need_ranks else f", {q.have_ranks} ranks")
             + (" met" if q.met else " not met")]
    for deadline in deadlines(state):
        parts.append(f"{deadline.label} in {duration(deadline.seconds_left)}")
    exited = [row for row in roster_rows(state, limit=1 << 30) if row.exit != "-"]
    if exited:
        parts.append("exits " + ", ".join(f"{row.host}={row.exit}" for row in exited[:8])
                     + (" ..." if len(exited) > 8 else ""))
    switch = switch_text(state, start_cmd)
    if switch:
        parts.append(f"switch {switch}")
    if state.get("reason"):
        parts.append(f"reason: {state['reason']}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- fdl status --watch


def watch_plain(watcher: Watcher, out: TextIO, start_cmd: str | None = None) -> WatchEnd:
    """One line per look: `HH:MM:SS run R at ADDR: phase ...`; the last line says how the watch ended."""
    def draw(state: State | None, problem: str | None) -> None:
        stamp = time.strftime("%H:%M:%S")
        if state is None:
            out.write(f"{stamp} {watcher.address}: {printable(problem)}\n")
        else:
            text = status_line(state, start_cmd)
            run = printable(state.get("run_id") or "(no run id)")
            out.write(f"{stamp} run {run} at {watcher.address}: {text}"
                      + (f"; {printable(problem)}" if problem else "") + "\n")
        out.flush()

    end = watcher.follow(draw)
    out.write(f"{time.strftime('%H:%M:%S')} {printable(end.message)}\n")
    out.flush()
    return end


def watch_json(watcher: Watcher, out: TextIO) -> WatchEnd:
    """One state.json per look, one per line (NDJSON); nothing is written for a look that failed."""
    def draw(state: State | None, problem: str | None) -> None:
        if state is not None and problem is None:
            out.write(json.dumps(state, separators=(",", ":")) + "\n")
            out.flush()

    return watcher.follow(draw)


def watch_live(watcher: Watcher, out: TextIO, start_cmd: str | None = None) -> WatchEnd:
    """A live rich view, redrawn at every look; the last one stays on screen."""
    from rich.console import Console
    from rich.live import Live

    console = Console(file=out, highlight=False)
    with Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False,
              vertical_overflow="crop") as live:
        def draw(state: State | None, problem: str | None) -> None:
            live.update(live_view(state, problem, watcher.address, interval=watcher.interval, start_cmd=start_cmd,
                                  height=console.size.height), refresh=True)

        end = watcher.follow(draw)
        if end.state is not None:
            live.update(live_view(end.state, None, watcher.address, interval=watcher.interval, start_cmd=start_cmd,
                                  height=console.size.height, ended=end), refresh=True)
    style = "bold" if end.how == "ended" else "yellow"
    console.print(printable(end.message), style=style, markup=False)
    return end


def live_view(state: State | None, problem: str | None, address: str, *, interval: float = 1.0,
              start_cmd: str | None = None, height: int = 40, ended: WatchEnd | None = None) -> Any:
    """One frame of the live view (a rich renderable)."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    if state is None:
        return Text(f"{address}: {printable(problem or 'waiting for the first answer')}", style="yellow")
    # Everything a peer sent is data: made printable, and handed to rich as Text (never parsed as markup).
    state = clean_state(state)
    problem = None if problem is None else printable(problem)
    parts: list[Any] = []
    phase = state.get("phase", "?")
    title = Text(headline(state, address))
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
    q = quorum_counts(state)
    quorum = Text(f"hosts {q.have_hosts}/{q.need_hosts}"
                  + (f", ranks {q.have_ranks}/{q.need_ranks}" if q.need_ranks else f", {q.have_ranks} ranks"))
    quorum.append("  met" if q.met else "  not met", style="green" if q.met else "yellow")
    grid.add_row("quorum", with_bar(ProgressBar(total=q.need_hosts, completed=min(q.have_hosts, q.need_hosts),
                                                width=40, complete_style="green" if q.met else "yellow"), quorum))
    switch = switch_text(state)
    if (state.get("start") or {}).get("startable") and start_cmd and ended is None:
        grid.add_row("switch", Text.assemble("roster startable, fire it with  ", (start_cmd, "bold reverse")))
    elif switch:
        grid.add_row("switch", Text(switch))
    world = world_text(state)
    if world:
        grid.add_row("world", Text(world))
    parts.append(grid)

    hosts, ranks = roster_totals(state)
    shown = max(3, min(ROSTER_SHOWN, height - 16))
    roster = Table(title=Text(f"roster: {hosts} host(s), {ranks} rank(s)"), title_justify="left", expand=False,
                   show_edge=False, pad_edge=False, header_style="bold")
    for column in ("HOST", "DEVICES", "RANKS", "HARDWARE", "SIGNATURE", "STATUS", "EXIT", "HEARTBEAT"):
        roster.add_column(column, no_wrap=True, justify="right" if column in ("RANKS", "EXIT") else "left")
    for row in roster_rows(state, limit=shown):
        exit_style = "" if row.exit == "-" else ("green" if row.exit == "0" else "bold red")
        roster.add_row(Text(row.host), Text(row.devices), Text(row.ranks), Text(row.hardware),
                       Text(row.signature), Text(row.status), Text(row.exit, style=exit_style),
                       Text(row.last_seen))
    if hosts:
        parts.append(roster)
        if hosts > shown:
            parts.append(Text(f"  ... and {hosts - shown} more (fdl status --json lists every host)", style="dim"))
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
        parts.append(Text(f"  updated {time.strftime('%H:%M:%S')}, every {interval:g} s; Ctrl-C stops "
                          f"watching (the run goes on)", style="dim"))
    return Group(*parts)
