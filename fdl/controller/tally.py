"""What a run counts for state.json: its refusals by reason and its exit reports by code."""

from __future__ import annotations

from typing import Any

from fdl.controller.states import Refused

__all__ = ["Tally"]


class Tally:
    """The run's counters (state.json `refusals` and `exits`); every refusal is made here so that it is counted."""

    def __init__(self) -> None:
        self.refusals: dict[str, int] = {}  # refused requests by reason
        self.exits: dict[int, int] = {}  # exit reports by code

    def refuse(self, reason: str, message: str, *, status: int = 409, extra: dict[str, Any] | None = None) -> Refused:
        """A refusal, counted by reason (state.json `refusals`); the caller raises it."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        return Refused(reason, message, status=status, extra=extra)

    def exit_reported(self, code: int) -> None:
        """A member's first exit report (later ones from the same member are not counted)."""
        self.exits[code] = self.exits.get(code, 0) + 1
