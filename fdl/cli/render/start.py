"""`fdl start` for people: what the armed switch formed."""

from __future__ import annotations

from typing import Any

from fdl.controller.view import clean_state


def render_start(answer: dict[str, Any], address: str) -> str:
    """The report once the switch is armed."""
    world = clean_state(answer.get("world") or {})
    size = world.get("size")
    extra = f" ({size} rank(s) on {world.get('nodes')} host(s))" if size is not None else ""
    return f"start armed at {address}: the world formed{extra}. Watch it with fdl status.\n"
