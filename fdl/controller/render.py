"""The human view of state.json (`fdl status`), and of a start answer (`fdl start`)."""

from __future__ import annotations

from typing import Any, NamedTuple

ROSTER_SHOWN = 64
_REPLACEMENT = "\ufffd"


def printable(text: object) -> str:
    """text with every character a terminal would act on (controls, escapes, lone surrogates, line and
    paragraph separators) replaced, so what a peer sent is shown as data and cannot move the cursor, recolour
    the screen or fail to encode."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _REPLACEMENT for c in text)


def clean_state(value: Any) -> Any:
    """A state.json (or any JSON value) with every string made printable (keys too)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k): clean_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_state(v) for v in value]
    return value


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


def _ago(now: float | None, then: float | None) -> str:
    if now is None or then is None:
        return "-"
    return duration(now - then) + " ago"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _hardware(entry: dict[str, Any]) -> str:
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


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class Deadline(NamedTuple):
    """An open deadline: what closes, how long is left, out of how long."""

    name: str  # stable key ("window"), the label of fdl_deadline_seconds_left
    label: str  # for people
    seconds_left: float
    total: float


def deadlines(state: dict[str, Any]) -> list[Deadline]:
    """Every deadline that is counting down now (the join window's, while it is open and has started)."""
    window = state.get("window") or {}
    left = window.get("seconds_left")
    if window.get("open") and left is not None:
        return [Deadline("window", "join window closes", float(left), float(window.get("window_s") or left))]
    return []


def start_line(address: str, *, env: str | None = None, from_env: bool = False) -> str:
    """The exact command that fires this run's switch, as seen from where we found it.

    From loopback no token is needed; an address taken from the env's cluster.controller is reached again
    through that env (whose join.token `fdl start` presents); any other address needs the token typed.
    """
    host = address.rsplit(":", 1)[0]
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return f"fdl start --addr {address}"
    if from_env:
        return f"fdl @{env} start" if env else "fdl start"
    return f"fdl start --addr {address} --token TOKEN"


def headline(state: dict[str, Any], address: str) -> str:
    run = state.get("run_id")
    start = state.get("start") or {}
    return (f"run {run or '(no run id)'} at {address}: {state.get('phase', '?')}  "
            f"({state.get('kind', '?')} window, start: {start.get('mode', '?')})")


def window_text(state: dict[str, Any]) -> str:
    window = state.get("window") or {}
    if not window.get("open"):
        return "closed"
    if window.get("deadline") is None:
        return f"open; its {duration(window.get('window_s'))} start counting at the first admission"
    return (f"open, closes in {duration(window.get('seconds_left'))} "
            f"(opened {_ago(state.get('now'), window.get('opened_at'))})")


def quorum_counts(state: dict[str, Any]) -> tuple[int, int, int, int, bool]:
    """(have hosts, need hosts, have ranks, need ranks, met); need hosts is at least 1."""
    quorum = state.get("quorum") or {}
    need, have = quorum.get("need") or {}, quorum.get("have") or {}
    return (int(have.get("hosts", 0)), max(int(need.get("hosts", 0) or 0), 1), int(have.get("ranks", 0)),
            int(need.get("ranks", 0) or 0), bool(quorum.get("met")))


def quorum_text(state: dict[str, Any]) -> str:
    quorum = state.get("quorum") or {}
    need, have = quorum.get("need") or {}, quorum.get("have") or {}
    need_text = f"{need.get('hosts', 0)} host(s)" + (f", {need['ranks']} ranks" if need.get("ranks") else "")
    return (f"{'met' if quorum.get('met') else 'not met'}: {have.get('hosts', 0)} host(s), "
            f"{have.get('ranks', 0)} rank(s) joined; needs {need_text}")


def switch_text(state: dict[str, Any], start_cmd: str | None = None) -> str | None:
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
        return f"fired by {start.get('fired_by') or '?'} {_ago(now, start.get('fired_at'))}"
    if start.get("startable"):
        return "roster startable, fire with " + (start_cmd or "fdl start")
    if phase in ("waiting", "staging"):
        extra = " or the window closes" if mode == "hybrid" else ""
        return f"unarmed; fdl start fires it once quorum is met{extra}"
    return "not fired"


def world_text(state: dict[str, Any]) -> str | None:
    world = state.get("world")
    if not world:
        return None
    return (f"{world.get('size')} rank(s) on {world.get('nodes')} host(s), backend {world.get('backend')}, "
            f"rendezvous {world.get('master_addr')}:{world.get('master_port')}; formed by "
            f"{world.get('formed_by')} {_ago(state.get('now'), world.get('formed_at'))}")


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


def roster_rows(state: dict[str, Any], limit: int = ROSTER_SHOWN) -> list[RosterRow]:
    now = state.get("now")
    rows = []
    for entry in (state.get("roster") or [])[:limit]:
        code = entry.get("exit_code")
        rows.append(RosterRow(str(entry.get("host")), str(entry.get("address")), str(entry.get("devices")),
                              str(entry.get("ranks")), _hardware(entry), str(entry.get("signature") or "-"),
                              str(entry.get("status")), "-" if code is None else str(code),
                              _ago(now, entry.get("last_seen"))))
    return rows


def roster_totals(state: dict[str, Any]) -> tuple[int, int]:
    roster = state.get("roster") or []
    return len(roster), sum(int(e.get("ranks", 0)) for e in roster)


def render_state(state: dict[str, Any], address: str, start_cmd: str | None = None) -> str:
    """A few lines for people: phase, window, quorum, switch, world, roster."""
    state = clean_state(state)
    lines = [headline(state, address)]
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
        lines.extend(_table(rows, indent="    "))
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


def status_line(state: dict[str, Any], start_cmd: str | None = None) -> str:
    """One line per look, for `fdl status --watch` when stdout is not a terminal (logs, CI)."""
    state = clean_state(state)
    have_h, need_h, have_r, need_r, met = quorum_counts(state)
    parts = [f"phase {state.get('phase', '?')}",
             f"quorum {have_h}/{need_h} hosts" + (f", {have_r}/{need_r} ranks" if need_r else f", {have_r} ranks")
             + (" met" if met else " not met")]
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


def render_start(answer: dict[str, Any], address: str) -> str:
    world = clean_state(answer.get("world") or {})
    size = world.get("size")
    extra = f" ({size} rank(s) on {world.get('nodes')} host(s))" if size is not None else ""
    return f"start armed at {address}: the world formed{extra}. Watch it with fdl status.\n"
