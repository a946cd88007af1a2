"""What a state.json says, read as data: made printable, its open deadlines, its quorum and roster counts.

The controller's metrics and every renderer of a run's state (fdl.cli.render.status) read a state through
these, so they agree on what the numbers are. No text for people is made here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class QuorumCounts(NamedTuple):
    """Where a run stands against its quorum; need_hosts is at least 1, need_ranks 0 when ranks are not asked."""

    have_hosts: int
    need_hosts: int
    have_ranks: int
    need_ranks: int
    met: bool


def quorum_counts(state: dict[str, Any]) -> QuorumCounts:
    quorum = state.get("quorum") or {}
    need, have = quorum.get("need") or {}, quorum.get("have") or {}
    return QuorumCounts(int(have.get("hosts", 0)), max(int(need.get("hosts", 0) or 0), 1),
                        int(have.get("ranks", 0)), int(need.get("ranks", 0) or 0), bool(quorum.get("met")))


def roster_totals(state: dict[str, Any]) -> tuple[int, int]:
    """(hosts on the roster, ranks they offer)."""
    roster = state.get("roster") or []
    return len(roster), sum(int(e.get("ranks", 0)) for e in roster)
