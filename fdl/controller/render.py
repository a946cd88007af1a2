"""The human view of state.json (`fdl status`), and of a start answer (`fdl start`)."""

from __future__ import annotations

from typing import Any

ROSTER_SHOWN = 64


def duration(seconds: float | None) -> str:
    """3725 -> '1h02m05s'; 75 -> '1m15s'; 4.2 -> '4.2s'."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
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


def _hardware(entry: dict) -> str:
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


def render_state(state: dict, address: str) -> str:
    """A few lines for people: phase, window, quorum, switch, world, roster."""
    now = state.get("now")
    phase = state.get("phase", "?")
    start = state.get("start") or {}
    window = state.get("window") or {}
    quorum = state.get("quorum") or {}
    mode = start.get("mode", "?")
    kind = state.get("kind", "?")
    run = state.get("run_id")
    lines = [f"run {run or '(no run id)'} at {address}: {phase}  ({kind} window, start: {mode})"]
    if state.get("reason"):
        lines.append(f"  reason: {state['reason']}")

    if window.get("open"):
        if window.get("deadline") is None:
            lines.append(f"  window: open; its {duration(window.get('window_s'))} start counting at the first "
                         f"admission")
        else:
            lines.append(f"  window: open, closes in {duration(window.get('seconds_left'))} "
                         f"(opened {_ago(now, window.get('opened_at'))})")
    else:
        lines.append("  window: closed")

    need, have = quorum.get("need") or {}, quorum.get("have") or {}
    need_text = f"{need.get('hosts', 0)} host(s)" + (f", {need['ranks']} ranks" if need.get("ranks") else "")
    lines.append(f"  quorum: {'met' if quorum.get('met') else 'not met'}: {have.get('hosts', 0)} host(s), "
                 f"{have.get('ranks', 0)} rank(s) joined; needs {need_text}")

    if mode == "auto":
        if phase in ("waiting", "staging"):
            lines.append("  switch: none (start: auto); forms when the roster is complete or the window closes")
    elif start.get("switch") == "fired":
        lines.append(f"  switch: fired by {start.get('fired_by') or '?'} {_ago(now, start.get('fired_at'))}")
    elif start.get("startable"):
        lines.append("  switch: roster startable, fire with fdl start")
    elif phase in ("waiting", "staging"):
        extra = " or the window closes" if mode == "hybrid" else ""
        lines.append(f"  switch: unarmed; fdl start fires it once quorum is met{extra}")
    else:
        lines.append("  switch: not fired")

    world = state.get("world")
    if world:
        lines.append(f"  world: {world.get('size')} rank(s) on {world.get('nodes')} host(s), backend "
                     f"{world.get('backend')}, rendezvous {world.get('master_addr')}:{world.get('master_port')}; "
                     f"formed by {world.get('formed_by')} {_ago(now, world.get('formed_at'))}")

    roster = state.get("roster") or []
    if roster:
        lines.append(f"  joined: {len(roster)} host(s), {sum(int(e.get('ranks', 0)) for e in roster)} rank(s)")
        rows = [["HOST", "ADDRESS", "DEVICES", "RANKS", "HARDWARE", "STATUS", "EXIT", "LAST SEEN"]]
        for entry in roster[:ROSTER_SHOWN]:
            code = entry.get("exit_code")
            rows.append([str(entry.get("host")), str(entry.get("address")), str(entry.get("devices")),
                         str(entry.get("ranks")), _hardware(entry), str(entry.get("status")),
                         "-" if code is None else str(code), _ago(now, entry.get("last_seen"))])
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


def render_start(answer: dict[str, Any], address: str) -> str:
    world = answer.get("world") or {}
    size = world.get("size")
    extra = f" ({size} rank(s) on {world.get('nodes')} host(s))" if size is not None else ""
    return f"start armed at {address}: the world formed{extra}. Watch it with fdl status.\n"
